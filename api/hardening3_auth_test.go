package api_test

import (
	"strings"
	"testing"

	"devicehub/bench/testkit"
	"devicehub/meta"
)

// Hardening, round three (issue 41): users, keys, logins and the
// server's framing, from the attacker's side. Each test fails when the
// rule it checks is removed.

// TestHardeningKeysNeverManageUsers: a request made with an API key, even
// one holding user:admin, cannot create, change or delete users or roles,
// nor change or reset a password (403 access_denied saying so); nothing
// is changed, and the same calls with the login's token still work.
func TestHardeningKeysNeverManageUsers(t *testing.T) {
	e := newEnv(t)
	victimID, _ := e.addUser("victim", meta.RoleViewer)
	key := e.createKey(e.token, map[string]any{"name": "all", "permissions": meta.Permissions}).Key
	for _, c := range []struct {
		method, path string
		body         any
	}{
		{"POST", "/api/user", map[string]any{"username": "mallory", "password": "mallory-pass-1", "roles": []string{"admin"}}},
		{"PUT", "/api/user/" + victimID, map[string]any{"roles": []string{"admin"}}},
		{"PUT", "/api/user/admin", map[string]any{"state": "disabled"}},
		{"DELETE", "/api/user/" + victimID, nil},
		{"PUT", "/api/user/admin/password", map[string]any{"password": "taken-over-1"}},
		{"PUT", "/api/user/" + victimID + "/password", map[string]any{"password": "taken-over-1"}},
		{"PUT", "/api/user/passwd", map[string]any{"oldPassword": "admin123", "newPassword": "taken-over-1"}},
		{"POST", "/api/role", map[string]any{"id": "all", "name": "All", "permissions": meta.Permissions}},
		{"PUT", "/api/role/viewer", map[string]any{"permissions": meta.Permissions}},
		{"DELETE", "/api/role/viewer", nil},
	} {
		r := e.do(c.method, c.path, c.body, key)
		if r.HTTPStatus != 403 || r.Code != "access_denied" || !strings.Contains(r.Message, "API key") {
			t.Errorf("%s %s with a key holding user:admin: %d %s, want 403 access_denied naming the key", c.method, c.path, r.HTTPStatus, r.raw)
		}
	}
	// Nothing changed: the admin still signs in, the victim is a viewer,
	// no user or role was added.
	e.login("admin", "admin123")
	if n := e.countRows("users"); n != 2 {
		t.Errorf("%d users after refused calls, want 2", n)
	}
	var roles []string
	if err := e.store.DB().Select(&roles, `SELECT role_id FROM user_roles WHERE user_id = $1`, victimID); err != nil || len(roles) != 1 || roles[0] != meta.RoleViewer {
		t.Errorf("victim's roles after refused calls: %v %v", roles, err)
	}
	// Reading stays open to a key with user:admin.
	if r := e.do("POST", "/api/user/_query", map[string]any{}, key); r.HTTPStatus != 200 {
		t.Errorf("user list with a key: %d %s", r.HTTPStatus, r.raw)
	}
	// The login's token may.
	e.ok("PUT", "/api/user/"+victimID, map[string]any{"name": "Victim"}, nil)
	e.ok("POST", "/api/role", map[string]any{"id": "r3", "name": "R3", "permissions": []string{"device:read"}}, nil)
}

