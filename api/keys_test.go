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

// API keys (keys.go, meta/keys.go), from the attacker's side. Each test
// fails when the rule it checks is removed.

type keyJSON struct {
	ID          string      `json:"id"`
	Name        string      `json:"name"`
	UserID      string      `json:"userId"`
	Username    string      `json:"username"`
	Permissions []meta.Enum `json:"permissions"`
	Products    []string    `json:"products"`
	CreateTime  int64       `json:"createTime"`
	ExpiresAt   int64       `json:"expiresAt"`
	LastUsed    int64       `json:"lastUsed"`
	Key         string      `json:"key"`
}

// createKey makes a key with token's user and returns it, with its secret.
func (e *env) createKey(token string, body map[string]any) keyJSON {
	e.t.Helper()
	r := e.do("POST", "/api/user/key", body, token)
	var k keyJSON
	if r.HTTPStatus != 200 || json.Unmarshal(r.Result, &k) != nil || !strings.HasPrefix(k.Key, meta.KeyPrefix) || k.ID == "" {
		e.t.Fatalf("create key %v: %d %s", body, r.HTTPStatus, r.raw)
	}
	return k
}

// status is the HTTP status of method path with token.
func (e *env) status(method, path string, body any, token string) int {
	e.t.Helper()
	return e.do(method, path, body, token).HTTPStatus
}

// The route walk (permissions_test.go) adds an administrator's key
// holding less than the administrator, and a revoked key.
func init() {
	accessCallerHooks = append(accessCallerHooks, func(e *env) []accessCaller {
		fewer := []meta.Permission{meta.PermProductRead, meta.PermDeviceRead}
		k := e.createKey(e.token, map[string]any{"name": "fewer", "permissions": fewer})
		revoked := e.createKey(e.token, map[string]any{"name": "revoked", "permissions": meta.Permissions})
		e.ok("DELETE", "/api/user/key/"+revoked.ID, nil, nil)
		return []accessCaller{
			{name: "key with fewer permissions", token: k.Key, perms: fewer, key: true},
			{name: "revoked key", token: revoked.Key, disabled: true, key: true},
		}
	})
}

