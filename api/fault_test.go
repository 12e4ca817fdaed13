package api_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"devicehub/api"
	"devicehub/meta"
	"devicehub/meta/metatest"
)

// proxy forwards TCP connections to target until Down, which also cuts the
// connections open through it; Up listens again on the same address.
type proxy struct {
	t      *testing.T
	addr   string
	target string
	mu     sync.Mutex
	ln     net.Listener
	conns  []net.Conn
	wg     sync.WaitGroup
}

func newProxy(t *testing.T, target string) *proxy {
	p := &proxy{t: t, target: target}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.addr = ln.Addr().String()
	p.serve(ln)
	t.Cleanup(func() { p.Down(); p.wg.Wait() })
	return p
}

func (p *proxy) serve(ln net.Listener) {
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", p.target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, u)
			p.mu.Unlock()
			p.wg.Add(2)
			go func() { defer p.wg.Done(); _, _ = io.Copy(u, c); u.Close() }()
			go func() { defer p.wg.Done(); _, _ = io.Copy(c, u); c.Close() }()
		}
	}()
}

// Down stops listening and cuts every connection.
func (p *proxy) Down() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// Up listens again on the same address.
func (p *proxy) Up() {
	var ln net.Listener
	var err error
	for i := 0; i < 50; i++ {
		if ln, err = net.Listen("tcp", p.addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		p.t.Fatalf("proxy up: %v", err)
	}
	p.serve(ln)
}

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
	dsn := metatest.NewDatabase(t)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	px := newProxy(t, u.Host)
	u.Host = px.addr
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
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.App().Listener(ln) }()
	defer srv.Shutdown(context.Background())
	e := &env{t: t, base: "http://" + ln.Addr().String(), store: store, server: srv}
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
	if h := e.do("GET", "/healthz", nil, ""); h.HTTPStatus != 503 || !strings.Contains(string(h.Result), `"postgres":"down"`) {
		t.Fatalf("healthz with PostgreSQL down: %d %s", h.HTTPStatus, h.raw)
	}

	px.Up()
	deadline := time.Now().Add(10 * time.Second)
	for {
		r := e.do("POST", "/api/device-product/_query/", `{}`, e.token)
		if r.HTTPStatus == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("did not recover: %d %s", r.HTTPStatus, r.raw)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if log := logs.String(); strings.Contains(log, e.token) || strings.Contains(log, "admin123") {
		t.Fatalf("the log holds a token or password:\n%s", log)
	}
	if !strings.Contains(logs.String(), "request failed") {
		t.Fatalf("server errors were not logged:\n%s", logs.String())
	}
}
