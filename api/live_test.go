package api_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"devicehub/api"
	"devicehub/api/live"
	"devicehub/bench/testkit"
	"devicehub/ingest"
	"devicehub/ingest/link"
	"devicehub/ingest/mqtttest"
	"devicehub/meta"
	"devicehub/meta/metatest"
	"devicehub/tsdb"
	"devicehub/tsdb/tsdbtest"
)

func liveSuffix() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// liveInstance is one devicehub instance's live-update path on the
// shared broker and the test's databases: a hub (on the PostgreSQL bus
// when bus is set), its presence view, and, when ingesting, an ingest
// pipeline of the test's product feeding it.
type liveInstance struct {
	hub *live.Hub
}

func startLiveInstance(t *testing.T, store *meta.Store, ch *tsdb.DB, product string, opt live.Options, bus, ingesting bool) *liveInstance {
	t.Helper()
	return startLiveInstanceFlush(t, store, ch, product, opt, bus, ingesting, 50*time.Millisecond)
}

// startLiveInstanceFlush is startLiveInstance whose ingest inserts every
// flush.
func startLiveInstanceFlush(t *testing.T, store *meta.Store, ch *tsdb.DB, product string, opt live.Options, bus, ingesting bool, flush time.Duration) *liveInstance {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	quiet := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	opt.Logger = quiet
	if bus {
		b, err := live.NewPGBus(storeDSN(t, store))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		opt.Bus = b
	}
	hub, err := live.New(ctx, opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(hub.Close)
	popt := link.DefaultPresenceOptions()
	popt.BrokerURL, popt.ClientID, popt.ProductIDs, popt.Logger = brokerURL(), "live-test-"+liveSuffix(), []string{product}, quiet
	presence, err := link.NewPresence(ctx, popt, store)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(presence.Close)
	presence.OnPresenceChange(hub.PresenceChanged)
	if ingesting {
		iopt := ingest.DefaultOptions()
		iopt.BrokerURL, iopt.ClientID, iopt.ShareGroup = brokerURL(), "live-test-"+liveSuffix(), "g"+liveSuffix()
		iopt.ProductIDs, iopt.Logger, iopt.Live = []string{product}, quiet, hub
		iopt.Writer.FlushInterval, iopt.StateFlushInterval = flush, 50*time.Millisecond
		in, err := ingest.New(ctx, iopt, ch, store, store)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_ = in.Close(ctx)
			for _, id := range ingest.SessionIDs(iopt) { // its persistent sessions
				c := mqtt.NewClient(mqtttest.ServiceOptions(brokerURL(), id).SetCleanSession(true))
				if tok := c.Connect(); tok.WaitTimeout(5*time.Second) && tok.Error() == nil {
					c.Disconnect(0)
				}
			}
		})
	}
	return &liveInstance{hub: hub}
}

// storeDSN is the DSN of the store's database on the test server.
func storeDSN(t *testing.T, store *meta.Store) string {
	t.Helper()
	var name string
	if err := store.DB().Get(&name, `SELECT current_database()`); err != nil {
		t.Fatal(err)
	}
	return metatest.ServerDSN() + "/" + name + "?sslmode=disable"
}

// otherStore opens a second Store on store's database: another
// instance's, closed when the test ends.
func otherStore(t *testing.T, store *meta.Store) *meta.Store {
	t.Helper()
	mo := meta.DefaultOptions()
	mo.DSN, mo.MaxOpenConns = storeDSN(t, store), 4
	other, err := meta.Open(context.Background(), mo)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Close() })
	return other
}

// addLiveDevices adds a deployed product and its devices (offline).
func addLiveDevices(t *testing.T, store *meta.Store, product string, ids ...string) {
	t.Helper()
	if _, err := store.DB().Exec(`INSERT INTO products (id, name, device_type, state) VALUES ($1, $1, 'device', 1) ON CONFLICT DO NOTHING`, product); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		if _, err := store.DB().Exec(`INSERT INTO devices (id, name, product_id, state) VALUES ($1, $1, $2, 'offline')`, id, product); err != nil {
			t.Fatal(err)
		}
	}
}

