package api_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"devicehub/api"
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
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
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

// rawExchange sends head (a request's line and header, without the blank
// line) on a new connection and reads the first answer, which must come
// within 10 s: a server that waits for a body declared but not sent
// fails the test. It returns the answer and the connection.
func rawExchange(t *testing.T, base, head string) (*http.Response, net.Conn, *bufio.Reader) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", strings.TrimPrefix(base, "http://"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(conn, strings.ReplaceAll(head, "\n", "\r\n")+"\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("%.60s: no answer: %v", head, err)
	}
	return res, conn, br
}

// TestHardeningBodyAfterAuth: a bulk route reads a body over the
// server's limit (up to 16 MiB) only from a caller whose token may write
// devices: without one, a declared 16 MiB is refused from the header at
// once, none of it read; Expect: 100-continue gets no 100 without a
// live token (417, the connection closed), and a signed-in caller's does.
func TestHardeningBodyAfterAuth(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.createProduct("meter", "Meter", nil)
	_, viewer := e.addUser("viewer1", meta.RoleViewer)
	for _, path := range []string{"/api/device/instance/batch/_create", "/api/device/instance/meter/import", "/API/device/instance/batch/_delete/"} {
		for name, token := range map[string]string{"no token": "", "a bad token": "0123456789abcdef", "a viewer's token": viewer} {
			res, _, _ := rawExchange(t, e.base, fmt.Sprintf("POST %s HTTP/1.1\nHost: t\nContent-Type: application/json\nX-Access-Token: %s\nContent-Length: %d", path, token, 16<<20))
			r := e.envelope("POST", path, res)
			if r.HTTPStatus != 400 || !strings.Contains(r.Message, "too large") {
				t.Errorf("POST %s declaring 16 MiB with %s: %d %s, want 400 too large at once", path, name, r.HTTPStatus, r.raw)
			}
			// With Expect: 100-continue, no 100: 417, and the connection closes.
			res, conn, br := rawExchange(t, e.base, fmt.Sprintf("POST %s HTTP/1.1\nHost: t\nContent-Type: application/json\nX-Access-Token: %s\nExpect: 100-continue\nContent-Length: %d", path, token, 2<<20))
			if res.StatusCode != http.StatusExpectationFailed {
				t.Errorf("POST %s with Expect: 100-continue and %s: %d, want 417", path, name, res.StatusCode)
				continue
			}
			res.Body.Close()
			_, _ = conn.Write([]byte("[]"))
			if n, err := br.Read(make([]byte, 1)); err == nil {
				t.Errorf("POST %s with Expect: 100-continue and %s: %d more bytes after 417, want the connection closed", path, name, n)
			}
		}
	}
	// A caller who may write devices still sends 2 MiB, with or without
	// Expect: 100-continue.
	bulk := func(id string) string {
		return `[{"id":"` + id + `","name":"B","productId":"meter"}` + strings.Repeat(" ", 2<<20) + `]`
	}
	big := bulk("b1")
	if r := e.call("POST", "/api/device/instance/batch/_create", big); r.HTTPStatus != 200 {
		t.Fatalf("bulk create of 2 MiB by the admin: %d %.300s", r.HTTPStatus, r.raw)
	}
	big = bulk("b2")
	res, conn, br := rawExchange(t, e.base, fmt.Sprintf("POST /api/device/instance/batch/_create HTTP/1.1\nHost: t\nContent-Type: application/json\nX-Access-Token: %s\nExpect: 100-continue\nContent-Length: %d", e.token, len(big)))
	if res.StatusCode != http.StatusContinue {
		t.Fatalf("Expect: 100-continue with the admin's token: %d, want 100", res.StatusCode)
	}
	if _, err := io.WriteString(conn, big); err != nil {
		t.Fatal(err)
	}
	if res, err := http.ReadResponse(br, nil); err != nil {
		t.Fatal(err)
	} else if r := e.envelope("POST", "batch/_create", res); r.HTTPStatus != 200 {
		t.Fatalf("bulk create after 100 Continue: %d %.300s", r.HTTPStatus, r.raw)
	}
	// A login needs no token to be told to continue.
	login := `{"username":"admin","password":"admin123"}`
	res, conn, br = rawExchange(t, e.base, fmt.Sprintf("POST /api/authorize/login HTTP/1.1\nHost: t\nContent-Type: application/json\nExpect: 100-continue\nContent-Length: %d", len(login)))
	if res.StatusCode != http.StatusContinue {
		t.Fatalf("login with Expect: 100-continue: %d, want 100", res.StatusCode)
	}
	_, _ = io.WriteString(conn, login)
	if res, err := http.ReadResponse(br, nil); err != nil || res.StatusCode != 200 {
		t.Fatalf("login after 100 Continue: %v %v", res, err)
	}
}