// TestKeyNeverExceedsItsCreator: a key is made with at most what its
// user holds, and does at most what its user holds now: when the user
// loses a role, the key loses it at once; when the user is disabled, the
// key is refused.
func TestKeyNeverExceedsItsCreator(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.createProduct("kp", "Key product", nil)
	opID, opTok := e.addUser("op", meta.RoleOperator, meta.RoleViewer)
	// Asking for more than the user holds is refused, naming it.
	r := e.do("POST", "/api/user/key", map[string]any{"name": "greedy", "permissions": []string{"device:read", "product:write"}}, opTok)
	if r.HTTPStatus != 400 || r.Code != "illegal_argument" || !strings.Contains(r.Message, "permissions[1]") {
		t.Fatalf("a key with a permission its user lacks: %d %s", r.HTTPStatus, r.raw)
	}
	r = e.do("POST", "/api/user/key", map[string]any{"name": "admin", "permissions": []string{"user:admin"}}, opTok)
	if r.HTTPStatus != 400 {
		t.Fatalf("a key with user:admin by an operator: %d %s", r.HTTPStatus, r.raw)
	}
	if n := e.countRows("api_keys"); n != 0 {
		t.Fatalf("%d keys after refused creations", n)
	}
	k := e.createKey(opTok, map[string]any{"name": "script", "permissions": []string{"device:read", "device:write", "product:read"}})
	device := map[string]any{"id": "kd1", "name": "Key device", "productId": "kp"}
	if s := e.status("POST", "/api/device/instance", device, k.Key); s != 200 {
		t.Fatalf("the key writes a device: %d", s)
	}
	// The audit trail names the user and the key.
	if got := e.waitAudit(`[{"column":"keyId","value":"`+k.ID+`"}]`, 1); got[0].UserID != opID || got[0].Route != "/api/device/instance" {
		t.Fatalf("the key's write audited as %+v", got[0])
	}
	// The key cannot do what it was not given, though its user may.
	if s := e.status("POST", "/api/device/instance/kd1/properties/_read", []string{"x"}, k.Key); s != 403 {
		t.Fatalf("the key commands a device (not its permission): %d", s)
	}
	// The user loses device:write (operator): the key too, within 1 s.
	e.ok("PUT", "/api/user/"+opID, map[string]any{"roles": []string{meta.RoleViewer}}, nil)
	if !testkit.Within(time.Second, func() bool {
		return e.status("DELETE", "/api/device/instance/kd1", nil, k.Key) == 403
	}) {
		t.Fatal("the key still writes devices 1 s after its user lost the role granting it")
	}
	if s := e.status("POST", "/api/device-instance/_query", `{}`, k.Key); s != 200 {
		t.Fatalf("the key reads devices (its user still may): %d", s)
	}
	// Given back, the key's rights come back: they are the user's, now.
	e.ok("PUT", "/api/user/"+opID, map[string]any{"roles": []string{meta.RoleOperator}}, nil)
	device["id"] = "kd2"
	if !testkit.Within(time.Second, func() bool { return e.status("POST", "/api/device/instance", device, k.Key) == 200 }) {
		t.Fatal("the key does not write devices again 1 s after its user got the role back")
	}
	// A disabled user's keys are refused; a deleted user's are gone.
	e.ok("PUT", "/api/user/"+opID, map[string]any{"state": "disabled"}, nil)
	if !testkit.Within(time.Second, func() bool { return e.status("POST", "/api/device-instance/_query", `{}`, k.Key) == 401 }) {
		t.Fatal("a disabled user's key still works after 1 s")
	}
	e.ok("DELETE", "/api/user/"+opID, nil, nil)
	if n := e.countRows("api_keys"); n != 0 {
		t.Fatalf("%d keys left after their user's deletion", n)
	}
}

// TestKeyRevokedOnEveryInstance: a key revoked through one instance is
// refused by another on the same database within 1 s, though that one
// had it cached; so is its live stream ended.
func TestKeyRevokedOnEveryInstance(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	hub := newLiveHub(t)
	other := serveStore(t, api.DefaultOptions(), e.store, func(d *api.Deps) { d.Live, d.LiveDevices = hub, e.store })
	e.createProduct("rp", "Revoke product", nil)
	e.ok("POST", "/api/device/instance", map[string]any{"id": "rd1", "name": "Revoke device", "productId": "rp"}, nil)
	k := e.createKey(e.token, map[string]any{"name": "dash", "permissions": []string{"device:read", "product:read"}})
	b := &env{t: t, base: other, store: e.store}
	if s := b.status("POST", "/api/device-instance/_query", `{}`, k.Key); s != 200 {
		t.Fatalf("the key on the other instance: %d", s)
	}
	stream := openLiveWithin(t, other, "deviceId=rd1", k.Key, 5*time.Second)
	e.ok("DELETE", "/api/user/key/"+k.ID, nil, nil)
	start := time.Now()
	if !testkit.Within(time.Second, func() bool { return b.status("POST", "/api/device-instance/_query", `{}`, k.Key) == 401 }) {
		t.Fatal("a revoked key still works on another instance 1 s later")
	}
	if _, ended := stream.ended(time.Second - time.Since(start)); !ended {
		t.Fatal("the revoked key's live stream on another instance is still open 1 s later")
	}
	e.fails("DELETE", "/api/user/key/"+k.ID, nil, 404, "not_found")
}

