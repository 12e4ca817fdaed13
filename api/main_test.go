package api_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"devicehub/api"
	"devicehub/bench/testkit"
	"devicehub/ingest/forward"
	"devicehub/ingest/notify"
	"devicehub/meta"
	"devicehub/meta/metatest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// database/sql and fasthttp keep pool goroutines for the process.
		goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func2"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"),
		// A fasthttp client's (BenchmarkDashboardCounts): its idle-connection
		// cleaner ends up to its idle time after the last connection; its
		// dialer's address cache is the process's.
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*HostClient).connsCleaner"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*TCPDialer).tcpAddrsClean"),
		goleak.IgnoreAnyFunction("github.com/lib/pq.NewDialListener"),
		// paho's Subscribe, called by a device-login feed's OnConnect
		// (ingest/dynsec, DialTopic) as the feed is closed, waits up to 30 s
		// (paho's write timeout) to hand its packet to a connection that is
		// gone; it then returns.
		goleak.IgnoreAnyFunction("devicehub/ingest/dynsec.DialTopic.func1"),
	)
}

// env is one running server on a fresh database, reached over real HTTP.
type env struct {
	t      *testing.T
	base   string
	store  *meta.Store
	server *api.Server
	token  string
}

func newEnv(t *testing.T) *env { return newEnvWith(t, nil) }

// newEnvWith lets a test add dependencies (ClickHouse, MQTT) to the server.
func newEnvWith(t *testing.T, with func(store *meta.Store, deps *api.Deps)) *env {
	t.Helper()
	return newEnvOpts(t, api.DefaultOptions(), with)
}

// newEnvOpts is newEnvWith with the server's options.
func newEnvOpts(t *testing.T, opts api.Options, with func(store *meta.Store, deps *api.Deps)) *env {
	t.Helper()
	store := metatest.NewStore(t)
	reg := prometheus.NewRegistry()
	deps := api.Deps{
		Auth: store, Products: store, Roles: store, Devices: store, Audit: store,
		Health:   map[string]func(context.Context) error{"postgres": store.Ping},
		Registry: reg, Gatherer: reg,
	}
	deps.Notify = notify.NewStore(store)   // api/notify.go
	deps.Forward = forward.NewStore(store) // api/forward.go
	if with != nil {
		with(store, &deps)
	}
	srv := api.New(opts, deps)
	base := testkit.Serve(t, srv.App().Listener, srv.Shutdown)
	e := &env{t: t, base: base, store: store, server: srv}
	e.token = e.login("admin", "admin123")
	return e
}

// response is a decoded envelope.
type response struct {
	HTTPStatus int
	Message    string          `json:"message"`
	Result     json.RawMessage `json:"result"`
	Status     int             `json:"status"`
	Code       string          `json:"code"`
	Timestamp  int64           `json:"timestamp"`
	raw        []byte
}

func (e *env) do(method, path string, body any, token string) response {
	e.t.Helper()
	r := testkit.API{Base: e.base, Token: token}.Send(e.t, method, path, body)
	return e.checked(method, path, r.HTTPStatus, r.Raw)
}

// doOversized sends method path with the admin token, declaring a body of
// n bytes but sending none of it: the server must refuse it from the
// header alone. (Sending the body races the server's early answer and
// close: the client may get a connection reset while still writing.)
func (e *env) doOversized(method, path string, n int) response {
	e.t.Helper()
	conn, err := net.DialTimeout("tcp", strings.TrimPrefix(e.base, "http://"), 5*time.Second)
	if err != nil {
		e.t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(conn, "%s %s HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\nX-Access-Token: %s\r\nContent-Length: %d\r\n\r\n",
		method, path, e.token, n)
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		e.t.Fatalf("%s %s with a %d-byte body: %v", method, path, n, err)
	}
	return e.envelope(method, path, res)
}

// envelope reads res and checks that it is the envelope.
func (e *env) envelope(method, path string, res *http.Response) response {
	e.t.Helper()
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	return e.checked(method, path, res.StatusCode, raw)
}

// checked decodes raw, an answer with HTTP status status, checking that
// it is the envelope.
func (e *env) checked(method, path string, status int, raw []byte) response {
	e.t.Helper()
	r := response{HTTPStatus: status, raw: raw}
	if err := json.Unmarshal(raw, &r); err != nil {
		e.t.Fatalf("%s %s: body is not an envelope: %v: %s", method, path, err, raw)
	}
	if r.Status != status {
		e.t.Fatalf("%s %s: envelope status %d != HTTP %d", method, path, r.Status, status)
	}
	if r.Timestamp == 0 {
		e.t.Fatalf("%s %s: envelope without timestamp: %s", method, path, raw)
	}
	return r
}

// metrics is the server's /metrics page.
func (e *env) metrics() string {
	e.t.Helper()
	return string(testkit.API{Base: e.base}.Send(e.t, "GET", "/metrics", nil).Raw)
}

// call is do with the admin token.
func (e *env) call(method, path string, body any) response {
	e.t.Helper()
	return e.do(method, path, body, e.token)
}

// ok calls and requires 200 success, decoding result into out (if non-nil).
func (e *env) ok(method, path string, body, out any) {
	e.t.Helper()
	r := e.call(method, path, body)
	if r.HTTPStatus != 200 || r.Message != "success" || r.Code != "" {
		e.t.Fatalf("%s %s: want 200 success, got %d: %s", method, path, r.HTTPStatus, r.raw)
	}
	if out != nil {
		if err := json.Unmarshal(r.Result, out); err != nil {
			e.t.Fatalf("%s %s: result: %v: %s", method, path, err, r.Result)
		}
	}
}

// fails calls and requires the given status and code.
func (e *env) fails(method, path string, body any, status int, code string) response {
	e.t.Helper()
	r := e.call(method, path, body)
	if r.HTTPStatus != status || r.Code != code {
		e.t.Fatalf("%s %s %v: want %d %s, got %d: %s", method, path, body, status, code, r.HTTPStatus, r.raw)
	}
	return r
}

func (e *env) login(user, pass string) string {
	e.t.Helper()
	r := e.do("POST", "/api/authorize/login", map[string]string{"username": user, "password": pass}, "")
	if r.HTTPStatus != 200 {
		e.t.Fatalf("login %s: %d %s", user, r.HTTPStatus, r.raw)
	}
	var res struct {
		Token string `json:"token"`
	}
	if err := json.Unmarshal(r.Result, &res); err != nil || res.Token == "" {
		e.t.Fatalf("login: no token: %s", r.raw)
	}
	return res.Token
}

// createProduct creates a product with the required fields plus extra.
func (e *env) createProduct(id, name string, extra map[string]any) map[string]any {
	e.t.Helper()
	body := map[string]any{"id": id, "name": name, "classifiedId": "meter", "modelFrom": "custom", "accessId": "mqtt-direct", "deviceType": "device"}
	for k, v := range extra {
		body[k] = v
	}
	var p map[string]any
	e.ok("POST", "/api/device/product", body, &p)
	return p
}

func (e *env) countRows(table string) int {
	e.t.Helper()
	var n int
	if err := e.store.DB().Get(&n, fmt.Sprintf("SELECT count(*) FROM %s", table)); err != nil {
		e.t.Fatal(err)
	}
	return n
}
