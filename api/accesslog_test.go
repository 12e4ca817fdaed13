package api_test

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"devicehub/api"
	"devicehub/meta"
)

// TestAccessLog sends requests that carry secrets (a password, the token in
// its header and in a query string) and requests that fail, with the
// access log on: each gets one line with its method, path without the
// query, status, duration, bytes and remote address, and no secret is in
// any line the server logged.
func TestAccessLog(t *testing.T) {
	t.Parallel()
	logs := &syncBuffer{}
	opts := api.DefaultOptions()
	opts.AccessLog = true
	e := newEnvOpts(t, opts, func(_ *meta.Store, deps *api.Deps) {
		deps.Logger = slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	before := strings.Count(logs.String(), "\n") // newEnvOpts logged in
	const badPassword = "Wrong-Secret-9"
	type request struct {
		method, path string
		body         any
		token        string
		wantPath     string
		wantStatus   int
	}
	requests := []request{
		{"POST", "/api/authorize/login", map[string]string{"username": "admin", "password": "admin123"}, "", "/api/authorize/login", 200},
		{"POST", "/api/authorize/login", map[string]string{"username": "admin", "password": badPassword}, "", "/api/authorize/login", 400},
		{"GET", "/api/authorize/me", nil, e.token, "/api/authorize/me", 200},
		// The live endpoint's form of the token: in the query string.
		{"POST", "/api/device-product/_query?token=" + e.token + "&deviceId=d1", nil, e.token, "/api/device-product/_query", 200},
		{"GET", "/api/authorize/me?token=" + e.token, nil, "", "/api/authorize/me", 401},
		{"GET", "/api/device-product/no-such-product", nil, e.token, "/api/device-product/no-such-product", 404},
		{"GET", "/healthz", nil, "", "/healthz", 200},
	}
	var tokens []string
	var sizes []int
	for _, r := range requests {
		res := e.do(r.method, r.path, r.body, r.token)
		if res.HTTPStatus != r.wantStatus {
			t.Fatalf("%s %s: %d, want %d: %s", r.method, r.path, res.HTTPStatus, r.wantStatus, res.raw)
		}
		sizes = append(sizes, len(res.raw))
		var login struct {
			Token string `json:"token"`
		}
		if json.Unmarshal(res.Result, &login) == nil && login.Token != "" {
			tokens = append(tokens, login.Token)
		}
	}

	var lines []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n")[before:] {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if rec["msg"] == "http request" {
			lines = append(lines, rec)
		}
	}
	if len(lines) != len(requests) {
		t.Fatalf("%d access log lines for %d requests:\n%s", len(lines), len(requests), logs.String())
	}
	for i, r := range requests {
		rec := lines[i]
		if rec["level"] != "INFO" || rec["method"] != r.method || rec["path"] != r.wantPath || rec["status"] != float64(r.wantStatus) {
			t.Errorf("%s %s: logged %v, want method %s path %s status %d", r.method, r.path, rec, r.method, r.wantPath, r.wantStatus)
		}
		if rec["bytes"] != float64(sizes[i]) {
			t.Errorf("%s %s: bytes %v, want the body's %d", r.method, r.path, rec["bytes"], sizes[i])
		}
		if d, ok := rec["duration"].(float64); !ok || d <= 0 {
			t.Errorf("%s %s: duration %v", r.method, r.path, rec["duration"])
		}
		if remote, _ := rec["remote"].(string); !strings.HasPrefix(remote, "127.0.0.1:") {
			t.Errorf("%s %s: remote %q, want the peer's 127.0.0.1:port", r.method, r.path, remote)
		}
	}
	if len(tokens) != 1 {
		t.Fatalf("want the token of the one good login, got %d", len(tokens))
	}
	all := logs.String()
	for _, secret := range append(tokens, e.token, "admin123", badPassword, "token=") {
		if strings.Contains(all, secret) {
			t.Errorf("the log holds %q:\n%s", secret, all)
		}
	}
}

// TestAccessLogOff: without Options.AccessLog, requests log nothing.
func TestAccessLogOff(t *testing.T) {
	t.Parallel()
	logs := &syncBuffer{}
	e := newEnvWith(t, func(_ *meta.Store, deps *api.Deps) {
		deps.Logger = slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	e.ok("GET", "/api/authorize/me", nil, nil)
	res, err := http.Get(e.base + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if strings.Contains(logs.String(), "http request") {
		t.Errorf("access log written while off:\n%s", logs.String())
	}
}
