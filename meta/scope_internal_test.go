package meta

import (
	"encoding/json"
	"reflect"
	"testing"
)

// TestUserScope: a user's scope per permission, from its grants, and
// Restrict's intersection with a subset of permissions and products.
func TestUserScope(t *testing.T) {
	t.Parallel()
	var u User
	// product:read on every product (one role) and on a (another); device:read
	// on b and a; device:write on c; user:admin from a limited role (not held);
	// dashboard:read on no product (its products deleted: not held).
	if err := u.setGrants([]byte(`[
		{"p":"device:read","all":false,"products":["b","a","b"]},
		{"p":"device:write","all":false,"products":["c"]},
		{"p":"dashboard:read","all":false,"products":[]},
		{"p":"product:read","all":true,"products":["a"]},
		{"p":"user:admin","all":false,"products":["a"]}]`)); err != nil {
		t.Fatal(err)
	}
	if want := []string{"device:read", "device:write", "product:read"}; !reflect.DeepEqual(u.Permissions, want) {
		t.Fatalf("permissions %v, want %v", u.Permissions, want)
	}
	scope := func(u User, p Permission, wantAll bool, want []string) {
		t.Helper()
		all, ids := u.Scope(p)
		if all != wantAll || !reflect.DeepEqual(ids, want) {
			t.Fatalf("Scope(%s) = %v %v, want %v %v", p, all, ids, wantAll, want)
		}
	}
	scope(u, PermProductRead, true, nil)
	scope(u, PermDeviceRead, false, []string{"a", "b"})
	scope(u, PermDeviceWrite, false, []string{"c"})
	scope(u, PermDashboardRead, false, nil)
	scope(u, PermUserAdmin, false, nil)
	if !u.Limited() || (User{Permissions: []string{"device:read"}}).Limited() {
		t.Fatal("Limited: want true for a user with a limited permission only")
	}

	can := func(u User, p Permission, product string, want bool) {
		t.Helper()
		if got := u.CanProduct(p, product); got != want {
			t.Fatalf("CanProduct(%s, %q) = %v, want %v", p, product, got, want)
		}
		if want && !u.Can(p) {
			t.Fatalf("Can(%s) false, but held on %q", p, product)
		}
	}
	can(u, PermProductRead, "zzz", true)
	can(u, PermDeviceRead, "a", true)
	can(u, PermDeviceRead, "b", true)
	can(u, PermDeviceRead, "c", false)
	can(u, PermDeviceWrite, "a", false)
	can(u, PermDeviceWrite, "c", true)
	can(u, PermDashboardRead, "a", false)
	can(u, PermDeviceCommand, "a", false)

	// Restrict: permissions and products both intersect.
	r := u.Restrict([]Permission{PermProductRead, PermDeviceRead, PermDeviceCommand}, []string{"b", "x"})
	if want := []string{"product:read", "device:read"}; !reflect.DeepEqual(r.Permissions, want) {
		t.Fatalf("restricted permissions %v, want %v", r.Permissions, want)
	}
	scope(r, PermProductRead, false, []string{"b", "x"}) // all, limited to the list
	scope(r, PermDeviceRead, false, []string{"b"})       // a and b, with b and x
	scope(r, PermDeviceWrite, false, nil)                // not asked for
	can(r, PermDeviceRead, "a", false)
	// Nothing left on a permission: not held.
	r = u.Restrict([]Permission{PermDeviceWrite, PermDeviceRead}, []string{"a"})
	if want := []string{"device:read"}; !reflect.DeepEqual(r.Permissions, want) {
		t.Fatalf("restricted permissions %v, want %v", r.Permissions, want)
	}
	// No product limit: the user's own scopes stay.
	r = u.Restrict(Permissions, nil)
	if !reflect.DeepEqual(r.Permissions, []string{"product:read", "device:read", "device:write"}) {
		t.Fatalf("restricted permissions %v", r.Permissions)
	}
	scope(r, PermDeviceRead, false, []string{"a", "b"})
	scope(r, PermProductRead, true, nil)
	// nil permissions: none.
	if r := u.Restrict(nil, nil); len(r.Permissions) != 0 || r.Can(PermProductRead) {
		t.Fatalf("Restrict(nil, nil) holds %v", r.Permissions)
	}
	// user:admin survives only without a product limit; the original is untouched.
	admin := User{Permissions: []string{"user:admin", "device:read"}}
	if r := admin.Restrict(Permissions, []string{"a"}); r.Can(PermUserAdmin) || !r.CanProduct(PermDeviceRead, "a") || r.CanProduct(PermDeviceRead, "b") {
		t.Fatalf("admin restricted to a: %+v", r)
	}
	if r := admin.Restrict([]Permission{PermUserAdmin}, nil); !r.Can(PermUserAdmin) || r.Can(PermDeviceRead) {
		t.Fatalf("admin restricted to user:admin: %+v", r)
	}
	if !admin.CanProduct(PermDeviceRead, "b") || admin.Limited() {
		t.Fatalf("Restrict changed its receiver: %+v", admin)
	}
	// Restrict copies: changing the result's lists leaves u alone.
	r = u.Restrict(Permissions, nil)
	r.Products[PermDeviceRead][0] = "zz"
	scope(u, PermDeviceRead, false, []string{"a", "b"})
}

// TestProductListJSON: absent, null and a list are three answers.
func TestProductListJSON(t *testing.T) {
	t.Parallel()
	f := func(body string, set bool, ids []string) {
		t.Helper()
		var in RoleInput
		if err := json.Unmarshal([]byte(body), &in); err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		if in.Products.Set != set || !reflect.DeepEqual(in.Products.IDs, ids) {
			t.Fatalf("%s: %+v, want set %v ids %#v", body, in.Products, set, ids)
		}
	}
	f(`{}`, false, nil)
	f(`{"products":null}`, true, nil)
	f(`{"products":[]}`, true, []string{})
	f(`{"products":["a"]}`, true, []string{"a"})
	var in RoleInput
	if err := json.Unmarshal([]byte(`{"permissions":["device:read",{"text":"Read products","value":"product:read"}]}`), &in); err != nil ||
		!reflect.DeepEqual(*in.Permissions, []Permission{PermDeviceRead, PermProductRead}) {
		t.Fatalf("permissions as values and as {text, value}: %v %v", in.Permissions, err)
	}
	if err := json.Unmarshal([]byte(`{"products":"a"}`), &in); err == nil {
		t.Fatal(`products "a": no error`)
	}
}
