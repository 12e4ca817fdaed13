package api_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"devicehub/api"
	"devicehub/api/live"
	"devicehub/bench/testkit"
	"devicehub/meta"
	"devicehub/meta/metatest"
)

// Tests of what a hostile client tried: each fails without its fix.

// newLiveHub is a hub without a bus, closed when the test ends.
func newLiveHub(t *testing.T) *live.Hub {
	t.Helper()
	hub, err := live.New(context.Background(), live.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(hub.Close)
	return hub
}

// serveStore starts another api.Server on store (a second instance on the
// same database) and returns its base URL.
func serveStore(t *testing.T, opts api.Options, store *meta.Store, with func(deps *api.Deps)) string {
	t.Helper()
	reg := prometheus.NewRegistry()
	deps := api.Deps{Auth: store, Products: store, Roles: store, Devices: store, Registry: reg, Gatherer: reg}
	if with != nil {
		with(&deps)
	}
	srv := api.New(opts, deps)
	return testkit.Serve(t, srv.App().Listener, srv.Shutdown)
}

// openLiveWithin is openLive that fails, rather than hangs, when the
// stream's headers do not come within d.
func openLiveWithin(t *testing.T, base, query, token string, d time.Duration) *sseStream {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	req, err := http.NewRequestWithContext(ctx, "GET", base+"/api/live?"+query, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("X-Access-Token", token)
	}
	timer := time.AfterFunc(d, cancel)
	res, err := liveClient.Do(req)
	if !timer.Stop() || err != nil {
		t.Fatalf("GET /api/live: no response within %s: %v", d, err)
	}
	if res.StatusCode != 200 {
		raw, _ := io.ReadAll(res.Body)
		res.Body.Close()
		t.Fatalf("GET /api/live?%.200s: %d %s", query, res.StatusCode, raw)
	}
	s := &sseStream{t: t, header: res.Header, events: make(chan sseEvent, 100000), pings: make(chan struct{}, 100), body: res.Body}
	go readSSE(bufio.NewReader(res.Body), s.events, s.pings)
	t.Cleanup(func() { res.Body.Close(); liveClient.CloseIdleConnections() })
	return s
}

// ended waits up to d for the stream to end and returns when it did.
func (s *sseStream) ended(d time.Duration) (time.Time, bool) {
	timeout := time.After(d)
	for {
		select {
		case _, ok := <-s.events:
			if !ok {
				return time.Now(), true
			}
		case <-timeout:
			return time.Time{}, false
		}
	}
}

// TestHardeningAccessLogLive: with the access log on, a live stream
// flows (the log never reads a streamed body, which would drain it) and
// its subscription is released when the client leaves; the line says
// bytes -1.
func TestHardeningAccessLogLive(t *testing.T) {
	t.Parallel()
	product := "al" + liveSuffix()
	dev := product + "-1"
	logs := &syncBuffer{}
	opts := api.DefaultOptions()
	opts.AccessLog = true
	var hub *live.Hub
	e := newEnvOpts(t, opts, func(store *meta.Store, deps *api.Deps) {
		addLiveDevices(t, store, product, dev)
		hub = newLiveHub(t)
		deps.Live, deps.LiveDevices = hub, store
		deps.Logger = slog.New(slog.NewJSONHandler(logs, nil))
	})
	s := openLiveWithin(t, e.base, liveQuery(e.token, []string{dev}), "", 3*time.Second)
	select {
	case <-s.pings:
	case <-time.After(3 * time.Second):
		t.Fatal("no comment at the start of the stream with the access log on")
	}
	hub.PresenceChanged(dev, true)
	if ev := s.next(3 * time.Second); ev.Name != "state" || !strings.Contains(ev.Data, `"state":"online"`) {
		t.Fatalf("event %s %s", ev.Name, ev.Data)
	}
	s.body.Close()
	if !testkit.Within(2*time.Second, func() bool { return hub.Subscribers() == 0 }) {
		t.Fatalf("%d subscriptions 2 s after the client left", hub.Subscribers())
	}
	var line map[string]any
	if !testkit.Within(2*time.Second, func() bool {
		for _, l := range strings.Split(logs.String(), "\n") {
			if strings.Contains(l, `"path":"/api/live"`) {
				return json.Unmarshal([]byte(l), &line) == nil
			}
		}
		return false
	}) {
		t.Fatalf("no access log line of /api/live:\n%s", logs.String())
	}
	if line["status"] != 200.0 || line["bytes"] != -1.0 {
		t.Fatalf("access log line of the stream: %v; want status 200, bytes -1", line)
	}
}

// TestHardeningLiveEndsWithToken: a live stream ends within a second of
// its token's end (logout, expiry, its user disabled or deleted), on
// every instance, and the other instance's token cache forgets the token
// as fast; streams of other tokens go on.
func TestHardeningLiveEndsWithToken(t *testing.T) {
	t.Parallel()
	product := "lt" + liveSuffix()
	dev := product + "-1"
	var storeA *meta.Store
	var hubA *live.Hub
	a := newEnvWith(t, func(store *meta.Store, deps *api.Deps) {
		storeA = store
		addLiveDevices(t, store, product, dev)
		hubA = newLiveHub(t)
		deps.Live, deps.LiveDevices = hubA, store
	})
	storeB := otherStore(t, storeA)
	hubB := newLiveHub(t)
	baseB := serveStore(t, api.DefaultOptions(), storeB, func(deps *api.Deps) { deps.Live, deps.LiveDevices = hubB, storeB })
	b := &env{t: t, base: baseB, store: storeB}

	for _, u := range []string{"alice", "bob", "carol", "dave"} {
		if _, err := storeA.CreateUser(context.Background(), u, "password-"+u, meta.RoleViewer); err != nil {
			t.Fatal(err)
		}
	}
	// A control stream on each instance, of a token that stays.
	keep := a.login("admin", "admin123")
	controls := []*sseStream{
		openLiveWithin(t, a.base, liveQuery(keep, []string{dev}), "", 3*time.Second),
		openLiveWithin(t, b.base, liveQuery(keep, []string{dev}), "", 3*time.Second),
	}
	sqlExec := func(q string, args ...any) {
		t.Helper()
		if _, err := storeA.DB().Exec(q, args...); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		name, user string
		prepare    func(token string) // before the streams open
		end        func(token string)
		notBefore  time.Duration // the streams must not end sooner
	}{
		{"logout through the other instance", "alice", nil, func(token string) {
			if r := a.do("POST", "/api/authorize/logout", nil, token); r.HTTPStatus != 200 {
				t.Fatalf("logout: %s", r.raw)
			}
		}, 0},
		{"expiry", "bob", func(token string) {
			// A lifetime of 2 s (below the 1 minute a login may ask for):
			// no request slides it.
			sqlExec(`UPDATE tokens SET lifetime_ms = 2000, expires_at = now() + interval '2 seconds' WHERE hash = sha256($1::bytea)`, token)
		}, func(string) {}, 1500 * time.Millisecond},
		{"user disabled", "carol", nil, func(string) { sqlExec(`UPDATE users SET state = 'disabled' WHERE username = 'carol'`) }, 0},
		{"user deleted", "dave", nil, func(string) { sqlExec(`DELETE FROM users WHERE username = 'dave'`) }, 0},
	} {
		token := a.login(c.user, "password-"+c.user)
		if c.prepare != nil {
			c.prepare(token)
		}
		start := time.Now()
		sa := openLiveWithin(t, a.base, liveQuery(token, []string{dev}), "", 3*time.Second)
		sb := openLiveWithin(t, b.base, liveQuery("", []string{dev}), token, 3*time.Second)
		// Each instance has checked, and B cached, the token.
		if r := b.do("GET", "/api/authorize/me", nil, token); r.HTTPStatus != 200 {
			t.Fatalf("%s: /me on B before: %s", c.name, r.raw)
		}
		if !testkit.Within(3*time.Second, func() bool { return hubA.Subscribers() == 2 && hubB.Subscribers() == 2 }) {
			t.Fatalf("%s: subscriptions A %d, B %d; want 2 each", c.name, hubA.Subscribers(), hubB.Subscribers())
		}
		if c.notBefore > 0 {
			start = start.Add(2 * time.Second) // the token's expiry
		} else {
			c.end(token)
			start = time.Now()
		}
		for i, s := range []*sseStream{sa, sb} {
			at, ok := s.ended(time.Until(start.Add(time.Second)))
			if !ok {
				t.Fatalf("%s: the stream on instance %c still runs 1 s after its token ended", c.name, "AB"[i])
			}
			if c.notBefore > 0 && at.Before(start.Add(-2*time.Second+c.notBefore)) {
				t.Fatalf("%s: the stream on instance %c ended %s before its token expired", c.name, "AB"[i], start.Sub(at))
			}
		}
		if !testkit.Within(time.Until(start.Add(time.Second)), func() bool {
			return b.do("GET", "/api/authorize/me", nil, token).HTTPStatus == 401
		}) {
			t.Fatalf("%s: instance B still takes the token 1 s after it ended", c.name)
		}
		if !testkit.Within(time.Second, func() bool { return hubA.Subscribers() == 1 && hubB.Subscribers() == 1 }) {
			t.Fatalf("%s: subscriptions A %d, B %d; want the control streams' only", c.name, hubA.Subscribers(), hubB.Subscribers())
		}
		t.Logf("%s: streams ended, B refuses the token", c.name)
	}
	for i, s := range controls {
		select {
		case _, ok := <-s.events:
			if !ok {
				t.Fatalf("the control stream on instance %c ended", "AB"[i])
			}
		default:
		}
	}
	if r := b.do("GET", "/api/authorize/me", nil, keep); r.HTTPStatus != 200 {
		t.Fatalf("the control token on B: %s", r.raw)
	}
}

// TestHardeningLoginNeedsJSON: a login's body must be declared JSON. A
// browser's cross-site no-cors request can send a body without any
// Content-Type (a Blob), so login is the one endpoint where no
// Content-Type is refused: failed guesses sent so would lock the account
// out of its user's address.
func TestHardeningLoginNeedsJSON(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	post := func(contentType, body string) response {
		t.Helper()
		req, err := http.NewRequest("POST", e.base+"/api/authorize/login", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if contentType != "" {
			req.Header.Set("Content-Type", contentType)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return e.envelope("POST", "/api/authorize/login", res)
	}
	for i := range 6 { // more than the lockout's 5 failures
		for _, ct := range []string{"", "text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded"} {
			r := post(ct, `{"username":"admin","password":"wrong-password-`+fmt.Sprint(i)+`"}`)
			if r.HTTPStatus != 415 || r.Code != "unsupported_media_type" || !strings.Contains(r.Message, "application/json") {
				t.Fatalf("login with Content-Type %q: want 415 unsupported_media_type naming application/json, got %d %s", ct, r.HTTPStatus, r.raw)
			}
		}
	}
	if r := post("", ""); r.HTTPStatus != 415 {
		t.Fatalf("login without a body or Content-Type: want 415, got %d %s", r.HTTPStatus, r.raw)
	}
	// None of them counted as a failed login.
	for _, ct := range []string{"application/json", "application/json; charset=utf-8", "application/vnd.devicehub+json"} {
		if r := post(ct, `{"username":"admin","password":"admin123"}`); r.HTTPStatus != 200 {
			t.Fatalf("login with Content-Type %q: %d %s", ct, r.HTTPStatus, r.raw)
		}
	}
}

// TestHardeningRequestText: a NUL or bytes that are not UTF-8 in a query
// parameter's name or value, or in a path (percent-encoded or not), are
// 400 illegal_argument on every route, before any handler or database
// sees them.
func TestHardeningRequestText(t *testing.T) {
	t.Parallel()
	product := "rt" + liveSuffix()
	dev := product + "-1"
	e := newEnvWith(t, func(store *meta.Store, deps *api.Deps) {
		addLiveDevices(t, store, product, dev)
		deps.Live, deps.LiveDevices = newLiveHub(t), store
		deps.Models = store
	})
	for _, c := range []struct {
		method, path, body, field, mention string
	}{
		{"GET", "/api/live?deviceId=%00", "", "deviceId", "NUL"},
		{"GET", "/api/live?deviceId=" + dev + "&property=a%00b", "", "property", "NUL"},
		{"GET", "/api/live?deviceId=%ff", "", "deviceId", "UTF-8"},
		{"GET", "/api/live?deviceId=" + dev + "&token=%00", "", "token", "NUL"},
		{"GET", "/api/authorize/me?x=%C0%AF", "", "x", "UTF-8"},
		{"GET", "/api/authorize/me?a%00b=1", "", "query", "NUL"},
		{"GET", "/api/authorize/me?%ff=1", "", "query", "UTF-8"},
		{"POST", "/api/device-product/_query/?pageSize=%00", `{}`, "pageSize", "NUL"},
		{"GET", "/api/device-product/" + product + "?v=%00", "", "v", "NUL"},
		{"GET", "/api/device/standard/" + dev + "/property/temp?timeout=1%00", "", "timeout", "NUL"},
		{"GET", "/healthz?x=%00", "", "x", "NUL"},
		{"GET", "/api/device-product/%00", "", "path", "NUL"},
		{"GET", "/api/device-product/a%00b", "", "path", "NUL"},
		{"GET", "/api/device/instance/%ff/detail", "", "path", "UTF-8"},
		{"DELETE", "/api/device/instance/%C0%AF", "", "path", "UTF-8"},
		{"GET", "/api/device/standard/" + dev + "/property/%00", "", "path", "NUL"},
		{"GET", "/api/device/instance/a%2Fb/detail", "", "path", "/"},
	} {
		// A client that gives up: without the check, some of these start
		// a stream.
		req, err := http.NewRequest(c.method, e.base+c.path, strings.NewReader(c.body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Access-Token", e.token)
		res, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
		if err != nil {
			t.Errorf("%s %s: %v", c.method, c.path, err)
			continue
		}
		if res.Header.Get("Content-Type") == "text/event-stream" {
			res.Body.Close()
			t.Errorf("%s %s: the stream started", c.method, c.path)
			continue
		}
		r := e.envelope(c.method, c.path, res)
		if r.HTTPStatus != 400 || r.Code != "illegal_argument" || !strings.Contains(r.Message, c.field) || !strings.Contains(r.Message, c.mention) {
			t.Errorf("%s %s: want 400 illegal_argument naming %q and %q, got %d %s", c.method, c.path, c.field, c.mention, r.HTTPStatus, r.raw)
		}
	}
	// A malformed escape, which Go's client will not send.
	conn, err := net.DialTimeout("tcp", strings.TrimPrefix(e.base, "http://"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(conn, "GET /api/device/instance/a%%zzb/detail HTTP/1.1\r\nHost: test\r\nX-Access-Token: %s\r\n\r\n", e.token)
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	if r := e.envelope("GET", "/api/device/instance/a%zzb/detail", res); r.HTTPStatus != 400 || r.Code != "illegal_argument" ||
		!strings.Contains(r.Message, "path") || !strings.Contains(r.Message, "%") {
		t.Errorf("GET /api/device/instance/a%%zzb/detail: want 400 illegal_argument naming the path, got %d %s", r.HTTPStatus, r.raw)
	}
	// Text that is fine passes: a space, an escaped UTF-8 character.
	e.ok("GET", "/api/authorize/me?x=%20%C3%A9&y=a+b", nil, nil)
	e.fails("GET", "/api/device-product/%C3%A9t%C3%A9", nil, 404, "not_found")
}

// TestHardeningDeviceKeys: a device key a user chooses is 16 to 128
// characters; a refusal names configuration.secureKey and changes
// nothing. Generated keys are 128-bit random (32 hex digits), and echoing
// the masked key back keeps the stored one.
func TestHardeningDeviceKeys(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.createProduct("p", "P", nil)
	conf := func(key string) map[string]any { return map[string]any{"secureKey": key} }
	for _, key := range []string{"a", "0123456789abcde", strings.Repeat("k", 129)} {
		r := e.fails("POST", "/api/device/instance", map[string]any{"id": "short", "name": "S", "productId": "p", "configuration": conf(key)}, 400, "illegal_argument")
		if !strings.Contains(r.Message, "configuration.secureKey") || !strings.Contains(r.Message, "16") {
			t.Errorf("create with a %d-character key: message %q", len(key), r.Message)
		}
	}
	if n := e.countRows("devices"); n != 0 {
		t.Fatalf("refused keys created %d devices", n)
	}
	for _, key := range []string{"0123456789abcdef", strings.Repeat("k", 128)} {
		id := fmt.Sprintf("k%d", len(key))
		if d := e.createDevice(id, "K", "p", map[string]any{"configuration": conf(key)}); d["configuration"].(map[string]any)["secureKey"] != key {
			t.Fatalf("create with a %d-character key: %v", len(key), d["configuration"])
		}
	}
	d := e.createDevice("gen", "G", "p", nil)
	if k, _ := d["configuration"].(map[string]any)["secureKey"].(string); len(k) != 32 || strings.Trim(k, "0123456789abcdef") != "" {
		t.Fatalf("generated key %q: want 32 hex digits", k)
	}
	var stored string
	keyOf := func() string {
		t.Helper()
		if err := e.store.DB().Get(&stored, `SELECT secure_key FROM devices WHERE id = 'k16'`); err != nil {
			t.Fatal(err)
		}
		return stored
	}
	for _, key := range []string{"b", "short-key", strings.Repeat("k", 129)} {
		r := e.fails("PUT", "/api/device/instance/k16", map[string]any{"configuration": conf(key)}, 400, "illegal_argument")
		if !strings.Contains(r.Message, "configuration.secureKey") {
			t.Errorf("update with a %d-character key: message %q", len(key), r.Message)
		}
	}
	if keyOf() != "0123456789abcdef" {
		t.Fatalf("refused updates changed the key to %q", stored)
	}
	e.ok("PUT", "/api/device/instance/k16", map[string]any{"name": "K2", "configuration": conf("******")}, nil)
	e.ok("PUT", "/api/device/instance/k16", map[string]any{"configuration": conf("")}, nil)
	if keyOf() != "0123456789abcdef" {
		t.Fatalf("a masked or empty key changed the key to %q", stored)
	}
	e.ok("PUT", "/api/device/instance/k16", map[string]any{"configuration": conf("fedcba9876543210")}, nil)
	if keyOf() != "fedcba9876543210" {
		t.Fatalf("key after update: %q", stored)
	}
}

// TestHardeningIDs: product and device ids are 1 to 64 of A-Z a-z 0-9 _ -
// . : but never "." or ".." alone (a client or proxy resolves such a path
// segment away); percent-encoded path parameters are decoded, on every
// route that takes an id.
func TestHardeningIDs(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, func(store *meta.Store, deps *api.Deps) { deps.Models = store })
	for _, id := range []string{".", ".."} {
		r := e.fails("POST", "/api/device/product", map[string]any{"id": id, "name": "N", "classifiedId": "c", "modelFrom": "custom",
			"accessId": "a", "deviceType": "device"}, 400, "illegal_argument")
		if !strings.HasPrefix(r.Message, "id:") {
			t.Errorf("product id %q: message %q does not name id", id, r.Message)
		}
	}
	e.createProduct("pr:od", "P", nil)
	for _, id := range []string{".", ".."} {
		r := e.fails("POST", "/api/device/instance", map[string]any{"id": id, "name": "N", "productId": "pr:od"}, 400, "illegal_argument")
		if !strings.HasPrefix(r.Message, "id:") {
			t.Errorf("device id %q: message %q does not name id", id, r.Message)
		}
	}
	if n := e.countRows("devices"); n != 0 {
		t.Fatalf("refused ids created %d devices", n)
	}
	// What was accepted before still is.
	for _, id := range []string{"a.b", "...", ".x", "x..", "A-Z_0.9:x"} {
		e.createDevice(id, "N", "pr:od", nil)
	}
	e.createDevice("co:lon", "Colon", "pr:od", nil)

	var p map[string]any
	e.ok("GET", "/api/device-product/pr%3Aod", nil, &p)
	if p["id"] != "pr:od" {
		t.Fatalf("product by its encoded id: %v", p["id"])
	}
	e.ok("POST", "/api/device-product/pr%3aod/deploy", nil, nil)
	for _, path := range []string{"/api/device/instance/co%3Alon/detail", "/api/device/instance/co%3alon", "/api/device/instance/%63o:lon/detail"} {
		var d map[string]any
		e.ok("GET", path, nil, &d)
		if d["id"] != "co:lon" {
			t.Fatalf("GET %s: device %v", path, d["id"])
		}
	}
	var d map[string]any
	e.ok("PUT", "/api/device/instance/co%3Alon", map[string]any{"name": "Renamed"}, &d)
	if d["id"] != "co:lon" || d["name"] != "Renamed" {
		t.Fatalf("PUT by the encoded id: %v %v", d["id"], d["name"])
	}
	e.ok("PUT", "/api/device/instance/co%3Alon/metadata", `{"properties":[{"id":"t","name":"T","valueType":{"type":"int"}}]}`, nil)
	e.ok("DELETE", "/api/device/instance/co%3Alon/metadata", nil, nil)
	e.ok("POST", "/api/device/instance/co%3Alon/deploy", nil, nil)
	e.ok("POST", "/api/device/instance/co%3Alon/secret", nil, nil)
	e.ok("POST", "/api/device/instance/co%3Alon/undeploy", nil, nil)
	e.ok("DELETE", "/api/device/instance/co%3Alon", nil, nil)
	e.fails("GET", "/api/device/instance/co:lon/detail", nil, 404, "not_found")
	e.ok("DELETE", "/api/device/instance/a%2Eb", nil, nil)
	e.fails("GET", "/api/device/instance/%2E%2E/detail", nil, 404, "not_found")
}

// liveRaw opens GET /api/live?query on a raw connection and reads up to
// the stream's first comment.
func liveRaw(t *testing.T, base, query string) (*net.TCPConn, *bufio.Reader) {
	t.Helper()
	c, err := net.DialTimeout("tcp", strings.TrimPrefix(base, "http://"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	conn := c.(*net.TCPConn)
	t.Cleanup(func() { conn.Close() })
	if _, err := fmt.Fprintf(conn, "GET /api/live?%s HTTP/1.1\r\nHost: test\r\n\r\n", query); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	r := bufio.NewReader(conn)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("reading the stream's start: %v", err)
		}
		if strings.HasPrefix(line, ": ping") {
			return conn, r
		}
	}
}

// TestHardeningLiveClientGone: a client that leaves, closing its
// connection or only its sending side, frees its subscription and its
// connection at once, not at the next heartbeat's failed write.
func TestHardeningLiveClientGone(t *testing.T) {
	t.Parallel()
	product := "lg" + liveSuffix()
	dev := product + "-1"
	var hub *live.Hub
	e := newEnvWith(t, func(store *meta.Store, deps *api.Deps) {
		addLiveDevices(t, store, product, dev)
		var err error
		if hub, err = live.New(context.Background(), live.Options{MaxSubscribers: 2}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(hub.Close)
		deps.Live, deps.LiveDevices = hub, store
	})
	q := liveQuery(e.token, []string{dev})
	closed, _ := liveRaw(t, e.base, q)
	half, r := liveRaw(t, e.base, q)
	if n := hub.Subscribers(); n != 2 {
		t.Fatalf("%d subscriptions, want 2", n)
	}
	left := time.Now()
	closed.Close()
	if !testkit.Within(time.Second, func() bool { return hub.Subscribers() == 1 }) {
		t.Fatalf("%d subscriptions 1 s after a client closed its connection", hub.Subscribers())
	}
	t.Logf("subscription freed %s after the client closed", time.Since(left).Round(time.Millisecond))
	// The slot is free for another client.
	openLiveWithin(t, e.base, q, "", 3*time.Second)
	if !testkit.Within(time.Second, func() bool { return hub.Subscribers() == 2 }) {
		t.Fatalf("%d subscriptions, want 2", hub.Subscribers())
	}

	left = time.Now()
	if err := half.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	_ = half.SetReadDeadline(time.Now().Add(time.Second))
	if _, err := io.Copy(io.Discard, r); err != nil {
		t.Fatalf("the server kept the connection of a client that left 1 s ago: %v", err)
	}
	t.Logf("connection closed by the server %s after the client's half-close", time.Since(left).Round(time.Millisecond))
	if !testkit.Within(time.Second, func() bool { return hub.Subscribers() == 1 }) {
		t.Fatalf("%d subscriptions after the client left", hub.Subscribers())
	}
}

// TestHardeningNosniff: every response, of every kind, says
// X-Content-Type-Options: nosniff, so that no browser reads a JSON
// answer (which may echo client text) as HTML or script.
func TestHardeningNosniff(t *testing.T) {
	t.Parallel()
	product := "ns" + liveSuffix()
	dev := product + "-1"
	e := newEnvWith(t, func(store *meta.Store, deps *api.Deps) {
		addLiveDevices(t, store, product, dev)
		deps.Live, deps.LiveDevices = newLiveHub(t), store
	})
	for _, c := range []struct {
		method, path, contentType, body, token string
		status                                 int
	}{
		{"POST", "/api/authorize/login", "application/json", `{"username":"admin","password":"admin123"}`, "", 200},
		{"POST", "/api/authorize/login", "application/json", `{"username":"admin","password":"wrong-pass"}`, "", 400},
		{"POST", "/api/authorize/login", "text/plain", `{}`, "", 415},
		{"GET", "/api/authorize/me", "", "", e.token, 200},
		{"GET", "/api/authorize/me", "", "", "", 401},
		{"GET", "/api/device-product/nope", "", "", e.token, 404},
		{"GET", "/api/nothing-here", "", "", "", 401},
		{"GET", "/api/nothing-here", "", "", e.token, 404},
		{"PUT", "/healthz", "", "", "", 404},
		{"GET", "/api/authorize/me?x=%00", "", "", e.token, 400},
		{"POST", "/api/device-product/_query/", "application/json", `{"pageSize":"x"}`, e.token, 400},
		{"GET", "/healthz", "", "", "", 200},
		{"GET", "/readyz", "", "", "", 200},
		{"GET", "/metrics", "", "", "", 200},
		{"GET", "/openapi.json", "", "", "", 200},
		{"GET", "/docs", "", "", "", 200},
		{"GET", "/", "", "", "", 200},
		{"GET", "/assets/app.js", "", "", "", 200},
		{"GET", "/api/live?deviceId=nope", "", "", e.token, 400},
		{"HEAD", "/api/live?deviceId=" + dev, "", "", e.token, 200},
		{"OPTIONS", "/api/authorize/me", "", "", "", 401},
	} {
		req, err := http.NewRequest(c.method, e.base+c.path, strings.NewReader(c.body))
		if err != nil {
			t.Fatal(err)
		}
		if c.contentType != "" {
			req.Header.Set("Content-Type", c.contentType)
		}
		if c.token != "" {
			req.Header.Set("X-Access-Token", c.token)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		if res.StatusCode != c.status || res.Header.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("%s %s: %d, X-Content-Type-Options %q; want %d and nosniff", c.method, c.path, res.StatusCode,
				res.Header.Get("X-Content-Type-Options"), c.status)
		}
	}
	s := openLiveWithin(t, e.base, liveQuery(e.token, []string{dev}), "", 3*time.Second)
	if v := s.header.Get("X-Content-Type-Options"); v != "nosniff" {
		t.Errorf("GET /api/live stream: X-Content-Type-Options %q", v)
	}
}

// TestHardeningReservedSecureIDs: a device's secureId (its broker
// username; the device id when none is given) never names devicehub's
// own broker login (meta.Options.ReservedLogins, default "devicehub"),
// "admin" or a name starting with "$", in any case: refused with 400
// naming configuration.secureId at create and update, and nothing changes.
func TestHardeningReservedSecureIDs(t *testing.T) {
	t.Parallel()
	mo := meta.DefaultOptions()
	mo.DSN = metatest.NewDatabase(t)
	mo.ReservedLogins = []string{"svc-login"}
	store, err := meta.Open(context.Background(), mo)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	if err := store.EnsureAdmin(context.Background(), "admin123"); err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, base: serveStore(t, api.DefaultOptions(), store, nil), store: store}
	e.token = e.login("admin", "admin123")
	e.createProduct("p", "P", nil)
	e.createDevice("d", "D", "p", nil)
	reserved := []string{"svc-login", "SVC-Login", "admin", "Admin", "$SYS", "$share", "$"}
	for _, sid := range reserved {
		r := e.fails("POST", "/api/device/instance", map[string]any{"id": "x", "name": "X", "productId": "p",
			"configuration": map[string]any{"secureId": sid}}, 400, "illegal_argument")
		if !strings.Contains(r.Message, "configuration.secureId") || !strings.Contains(r.Message, "reserved") {
			t.Errorf("create with secureId %q: message %q", sid, r.Message)
		}
		r = e.fails("PUT", "/api/device/instance/d", map[string]any{"configuration": map[string]any{"secureId": sid}}, 400, "illegal_argument")
		if !strings.Contains(r.Message, "configuration.secureId") {
			t.Errorf("update to secureId %q: message %q", sid, r.Message)
		}
	}
	// A device id is its secureId when none is given.
	for _, id := range []string{"svc-login", "admin"} {
		r := e.fails("POST", "/api/device/instance", map[string]any{"id": id, "name": "X", "productId": "p"}, 400, "illegal_argument")
		if !strings.Contains(r.Message, "configuration.secureId") {
			t.Errorf("create device %q without a secureId: message %q", id, r.Message)
		}
	}
	if n := e.countRows("devices"); n != 1 {
		t.Fatalf("%d devices, want 1", n)
	}
	if sid := e.deviceDetail("d")["configuration"].(map[string]any)["secureId"]; sid != "d" {
		t.Fatalf("refused updates changed the secureId to %v", sid)
	}
	// A device named so may exist under another secureId; names near the
	// reserved ones are fine.
	e.createDevice("admin", "A", "p", map[string]any{"configuration": map[string]any{"secureId": "admin-device"}})
	for _, sid := range []string{"devicehub-meter", "admins", "a$b"} {
		e.ok("PUT", "/api/device/instance/d", map[string]any{"configuration": map[string]any{"secureId": sid}}, nil)
	}

	// The default store reserves devicehub, the default service login.
	d := newEnv(t)
	d.createProduct("p", "P", nil)
	r := d.fails("POST", "/api/device/instance", map[string]any{"name": "X", "productId": "p",
		"configuration": map[string]any{"secureId": "devicehub"}}, 400, "illegal_argument")
	if !strings.Contains(r.Message, "configuration.secureId") {
		t.Errorf("secureId devicehub: message %q", r.Message)
	}
}
