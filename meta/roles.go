package meta

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"devicehub/schema"
)

// Permission is a right, resource:action: what a route needs (api/routes.go
// declares one beside each route) and what a role grants.
type Permission string

// The permissions, a small fixed set. A role grants each on every product
// or on listed ones (scope.go). Adding one: here, in Permissions, in the admin role's
// grants (schema/postgres, a new migration) and in api/openapi.
const (
	PermProductRead   Permission = "product:read"   // products: list, count, detail
	PermProductWrite  Permission = "product:write"  // products: create, change, delete, deploy
	PermDeviceRead    Permission = "device:read"    // devices: list, detail; live updates
	PermDeviceWrite   Permission = "device:write"   // devices: create, change, delete, deploy, thing model
	PermDeviceCommand Permission = "device:command" // property reads, function invokes
	PermDeviceSecret  Permission = "device:secret"  // a device's secureKey: rotation, and the generated one at creation
	PermDashboardRead Permission = "dashboard:read" // dashboard queries and exports
	PermUserAdmin     Permission = "user:admin"     // users and their roles
	PermAlarmRead     Permission = "alarm:read"     // alarm rules and records: list, detail, export
	PermAlarmWrite    Permission = "alarm:write"    // alarms: acknowledge, clear by hand
	PermRuleWrite     Permission = "rule:write"     // alarm rules: create, change, delete, enable, import
	PermNotifyAdmin   Permission = "notify:admin"   // notification channels, subscriptions, dead letters (ingest/notify)
	PermFirmwareWrite Permission = "firmware:write" // firmware packages and rollouts (ingest/firmware)
)

// Permissions lists every permission, in the order above.
var Permissions = []Permission{PermProductRead, PermProductWrite, PermDeviceRead, PermDeviceWrite,
	PermDeviceCommand, PermDeviceSecret, PermDashboardRead, PermUserAdmin,
	PermAlarmRead, PermAlarmWrite, PermRuleWrite, PermNotifyAdmin, PermFirmwareWrite}

var permissionText = map[Permission]string{
	PermProductRead:   "Read products",
	PermProductWrite:  "Write products",
	PermDeviceRead:    "Read devices",
	PermDeviceWrite:   "Write devices",
	PermDeviceCommand: "Command devices",
	PermDeviceSecret:  "Device secrets",
	PermDashboardRead: "Read dashboards",
	PermUserAdmin:     "Administer users",
	PermAlarmRead:     "Read alarms",
	PermAlarmWrite:    "Handle alarms",
	PermRuleWrite:     "Write alarm rules",
	PermNotifyAdmin:   "Administer notifications",
	PermFirmwareWrite: "Write firmware",
}

// Text is the display label of p (api writes it as the text of the
// spec's EnumObject {text, value}); an unknown permission shows itself.
func (p Permission) Text() string {
	if text, ok := permissionText[p]; ok {
		return text
	}
	return string(p)
}

// UnmarshalJSON reads a permission as its value, "device:read", or as the
// EnumObject api writes ({text, value}: a role read from endpoint 13 can be
// sent back).
func (p *Permission) UnmarshalJSON(b []byte) error {
	var e Enum
	if err := e.UnmarshalJSON(b); err != nil {
		return err
	}
	*p = Permission(e)
	return nil
}

// The built-in roles (schema/postgres/00011_role_permissions.sql): admin
// holds every permission, operator runs devices (no users, no device
// secrets), viewer reads.
const (
	RoleAdmin    = "admin"
	RoleOperator = "operator"
	RoleViewer   = "viewer"
)

// Role is a named permission group (spec: Role), with the permissions it
// grants, on every product (Products nil, JSON null) or on the listed
// products and their devices.
type Role struct {
	ID          string       `db:"id"`
	Name        string       `db:"name"`
	Description string       `db:"description"`
	State       Enum         `db:"state"`
	CreatorID   string       `db:"creator_id"`
	CreateTime  Millis       `db:"-"`
	Permissions []Permission `db:"-"`
	Products    []string     `db:"-"`
}

type roleRow struct {
	Role
	CreatedAt   time.Time      `db:"create_time"`
	Perms       pq.StringArray `db:"permissions"`
	AllProducts bool           `db:"all_products"`
	ProductIDs  pq.StringArray `db:"products"`
}

