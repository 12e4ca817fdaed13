package meta_test

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"devicehub/meta"
	"devicehub/meta/metatest"
	"devicehub/schema"
)

// TestRoleProducts: roles limited to products give their users those
// products only (Authenticate), their changes are announced to the
// token watchers, and a product's deletion takes it from its roles.
func TestRoleProducts(t *testing.T) {
	t.Parallel()
	s := metatest.NewStore(t)
	ctx := context.Background()
	for _, id := range []string{"pa", "pb", "pc"} {
		createTestProduct(t, s, id, false)
	}
	perms := func(ps ...meta.Permission) *[]meta.Permission { return &ps }
	name := func(n string) *string { return &n }
	if _, err := s.AddRole(ctx, meta.RoleInput{ID: "ra", Name: name("A"), Permissions: perms(meta.PermDeviceRead, meta.PermProductRead),
		Products: meta.ProductList{Set: true, IDs: []string{"pa"}}}, "admin", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AddRole(ctx, meta.RoleInput{ID: "rb", Name: name("B"), Permissions: perms(meta.PermDeviceRead, meta.PermDeviceWrite),
		Products: meta.ProductList{Set: true, IDs: []string{"pb", "pc"}}}, "admin", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateUser(ctx, "limited", "secret1", "ra", "rb"); err != nil {
		t.Fatal(err)
	}
	sess, err := s.Login(ctx, "x", "limited", "secret1", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	u, _, err := s.Authenticate(ctx, sess.Token)
	if err != nil {
		t.Fatal(err)
	}
	want := map[meta.Permission][]string{
		meta.PermDeviceRead:  {"pa", "pb", "pc"},
		meta.PermDeviceWrite: {"pb", "pc"},
		meta.PermProductRead: {"pa"},
	}
	if !reflect.DeepEqual(u.Products, want) || !reflect.DeepEqual(u.Permissions, []string{"device:read", "device:write", "product:read"}) {
		t.Fatalf("user %+v, want products %v", u, want)
	}
	// Another role on every product makes its permission whole.
	if _, err := s.UpdateUser(ctx, u.ID, meta.UserPatch{Roles: &[]string{"ra", "rb", meta.RoleViewer}}); err != nil {
		t.Fatal(err)
	}
	if u, _, _ = s.Authenticate(ctx, sess.Token); !reflect.DeepEqual(u.Products, map[meta.Permission][]string{meta.PermDeviceWrite: {"pb", "pc"}}) {
		t.Fatalf("with viewer: %+v", u.Products)
	}
	if _, err := s.UpdateUser(ctx, u.ID, meta.UserPatch{Roles: &[]string{"ra", "rb"}}); err != nil {
		t.Fatal(err)
	}

	// Changes of a role's products are announced (the user's token).
	heard := make(chan []string, 100)
	w := s.WatchTokens(func(ids []string) { heard <- ids })
	defer w.Stop()
	if ids := <-heard; ids != nil {
		t.Fatalf("first announcement %v", ids)
	}
	announced := func(what string) {
		t.Helper()
		select {
		case ids := <-heard:
			if !reflect.DeepEqual(ids, []string{meta.TokenID(sess.Token)}) {
				t.Fatalf("%s: announced %v", what, ids)
			}
		case <-time.After(2 * time.Second):
			t.Fatalf("%s: not announced", what)
		}
	}
	if _, err := s.UpdateRole(ctx, "rb", meta.RoleInput{Products: meta.ProductList{Set: true, IDs: []string{"pb"}}}); err != nil {
		t.Fatal(err)
	}
	announced("products narrowed")
	if u, _, _ = s.Authenticate(ctx, sess.Token); !reflect.DeepEqual(u.Products[meta.PermDeviceWrite], []string{"pb"}) {
		t.Fatalf("after narrowing: %+v", u.Products)
	}
	if _, err := s.UpdateRole(ctx, "rb", meta.RoleInput{Products: meta.ProductList{Set: true}}); err != nil {
		t.Fatal(err)
	}
	announced("every product")
	if u, _, _ = s.Authenticate(ctx, sess.Token); !reflect.DeepEqual(u.Products, map[meta.Permission][]string{meta.PermProductRead: {"pa"}}) {
		t.Fatalf("rb on every product: %+v", u.Products)
	}
	// A product's deletion takes it from role ra: product:read on no
	// product is not held; device:read stays on every product (rb).
	if _, err := s.DeleteProduct(ctx, "pa"); err != nil {
		t.Fatal(err)
	}
	announced("product deleted")
	if u, _, _ = s.Authenticate(ctx, sess.Token); u.Can(meta.PermProductRead) || u.Limited() || !u.Can(meta.PermDeviceRead) {
		t.Fatalf("after deleting pa: %+v", u)
	}
	r, err := s.GetRole(ctx, "ra")
	if err != nil || r.Products == nil || len(r.Products) != 0 {
		t.Fatalf("role ra %+v %v: want limited to no product", r, err)
	}
}

// TestRoleEditing: creation, change and deletion of roles, and the
// input errors naming their field, with nothing half-written.
func TestRoleEditing(t *testing.T) {
	t.Parallel()
	s := metatest.NewStore(t)
	ctx := context.Background()
	createTestProduct(t, s, "pa", false)
	perms := func(ps ...meta.Permission) *[]meta.Permission { return &ps }
	name := func(n string) *string { return &n }
	r, err := s.AddRole(ctx, meta.RoleInput{Name: name("Fresh"), Permissions: perms(meta.PermDeviceRead)}, "admin", "")
	if err != nil || r.ID == "" || r.Products != nil || !reflect.DeepEqual(r.Permissions, []meta.Permission{meta.PermDeviceRead}) || r.CreatorID != "admin" {
		t.Fatalf("role %+v %v", r, err)
	}
	roles := countRows(t, s, "roles")
	for _, c := range []struct {
		name  string
		in    meta.RoleInput
		field string
	}{
		{"no name", meta.RoleInput{ID: "x"}, "name"},
		{"unknown permission", meta.RoleInput{ID: "x", Name: name("X"), Permissions: perms(meta.PermDeviceRead, "device:fly")}, "permissions[1]"},
		{"unknown product", meta.RoleInput{ID: "x", Name: name("X"), Permissions: perms(meta.PermDeviceRead), Products: meta.ProductList{Set: true, IDs: []string{"pa", "nope"}}}, "products[1]"},
		{"empty products", meta.RoleInput{ID: "x", Name: name("X"), Products: meta.ProductList{Set: true, IDs: []string{}}}, "products"},
		{"user:admin limited", meta.RoleInput{ID: "x", Name: name("X"), Permissions: perms(meta.PermUserAdmin), Products: meta.ProductList{Set: true, IDs: []string{"pa"}}}, "permissions[0]"},
		{"bad id", meta.RoleInput{ID: "a b", Name: name("X")}, "id"},
	} {
		_, err := s.AddRole(ctx, c.in, "admin", "")
		var ae *schema.ArgError
		if !errors.As(err, &ae) || ae.Field != c.field {
			t.Fatalf("%s: %v, want an input error on %s", c.name, err, c.field)
		}
	}
	if _, err := s.AddRole(ctx, meta.RoleInput{ID: r.ID, Name: name("Again")}, "admin", ""); !errors.Is(err, meta.ErrDuplicateKey) {
		t.Fatalf("taken id: %v", err)
	}
	if n := countRows(t, s, "roles"); n != roles {
		t.Fatalf("%d roles after refused creations, want %d", n, roles)
	}
	// Update: absent fields stay.
	r2, err := s.UpdateRole(ctx, r.ID, meta.RoleInput{Description: name("d"), Products: meta.ProductList{Set: true, IDs: []string{"pa"}}})
	if err != nil || r2.Name != "Fresh" || r2.Description != "d" || !reflect.DeepEqual(r2.Products, []string{"pa"}) || len(r2.Permissions) != 1 {
		t.Fatalf("updated %+v %v", r2, err)
	}
	if _, err := s.UpdateRole(ctx, r.ID, meta.RoleInput{Permissions: perms(meta.PermUserAdmin)}); err == nil {
		t.Fatal("user:admin on a limited role: no error")
	}
	if _, err := s.UpdateRole(ctx, "nope", meta.RoleInput{Name: name("n")}); !errors.Is(err, meta.ErrNotFound) {
		t.Fatalf("update unknown: %v", err)
	}
	for _, f := range []func() error{
		func() error { _, err := s.UpdateRole(ctx, meta.RoleAdmin, meta.RoleInput{Name: name("n")}); return err },
		func() error { _, err := s.DeleteRole(ctx, meta.RoleAdmin); return err },
	} {
		if err := f(); !errors.Is(err, meta.ErrBuiltinRole) || !errors.Is(err, schema.ErrIllegalArgument) {
			t.Fatalf("admin role: %v", err)
		}
	}
	// A held role is not deleted; once free, it is.
	if _, err := s.CreateUser(ctx, "holder", "secret1", r.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.DeleteRole(ctx, r.ID); !errors.Is(err, meta.ErrRoleHeld) {
		t.Fatalf("delete held role: %v", err)
	}
	if _, err := s.DeleteUser(ctx, userID(t, s, "holder")); err != nil {
		t.Fatal(err)
	}
	if d, err := s.DeleteRole(ctx, r.ID); err != nil || d.ID != r.ID {
		t.Fatalf("delete role: %+v %v", d, err)
	}
	if _, err := s.GetRole(ctx, r.ID); !errors.Is(err, meta.ErrNotFound) {
		t.Fatalf("deleted role: %v", err)
	}
	// The last administrator's role cannot lose user:admin.
	if _, err := s.AddRole(ctx, meta.RoleInput{ID: "boss", Name: name("Boss"), Permissions: perms(meta.PermUserAdmin)}, "admin", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := s.UpdateUser(ctx, "admin", meta.UserPatch{Roles: &[]string{"boss"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.UpdateRole(ctx, "boss", meta.RoleInput{Permissions: perms(meta.PermDeviceRead)}); !errors.Is(err, meta.ErrLastAdmin) {
		t.Fatalf("last admin's role: %v", err)
	}
}

func userID(t *testing.T, s *meta.Store, username string) string {
	t.Helper()
	var id string
	if err := s.DB().Get(&id, `SELECT id FROM users WHERE username = $1`, username); err != nil {
		t.Fatal(err)
	}
	return id
}

// TestProductLimit: a context limited to products (LimitProducts) lists,
// counts and finds only them and their devices; the same query without
// the limit, asked before and after, is not served the limited page.
func TestProductLimit(t *testing.T) {
	t.Parallel()
	s := metatest.NewStore(t)
	bg := context.Background()
	createTestProduct(t, s, "pa", false)
	createTestProduct(t, s, "pb", false)
	createTestDevice(t, s, "da", "pa")
	createTestDevice(t, s, "db", "pb")
	limited := meta.LimitProducts(bg, false, []string{"pa", "gone"})
	if all, ids := meta.ProductsOf(limited); all || !reflect.DeepEqual(ids, []string{"gone", "pa"}) {
		t.Fatalf("ProductsOf %v %v", all, ids)
	}
	if meta.LimitProducts(bg, true, nil) != bg {
		t.Fatal("LimitProducts(all) made a new context")
	}
	ids := func(ctx context.Context, list string) []string {
		t.Helper()
		var out []string
		switch list {
		case "products":
			p, err := s.QueryProducts(ctx, queryBody(t, `{"sorts":[{"name":"id"}]}`))
			if err != nil {
				t.Fatal(err)
			}
			for _, x := range p.Data {
				out = append(out, x.ID)
			}
		case "devices":
			p, err := s.QueryDevices(ctx, queryBody(t, `{"sorts":[{"name":"id"}]}`))
			if err != nil {
				t.Fatal(err)
			}
			for _, x := range p.Data {
				out = append(out, x.ID)
			}
		}
		return out
	}
	for i := 0; i < 2; i++ { // twice: the second from the page cache
		if got := ids(bg, "products"); !reflect.DeepEqual(got, []string{"pa", "pb"}) {
			t.Fatalf("products unlimited: %v", got)
		}
		if got := ids(limited, "products"); !reflect.DeepEqual(got, []string{"pa"}) {
			t.Fatalf("products limited: %v", got)
		}
		if got := ids(bg, "devices"); !reflect.DeepEqual(got, []string{"da", "db"}) {
			t.Fatalf("devices unlimited: %v", got)
		}
		if got := ids(limited, "devices"); !reflect.DeepEqual(got, []string{"da"}) {
			t.Fatalf("devices limited: %v", got)
		}
	}
	if n, err := s.CountProducts(limited, queryBody(t, `{}`)); err != nil || n != 1 {
		t.Fatalf("count limited: %d %v", n, err)
	}
	if n, err := s.CountProducts(bg, queryBody(t, `{}`)); err != nil || n != 2 {
		t.Fatalf("count: %d %v", n, err)
	}
	// The limit narrows the total too: the product counts, which answer
	// these terms for the whole fleet, do not answer them under a limit.
	for body, want := range map[string]int{`{}`: 1, `{"terms":[{"column":"productId","value":"pb"}]}`: 0,
		`{"terms":[{"column":"state","value":"notActive"}]}`: 1} {
		p, err := s.QueryDevices(limited, queryBody(t, body))
		if err != nil || p.Total != want || len(p.Data) != want || !p.TotalExact {
			t.Fatalf("devices limited, %s: total %d (exact %v), %d items, %v; want %d", body, p.Total, p.TotalExact, len(p.Data), err, want)
		}
	}
	// An OR in the terms does not escape the limit.
	p, err := s.QueryDevices(limited, queryBody(t, `{"terms":[{"column":"id","value":"db"},{"column":"id","value":"da","type":"or"}]}`))
	if err != nil || len(p.Data) != 1 || p.Data[0].ID != "da" {
		t.Fatalf("or terms: %+v %v", p.Data, err)
	}
	if _, err := s.GetProduct(limited, "pb"); !errors.Is(err, meta.ErrNotFound) {
		t.Fatalf("product outside: %v", err)
	}
	if _, err := s.GetDeviceDetail(limited, "db"); !errors.Is(err, meta.ErrNotFound) {
		t.Fatalf("device outside: %v", err)
	}
	if _, err := s.GetDeviceDetail(limited, "da"); err != nil {
		t.Fatalf("device inside: %v", err)
	}
}
