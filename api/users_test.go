package api_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"devicehub/api"
	"devicehub/bench/testkit"
	"devicehub/meta"
)

// User administration (users.go), from the attacker's side too.

type userJSON struct {
	ID       string    `json:"id"`
	Username string    `json:"username"`
	Name     string    `json:"name"`
	State    meta.Enum `json:"state"`
	Roles    []string  `json:"roles"`
}

func TestUserAdministration(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	// Creation: checked input; the password never comes back.
	e.fails("POST", "/api/user", map[string]any{"username": "ann", "password": "short", "roles": []string{"viewer"}}, 400, "illegal_argument")
	e.fails("POST", "/api/user", map[string]any{"username": "ann", "password": "long-enough"}, 400, "illegal_argument")
	e.fails("POST", "/api/user", map[string]any{"username": "ann", "password": "long-enough", "roles": []string{"root"}}, 400, "illegal_argument")
	e.fails("POST", "/api/user", map[string]any{"username": "admin", "password": "long-enough", "roles": []string{}}, 400, "duplicate_key")
	r := e.call("POST", "/api/user", map[string]any{"username": "ann", "name": "Ann", "password": "ann-password", "roles": []string{"viewer"}})
	var ann userJSON
	if r.HTTPStatus != 200 || json.Unmarshal(r.Result, &ann) != nil || ann.Username != "ann" || ann.Name != "Ann" ||
		ann.State != "enabled" || len(ann.Roles) != 1 || ann.Roles[0] != "viewer" {
		t.Fatalf("create: %s", r.raw)
	}
	if strings.Contains(strings.ToLower(string(r.raw)), "password") || strings.Contains(string(r.raw), "$2a$") {
		t.Fatalf("create answers with a password: %s", r.raw)
	}
	if n := e.countRows("users"); n != 2 {
		t.Fatalf("%d users, want 2 (refused creations make none)", n)
	}

	// The list: terms on username and state; no password.
	var page struct {
		Total int        `json:"total"`
		Data  []userJSON `json:"data"`
	}
	e.ok("POST", "/api/user/_query", `{"terms":[{"column":"username","value":"%an%","termType":"like"},{"column":"state","value":"enabled"}]}`, &page)
	if page.Total != 1 || page.Data[0].ID != ann.ID {
		t.Fatalf("query: %+v", page)
	}
	r = e.call("POST", "/api/user/_query", `{"sorts":[{"name":"createTime","order":"asc"}]}`)
	if strings.Contains(strings.ToLower(string(r.raw)), "password") || strings.Contains(string(r.raw), "$2a$") {
		t.Fatalf("the list shows a password: %s", r.raw)
	}
	e.fails("POST", "/api/user/_query", `{"terms":[{"column":"password_hash","value":"x"}]}`, 400, "illegal_argument")

	// Ann logs in and changes her own password: wrong old one refused;
	// her other tokens end, this one stays.
	annTok := e.login("ann", "ann-password")
	other := e.login("ann", "ann-password")
	if r := e.do("PUT", "/api/user/passwd", map[string]any{"oldPassword": "wrong-password", "newPassword": "ann-password-2"}, annTok); r.HTTPStatus != 400 {
		t.Fatalf("passwd with a wrong old password: %s", r.raw)
	}
	if r := e.do("PUT", "/api/user/passwd", map[string]any{"oldPassword": "ann-password", "newPassword": "short"}, annTok); r.HTTPStatus != 400 {
		t.Fatalf("passwd with a short new password: %s", r.raw)
	}
	if r := e.do("PUT", "/api/user/passwd", map[string]any{"oldPassword": "ann-password", "newPassword": "ann-password-2"}, annTok); r.HTTPStatus != 200 {
		t.Fatalf("passwd: %s", r.raw)
	}
	if r := e.do("GET", "/api/authorize/me", nil, annTok); r.HTTPStatus != 200 {
		t.Fatalf("the token that changed the password: %s", r.raw)
	}
	if !testkit.Within(time.Second, func() bool { return e.do("GET", "/api/authorize/me", nil, other).HTTPStatus == 401 }) {
		t.Fatal("ann's other token still works 1 s after her password changed")
	}
	annTok = e.login("ann", "ann-password-2")

	// Update: name, roles, state.
	var got userJSON
	e.ok("PUT", "/api/user/"+ann.ID, map[string]any{"name": "Ann B", "roles": []string{"operator", "viewer"}}, &got)
	if got.Name != "Ann B" || len(got.Roles) != 2 {
		t.Fatalf("update: %+v", got)
	}
	e.fails("PUT", "/api/user/"+ann.ID, map[string]any{"state": "frozen"}, 400, "illegal_argument")
	e.fails("PUT", "/api/user/nobody", map[string]any{"name": "x"}, 404, "not_found")

	// Reset by the administrator: every token of ann ends.
	e.fails("PUT", "/api/user/"+ann.ID+"/password", map[string]any{"password": "short"}, 400, "illegal_argument")
	e.ok("PUT", "/api/user/"+ann.ID+"/password", map[string]any{"password": "reset-by-admin"}, nil)
	if !testkit.Within(time.Second, func() bool { return e.do("GET", "/api/authorize/me", nil, annTok).HTTPStatus == 401 }) {
		t.Fatal("ann's token still works 1 s after an administrator reset her password")
	}
	annTok = e.login("ann", "reset-by-admin")

	// Delete.
	e.ok("DELETE", "/api/user/"+ann.ID, nil, nil)
	e.fails("DELETE", "/api/user/"+ann.ID, nil, 404, "not_found")
	if !testkit.Within(time.Second, func() bool { return e.do("GET", "/api/authorize/me", nil, annTok).HTTPStatus == 401 }) {
		t.Fatal("a deleted user's token still works after 1 s")
	}
}