// TestHardeningFraming: a request whose body's length two headers tell
// differently (two Content-Length values, Content-Length with
// Transfer-Encoding, a Transfer-Encoding other than one chunked) is
// refused with 400 and its connection closed: a proxy in front that read
// it the other way cannot smuggle a request behind it. Plain framings
// still work on the same connection.
func TestHardeningFraming(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	login := `{"username":"admin","password":"admin123"}`
	smuggled := "GET /api/authorize/me HTTP/1.1\nHost: t\nX-Access-Token: " + e.token
	for _, c := range []struct{ name, head, body string }{
		{"two lengths", fmt.Sprintf("Content-Length: %d\nContent-Length: 0", len(login)), login},
		{"two lengths, the longer last", fmt.Sprintf("Content-Length: 0\ncontent-length: %d", len(login)), login},
		{"length and chunked", fmt.Sprintf("Content-Length: %d\nTransfer-Encoding: chunked", len(login)), fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(login), login)},
		{"chunked and length", fmt.Sprintf("Transfer-Encoding: chunked\nContent-Length: %d", len(login)), fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(login), login)},
		{"two transfer codings", "Transfer-Encoding: chunked\nTransfer-Encoding: identity", fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(login), login)},
		{"gzip, chunked", "Transfer-Encoding: gzip, chunked", fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(login), login)},
	} {
		conn, err := net.DialTimeout("tcp", strings.TrimPrefix(e.base, "http://"), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
		head := "POST /api/authorize/login HTTP/1.1\nHost: t\nContent-Type: application/json\n" + c.head
		req := strings.ReplaceAll(head, "\n", "\r\n") + "\r\n\r\n" + c.body + strings.ReplaceAll(smuggled, "\n", "\r\n") + "\r\n\r\n"
		if _, err := io.WriteString(conn, req); err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(conn)
		res, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		r := e.envelope("POST", c.name, res)
		if r.HTTPStatus != 400 || r.Code != "illegal_argument" || !strings.Contains(r.Message, "framing") {
			t.Errorf("%s: %d %s, want 400 illegal_argument about the framing", c.name, r.HTTPStatus, r.raw)
		}
		if res, err := http.ReadResponse(br, nil); err == nil {
			t.Errorf("%s: a second answer on the connection (%d): want it closed", c.name, res.StatusCode)
		}
		conn.Close()
	}
	// One length, or chunked alone, and the next request on the connection.
	for _, c := range []struct{ name, head, body string }{
		{"one length", fmt.Sprintf("Content-Length: %d", len(login)), login},
		{"chunked", "Transfer-Encoding: chunked", fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(login), login)},
	} {
		head := "POST /api/authorize/login HTTP/1.1\nHost: t\nContent-Type: application/json\n" + c.head
		res, conn, br := rawExchange(t, e.base, head+"\n\n"+strings.ReplaceAll(c.body, "\r\n", "\n")+smuggled)
		if res.StatusCode != 200 {
			t.Errorf("%s: %d", c.name, res.StatusCode)
		}
		res.Body.Close()
		_ = conn
		if res, err := http.ReadResponse(br, nil); err != nil || res.StatusCode != 200 {
			t.Errorf("%s: the next request: %v %v", c.name, res, err)
		}
	}
}