// TestKeyWithFewerPermissions: a key holding less than its user is
// refused (403) wherever it lacks the permission, and limited to its
// products when it names some.
func TestKeyWithFewerPermissions(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.createProduct("fa", "Product A", nil)
	e.createProduct("fb", "Product B", nil)
	for _, d := range [][2]string{{"fa1", "fa"}, {"fb1", "fb"}} {
		e.ok("POST", "/api/device/instance", map[string]any{"id": d[0], "name": d[0], "productId": d[1]}, nil)
	}
	k := e.createKey(e.token, map[string]any{"name": "reader", "permissions": []string{"device:read"}})
	f := func(method, path string, body any, want int) {
		t.Helper()
		if r := e.do(method, path, body, k.Key); r.HTTPStatus != want || (want == 403 && r.Code != "access_denied") {
			t.Errorf("%s %s with a device:read key: %d %s, want %d", method, path, r.HTTPStatus, r.raw, want)
		}
	}
	f("POST", "/api/device-instance/_query", `{}`, 200)
	f("GET", "/api/device/instance/fa1/detail", nil, 200)
	f("POST", "/api/device-product/_query", `{}`, 403)
	f("DELETE", "/api/device/instance/fa1", nil, 403)
	f("POST", "/api/device/product", map[string]any{"id": "x"}, 403)
	f("POST", "/api/user/_query", `{}`, 403)
	f("POST", "/api/audit/_query", `{}`, 403)
	f("POST", "/api/dashboard/_multi", `[]`, 403)
	// A key cannot make keys, change a password, or log out.
	f("POST", "/api/user/key", map[string]any{"name": "child", "permissions": []string{"device:read"}}, 403)
	f("PUT", "/api/user/passwd", map[string]any{"oldPassword": "admin123", "newPassword": "taken-over"}, 403)
	f("POST", "/api/authorize/logout", nil, 403)
	if n := e.countRows("api_keys"); n != 1 {
		t.Fatalf("%d keys, want 1", n)
	}
	if e.status("GET", "/api/authorize/me", nil, e.token) != 200 {
		t.Fatal("the admin's password changed or token ended through a key")
	}

	// Limited to product A: B's devices do not exist for it.
	ka := e.createKey(e.token, map[string]any{"name": "line A", "permissions": []string{"device:read"}, "products": []string{"fa"}})
	if s := e.status("GET", "/api/device/instance/fb1/detail", nil, ka.Key); s != 404 {
		t.Errorf("a key of product A reads B's device: %d", s)
	}
	if s := e.status("GET", "/api/device/instance/fa1/detail", nil, ka.Key); s != 200 {
		t.Errorf("a key of product A reads A's device: %d", s)
	}
	var page struct {
		Total int `json:"total"`
	}
	r := e.do("POST", "/api/device-instance/_query", `{}`, ka.Key)
	if json.Unmarshal(r.Result, &page) != nil || page.Total != 1 {
		t.Errorf("a key of product A lists %s", r.raw)
	}
	// The user's own answer through the key says what the key holds.
	var me struct {
		KeyID       string   `json:"keyId"`
		Permissions []string `json:"permissions"`
	}
	r = e.do("GET", "/api/authorize/me", nil, ka.Key)
	if json.Unmarshal(r.Result, &me) != nil || me.KeyID != ka.ID || strings.Join(me.Permissions, ",") != "device:read" {
		t.Errorf("me with the key: %s", r.raw)
	}
}

// TestKeyExpires: a key past its expiry is 401, though it was cached; a
// key cannot be made already expired.
func TestKeyExpires(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.fails("POST", "/api/user/key", map[string]any{"name": "old", "permissions": []string{"device:read"}, "expiresAt": time.Now().Add(-time.Minute).UnixMilli()}, 400, "illegal_argument")
	expires := time.Now().Add(3 * time.Second)
	k := e.createKey(e.token, map[string]any{"name": "short", "permissions": []string{"device:read"}, "expiresAt": expires.UnixMilli()})
	if k.ExpiresAt != expires.UnixMilli() {
		t.Fatalf("expiresAt %d, want %d", k.ExpiresAt, expires.UnixMilli())
	}
	if s := e.status("POST", "/api/device-instance/_query", `{}`, k.Key); s != 200 {
		t.Fatalf("before its expiry: %d", s)
	}
	time.Sleep(time.Until(expires)) // the server reads the wall clock: wait for the expiry instant itself, then assert the refusal
	if r := e.do("POST", "/api/device-instance/_query", `{}`, k.Key); r.HTTPStatus != 401 || r.Code != "unauthorized" {
		t.Fatalf("after its expiry: %d %s", r.HTTPStatus, r.raw)
	}
}

