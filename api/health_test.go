package api_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"os"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"devicehub/api"
	"devicehub/bench/testkit"
	"devicehub/ingest"
	"devicehub/ingest/link"
	"devicehub/ingest/mqtttest"
	"devicehub/meta"
	"devicehub/tsdb/tsdbtest"
)

// brokerCheck is a readiness check over a client's connection state, as
// cmd/devicehub wires it.
func brokerCheck(connected func() bool) func(context.Context) error {
	return func(context.Context) error {
		if !connected() {
			return errors.New("not connected")
		}
		return nil
	}
}

// TestHealthzAndReadyzFollowTheBroker runs the server with the checks of
// an instance of both roles: PostgreSQL, ClickHouse, a real Presence
// ("mqtt") and a real Ingester of two connections ("mqtt_ingest"), both on
// a private Mosquitto. With all up /readyz is 200 naming each check up;
// with the broker killed /healthz stays 200 (liveness, no dependency)
// while /readyz is 503 naming mqtt and mqtt_ingest down and the stores
// up, neither needing a token; with the broker back, /readyz is 200 again.
func TestHealthzAndReadyzFollowTheBroker(t *testing.T) {
	t.Parallel()
	broker := mqtttest.StartBroker(t)
	quiet := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	ch := tsdbtest.NewDB(t, time.UTC)
	var presence *link.Presence
	var ing *ingest.Ingester
	e := newEnvOpts(t, api.DefaultOptions(), func(store *meta.Store, deps *api.Deps) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		popt := link.DefaultPresenceOptions()
		popt.BrokerURL, popt.Logger = broker.URL(), quiet
		var err error
		if presence, err = link.NewPresence(ctx, popt, store); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(presence.Close)
		iopt := ingest.DefaultOptions()
		iopt.BrokerURL, iopt.Logger = broker.URL(), quiet
		iopt.ClientID, iopt.ShareGroup, iopt.Connections = "health-test", "health", 2
		if ing, err = ingest.New(ctx, iopt, ch, store, store); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = ing.Close(ctx)
		})
		deps.Health = map[string]func(context.Context) error{
			"postgres":    store.Ping,
			"clickhouse":  func(ctx context.Context) error { return ch.Conn().Ping(ctx) },
			"mqtt":        brokerCheck(presence.Connected),
			"mqtt_ingest": brokerCheck(ing.Connected),
		}
	})
	checks := func(path string) (int, map[string]string) {
		t.Helper()
		r := e.do("GET", path, nil, "")
		var res map[string]string
		if err := json.Unmarshal(r.Result, &res); err != nil {
			t.Fatalf("GET %s: result is not a map of names: %v: %s", path, err, r.raw)
		}
		return r.HTTPStatus, res
	}
	allUp := map[string]string{"postgres": "up", "clickhouse": "up", "mqtt": "up", "mqtt_ingest": "up"}

	if st, res := checks("/readyz"); st != 200 || !reflect.DeepEqual(res, allUp) {
		t.Fatalf("/readyz with everything up: %d %v", st, res)
	}
	if st, _ := checks("/healthz"); st != 200 {
		t.Fatalf("/healthz with everything up: %d", st)
	}

	broker.Stop(syscall.SIGKILL)
	testkit.Eventually(t, 10*time.Second, "both clients to see the broker gone", func() bool {
		return !presence.Connected() && !ing.Connected()
	})

	if st, _ := checks("/healthz"); st != 200 {
		t.Fatalf("/healthz with the broker down: %d, want 200 (liveness checks no dependency)", st)
	}
	down := map[string]string{"postgres": "up", "clickhouse": "up", "mqtt": "down", "mqtt_ingest": "down"}
	r := e.do("GET", "/readyz", nil, "")
	var res map[string]string
	_ = json.Unmarshal(r.Result, &res)
	if r.HTTPStatus != 503 || !reflect.DeepEqual(res, down) || r.Code == "" {
		t.Fatalf("/readyz with the broker down: %d %s, want 503 naming mqtt and mqtt_ingest down", r.HTTPStatus, r.raw)
	}

	broker.Start()
	testkit.Eventually(t, 30*time.Second, "/readyz to answer 200 after the broker is back", func() bool {
		st, res := checks("/readyz")
		return st == 200 && reflect.DeepEqual(res, allUp)
	})

}

// TestReadyzStoreDown: a failing store check makes /readyz 503 naming it,
// while /healthz stays 200.
func TestReadyzStoreDown(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, func(store *meta.Store, deps *api.Deps) {
		deps.Health["clickhouse"] = func(context.Context) error { return errors.New("connection refused") }
	})
	if r := e.do("GET", "/healthz", nil, ""); r.HTTPStatus != 200 {
		t.Fatalf("/healthz with ClickHouse down: %d %s", r.HTTPStatus, r.raw)
	}
	r := e.do("GET", "/readyz", nil, "")
	if r.HTTPStatus != 503 || !strings.Contains(string(r.Result), `"clickhouse":"down"`) || !strings.Contains(string(r.Result), `"postgres":"up"`) {
		t.Fatalf("/readyz with ClickHouse down: %d %s", r.HTTPStatus, r.raw)
	}
}