// sseEvent is one server-sent event.
type sseEvent struct {
	Name, Data string
	At         time.Time // received
}

// sseStream reads a live stream on a goroutine of its own, always, so it
// is a subscriber that keeps up.
type sseStream struct {
	t      *testing.T
	header http.Header
	events chan sseEvent
	pings  chan struct{}
	body   io.Closer
}

var liveClient = &http.Client{Transport: &http.Transport{}}

// openLive opens GET /api/live?query with token in the X-Access-Token
// header (when not empty) and requires a stream.
func openLive(t *testing.T, base, query, token string) *sseStream {
	t.Helper()
	return openLiveWithin(t, base, query, token, 30*time.Second)
}

// readSSE parses an event stream into events (and comments into pings)
// until it ends.
func readSSE(r *bufio.Reader, events chan<- sseEvent, pings chan<- struct{}) {
	defer close(events)
	var ev sseEvent
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		line = strings.TrimSuffix(line, "\n")
		switch {
		case line == "":
			if ev.Name != "" || ev.Data != "" {
				ev.At = time.Now()
				events <- ev
			}
			ev = sseEvent{}
		case strings.HasPrefix(line, ":"):
			select {
			case pings <- struct{}{}:
			default:
			}
		case strings.HasPrefix(line, "event: "):
			ev.Name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			ev.Data = strings.TrimPrefix(line, "data: ")
		}
	}
}

// next returns the next event, failing after d.
func (s *sseStream) next(d time.Duration) sseEvent {
	s.t.Helper()
	select {
	case ev, ok := <-s.events:
		if !ok {
			s.t.Fatal("the stream ended")
		}
		return ev
	case <-time.After(d):
		s.t.Fatalf("no event within %s", d)
	}
	return sseEvent{}
}

// quiet fails if an event arrives within d.
func (s *sseStream) quiet(d time.Duration) {
	s.t.Helper()
	select {
	case ev := <-s.events:
		s.t.Fatalf("unexpected event %s %s", ev.Name, ev.Data)
	case <-time.After(d):
	}
}

func liveQuery(token string, devices []string, props ...string) string {
	q := url.Values{"deviceId": devices}
	if len(props) > 0 {
		q["property"] = props
	}
	if token != "" {
		q.Set("token", token)
	}
	return q.Encode()
}