// TestHardeningPasswords: the password policy holds wherever a password
// is set (creation, reset, one's own change): at least 8 characters, at
// most 72 bytes, not only white space, not the username; and a change or
// a reset ends every API key of the user as well as its tokens (a reset
// all of them, a change all but the token that made it).
func TestHardeningPasswords(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, c := range []struct{ username, password, want string }{
		{"u1", strings.Repeat(" ", 8), "white space"},
		{"u2", " \t \n \u00a0 \u3000 \u2003 ", "white space"},
		{"u3", "seven77", "at least 8 characters"},
		{"u4", "ééééééé", "at least 8 characters"}, // 14 bytes, 7 characters
		{"u5", strings.Repeat("p", 73), "at most 72 bytes"},
		{"carol-the-admin", "Carol-The-Admin", "username"},
	} {
		r := e.call("POST", "/api/user", map[string]any{"username": c.username, "password": c.password, "roles": []string{meta.RoleViewer}})
		if r.HTTPStatus != 400 || r.Code != "illegal_argument" || !strings.Contains(r.Message, "password") || !strings.Contains(r.Message, c.want) {
			t.Errorf("user %s with password %q: %d %s, want 400 saying %q", c.username, c.password, r.HTTPStatus, r.raw, c.want)
		}
	}
	if n := e.countRows("users"); n != 1 {
		t.Fatalf("%d users after refused creations", n)
	}
	e.ok("POST", "/api/user", map[string]any{"username": "dave", "password": "dave-pass-1", "roles": []string{meta.RoleOperator}}, nil)
	id := e.userID("dave")
	for _, pw := range []string{strings.Repeat(" ", 9), "DAVE", "dave", "short"} {
		e.fails("PUT", "/api/user/"+id+"/password", map[string]any{"password": pw}, 400, "illegal_argument")
	}
	tok := e.login("dave", "dave-pass-1")
	for _, pw := range []string{strings.Repeat(" ", 9), "Dave", "short"} {
		if r := e.do("PUT", "/api/user/passwd", map[string]any{"oldPassword": "dave-pass-1", "newPassword": pw}, tok); r.HTTPStatus != 400 || r.Code != "illegal_argument" {
			t.Errorf("own change to %q: %d %s", pw, r.HTTPStatus, r.raw)
		}
	}

	// A reset ends the user's keys and tokens.
	key := e.createKey(tok, map[string]any{"name": "k", "permissions": []string{"device:read"}}).Key
	if s := e.status("GET", "/api/authorize/me", nil, key); s != 200 {
		t.Fatalf("key before the reset: %d", s)
	}
	e.ok("PUT", "/api/user/"+id+"/password", map[string]any{"password": "reset-pass-1"}, nil)
	testkit.Eventually(t, 5*time.Second, "the key refused after its user's password was reset", func() bool { return e.status("GET", "/api/authorize/me", nil, key) == 401 })
	if s := e.status("GET", "/api/authorize/me", nil, tok); s != 401 {
		t.Errorf("token after the reset: %d, want 401", s)
	}
	if n := e.countRows("api_keys"); n != 0 {
		t.Errorf("%d keys after the reset", n)
	}

	// One's own change ends the keys and other tokens, not this token.
	tok = e.login("dave", "reset-pass-1")
	other := e.login("dave", "reset-pass-1")
	key = e.createKey(tok, map[string]any{"name": "k2", "permissions": []string{"device:read"}}).Key
	if r := e.do("PUT", "/api/user/passwd", map[string]any{"oldPassword": "reset-pass-1", "newPassword": "changed-pass-1"}, tok); r.HTTPStatus != 200 {
		t.Fatalf("own change: %d %s", r.HTTPStatus, r.raw)
	}
	testkit.Eventually(t, 5*time.Second, "the key refused after its user changed the password", func() bool { return e.status("GET", "/api/authorize/me", nil, key) == 401 })
	if s := e.status("GET", "/api/authorize/me", nil, other); s != 401 {
		t.Errorf("the other token after the change: %d, want 401", s)
	}
	if s := e.status("GET", "/api/authorize/me", nil, tok); s != 200 {
		t.Errorf("the token that changed the password: %d, want 200", s)
	}
	// The development default still signs in (set before the policy, and
	// within it).
	e.login("admin", "admin123")
}

// userID is the id of the user named username.
func (e *env) userID(username string) string {
	e.t.Helper()
	var id string
	if err := e.store.DB().Get(&id, `SELECT id FROM users WHERE username = $1`, username); err != nil {
		e.t.Fatal(err)
	}
	return id
}