// TestOperatorCannotManageUsers: no user:admin, no user endpoint but
// one's own password; and no way to raise one's own roles.
func TestOperatorCannotManageUsers(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	opID, opTok := e.addUser("op", meta.RoleOperator)
	for _, c := range []struct {
		method, path string
		body         any
	}{
		{"POST", "/api/user/_query", `{}`},
		{"POST", "/api/user", map[string]any{"username": "mole", "password": "mole-password", "roles": []string{"admin"}}},
		{"PUT", "/api/user/" + opID, map[string]any{"roles": []string{"admin"}}},
		{"PUT", "/api/user/admin", map[string]any{"state": "disabled"}},
		{"DELETE", "/api/user/admin", nil},
		{"PUT", "/api/user/admin/password", map[string]any{"password": "taken-over"}},
		{"POST", "/api/role/_query/", `{}`},
	} {
		if r := e.do(c.method, c.path, c.body, opTok); r.HTTPStatus != 403 || r.Code != "access_denied" {
			t.Errorf("operator %s %s: %d %s, want 403 access_denied", c.method, c.path, r.HTTPStatus, r.raw)
		}
	}
	var roles []string
	if err := e.store.DB().Select(&roles, `SELECT role_id FROM user_roles WHERE user_id = $1`, opID); err != nil || len(roles) != 1 || roles[0] != "operator" {
		t.Fatalf("operator's roles after the refused requests: %v %v", roles, err)
	}
	if n := e.countRows("users"); n != 2 {
		t.Fatalf("%d users, want 2", n)
	}
	e.login("admin", "admin123") // the admin's password is unchanged
	// Its own password it may change.
	if r := e.do("PUT", "/api/user/passwd", map[string]any{"oldPassword": "password-op", "newPassword": "password-op-2"}, opTok); r.HTTPStatus != 200 {
		t.Fatalf("operator's own password: %s", r.raw)
	}
}

// TestRoleChangeWithinOneSecond: a user's roles changed (through the API
// of one instance, or in psql) change what its token may do on every
// instance within 1 s, though the token cache keeps checks 5 s: the
// change is announced like an ended token (migration 00011), and the
// permissions are read again.
func TestRoleChangeWithinOneSecond(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	opts := api.DefaultOptions()
	if opts.TokenCacheTTL < 5*time.Second {
		t.Fatalf("token cache TTL %s: the test needs one longer than 1 s", opts.TokenCacheTTL)
	}
	storeB := otherStore(t, e.store)
	b := &env{t: t, base: serveStore(t, opts, storeB, nil), store: storeB}

	id, tok := e.addUser("op", meta.RoleOperator)
	list := func(x *env) int {
		return x.do("POST", "/api/device-instance/_query", `{}`, tok).HTTPStatus
	}
	write := func(x *env) int {
		return x.do("POST", "/api/device/instance", map[string]any{"id": "d1", "name": "D", "productId": "none"}, tok).HTTPStatus
	}
	// Both instances have checked, and cached, the token.
	for _, x := range []*env{e, b} {
		if s := list(x); s != 200 {
			t.Fatalf("operator's list: %d", s)
		}
	}
	// Through the API of instance A: operator becomes viewer.
	start := time.Now()
	e.ok("PUT", "/api/user/"+id, map[string]any{"roles": []string{"viewer"}}, nil)
	for i, x := range []*env{e, b} {
		if !testkit.Within(time.Until(start.Add(time.Second)), func() bool { return write(x) == 403 }) {
			t.Fatalf("instance %c: the former operator still writes devices 1 s after its role changed", "AB"[i])
		}
		if s := list(x); s != 200 {
			t.Fatalf("instance %c: the viewer's list: %d", "AB"[i], s)
		}
	}
	// In psql: every role removed.
	start = time.Now()
	if _, err := e.store.DB().Exec(`DELETE FROM user_roles WHERE user_id = $1`, id); err != nil {
		t.Fatal(err)
	}
	for i, x := range []*env{e, b} {
		if !testkit.Within(time.Until(start.Add(time.Second)), func() bool { return list(x) == 403 }) {
			t.Fatalf("instance %c: a user without roles still lists devices 1 s after its roles were removed", "AB"[i])
		}
	}
	// A role's permissions changed in psql: its users' tokens follow.
	if _, err := e.store.DB().Exec(`INSERT INTO user_roles (user_id, role_id) VALUES ($1, 'viewer')`, id); err != nil {
		t.Fatal(err)
	}
	for _, x := range []*env{e, b} {
		if !testkit.Within(time.Second, func() bool { return list(x) == 200 }) {
			t.Fatal("the viewer role given back is not seen within 1 s")
		}
	}
	start = time.Now()
	if _, err := e.store.DB().Exec(`DELETE FROM role_permissions WHERE role_id = 'viewer' AND permission = 'device:read'`); err != nil {
		t.Fatal(err)
	}
	for i, x := range []*env{e, b} {
		if !testkit.Within(time.Until(start.Add(time.Second)), func() bool { return list(x) == 403 }) {
			t.Fatalf("instance %c: device:read taken from role viewer, its user still lists devices after 1 s", "AB"[i])
		}
	}
}