func (r *roleRow) role() Role {
	role := r.Role
	role.CreateTime = Millis(r.CreatedAt)
	role.Permissions = make([]Permission, len(r.Perms))
	for i, p := range r.Perms {
		role.Permissions[i] = Permission(p)
	}
	if !r.AllProducts {
		role.Products = append([]string{}, r.ProductIDs...)
	}
	return role
}

const roleColumns = `r.id, r.name, r.description, r.state, r.creator_id, r.create_time, r.all_products,
	ARRAY(SELECT p.permission FROM role_permissions p WHERE p.role_id = r.id ORDER BY p.permission) AS permissions,
	ARRAY(SELECT rp.product_id FROM role_products rp WHERE rp.role_id = r.id ORDER BY rp.product_id) AS products`

// RoleResource allows the spec's sort names id, name, description and
// createTime.
var RoleResource = &Resource{
	Name: "role",
	Columns: map[string]Column{
		"id":          {Expr: "r.id", Kind: KindText},
		"name":        {Expr: "r.name", Kind: KindText},
		"description": {Expr: "r.description", Kind: KindText},
		"state":       {Expr: "r.state", Kind: KindText},
		"creatorId":   {Expr: "r.creator_id", Kind: KindText},
		"createTime":  {Expr: "r.create_time", Kind: KindTime},
	},
	Sorts: map[string]string{
		"id":          Natural("r.id"),
		"name":        Natural("r.name"),
		"description": "r.description",
		"createTime":  "r.create_time",
	},
	DefaultSort: "r.create_time DESC, r.id",
	TieBreak:    Natural("r.id"),
}

// QueryRoles answers endpoint 13: roles with their permissions and
// products.
func (s *Store) QueryRoles(ctx context.Context, q *Query) (Page[Role], error) {
	return roleList.Query(ctx, s, q, nil)
}

// roleList is endpoint 13's statement.
var roleList = NewList(RoleResource, ListSQL{
	Select: roleColumns,
	From:   "roles r",
}, (*roleRow).role)

// GetRole returns one role, or ErrNotFound.
func (s *Store) GetRole(ctx context.Context, id string) (Role, error) {
	ctx, cancel := s.timeout(ctx)
	defer cancel()
	return s.getRole(ctx, s.db, id)
}

func (s *Store) getRole(ctx context.Context, db getter, id string) (Role, error) {
	var r roleRow
	err := db.GetContext(ctx, &r, `SELECT `+roleColumns+` FROM roles r WHERE r.id = $1`, id)
	if errors.Is(err, sql.ErrNoRows) {
		return Role{}, fmt.Errorf("role %q: %w", id, ErrNotFound)
	}
	if err != nil {
		return Role{}, fmt.Errorf("meta: get role: %w", err)
	}
	return r.role(), nil
}

// ProductList is a role's products in a request body: absent (Set
// false: a change keeps them), null (every product) or a list of product
// ids (at least one).
type ProductList struct {
	Set bool
	IDs []string // nil: every product
}

// UnmarshalJSON reads null or an array of strings.
func (l *ProductList) UnmarshalJSON(b []byte) error {
	l.Set = true
	l.IDs = nil
	if string(bytes.TrimSpace(b)) == "null" {
		return nil
	}
	var ids []string
	if err := json.Unmarshal(b, &ids); err != nil {
		return schema.Invalid("products", "must be null (every product) or an array of product ids")
	}
	if ids == nil {
		ids = []string{}
	}
	l.IDs = ids
	return nil
}

// RoleInput is the body of a role's creation (POST /api/role: ID
// optional, a new one is made; Name required) or change (PUT
// /api/role/{id}: absent fields stay; Permissions, when given, replace
// the role's).
type RoleInput struct {
	ID          string        `json:"id"`
	Name        *string       `json:"name"`
	Description *string       `json:"description"`
	Permissions *[]Permission `json:"permissions"`
	Products    ProductList   `json:"products"`
}

// ErrBuiltinRole refuses a change or deletion of the built-in role admin.
var ErrBuiltinRole = fmt.Errorf("the built-in role admin cannot be changed or deleted: %w", schema.ErrIllegalArgument)