// corsRequest sends method path with Origin and the given headers, no
// token, and returns the status and the Access-Control-* headers.
func corsRequest(t *testing.T, e *env, method, path, origin string, hdr map[string]string) (int, http.Header) {
	t.Helper()
	req, err := http.NewRequest(method, e.base+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if origin != "" {
		req.Header.Set("Origin", origin)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	acl := http.Header{}
	for k, v := range res.Header {
		if strings.HasPrefix(k, "Access-Control-") {
			acl[k] = v
		}
	}
	return res.StatusCode, acl
}

var preflight = map[string]string{
	"Access-Control-Request-Method":  "POST",
	"Access-Control-Request-Headers": "x-access-token,content-type",
}

// TestCORSAllowedOrigins: with origins configured, a preflight from one of
// them is answered 204 with the allow headers (methods, X-Access-Token and
// Content-Type), not 401, though it carries no token; the request that
// follows gets Access-Control-Allow-Origin; a preflight or request from
// another origin gets no allow header.
func TestCORSAllowedOrigins(t *testing.T) {
	t.Parallel()
	opts := api.DefaultOptions()
	var err error
	if opts.CORSOrigins, err = api.ParseCORSOrigins("https://console.example.com, http://localhost:3000"); err != nil {
		t.Fatal(err)
	}
	e := newEnvOpts(t, opts, nil)
	const path = "/api/device-product/_query"

	st, h := corsRequest(t, e, "OPTIONS", path, "https://console.example.com", preflight)
	if st != http.StatusNoContent || h.Get("Access-Control-Allow-Origin") != "https://console.example.com" {
		t.Fatalf("preflight from an allowed origin: %d %v, want 204 with Access-Control-Allow-Origin", st, h)
	}
	methods, headers := strings.ToLower(h.Get("Access-Control-Allow-Methods")), strings.ToLower(h.Get("Access-Control-Allow-Headers"))
	for _, m := range []string{"get", "post", "put", "patch", "delete"} {
		if !strings.Contains(methods, m) {
			t.Errorf("Access-Control-Allow-Methods %q lacks %s", methods, m)
		}
	}
	for _, hd := range []string{"x-access-token", "content-type"} {
		if !strings.Contains(headers, hd) {
			t.Errorf("Access-Control-Allow-Headers %q lacks %s", headers, hd)
		}
	}
	if st, h := corsRequest(t, e, "OPTIONS", path, "http://localhost:3000", preflight); st != http.StatusNoContent ||
		h.Get("Access-Control-Allow-Origin") != "http://localhost:3000" {
		t.Fatalf("preflight from the second allowed origin: %d %v", st, h)
	}

	// The actual request, with the token.
	st, h = corsRequest(t, e, "POST", path, "https://console.example.com", map[string]string{"X-Access-Token": e.token})
	if st != 200 || h.Get("Access-Control-Allow-Origin") != "https://console.example.com" {
		t.Fatalf("request from an allowed origin: %d %v", st, h)
	}

	// Another origin: no allow header, on the preflight or the request.
	if _, h := corsRequest(t, e, "OPTIONS", path, "https://evil.example.com", preflight); len(h) != 0 {
		t.Fatalf("preflight from another origin got allow headers: %v", h)
	}
	if _, h := corsRequest(t, e, "POST", path, "https://evil.example.com", map[string]string{"X-Access-Token": e.token}); len(h) != 0 {
		t.Fatalf("request from another origin got an allow header: %v", h)
	}
}

// TestCORSNoOriginsNoHeaders: without the setting (the default) no
// response carries a CORS header, and a preflight gets no special
// treatment: it is a request without a token like any other.
func TestCORSNoOriginsNoHeaders(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	st, h := corsRequest(t, e, "OPTIONS", "/api/device-product/_query", "https://console.example.com", preflight)
	if len(h) != 0 || st != http.StatusUnauthorized {
		t.Fatalf("preflight without configured origins: %d %v, want 401 and no CORS header", st, h)
	}
	if _, h := corsRequest(t, e, "POST", "/api/device-product/_query", "https://console.example.com",
		map[string]string{"X-Access-Token": e.token}); len(h) != 0 {
		t.Fatalf("request without configured origins got CORS headers: %v", h)
	}
}

func TestParseCORSOrigins(t *testing.T) {
	t.Parallel()
	f := func(text string, want []string, wantErr bool) {
		t.Helper()
		got, err := api.ParseCORSOrigins(text)
		if (err != nil) != wantErr || !reflect.DeepEqual(got, want) {
			t.Errorf("ParseCORSOrigins(%q) = %q, %v", text, got, err)
		}
	}
	f("", nil, false)
	f(" , ", nil, false)
	f("*", []string{"*"}, false)
	f("https://A.example.com/, http://localhost:3000", []string{"https://a.example.com", "http://localhost:3000"}, false)
	f("example.com", nil, true)
	f("ftp://example.com", nil, true)
	f("https://example.com/app", nil, true)
	f("https://example.com?x=1", nil, true)
	f("https://u@example.com", nil, true)
	f("*, https://example.com", nil, true)
}