// TestHardeningFailedLoginAudit: a flood of failed logins (most of them
// refused by the lockout, costing no bcrypt) writes a bounded number of
// audit rows: one per client address, name, outcome and minute, whose
// count and first and last times grow as attempts come; every attempt is
// counted.
func TestHardeningFailedLoginAudit(t *testing.T) {
	t.Parallel()
	e := newAuditEnv(t)
	one := &http.Client{Transport: &http.Transport{MaxConnsPerHost: 1, MaxIdleConnsPerHost: 1}, Timeout: time.Minute}
	defer one.CloseIdleConnections()
	flood := testkit.API{Base: e.base, Client: one}
	const n = 400
	start := time.Now()
	for i := range n {
		r := flood.Send(t, "POST", "/api/authorize/login", map[string]string{"username": "victim", "password": fmt.Sprintf("guess-%d", i)})
		if r.HTTPStatus != 400 && r.HTTPStatus != 429 {
			t.Fatalf("failed login %d: %d %s", i, r.HTTPStatus, r.Raw)
		}
	}
	end := time.Now()
	type row struct {
		Time      int64  `json:"time"`
		FirstTime int64  `json:"firstTime"`
		Count     int    `json:"count"`
		Username  string `json:"username"`
		Address   string `json:"address"`
		Status    int    `json:"status"`
	}
	var rows []row
	counted := func() int {
		var page struct {
			Data []row `json:"data"`
		}
		e.ok("POST", "/api/audit/_query", `{"pageSize":1000,"terms":[{"column":"username","value":"victim"}]}`, &page)
		rows = page.Data
		total := 0
		for _, r := range rows {
			total += max(r.Count, 1)
		}
		return total
	}
	if !testkit.Within(10*time.Second, func() bool { return counted() >= n }) {
		t.Fatalf("%d failed logins: %d counted in %d audit rows", n, counted(), len(rows))
	}
	if got := counted(); got != n {
		t.Fatalf("%d failed logins counted %d times", n, got)
	}
	// Two outcomes (400 wrong password, 429 locked), a minute or two.
	minutes := int(end.Truncate(time.Minute).Sub(start.Truncate(time.Minute))/time.Minute) + 1
	if len(rows) > 2*minutes {
		t.Fatalf("%d failed logins in %s wrote %d audit rows, want at most %d", n, end.Sub(start), len(rows), 2*minutes)
	}
	for _, r := range rows {
		if r.Address != "127.0.0.1" || r.FirstTime == 0 || r.FirstTime > r.Time || r.FirstTime < start.Add(-time.Second).UnixMilli() || r.Time > end.Add(time.Second).UnixMilli() {
			t.Errorf("row %+v: want times within the flood, first before last", r)
		}
	}
	if n := e.countRows("audit WHERE username = 'victim'"); n != len(rows) {
		t.Errorf("%d rows stored, %d listed", n, len(rows))
	}
}

// TestHardeningMetricsAccess: /metrics (fleet counts, routes, versions)
// is served to the addresses of Options.MetricsAllow (loopback by
// default) or with its bearer token, and to nobody else (403).
func TestHardeningMetricsAccess(t *testing.T) {
	t.Parallel()
	get := func(base, auth string) testkit.Response {
		t.Helper()
		req, err := http.NewRequest("GET", base+"/metrics", nil)
		if err != nil {
			t.Fatal(err)
		}
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		raw, _ := io.ReadAll(res.Body)
		return testkit.Response{HTTPStatus: res.StatusCode, Raw: raw}
	}
	// The default: loopback may, as make run's Prometheus on the host.
	def := newEnv(t)
	if r := get(def.base, ""); r.HTTPStatus != 200 || !strings.Contains(string(r.Raw), "devicehub_http_requests_total") {
		t.Fatalf("GET /metrics from loopback by default: %d %.200s", r.HTTPStatus, r.Raw)
	}
	if len(api.DefaultOptions().MetricsAllow) == 0 {
		t.Fatal("the default allows no address")
	}

	// Loopback not allowed: only the bearer token.
	const secret = "metrics-secret-0123456789"
	opts := api.DefaultOptions()
	opts.MetricsAllow = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8")}
	opts.MetricsToken = secret
	e := newEnvOpts(t, opts, nil)
	for _, auth := range []string{"", "Bearer wrong", "Bearer " + secret + "x", "Basic " + secret, secret, "X-Access-Token " + e.token} {
		r := get(e.base, auth)
		if r.HTTPStatus != 403 || strings.Contains(string(r.Raw), "devicehub_") {
			t.Errorf("GET /metrics from loopback with %q: %d %.200s, want 403", auth, r.HTTPStatus, r.Raw)
		}
	}
	if r := e.do("GET", "/metrics", nil, e.token); r.HTTPStatus != 403 || r.Code != "access_denied" {
		t.Errorf("GET /metrics with the admin's token: %d %s, want 403 access_denied", r.HTTPStatus, r.raw)
	}
	if r := get(e.base, "Bearer "+secret); r.HTTPStatus != 200 || !strings.Contains(string(r.Raw), "devicehub_http_requests_total") {
		t.Errorf("GET /metrics with the bearer token: %d %.200s", r.HTTPStatus, r.Raw)
	}
	// No address and no token: nobody.
	opts.MetricsAllow, opts.MetricsToken = nil, ""
	none := newEnvOpts(t, opts, nil)
	if r := get(none.base, ""); r.HTTPStatus != 403 {
		t.Errorf("GET /metrics with no address allowed: %d", r.HTTPStatus)
	}
	if r := get(none.base, "Bearer "); r.HTTPStatus != 403 {
		t.Errorf("GET /metrics with an empty bearer and no token set: %d", r.HTTPStatus)
	}
}