// TestHardeningNoStore: every answer that carries a secret (a login's
// token, a key, a device's secureKey) says Cache-Control: no-store, so
// that no browser or proxy keeps it.
func TestHardeningNoStore(t *testing.T) {
	e := newEnv(t)
	e.createProduct("ns", "NS", nil)
	e.ok("POST", "/api/device/instance", map[string]any{"id": "ns-1", "name": "N", "productId": "ns"}, nil)
	api := testkit.API{Base: e.base, Token: e.token}
	for _, c := range []struct {
		method, path string
		body         any
		token        string
	}{
		{"POST", "/api/authorize/login", map[string]string{"username": "admin", "password": "admin123"}, ""},
		{"POST", "/api/user/key", map[string]any{"name": "k", "permissions": []string{"device:read"}}, e.token},
		{"POST", "/api/device/instance", map[string]any{"id": "ns-2", "name": "N", "productId": "ns"}, e.token},
		{"POST", "/api/device/instance/ns-1/secret", nil, e.token},
		{"POST", "/api/device/instance/batch/_create", []map[string]any{{"id": "ns-3", "name": "N", "productId": "ns"}}, e.token},
		{"POST", "/api/device/instance/ns/import", []map[string]any{{"id": "ns-4", "name": "N"}}, e.token},
		// Refusals and other answers too: one rule for every API answer.
		{"POST", "/api/authorize/login", map[string]string{"username": "admin", "password": "wrong-password"}, ""},
		{"GET", "/api/device/instance/ns-1", nil, e.token},
	} {
		r := api.WithToken(c.token).Send(t, c.method, c.path, c.body)
		if r.HTTPStatus >= 500 {
			t.Errorf("%s %s: %d %s", c.method, c.path, r.HTTPStatus, r.Raw)
		}
		if cc := r.Header.Get("Cache-Control"); cc != "no-store" {
			t.Errorf("%s %s (%d): Cache-Control %q, want no-store", c.method, c.path, r.HTTPStatus, cc)
		}
	}
}

// TestHardeningKeyProducts: a key may name only products on which its
// user holds each of the key's permissions: a product the user does not
// hold is refused at creation (400 naming it), not kept to widen the key
// silently once the user is given it.
func TestHardeningKeyProducts(t *testing.T) {
	e := newEnv(t)
	e.createProduct("ka", "A", nil)
	e.createProduct("kb", "B", nil)
	e.ok("POST", "/api/role", map[string]any{"id": "read-a", "name": "Read A", "permissions": []string{"device:read"}, "products": []string{"ka"}}, nil)
	e.ok("POST", "/api/role", map[string]any{"id": "write-a", "name": "Write A", "permissions": []string{"device:read", "device:write"}, "products": []string{"ka"}}, nil)
	_, tok := e.addUser("scoped", "read-a")
	r := e.do("POST", "/api/user/key", map[string]any{"name": "wide", "permissions": []string{"device:read"}, "products": []string{"ka", "kb"}}, tok)
	if r.HTTPStatus != 400 || r.Code != "illegal_argument" || !strings.Contains(r.Message, "products[1]") || !strings.Contains(r.Message, `"kb"`) {
		t.Fatalf("a key naming a product its user does not hold: %d %s, want 400 naming products[1] kb", r.HTTPStatus, r.raw)
	}
	// Products the user holds every permission of the key on (here
	// through the viewer role, on every product).
	_, tok2 := e.addUser("mixed", "read-a", meta.RoleViewer)
	r = e.do("POST", "/api/user/key", map[string]any{"name": "mixed", "permissions": []string{"device:read", "product:read"}, "products": []string{"ka", "kb"}}, tok2)
	if r.HTTPStatus != 200 {
		t.Fatalf("a key on products its user holds everything on: %d %s", r.HTTPStatus, r.raw)
	}
	_, tok3 := e.addUser("writer", "write-a", meta.RoleViewer)
	// A product the user holds one of the key's permissions on only.
	r = e.do("POST", "/api/user/key", map[string]any{"name": "w", "permissions": []string{"device:read", "device:write"}, "products": []string{"ka", "kb"}}, tok3)
	if r.HTTPStatus != 400 || !strings.Contains(r.Message, "device:write") || !strings.Contains(r.Message, `"kb"`) {
		t.Fatalf("a key naming a product its user holds one permission on: %d %s", r.HTTPStatus, r.raw)
	}
	if n := e.countRows("api_keys"); n != 1 {
		t.Fatalf("%d keys stored, want the one allowed", n)
	}
	// The user's own product is fine.
	e.createKey(tok, map[string]any{"name": "narrow", "permissions": []string{"device:read"}, "products": []string{"ka"}})
}
