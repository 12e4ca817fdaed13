package api_test

import (
	"context"
	"encoding/json"
	"regexp"
	"slices"
	"strings"
	"testing"

	"golang.org/x/crypto/bcrypt"

	"devicehub/api"
	"devicehub/bench/testkit"
	"devicehub/meta"
)

// Access control from the attacker's side: every route, each built-in
// role, a disabled user. Each test fails when the rule it checks is
// removed.

// rolePermissions are the built-in roles as the issue defines them,
// written out here rather than read from the code: the database's roles
// are checked against them (TestBuiltinRoles).
var rolePermissions = map[string][]meta.Permission{
	meta.RoleAdmin: meta.Permissions,
	meta.RoleOperator: {meta.PermProductRead, meta.PermDeviceRead, meta.PermDeviceWrite,
		meta.PermDeviceCommand, meta.PermDashboardRead, meta.PermAlarmRead, meta.PermAlarmWrite},
	meta.RoleViewer: {meta.PermProductRead, meta.PermDeviceRead, meta.PermDashboardRead, meta.PermAlarmRead},
}

// publicRoutes need no token: anything else must declare a permission
// or api.NeedSignedIn beside its route (routes.go).
var publicRoutes = []string{
	"GET /", "HEAD /",
	"GET /assets/:name", "HEAD /assets/:name",
	"GET /images/:name", "HEAD /images/:name",
	"GET /docs", "HEAD /docs",
	"GET /docs/:file", "HEAD /docs/:file",
	"GET /healthz", "HEAD /healthz",
	"GET /readyz", "HEAD /readyz",
	"GET /metrics", "HEAD /metrics",
	"GET /openapi.json", "HEAD /openapi.json",
	"POST /api/authorize/login",
	"GET /firmware/download/:token", "HEAD /firmware/download/:token", // the device's own credentials (firmware.go)
}

// signedInRoutes need a token and no permission.
var signedInRoutes = []string{
	"POST /api/authorize/logout",
	"GET /api/authorize/me", "HEAD /api/authorize/me",
	"GET /api/settings", "HEAD /api/settings",
	"PUT /api/user/passwd",
	"POST /api/user/key", "POST /api/user/key/_query", "DELETE /api/user/key/:id",
}

// keyRefusedRoutes need a login's token: a request with an API key is
// 403 (keys.go).
var keyRefusedRoutes = []string{"POST /api/authorize/logout", "PUT /api/user/passwd", "POST /api/user/key"}

// addUser creates a user holding roles, with a password hashed at
// bcrypt's lowest cost (logins under -race stay fast), and logs it in.
func (e *env) addUser(username string, roles ...string) (id, token string) {
	e.t.Helper()
	u, err := e.store.CreateUser(context.Background(), username, "password-"+username, roles...)
	if err != nil {
		e.t.Fatal(err)
	}
	hash, err := bcrypt.GenerateFromPassword([]byte("password-"+username), bcrypt.MinCost)
	if err != nil {
		e.t.Fatal(err)
	}
	if _, err := e.store.DB().Exec(`UPDATE users SET password_hash = $2 WHERE id = $1`, u.ID, string(hash)); err != nil {
		e.t.Fatal(err)
	}
	return u.ID, e.login(username, "password-"+username)
}

var routeParam = regexp.MustCompile(`:[A-Za-z0-9_]+\??|\*|\+`)

// rawCall sends method path with token and body {} (none for GET and
// HEAD), and returns the HTTP status and envelope code.
func rawCall(t *testing.T, base, method, path, token string) (int, string) {
	t.Helper()
	return rawCallBody(t, base, method, path, token, `{}`)
}

// rawCallBody is rawCall with body (ignored for GET and HEAD).
func rawCallBody(t *testing.T, base, method, path, token, body string) (int, string) {
	t.Helper()
	var send any
	if method != "GET" && method != "HEAD" {
		send = body
	}
	r := testkit.API{Base: base, Token: token}.Send(t, method, path, send)
	return r.HTTPStatus, r.Code
}