// TestLiveValuesAndState: values a device publishes over MQTT and its
// online/offline changes reach subscribers as events, each subscriber's
// devices and properties only; the token works as header and as query
// parameter.
func TestLiveValuesAndState(t *testing.T) {
	t.Parallel()
	product := "lp" + liveSuffix()
	d1, d2 := product+"-1", product+"-2"
	ch := tsdbtest.NewDB(t, time.UTC)
	var inst *liveInstance
	e := newEnvWith(t, func(store *meta.Store, deps *api.Deps) {
		addLiveDevices(t, store, product, d1, d2)
		inst = startLiveInstance(t, store, ch, product, live.Options{}, false, true)
		deps.Live, deps.LiveDevices = inst.hub, store
	})
	tempOnly := openLive(t, e.base, liveQuery(e.token, []string{d1}, "temp"), "") // the browser form
	both := openLive(t, e.base, liveQuery("", []string{d1, d2, d1}), e.token)     // a duplicate id counts once
	if ct := both.header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("Content-Type %q", ct)
	}

	gw := mqtttest.Gateway(t, brokerURL())
	dev := mqtttest.ConnectDevice(t, brokerURL(), "live-dev-"+liveSuffix(), gw)
	at := time.Now().Add(-time.Second).UnixMilli()
	published := time.Now()
	dev.MustPublish(t, "/"+product+"/"+d1+"/online", 1, "")
	dev.MustPublish(t, "/"+product+"/"+d1+"/properties/report", 1,
		fmt.Sprintf(`{"timestamp":%d,"properties":{"temp":21.5,"mode":"eco","on":true,"cfg":{"a":[1,2]}}}`, at))
	dev.MustPublish(t, "/"+product+"/"+d2+"/properties/report", 1, fmt.Sprintf(`{"timestamp":%d,"properties":{"temp":7}}`, at))
	dev.MustPublish(t, "/"+product+"/"+d1+"/offline", 1, "")

	// A property event as text, and a state event without its timestamp.
	prop := func(d, p, v string) string {
		return fmt.Sprintf(`property {"deviceId":"%s","productId":"%s","property":"%s","value":%s,"timestamp":%d,"stored":false}`, d, product, p, v, at)
	}
	state := func(d, s string) string { return fmt.Sprintf(`state {"deviceId":"%s","state":"%s"`, d, s) }
	for _, c := range []struct {
		name string
		s    *sseStream
		want []string
	}{
		{"d1, property temp (query token)", tempOnly, []string{state(d1, "online"), prop(d1, "temp", "21.5"), state(d1, "offline")}},
		{"d1 and d2, every property (header token)", both, []string{state(d1, "online"), prop(d1, "temp", "21.5"), prop(d1, "mode", `"eco"`),
			prop(d1, "on", "true"), prop(d1, "cfg", `{"a":[1,2]}`), prop(d2, "temp", "7"), state(d1, "offline")}},
	} {
		// States come from the presence client, values from ingest: the
		// two paths interleave in any order, each in its own order.
		var got []string
		var last time.Time
		for range c.want {
			ev := c.s.next(10 * time.Second)
			got = append(got, ev.Name+" "+ev.Data)
			last = ev.At
		}
		var states, props, wantStates, wantProps []string
		for _, g := range got {
			if strings.HasPrefix(g, "state ") {
				var se live.StateEvent
				if err := json.Unmarshal([]byte(strings.TrimPrefix(g, "state ")), &se); err != nil || se.Timestamp < published.UnixMilli()-1000 {
					t.Errorf("%s: state event %s: %v", c.name, g, err)
				}
				states = append(states, g)
			} else {
				props = append(props, g)
			}
		}
		for _, w := range c.want {
			if strings.HasPrefix(w, "state ") {
				wantStates = append(wantStates, w)
			} else {
				wantProps = append(wantProps, w)
			}
		}
		sort.Strings(props) // one report's values are stored together; their order is not part of the contract
		sort.Strings(wantProps)
		ok := len(states) == len(wantStates) && strings.Join(props, "\n") == strings.Join(wantProps, "\n")
		for i := range states {
			ok = ok && strings.HasPrefix(states[i], wantStates[i])
		}
		if !ok {
			t.Errorf("%s:\n got\n  %s\nwant\n  %s", c.name, strings.Join(got, "\n  "), strings.Join(c.want, "\n  "))
		}
		c.s.quiet(300 * time.Millisecond)
		t.Logf("%s: last event %s after the first publish", c.name, last.Sub(published).Round(time.Millisecond))
	}
}

// liveRefused requests GET /api/live?query (token in the header when not
// empty) and requires a refusal envelope with status and code whose
// message holds each of msgs.
func liveRefused(t *testing.T, e *env, name, query, token string, status int, code string, msgs ...string) {
	t.Helper()
	req, _ := http.NewRequest("GET", e.base+"/api/live?"+query, nil)
	if token != "" {
		req.Header.Set("X-Access-Token", token)
	}
	res, err := liveClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode == 200 {
		t.Errorf("%s: the stream started; want %d %s", name, status, code)
		return
	}
	r := e.envelope("GET", "/api/live", res)
	if r.HTTPStatus != status || r.Code != code {
		t.Errorf("%s: %d %s %q; want %d %s", name, r.HTTPStatus, r.Code, r.Message, status, code)
	}
	for _, m := range msgs {
		if !strings.Contains(r.Message, m) {
			t.Errorf("%s: message %q does not say %q", name, r.Message, m)
		}
	}
}