// TestKeyListings: a key's secret is shown once, at its creation, and in
// no listing; a user lists and revokes only its own keys, an
// administrator anyone's; the last use is shown.
func TestKeyListings(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	_, annTok := e.addUser("ann", meta.RoleViewer)
	_, bobTok := e.addUser("bob", meta.RoleViewer)
	ka := e.createKey(annTok, map[string]any{"name": "ann's", "permissions": []string{"device:read"}})
	kb := e.createKey(bobTok, map[string]any{"name": "bob's", "permissions": []string{"product:read"}})
	secretHex := strings.TrimPrefix(ka.Key, meta.KeyPrefix)
	if e.status("POST", "/api/device-instance/_query", `{}`, ka.Key) != 200 {
		t.Fatal("ann's key")
	}
	list := func(token, body string) []keyJSON {
		t.Helper()
		r := e.do("POST", "/api/user/key/_query", body, token)
		for _, secret := range []string{ka.Key, secretHex[:16], kb.Key, strings.TrimPrefix(kb.Key, meta.KeyPrefix)[:16], `"key"`, "hash"} {
			if strings.Contains(string(r.raw), secret) {
				t.Fatalf("a key listing shows %q: %s", secret, r.raw)
			}
		}
		var page struct {
			Data []keyJSON `json:"data"`
		}
		if r.HTTPStatus != 200 || json.Unmarshal(r.Result, &page) != nil {
			t.Fatalf("list keys: %d %s", r.HTTPStatus, r.raw)
		}
		return page.Data
	}
	// Ann sees hers, with its last use; no term widens it to Bob's.
	got := list(annTok, `{}`)
	if len(got) != 1 || got[0].ID != ka.ID || got[0].LastUsed == 0 || got[0].Username != "ann" {
		t.Fatalf("ann's keys: %+v", got)
	}
	if got := list(annTok, `{"terms":[{"column":"userId","value":"x","termType":"not"},{"column":"name","value":"bob's","type":"or"}]}`); len(got) != 1 || got[0].ID != ka.ID {
		t.Fatalf("ann's keys with an or-term: %+v", got)
	}
	// The administrator sees both.
	if got := list(e.token, `{"sorts":[{"name":"name","order":"asc"}]}`); len(got) != 2 || got[0].ID != ka.ID || got[1].ID != kb.ID {
		t.Fatalf("every key: %+v", got)
	}
	e.fails("POST", "/api/user/key/_query", `{"terms":[{"column":"hash","value":"x"}]}`, 400, "illegal_argument")
	// Ann cannot revoke Bob's key: 404, and it still works.
	if r := e.do("DELETE", "/api/user/key/"+kb.ID, nil, annTok); r.HTTPStatus != 404 {
		t.Fatalf("ann revokes bob's key: %d %s", r.HTTPStatus, r.raw)
	}
	if e.status("POST", "/api/device-product/_query", `{}`, kb.Key) != 200 {
		t.Fatal("bob's key was revoked by ann")
	}
	// The administrator can.
	e.ok("DELETE", "/api/user/key/"+kb.ID, nil, nil)
	if !testkit.Within(time.Second, func() bool { return e.status("POST", "/api/device-product/_query", `{}`, kb.Key) == 401 }) {
		t.Fatal("a key revoked by the administrator still works after 1 s")
	}
}