// maxRoleProducts bounds a role's product list.
const maxRoleProducts = 1000

// checkGrants checks a role's permissions and products: known
// permissions, existing products (at least one when a list is given),
// user:admin only on every product.
func checkGrants(ctx context.Context, tx *sqlx.Tx, perms []Permission, products []string) error {
	if len(perms) > len(Permissions)*4 {
		return schema.Invalid("permissions", "at most %d", len(Permissions))
	}
	for i, p := range perms {
		if !slices.Contains(Permissions, p) {
			return schema.Invalid(fmt.Sprintf("permissions[%d]", i), "no permission %q (known: %v)", short(string(p)), Permissions)
		}
		if products != nil && !ProductPermission(p) {
			return schema.Invalid(fmt.Sprintf("permissions[%d]", i), "%s is granted on every product only (products must be null)", p)
		}
	}
	if products == nil {
		return nil
	}
	if len(products) == 0 {
		return schema.Invalid("products", "give at least one product id, or null for every product")
	}
	if len(products) > maxRoleProducts {
		return schema.Invalid("products", "at most %d", maxRoleProducts)
	}
	var known []string
	if err := tx.SelectContext(ctx, &known, `SELECT id FROM products WHERE id = ANY($1)`, pq.StringArray(products)); err != nil {
		return fmt.Errorf("meta: role products: %w", err)
	}
	for i, id := range products {
		if !slices.Contains(known, id) {
			return schema.Invalid(fmt.Sprintf("products[%d]", i), "no product %q", short(id))
		}
	}
	return nil
}

// setGrants replaces role id's permissions (perms, unless nil) and, if
// set, its products.
func setRoleGrants(ctx context.Context, tx *sqlx.Tx, id string, perms *[]Permission, products ProductList) error {
	if perms != nil {
		ps := make(pq.StringArray, len(*perms))
		for i, p := range *perms {
			ps[i] = string(p)
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM role_permissions WHERE role_id = $1 AND NOT permission = ANY($2)`, id, ps); err != nil {
			return fmt.Errorf("meta: role permissions: %w", err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO role_permissions (role_id, permission) SELECT $1, unnest($2::text[]) ON CONFLICT DO NOTHING`, id, ps); err != nil {
			return fmt.Errorf("meta: role permissions: %w", err)
		}
	}
	if !products.Set {
		return nil
	}
	ids := pq.StringArray(products.IDs)
	if products.IDs == nil {
		ids = pq.StringArray{}
	}
	if _, err := tx.ExecContext(ctx, `UPDATE roles SET all_products = $2 WHERE id = $1 AND all_products IS DISTINCT FROM $2`, id, products.IDs == nil); err != nil {
		return fmt.Errorf("meta: role products: %w", err)
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM role_products WHERE role_id = $1 AND NOT product_id = ANY($2)`, id, ids); err != nil {
		return fmt.Errorf("meta: role products: %w", err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO role_products (role_id, product_id) SELECT $1, unnest($2::text[]) ON CONFLICT DO NOTHING`, id, ids); err != nil {
		return fmt.Errorf("meta: role products: %w", err)
	}
	return nil
}

// CreateRole adds a role with its permissions and products (nil: every
// product); an unknown permission or product is an input error naming
// the field.
func (s *Store) CreateRole(ctx context.Context, r Role) error {
	if err := checkID("id", r.ID); err != nil {
		return err
	}
	_, err := s.AddRole(ctx, RoleInput{ID: r.ID, Name: &r.Name, Description: &r.Description, Permissions: &r.Permissions,
		Products: ProductList{Set: true, IDs: r.Products}}, r.CreatorID, string(r.State))
	return err
}