// accessCaller is one principal TestEveryRouteDeclaresAccess walks every
// route with.
type accessCaller struct {
	name, token string
	perms       []meta.Permission // what it holds
	// limited: it holds perms on product walkInside only; the walk names
	// walkOutside's objects in its paths and wants 404 not_found for them.
	limited  bool
	disabled bool // every answer 401
	key      bool // an API key: the routes of keyRefusedRoutes are 403
}

// The walk's products, each with one device (walkInside+"-d").
const (
	walkInside  = "walk-in"
	walkOutside = "walk-out"
)

// accessCallerHooks add principals to the walk from other files (API
// keys: a revoked key, a key with fewer permissions): each gets the
// walk's env (products walkInside and walkOutside exist, with their
// devices) and returns its callers.
var accessCallerHooks []func(e *env) []accessCaller

// walkPath gives a route's path with real objects for its parameters:
// for a limited caller, walkOutside's product and device (and a function
// and property the command routes accept); else "x", which names nothing.
func walkPath(route string, limited bool) string {
	if !limited {
		return routeParam.ReplaceAllString(route, "x")
	}
	return routeParam.ReplaceAllStringFunc(route, func(p string) string {
		switch {
		case p == ":productId", p == ":id" && strings.HasPrefix(route, "/api/device-product/"):
			return walkOutside
		case p == ":deviceId", p == ":id" && strings.HasPrefix(route, "/api/device/instance/"):
			return walkOutside + "-d"
		case p == ":functionId":
			return "DeviceCtrl"
		case p == ":property":
			return "temperature"
		}
		return "x"
	})
}

// namesObject reports whether a route's path names a product or device.
func namesObject(route string) bool {
	return strings.Contains(route, ":productId") || strings.Contains(route, ":deviceId") ||
		strings.Contains(route, ":id") && (strings.HasPrefix(route, "/api/device-product/") || strings.HasPrefix(route, "/api/device/instance/"))
}

// walkBodies are the bodies the walk sends where {} would be refused
// before the object is looked up.
var walkBodies = map[string]string{
	"POST /api/device/invoked/:deviceId/function/:functionId": `{"Location":"l","ProductID":"p","OperCode":{"Switch":"1","Temperature":20}}`,
	"POST /api/device/instance/:deviceId/properties/_read":    `["temperature"]`,
	"PUT /api/device/instance/:id/metadata":                   `{"properties":[],"events":[],"functions":[],"tags":[]}`,
	"POST /api/device/instance/:productId/import":             `[{"id":"walk-new","name":"New"}]`,
}

