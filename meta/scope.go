package meta

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/lib/pq"
)

// Product scope. A role grants its permissions on every product, or only
// on the products it lists and their devices (schema/postgres/
// 00012_role_products.sql). A user holds a permission on every product if
// one of its enabled roles grants it so, else on the union of the
// products of the roles that grant it (User.Scope).
//
// Every permission but user:admin is a product permission. user:admin is
// held only from a role on every product (a role limited to products
// cannot grant it: who administers users can give themselves any role).

// ProductPermission reports whether p is granted per product.
func ProductPermission(p Permission) bool { return p != PermUserAdmin }

// Can reports whether u holds permission p, on every product or on some.
func (u User) Can(p Permission) bool {
	return slices.Contains(u.Permissions, string(p))
}

// Scope tells where u holds permission p: on every product (all), or on
// the listed products only (sorted, never empty). A permission u lacks
// is neither: (false, nil).
func (u User) Scope(p Permission) (all bool, products []string) {
	if !u.Can(p) {
		return false, nil
	}
	if ids, limited := u.Products[p]; limited {
		return false, ids
	}
	return true, nil
}

// CanProduct reports whether u holds permission p on product productID.
func (u User) CanProduct(p Permission, productID string) bool {
	all, ids := u.Scope(p)
	if all {
		return true
	}
	_, found := slices.BinarySearch(ids, productID)
	return found
}

// Limited reports whether u holds some permission on listed products only.
func (u User) Limited() bool { return len(u.Products) > 0 }

// Restrict returns u holding at most perms, on at most products (nil:
// no further limit; an API key's grant of a subset of its user's rights):
// the intersection of both. perms nil holds nothing. A permission left on
// no product is not held; user:admin is kept only without a product limit.
func (u User) Restrict(perms []Permission, products []string) User {
	r := u
	r.Permissions = []string{}
	r.Products = nil
	var only []string
	if products != nil {
		only = sortedSet(products)
	}
	for _, p := range Permissions {
		all, ids := u.Scope(p)
		if !slices.Contains(perms, p) || !all && ids == nil {
			continue
		}
		switch {
		case products == nil:
			if !all {
				r.limit(p, ids)
			}
		case !ProductPermission(p):
			continue
		case all:
			if len(only) == 0 {
				continue
			}
			r.limit(p, only)
		default:
			if ids = intersect(ids, only); len(ids) == 0 {
				continue
			}
			r.limit(p, ids)
		}
		r.Permissions = append(r.Permissions, string(p))
	}
	return r
}

// limit records that u holds p on ids only (sorted, distinct); none: not
// at all.
func (u *User) limit(p Permission, ids []string) {
	if len(ids) == 0 {
		return
	}
	if u.Products == nil {
		u.Products = map[Permission][]string{}
	}
	u.Products[p] = slices.Clone(ids)
}

func sortedSet(ids []string) []string {
	s := slices.Clone(ids)
	slices.Sort(s)
	return slices.Compact(s)
}

// intersect is the intersection of two sorted sets.
func intersect(a, b []string) []string {
	var out []string
	for i, j := 0, 0; i < len(a) && j < len(b); {
		switch {
		case a[i] < b[j]:
			i++
		case a[i] > b[j]:
			j++
		default:
			out = append(out, a[i])
			i, j = i+1, j+1
		}
	}
	return out
}

// grantsSQL reads the grants of the user whose id is the expression u, as
// JSON: [{"p": permission, "all": bool, "products": [ids]}], one per
// permission held from an enabled role (setGrants reads it).
func grantsSQL(u string) string {
	return `(SELECT coalesce(json_agg(json_build_object('p', g.permission, 'all', g.all_products, 'products', g.products) ORDER BY g.permission), '[]')
		FROM (SELECT p.permission, bool_or(r.all_products) AS all_products,
				coalesce(array_agg(DISTINCT rp.product_id) FILTER (WHERE rp.product_id IS NOT NULL), '{}') AS products
			FROM user_roles ur JOIN roles r ON r.id = ur.role_id AND r.state = 'enabled'
			JOIN role_permissions p ON p.role_id = ur.role_id
			LEFT JOIN role_products rp ON rp.role_id = r.id AND NOT r.all_products
			WHERE ur.user_id = ` + u + ` GROUP BY p.permission) g)`
}

// setGrants sets u's Permissions and Products from grantsSQL's JSON. A
// permission on no product is not held, nor user:admin from roles
// limited to products.
func (u *User) setGrants(raw []byte) error {
	var grants []struct {
		P        Permission `json:"p"`
		All      bool       `json:"all"`
		Products []string   `json:"products"`
	}
	if err := json.Unmarshal(raw, &grants); err != nil {
		return fmt.Errorf("meta: grants: %w", err)
	}
	u.Permissions = []string{}
	u.Products = nil
	for _, g := range grants {
		switch {
		case g.All:
		case !ProductPermission(g.P) || len(g.Products) == 0:
			continue
		default:
			u.limit(g.P, sortedSet(g.Products))
		}
		u.Permissions = append(u.Permissions, string(g.P))
	}
	return nil
}

// The store's product and device reads and writes see the products a
// request may reach: LimitProducts puts them on its context (the API
// does, with the scope of the permission each route declares), and
// lists, counts, details, writes and the references the dashboard and
// commands use find nothing outside them (ErrNotFound, as if it did not
// exist). A context without a limit reaches every product (the store's
// own callers: ingest, tests).
type productLimitKey struct{}

type productLimit struct{ ids []string } // sorted, distinct

// LimitProducts returns ctx limited to products, unless all (then ctx
// is returned as it is; an outer limit stays).
func LimitProducts(ctx context.Context, all bool, products []string) context.Context {
	if all {
		return ctx
	}
	return context.WithValue(ctx, productLimitKey{}, productLimit{ids: sortedSet(products)})
}

// ProductsOf tells the products ctx is limited to: all (no limit), or
// the listed ones.
func ProductsOf(ctx context.Context) (all bool, products []string) {
	l, ok := ctx.Value(productLimitKey{}).(productLimit)
	if !ok {
		return true, nil
	}
	return false, l.ids
}

// ProductAllowed reports whether ctx may reach product id.
func ProductAllowed(ctx context.Context, id string) bool {
	all, ids := ProductsOf(ctx)
	if all {
		return true
	}
	_, found := slices.BinarySearch(ids, id)
	return found
}

// limitCond is a condition that column (a product id) is one of ctx's
// products, with its parameter bound as $n: NULL (no limit) or the list.
func limitCond(ctx context.Context, column string, n int) (string, any) {
	var arg pq.StringArray // NULL
	if all, ids := ProductsOf(ctx); !all {
		arg = pq.StringArray(append([]string{}, ids...))
	}
	return fmt.Sprintf("($%d::text[] IS NULL OR %s = ANY($%d::text[]))", n, column, n), arg
}