// AddRole creates a role from in (POST /api/role), made by creatorID, in
// state (enabled when ""). Without an id it gets a new one.
func (s *Store) AddRole(ctx context.Context, in RoleInput, creatorID, state string) (Role, error) {
	if in.ID == "" {
		in.ID = NewID()
	}
	if err := checkID("id", in.ID); err != nil {
		return Role{}, err
	}
	if in.Name == nil {
		return Role{}, schema.Invalid("name", "is required")
	}
	if err := checkText("name", *in.Name, 128, true); err != nil {
		return Role{}, err
	}
	desc := ""
	if in.Description != nil {
		desc = *in.Description
	}
	if err := checkText("description", desc, 1024, false); err != nil {
		return Role{}, err
	}
	if state == "" {
		state = "enabled"
	}
	perms := []Permission{}
	if in.Permissions != nil {
		perms = *in.Permissions
	}
	err := s.changeUsers(ctx, false, func(ctx context.Context, tx *sqlx.Tx) error {
		if err := checkGrants(ctx, tx, perms, in.Products.IDs); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO roles (id, name, description, state, creator_id) VALUES ($1, $2, $3, $4, $5)`,
			in.ID, *in.Name, desc, state, creatorID)
		if isUniqueViolation(err) {
			return fmt.Errorf("role %q: %w", in.ID, ErrDuplicateKey)
		}
		if err != nil {
			return fmt.Errorf("meta: create role: %w", err)
		}
		in.Products.Set = true
		return setRoleGrants(ctx, tx, in.ID, &perms, in.Products)
	})
	if err != nil {
		return Role{}, err
	}
	return s.GetRole(ctx, in.ID)
}

// UpdateRole changes role id (PUT /api/role/{id}): its users' tokens are
// read again on every instance (00011, 00012). The built-in role admin
// cannot be changed (ErrBuiltinRole), and no change may leave no enabled
// user holding user:admin (ErrLastAdmin).
func (s *Store) UpdateRole(ctx context.Context, id string, in RoleInput) (Role, error) {
	if id == RoleAdmin {
		return Role{}, ErrBuiltinRole
	}
	if in.ID != "" && in.ID != id {
		return Role{}, schema.Invalid("id", "a role's id cannot change")
	}
	if in.Name != nil {
		if err := checkText("name", *in.Name, 128, true); err != nil {
			return Role{}, err
		}
	}
	if in.Description != nil {
		if err := checkText("description", *in.Description, 1024, false); err != nil {
			return Role{}, err
		}
	}
	err := s.changeUsers(ctx, true, func(ctx context.Context, tx *sqlx.Tx) error {
		cur, err := s.getRole(ctx, tx, id)
		if err != nil {
			return err
		}
		perms, products := cur.Permissions, cur.Products
		if in.Permissions != nil {
			perms = *in.Permissions
		}
		if in.Products.Set {
			products = in.Products.IDs
		}
		if err := checkGrants(ctx, tx, perms, products); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `UPDATE roles SET name = coalesce($2, name), description = coalesce($3, description) WHERE id = $1`,
			id, in.Name, in.Description); err != nil {
			return fmt.Errorf("meta: update role: %w", err)
		}
		return setRoleGrants(ctx, tx, id, in.Permissions, in.Products)
	})
	if err != nil {
		return Role{}, err
	}
	return s.GetRole(ctx, id)
}

// ErrRoleHeld refuses deleting a role that users hold.
var ErrRoleHeld = fmt.Errorf("role is held by users: take it from them first: %w", schema.ErrIllegalArgument)

// DeleteRole deletes role id (DELETE /api/role/{id}) and returns it. A
// role that users hold is not deleted (ErrRoleHeld, like a product that
// still has devices): taking it from them is a change of each user, seen
// in the user list. The built-in role admin cannot be deleted.
func (s *Store) DeleteRole(ctx context.Context, id string) (Role, error) {
	if id == RoleAdmin {
		return Role{}, ErrBuiltinRole
	}
	var r Role
	err := s.changeUsers(ctx, true, func(ctx context.Context, tx *sqlx.Tx) error {
		var err error
		if r, err = s.getRole(ctx, tx, id); err != nil {
			return err
		}
		var holders int
		if err := tx.GetContext(ctx, &holders, `SELECT count(*) FROM user_roles WHERE role_id = $1`, id); err != nil {
			return fmt.Errorf("meta: delete role: %w", err)
		}
		if holders > 0 {
			return fmt.Errorf("role %q, held by %d users: %w", id, holders, ErrRoleHeld)
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM roles WHERE id = $1`, id); err != nil {
			return fmt.Errorf("meta: delete role: %w", err)
		}
		return nil
	})
	return r, err
}