// TestLastAdministrator: no deletion, disabling or change of roles may
// leave no enabled user holding user:admin.
func TestLastAdministrator(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, c := range []struct {
		method, path string
		body         any
	}{
		{"DELETE", "/api/user/admin", nil},
		{"PUT", "/api/user/admin", map[string]any{"state": "disabled"}},
		{"PUT", "/api/user/admin", map[string]any{"roles": []string{"operator"}}},
		{"PUT", "/api/user/admin", map[string]any{"roles": []string{}}},
	} {
		r := e.fails(c.method, c.path, c.body, 400, "illegal_argument")
		if !strings.Contains(r.Message, "last administrator") {
			t.Fatalf("%s %s: message %q does not say why", c.method, c.path, r.Message)
		}
	}
	e.ok("GET", "/api/authorize/me", nil, nil) // the admin is untouched
	// With a second administrator, the first may go; then the second is the last.
	var second userJSON
	e.ok("POST", "/api/user", map[string]any{"username": "admin2", "password": "admin2-password", "roles": []string{"admin"}}, &second)
	e.ok("PUT", "/api/user/admin", map[string]any{"state": "disabled"}, nil)
	if !testkit.Within(time.Second, func() bool { return e.call("GET", "/api/authorize/me", nil).HTTPStatus == 401 }) {
		t.Fatal("the disabled admin's token still works after 1 s")
	}
	e.token = e.login("admin2", "admin2-password")
	e.fails("DELETE", "/api/user/"+second.ID, nil, 400, "illegal_argument")
	e.fails("PUT", "/api/user/"+second.ID, map[string]any{"roles": []string{"viewer"}}, 400, "illegal_argument")
	// A disabled administrator does not count: enabling admin again lets admin2 go.
	e.ok("PUT", "/api/user/admin", map[string]any{"state": "enabled"}, nil)
	e.ok("DELETE", "/api/user/"+second.ID, nil, nil)
}

// TestDisabledUserEndsEverywhere: a user disabled or deleted through the
// API of one instance loses its tokens and live streams on both within
// 1 s; a role change that takes device:read ends its streams too.
func TestDisabledUserEndsEverywhere(t *testing.T) {
	t.Parallel()
	const product, dev = "uend", "uend-1"
	var hubA = newLiveHub(t)
	e := newEnvWith(t, func(store *meta.Store, deps *api.Deps) {
		addLiveDevices(t, store, product, dev)
		deps.Live, deps.LiveDevices = hubA, store
	})
	storeB := otherStore(t, e.store)
	hubB := newLiveHub(t)
	b := &env{t: t, base: serveStore(t, api.DefaultOptions(), storeB, func(deps *api.Deps) { deps.Live, deps.LiveDevices = hubB, storeB }), store: storeB}

	for _, c := range []struct {
		name string
		end  func(id string)
	}{
		{"disabled", func(id string) { e.ok("PUT", "/api/user/"+id, map[string]any{"state": "disabled"}, nil) }},
		{"deleted", func(id string) { e.ok("DELETE", "/api/user/"+id, nil, nil) }},
		{"role without device:read", func(id string) { e.ok("PUT", "/api/user/"+id, map[string]any{"roles": []string{}}, nil) }},
	} {
		id, tok := e.addUser("u-"+strings.ReplaceAll(c.name, " ", "-"), meta.RoleViewer)
		sa := openLiveWithin(t, e.base, liveQuery(tok, []string{dev}), "", 3*time.Second)
		sb := openLiveWithin(t, b.base, liveQuery("", []string{dev}), tok, 3*time.Second)
		if r := b.do("GET", "/api/authorize/me", nil, tok); r.HTTPStatus != 200 {
			t.Fatalf("%s: /me on B before: %s", c.name, r.raw)
		}
		start := time.Now()
		c.end(id)
		for i, s := range []*sseStream{sa, sb} {
			if _, ok := s.ended(time.Until(start.Add(time.Second))); !ok {
				t.Fatalf("%s: the stream on instance %c still runs 1 s after", c.name, "AB"[i])
			}
		}
		for i, x := range []*env{e, b} {
			if !testkit.Within(time.Until(start.Add(time.Second)), func() bool {
				s := x.do("POST", "/api/device-instance/_query", `{}`, tok).HTTPStatus
				return s == 401 || s == 403
			}) {
				t.Fatalf("%s: instance %c still takes the token 1 s after", c.name, "AB"[i])
			}
		}
	}
}