// TestLiveRefusals: every refusal comes before the stream, as the usual
// envelope; each case would open a stream without its rule.
func TestLiveRefusals(t *testing.T) {
	t.Parallel()
	product := "lr" + liveSuffix()
	var ids []string
	for i := range 101 { // of 64 characters: 100 of them and 100 properties fit the request head
		ids = append(ids, fmt.Sprintf("%s%04d", strings.Repeat("r", 60), i))
	}
	e := newEnvWith(t, func(store *meta.Store, deps *api.Deps) {
		addLiveDevices(t, store, product, ids...)
		hub, err := live.New(context.Background(), live.Options{MaxSubscribers: 1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(hub.Close)
		deps.Live, deps.LiveDevices = hub, store
	})
	gone := e.login("admin", "admin123")
	e.do("POST", "/api/authorize/logout", nil, gone)
	long := strings.Repeat("p", 65)
	props := make([]string, 101)
	for i := range props {
		props[i] = "p" + strconv.Itoa(i)
	}
	d := ids[:1]
	for _, c := range []struct {
		name, query, header string
		status              int
		code                string
		msgs                []string
	}{
		{"no token", liveQuery("", d), "", 401, "unauthorized", nil},
		{"bad header token", liveQuery("", d), "nope", 401, "unauthorized", nil},
		{"bad query token", liveQuery("nope", d), "", 401, "unauthorized", nil},
		{"logged-out token", liveQuery(gone, d), "", 401, "unauthorized", nil},
		{"the header wins over the query", liveQuery(e.token, d), "nope", 401, "unauthorized", nil},
		{"no deviceId", liveQuery(e.token, nil), "", 400, "illegal_argument", []string{"deviceId", "required"}},
		{"empty deviceId", "deviceId=&token=" + e.token, "", 400, "illegal_argument", []string{"deviceId", "empty"}},
		{"101 devices", liveQuery(e.token, ids), "", 400, "illegal_argument", []string{"deviceId", "at most 100"}},
		{"unknown device", liveQuery(e.token, []string{ids[0], "nosuch"}), "", 400, "illegal_argument", []string{"deviceId", `unknown device "nosuch"`}},
		{"deviceId too long", liveQuery(e.token, []string{strings.Repeat("d", 65)}), "", 400, "illegal_argument", []string{"deviceId", "longer than 64"}},
		{"empty property", liveQuery(e.token, d, ""), "", 400, "illegal_argument", []string{"property", "empty"}},
		{"property too long", liveQuery(e.token, d, long), "", 400, "illegal_argument", []string{"property", "longer than 64"}},
		{"101 properties", liveQuery(e.token, d, props...), "", 400, "illegal_argument", []string{"property", "at most 100"}},
		{"property not UTF-8", liveQuery(e.token, d) + "&property=%ff", "", 400, "illegal_argument", []string{"property", "UTF-8"}},
	} {
		liveRefused(t, e, c.name, c.query, c.header, c.status, c.code, c.msgs...)
	}

	// 100 devices (one named twice) and 100 properties are within the
	// limits; that subscription takes the instance's only slot.
	s := openLive(t, e.base, liveQuery(e.token, append(ids[:100:100], ids[0]), props[:100]...), "")
	liveRefused(t, e, "no slot left", liveQuery(e.token, d), "", 503, "too_many_requests", "retry later")
	s.body.Close()
}

// stallConn opens GET /api/live?query on a raw connection with a small
// receive buffer and reads nothing until the test says so.
func stallConn(t *testing.T, base, query string) net.Conn {
	t.Helper()
	d := net.Dialer{Timeout: 5 * time.Second, Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
		if err != nil {
			return err
		}
		return serr
	}}
	conn, err := d.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if _, err := fmt.Fprintf(conn, "GET /api/live?%s HTTP/1.1\r\nHost: test\r\n\r\n", query); err != nil {
		t.Fatal(err)
	}
	return conn
}

// TestLiveStalledSubscriber: a subscriber that stops reading slows
// nothing: every value is stored and another subscriber of the same
// device gets every one, while the stalled one's queue stays at its
// bound. Once it reads again it gets the events that were in flight, a
// skipped event counting the rest and the newest events, at most a
// queue's worth: nothing is lost without being counted.
func TestLiveStalledSubscriber(t *testing.T) {
	t.Parallel()
	const (
		n          = 3000
		queueBytes = 512 << 10 // room for a flush's worth for the reader
		valueLen   = 1000
	)
	product := "ls" + liveSuffix()
	dev := product + "-1"
	ch := tsdbtest.NewDB(t, time.UTC)
	var inst *liveInstance
	e := newEnvWith(t, func(store *meta.Store, deps *api.Deps) {
		addLiveDevices(t, store, product, dev)
		inst = startLiveInstance(t, store, ch, product, live.Options{Queue: 1024, QueueBytes: queueBytes}, false, true)
		deps.Live, deps.LiveDevices = inst.hub, store
	})
	stalled := stallConn(t, e.base, liveQuery(e.token, []string{dev}))
	reader := openLive(t, e.base, liveQuery(e.token, []string{dev}), "")
	testkit.Eventually(t, 5*time.Second, "the stalled subscription started", func() bool { return inst.hub.Subscribers() >= 2 })

	// n reports of a 1 KB value, 1,000 a second: far more than the stalled
	// connection's socket buffers and queue hold.
	gw := mqtttest.Gateway(t, brokerURL())
	pub := mqtttest.ConnectDevice(t, brokerURL(), "live-dev-"+liveSuffix(), gw)
	pad := strings.Repeat("x", valueLen)
	start := time.Now()
	for i := range n {
		tok := pub.Publish("/"+product+"/"+dev+"/properties/report", 0, false, fmt.Sprintf(`{"properties":{"v":"%05d%s"}}`, i, pad))
		if i%50 == 49 {
			tok.Wait()
			time.Sleep(50 * time.Millisecond) // pacing: 1,000 a second, not an assertion
		}
	}
	var stored uint64
	testkit.Eventually(t, 30*time.Second, fmt.Sprintf("all %d values stored with a stalled subscriber", n), func() bool {
		if err := ch.Conn().QueryRow(context.Background(), "SELECT count() FROM device_property WHERE device_id = ?", dev).Scan(&stored); err != nil {
			t.Fatal(err)
		}
		return stored >= n
	})
	if stored != n {
		t.Fatalf("%d values stored, %d published", stored, n)
	}
	t.Logf("%d values published and stored in %s", n, time.Since(start).Round(time.Millisecond))

	// The reader gets all of them, in order, nothing skipped.
	for i := range n {
		ev := reader.next(10 * time.Second)
		if ev.Name != "property" || !strings.Contains(ev.Data, fmt.Sprintf(`"value":"%05d`, i)) {
			t.Fatalf("reader event %d: %s %.80s", i, ev.Name, ev.Data)
		}
	}

	// The stalled subscriber reads now.
	_ = stalled.SetReadDeadline(time.Now().Add(20 * time.Second))
	res, err := http.ReadResponse(bufio.NewReader(stalled), nil)
	if err != nil || res.StatusCode != 200 {
		t.Fatalf("stalled subscriber's response: %v %v", res, err)
	}
	events := make(chan sseEvent, n+10)
	go readSSE(bufio.NewReader(res.Body), events, make(chan struct{}, 100))
	var values, afterSkip, skipEvents int
	var skipped uint64
	for values+int(skipped) < n {
		var ev sseEvent
		select {
		case ev = <-events:
		case <-time.After(10 * time.Second):
			t.Fatalf("stalled subscriber: %d values and %d skipped of %d, then nothing", values, skipped, n)
		}
		switch ev.Name {
		case "property":
			values++
			if skipEvents > 0 {
				afterSkip++
			}
		case "skipped":
			var s live.SkippedEvent
			if err := json.Unmarshal([]byte(ev.Data), &s); err != nil || s.Count == 0 {
				t.Fatalf("skipped event %q: %v", ev.Data, err)
			}
			skipped += s.Count
			skipEvents++
		default:
			t.Fatalf("stalled subscriber: event %q", ev.Name)
		}
	}
	t.Logf("stalled subscriber: %d values in flight, %d skipped (in %d events), then %d queued values", values-afterSkip, skipped, skipEvents, afterSkip)
	if skipped == 0 || values+int(skipped) != n {
		t.Fatalf("stalled subscriber: %d values + %d skipped, want %d with some skipped", values, skipped, n)
	}
	if maxQueued := queueBytes/(valueLen+100) + 1; afterSkip > maxQueued {
		t.Fatalf("%d values queued after the skip: its queue held more than QueueBytes (%d values)", afterSkip, maxQueued)
	}
}

// TestLiveAcrossInstances: a value stored by instance a's ingest reaches
// a subscriber of instance b, which does not ingest, through the
// PostgreSQL bus; b's own presence view gives the state changes.
func TestLiveAcrossInstances(t *testing.T) {
	t.Parallel()
	product := "lx" + liveSuffix()
	dev := product + "-1"
	ch := tsdbtest.NewDB(t, time.UTC)
	var a, b *liveInstance
	e := newEnvWith(t, func(store *meta.Store, deps *api.Deps) {
		addLiveDevices(t, store, product, dev)
		a = startLiveInstance(t, store, ch, product, live.Options{}, true, true)
		b = startLiveInstance(t, store, ch, product, live.Options{}, true, false)
		deps.Live, deps.LiveDevices = b.hub, store // the HTTP server is b's
	})
	s := openLive(t, e.base, liveQuery(e.token, []string{dev}), "")
	testkit.Eventually(t, 5*time.Second, "a learning that b watches the device", func() bool { return a.hub.Watching(dev) })
	gw := mqtttest.Gateway(t, brokerURL())
	pub := mqtttest.ConnectDevice(t, brokerURL(), "live-dev-"+liveSuffix(), gw)
	published := time.Now()
	pub.MustPublish(t, "/"+product+"/"+dev+"/online", 1, "")
	pub.MustPublish(t, "/"+product+"/"+dev+"/properties/report", 1, `{"properties":{"temp":22.5}}`)
	var gotState, gotValue bool
	for !gotState || !gotValue {
		ev := s.next(10 * time.Second)
		switch {
		case ev.Name == "state" && strings.Contains(ev.Data, `"state":"online"`):
			gotState = true
		case ev.Name == "property" && strings.Contains(ev.Data, `"property":"temp","value":22.5`) && strings.Contains(ev.Data, `"stored":false`):
			gotValue = true
			t.Logf("value decoded by a, received through b after %s", ev.At.Sub(published).Round(time.Millisecond))
		default:
			t.Fatalf("unexpected event %s %s", ev.Name, ev.Data)
		}
	}
}

// TestLivePing: the stream starts with a comment, so the client sees it
// open at once (the 15 s heartbeat is the same comment).
func TestLivePing(t *testing.T) {
	t.Parallel()
	product := "lq" + liveSuffix()
	e := newEnvWith(t, func(store *meta.Store, deps *api.Deps) {
		addLiveDevices(t, store, product, product+"-1")
		hub, err := live.New(context.Background(), live.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(hub.Close)
		deps.Live, deps.LiveDevices = hub, store
	})
	s := openLive(t, e.base, liveQuery(e.token, []string{product + "-1"}), "")
	select {
	case <-s.pings:
	case <-time.After(5 * time.Second):
		t.Fatal("no comment at the start of the stream")
	}
}