// TestEveryRouteDeclaresAccess walks every route the server registers
// with an administrator, an operator, a viewer, a user limited to one
// product, a user with no role and a disabled user (an administrator
// before), and those of accessCallerHooks: each route declares what it
// needs, and each caller gets 403 access_denied exactly where it lacks
// that permission, 401 when disabled, and 404 not_found for the objects
// of a product outside its own.
func TestEveryRouteDeclaresAccess(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, func(store *meta.Store, deps *api.Deps) { deps.Models, deps.LiveDevices = store, store })
	for _, p := range []string{walkInside, walkOutside} {
		e.createProduct(p, p, nil)
		e.ok("POST", "/api/device-product/"+p+"/deploy", nil, nil)
		e.ok("POST", "/api/device/instance", map[string]any{"id": p + "-d", "name": "D", "productId": p}, nil)
		e.ok("POST", "/api/device/instance/"+p+"-d/deploy", nil, nil) // deployed: a delete is refused
	}
	limitedPerms := []meta.Permission{meta.PermProductRead, meta.PermProductWrite, meta.PermDeviceRead, meta.PermDeviceWrite,
		meta.PermDeviceCommand, meta.PermDeviceSecret, meta.PermDashboardRead}
	e.ok("POST", "/api/role", map[string]any{"id": "walk-limited", "name": "Limited", "permissions": limitedPerms, "products": []string{walkInside}}, nil)
	_, opTok := e.addUser("op", meta.RoleOperator)
	_, viewTok := e.addUser("view", meta.RoleViewer)
	_, limTok := e.addUser("lim", "walk-limited")
	_, noneTok := e.addUser("nobody")
	gone, goneTok := e.addUser("gone", meta.RoleAdmin)
	callers := []accessCaller{
		{name: "admin", token: e.token, perms: rolePermissions[meta.RoleAdmin]},
		{name: "operator", token: opTok, perms: rolePermissions[meta.RoleOperator]},
		{name: "viewer", token: viewTok, perms: rolePermissions[meta.RoleViewer]},
		{name: "limited", token: limTok, perms: limitedPerms, limited: true},
		{name: "no role", token: noneTok},
		{name: "disabled", token: goneTok, disabled: true},
	}
	for _, hook := range accessCallerHooks {
		callers = append(callers, hook(e)...)
	}
	e.ok("PUT", "/api/user/"+gone, map[string]any{"state": "disabled"}, nil)

	routes := e.server.RouteAccess()
	if len(routes) < 40 {
		t.Fatalf("only %d routes: %v", len(routes), routes)
	}
	walked := 0
	for _, r := range routes {
		key := r.Method + " " + r.Path
		path := walkPath(r.Path, false)
		switch {
		case r.Need == "":
			if !slices.Contains(publicRoutes, key) {
				t.Errorf("%s declares no access: add s.need(permission) or s.signedIn() beside it in api/routes.go (or list it as public here)", key)
				continue
			}
			if status, code := rawCall(t, e.base, r.Method, path, ""); status == 401 || status == 403 {
				t.Errorf("public %s without a token: %d %s", key, status, code)
			}
			walked++
			continue
		case slices.Contains(publicRoutes, key):
			t.Errorf("%s is listed as public but declares %q", key, r.Need)
		case r.Need == api.NeedSignedIn:
			if !slices.Contains(signedInRoutes, key) {
				t.Errorf("%s needs only a token: list it in signedInRoutes if it should", key)
			}
		case !slices.Contains(meta.Permissions, meta.Permission(r.Need)):
			t.Errorf("%s needs %q, not a permission", key, r.Need)
			continue
		}
		if status, code := rawCall(t, e.base, r.Method, path, ""); status != 401 {
			t.Errorf("%s without a token: %d %s, want 401", key, status, code)
		}
		body, ok := walkBodies[strings.Replace(key, "HEAD ", "GET ", 1)]
		if !ok {
			body = `{}`
		}
		for _, c := range callers {
			token := c.token
			if key == "POST /api/authorize/logout" && !c.disabled && !c.key {
				_, token = e.addUser("out-"+strings.ReplaceAll(c.name, " ", "-"), meta.RoleViewer) // a token of its own to end
			}
			status, code := rawCallBody(t, e.base, r.Method, walkPath(r.Path, c.limited), token, body)
			allowed := r.Need == api.NeedSignedIn || slices.Contains(c.perms, meta.Permission(r.Need))
			if c.limited && key == "POST /api/device/product" {
				allowed = false // a new product needs product:write on every product
			}
			if c.key && slices.Contains(keyRefusedRoutes, key) {
				allowed = false
			}
			// A HEAD answer has no body, hence no code.
			wantCode := func(want string) bool { return code == want || r.Method == "HEAD" && code == "" }
			switch {
			case c.disabled:
				if status != 401 {
					t.Errorf("%s by a disabled user: %d %s, want 401", key, status, code)
				}
			case !allowed:
				if status != 403 || !wantCode("access_denied") {
					t.Errorf("%s by %s (lacks %s): %d %s, want 403 access_denied", key, c.name, r.Need, status, code)
				}
			case c.limited && namesObject(r.Path):
				if status != 404 || !wantCode("not_found") {
					t.Errorf("%s by %s, on %s's objects: %d %s, want 404 not_found", key, c.name, walkOutside, status, code)
				}
			case status == 401 || status == 403:
				t.Errorf("%s by %s (holds %s): %d %s", key, c.name, r.Need, status, code)
			}
		}
		walked++
	}
	t.Logf("%d routes walked", walked)
	// Every listed route exists (a stale list hides nothing).
	registered := map[string]bool{}
	for _, r := range routes {
		registered[r.Method+" "+r.Path] = true
	}
	for _, k := range append(slices.Clone(publicRoutes), signedInRoutes...) {
		if !registered[k] {
			t.Errorf("%s is listed here but not registered", k)
		}
	}
	for k := range walkBodies {
		if !registered[k] {
			t.Errorf("walkBodies names %s, not registered", k)
		}
	}
	// Nothing of the outside product changed.
	var state string
	if err := e.store.DB().Get(&state, `SELECT state FROM devices WHERE id = $1`, walkOutside+"-d"); err != nil || state != meta.StateOffline {
		t.Errorf("%s-d after the walk: state %q %v, want it deployed still", walkOutside, state, err)
	}
	if n := e.countRows("devices WHERE id = 'walk-new'"); n != 0 {
		t.Errorf("the limited import into %s made a device", walkOutside)
	}
}

