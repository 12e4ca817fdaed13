package api_test

import (
	"bytes"
	"context"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"devicehub/api"
	"devicehub/bench/testkit"
	"devicehub/meta"
	"devicehub/meta/metatest"
)

// syncBuffer is a log sink safe for concurrent handlers.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestPostgresDown: with PostgreSQL unreachable the API answers 500
// server_error without internals, and recovers when it comes back. Tokens
// and passwords never reach the log.
func TestPostgresDown(t *testing.T) {
	t.Parallel()
	dsn := metatest.NewDatabase(t)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	px := metatest.NewProxy(t, u.Host)
	u.Host = px.Addr()
	opts := meta.DefaultOptions()
	opts.DSN = u.String()
	opts.QueryTimeout = 2 * time.Second
	store, err := meta.Open(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	if err := store.EnsureAdmin(context.Background(), "admin123"); err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	reg := prometheus.NewRegistry()
	srv := api.New(api.DefaultOptions(), api.Deps{
		Auth: store, Products: store, Roles: store,
		Health:   map[string]func(context.Context) error{"postgres": store.Ping},
		Logger:   slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Registry: reg, Gatherer: reg,
	})
	base := testkit.Serve(t, srv.App().Listener, srv.Shutdown)
	e := &env{t: t, base: base, store: store, server: srv}
	e.token = e.login("admin", "admin123")
	e.ok("POST", "/api/device-product/_query/", `{}`, nil)

	px.Down()
	for _, c := range []struct{ method, path, body string }{
		{"POST", "/api/device-product/_query/", `{}`},
		{"GET", "/api/device-product/x", ``},
		{"POST", "/api/device/product", `{"name":"N","classifiedId":"c","modelFrom":"custom","accessId":"a","deviceType":"device"}`},
	} {
		r := e.do(c.method, c.path, c.body, e.token)
		if r.HTTPStatus != 500 || r.Code != "server_error" || r.Message != "internal server error" {
			t.Fatalf("%s %s with PostgreSQL down: %d %s", c.method, c.path, r.HTTPStatus, r.raw)
		}
	}
	r := e.do("POST", "/api/authorize/login", `{"username":"admin","password":"admin123"}`, "")
	if r.HTTPStatus != 500 || r.Code != "server_error" {
		t.Fatalf("login with PostgreSQL down: %d %s", r.HTTPStatus, r.raw)
	}
	if h := e.do("GET", "/readyz", nil, ""); h.HTTPStatus != 503 || !strings.Contains(string(h.Result), `"postgres":"down"`) {
		t.Fatalf("readyz with PostgreSQL down: %d %s", h.HTTPStatus, h.raw)
	}

	px.Up()
	testkit.Eventually(t, 10*time.Second, "the product list answering 200 once PostgreSQL is back", func() bool {
		return e.do("POST", "/api/device-product/_query/", `{}`, e.token).HTTPStatus == 200
	})
	if log := logs.String(); strings.Contains(log, e.token) || strings.Contains(log, "admin123") {
		t.Fatalf("the log holds a token or password:\n%s", log)
	}
	if !strings.Contains(logs.String(), "request failed") {
		t.Fatalf("server errors were not logged:\n%s", logs.String())
	}
}
