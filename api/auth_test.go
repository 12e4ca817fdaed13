package api_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

func TestLogin(t *testing.T) {
	e := newEnv(t)
	f := func(body string, status int, code string) {
		t.Helper()
		r := e.do("POST", "/api/authorize/login", body, "")
		if r.HTTPStatus != status || r.Code != code {
			t.Fatalf("login %s: want %d %q, got %d %s", body, status, code, r.HTTPStatus, r.raw)
		}
		if strings.Contains(string(r.raw), "admin123") {
			t.Fatalf("response leaks the password: %s", r.raw)
		}
	}
	f(`{"username":"admin","password":"admin123"}`, 200, "")
	f(`{"username":"admin","password":"wrong-password"}`, 400, "illegal_password")
	f(`{"username":"nobody","password":"admin123"}`, 400, "illegal_password")
	f(`{"username":"admin"}`, 400, "illegal_argument")
	f(`{"password":"admin123"}`, 400, "illegal_argument")
	f(`{"username":"admin","password":"admin123","expires":10}`, 400, "illegal_argument")
	f(`{"username":1,"password":"admin123"}`, 400, "illegal_argument")
	f(`{"username":"admin",`, 400, "illegal_argument")
	f(``, 400, "illegal_argument")

	r := e.do("POST", "/api/authorize/login", `{"username":"admin","password":"admin123","expires":120000}`, "")
	var res struct {
		Token     string `json:"token"`
		UserID    string `json:"userId"`
		Username  string `json:"username"`
		Expires   int64  `json:"expires"`
		ExpiresAt int64  `json:"expiresAt"`
	}
	if err := json.Unmarshal(r.Result, &res); err != nil {
		t.Fatal(err)
	}
	if res.UserID != "admin" || res.Username != "admin" || res.Expires != 120000 || len(res.Token) != 64 {
		t.Fatalf("login result: %+v", res)
	}
	if d := res.ExpiresAt - r.Timestamp; d < 110000 || d > 130000 {
		t.Fatalf("expiresAt %d is not about 2 minutes after %d", res.ExpiresAt, r.Timestamp)
	}
}

func TestTokenRequired(t *testing.T) {
	e := newEnv(t)
	unauthorized := func(token string) {
		t.Helper()
		r := e.do("POST", "/api/device-product/_query/", `{}`, token)
		if r.HTTPStatus != 401 || r.Code != "unauthorized" || string(r.Result) != `{"text":"expired","value":"expired"}` {
			t.Fatalf("token %q: want the spec's 401 body, got %d %s", token, r.HTTPStatus, r.raw)
		}
	}
	unauthorized("")
	unauthorized("not-a-token")
	unauthorized(strings.Repeat("a", 64))

	// Expired: push the token's expiry into the past (before this server
	// has seen the token, so its short token cache does not hold it; the
	// cache itself honours expiry, see TestTokenCache).
	tok := e.login("admin", "admin123")
	if _, err := e.store.DB().Exec(`UPDATE tokens SET expires_at = now() - interval '1 second' WHERE expires_at > now()`); err != nil {
		t.Fatal(err)
	}
	unauthorized(tok)
	unauthorized(e.token)

	// Logout revokes.
	tok = e.login("admin", "admin123")
	if r := e.do("POST", "/api/authorize/logout", nil, tok); r.HTTPStatus != 200 {
		t.Fatalf("logout: %s", r.raw)
	}
	unauthorized(tok)
}

func TestTokenSlides(t *testing.T) {
	e := newEnv(t)
	var before, after int64
	if err := e.store.DB().Get(&before, `SELECT (extract(epoch FROM expires_at) * 1000)::bigint FROM tokens`); err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.DB().Exec(`UPDATE tokens SET expires_at = now() + interval '10 seconds'`); err != nil {
		t.Fatal(err)
	}
	e.ok("GET", "/api/authorize/me", nil, nil)
	if err := e.store.DB().Get(&after, `SELECT (extract(epoch FROM expires_at) * 1000)::bigint FROM tokens`); err != nil {
		t.Fatal(err)
	}
	if after < before {
		t.Fatalf("expiry did not slide back to the full lifetime: before %d, after %d", before, after)
	}
}

// TestEveryRouteNeedsToken walks the route table: every route but login,
// health and metrics answers 401 without a token.
func TestEveryRouteNeedsToken(t *testing.T) {
	e := newEnv(t)
	open := map[string]bool{"/api/authorize/login": true, "/healthz": true, "/metrics": true}
	// An expired token, never seen by this server's token cache.
	expired := e.login("admin", "admin123")
	if _, err := e.store.DB().Exec(`UPDATE tokens SET expires_at = now() - interval '1 second' WHERE hash = sha256($1::bytea)`, expired); err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, rt := range routes(t, e) {
		if open[rt.path] {
			continue
		}
		path := strings.NewReplacer(":id", "x1", ":deviceId", "x1", ":property", "p", ":functionId", "DeviceCtrl").Replace(rt.path)
		for _, tok := range []string{"", expired} {
			r := e.do(rt.method, path, `{}`, tok)
			if r.HTTPStatus != http.StatusUnauthorized || r.Code != "unauthorized" {
				t.Errorf("%s %s with token %q: %d %s", rt.method, rt.path, tok, r.HTTPStatus, r.raw)
			}
		}
		seen++
	}
	if seen < 10 {
		t.Fatalf("only %d protected routes found", seen)
	}
}

type route struct{ method, path string }

func routes(t *testing.T, e *env) []route {
	t.Helper()
	srv := e.server
	var out []route
	for _, r := range srv.App().GetRoutes(true) {
		if r.Method == "HEAD" || r.Path == "/" || r.Path == "/api" || strings.HasSuffix(r.Path, "*") {
			continue
		}
		out = append(out, route{r.Method, r.Path})
	}
	return out
}

func TestLoginLockout(t *testing.T) {
	e := newEnv(t)
	login := func(pass string) response {
		t.Helper()
		return e.do("POST", "/api/authorize/login", map[string]string{"username": "admin", "password": pass}, "")
	}
	for i := 0; i < 4; i++ {
		if r := login("wrong-password"); r.Code != "illegal_password" {
			t.Fatalf("failure %d: %s", i+1, r.raw)
		}
	}
	// A success in between resets the count.
	if r := login("admin123"); r.HTTPStatus != 200 {
		t.Fatalf("login before the limit: %s", r.raw)
	}
	for i := 0; i < 5; i++ {
		login("wrong-password")
	}
	// Locked now, even with the right password.
	if r := login("admin123"); r.HTTPStatus != 429 || r.Code != "too_many_requests" {
		t.Fatalf("after 5 failures: %d %s", r.HTTPStatus, r.raw)
	}
	// Tokens issued before keep working; only logins are refused.
	e.ok("GET", "/api/authorize/me", nil, nil)
	// When the lock expires, the right password works again.
	if _, err := e.store.DB().Exec(`UPDATE users SET locked_until = now() - interval '1 second'`); err != nil {
		t.Fatal(err)
	}
	if r := login("admin123"); r.HTTPStatus != 200 {
		t.Fatalf("after the lock expired: %s", r.raw)
	}
	// And a single failure after an expired lock does not lock again.
	if _, err := e.store.DB().Exec(`UPDATE users SET failed_logins = 5, locked_until = now() - interval '1 second'`); err != nil {
		t.Fatal(err)
	}
	login("wrong-password")
	if r := login("admin123"); r.HTTPStatus != 200 {
		t.Fatalf("one failure after an expired lock locked the account: %s", r.raw)
	}
}