// TestBuiltinRoles: endpoint 13 lists the built-in roles with the
// permissions each grants, as {text, value}; the administrator holds
// every permission, and /api/authorize/me says what the caller holds.
func TestBuiltinRoles(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var page struct {
		Data []struct {
			ID          string `json:"id"`
			Permissions []struct {
				Text  string `json:"text"`
				Value string `json:"value"`
			} `json:"permissions"`
		} `json:"data"`
	}
	e.ok("POST", "/api/role/_query/", `{"sorts":[{"name":"id"}]}`, &page)
	got := map[string][]meta.Permission{}
	for _, r := range page.Data {
		got[r.ID] = []meta.Permission{}
		for _, p := range r.Permissions {
			if p.Text == "" || p.Text == p.Value {
				t.Errorf("role %s: permission %+v without a label", r.ID, p)
			}
			got[r.ID] = append(got[r.ID], meta.Permission(p.Value))
		}
	}
	for role, want := range rolePermissions {
		want = slices.Clone(want)
		slices.Sort(want)
		if !slices.Equal(got[role], want) {
			t.Errorf("role %s grants %v, want %v", role, got[role], want)
		}
	}
	_, tok := e.addUser("v", meta.RoleViewer, meta.RoleOperator)
	var me meta.User
	if r := e.do("GET", "/api/authorize/me", nil, tok); r.HTTPStatus != 200 || json.Unmarshal(r.Result, &me) != nil {
		t.Fatalf("me: %s", r.raw)
	}
	want := []string{"alarm:read", "alarm:write", "dashboard:read", "device:command", "device:read", "device:write", "product:read"}
	if !slices.Equal(me.Permissions, want) || !slices.Equal(me.Roles, []string{"operator", "viewer"}) {
		t.Fatalf("me %+v: want roles operator, viewer and the union of their permissions %v", me, want)
	}
}

// TestViewerAndOperatorLimits: a viewer cannot write, command or read
// secrets; an operator writes devices but sees no secret, neither the
// generated one at creation nor one it would choose.
func TestViewerAndOperatorLimits(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.createProduct("lim", "Limits", nil)
	e.ok("POST", "/api/device-product/lim/deploy", nil, nil)
	_, viewTok := e.addUser("view", meta.RoleViewer)
	_, opTok := e.addUser("op", meta.RoleOperator)
	denied := func(token, method, path string, body any) {
		t.Helper()
		r := e.do(method, path, body, token)
		if r.HTTPStatus != 403 || r.Code != "access_denied" || !strings.Contains(r.Message, "device:") && !strings.Contains(r.Message, "product:") && !strings.Contains(r.Message, "user:") {
			t.Fatalf("%s %s: want 403 access_denied naming the permission, got %d: %s", method, path, r.HTTPStatus, r.raw)
		}
	}
	ok := func(token, method, path string, body, out any) {
		t.Helper()
		r := e.do(method, path, body, token)
		if r.HTTPStatus != 200 {
			t.Fatalf("%s %s: want 200, got %d: %s", method, path, r.HTTPStatus, r.raw)
		}
		if out != nil {
			if err := json.Unmarshal(r.Result, out); err != nil {
				t.Fatal(err)
			}
		}
	}
	var dev struct {
		Configuration struct {
			SecureKey string `json:"secureKey"`
		} `json:"configuration"`
	}
	// The administrator sees the generated key once.
	ok(e.token, "POST", "/api/device/instance", map[string]any{"id": "d-admin", "name": "A", "productId": "lim"}, &dev)
	if len(dev.Configuration.SecureKey) < 16 || dev.Configuration.SecureKey == "******" {
		t.Fatalf("administrator's new device key %q: want the generated key", dev.Configuration.SecureKey)
	}

	// Viewer: reads, nothing else.
	ok(viewTok, "POST", "/api/device-instance/_query", `{}`, nil)
	ok(viewTok, "GET", "/api/device/instance/d-admin/detail", nil, nil)
	denied(viewTok, "POST", "/api/device/product", map[string]any{"id": "p2", "name": "P2"})
	denied(viewTok, "POST", "/api/device/instance", map[string]any{"id": "d-view", "name": "V", "productId": "lim"})
	denied(viewTok, "PUT", "/api/device/instance/d-admin", map[string]any{"name": "renamed"})
	denied(viewTok, "DELETE", "/api/device/instance/d-admin", nil)
	denied(viewTok, "POST", "/api/device/instance/d-admin/secret", nil)
	denied(viewTok, "POST", "/api/device/invoked/d-admin/function/reboot", `{}`)
	denied(viewTok, "GET", "/api/device/standard/d-admin/property/temperature", nil)
	denied(viewTok, "POST", "/api/device/instance/d-admin/properties/_read", `["temperature"]`)
	denied(viewTok, "POST", "/api/user/_query", `{}`)

	// Operator: writes devices, but no secret.
	ok(opTok, "POST", "/api/device/instance", map[string]any{"id": "d-op", "name": "O", "productId": "lim"}, &dev)
	if dev.Configuration.SecureKey != "******" {
		t.Fatalf("operator's new device key %q: want it masked", dev.Configuration.SecureKey)
	}
	var bulk meta.BulkCreated
	ok(opTok, "POST", "/api/device/instance/batch/_create", []map[string]any{{"id": "d-op2", "name": "O2", "productId": "lim"}}, &bulk)
	if len(bulk.Devices) != 1 || bulk.Devices[0].SecureKey != "******" {
		t.Fatalf("operator's bulk-created keys %+v: want them masked", bulk.Devices)
	}
	denied(opTok, "POST", "/api/device/instance/d-op/secret", nil)
	denied(opTok, "POST", "/api/device/instance", map[string]any{"id": "d-op3", "name": "O3", "productId": "lim",
		"configuration": map[string]any{"secureKey": "chosen-by-the-operator"}})
	denied(opTok, "PUT", "/api/device/instance/d-op", map[string]any{"configuration": map[string]any{"secureKey": "chosen-by-the-operator"}})
	denied(opTok, "POST", "/api/device/instance/batch/_create", []map[string]any{{"id": "d-op4", "name": "O4", "productId": "lim",
		"configuration": map[string]any{"secureKey": "chosen-by-the-operator"}}})
	denied(opTok, "POST", "/api/device/product", map[string]any{"id": "p3", "name": "P3"})
	var key string
	if err := e.store.DB().Get(&key, `SELECT secure_key FROM devices WHERE id = 'd-op'`); err != nil || key == "chosen-by-the-operator" {
		t.Fatalf("d-op's key after the refused change: %q %v", key, err)
	}
	if n := e.countRows("devices"); n != 3 {
		t.Fatalf("%d devices, want 3 (refused creations make none)", n)
	}
	ok(opTok, "PUT", "/api/device/instance/d-op", map[string]any{"name": "renamed"}, nil)
}
