package forward

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/prometheus/client_golang/prometheus"

	"devicehub/bench/testkit"
	"devicehub/ingest/mqttconn"
	"devicehub/ingest/mqtttest"
	"devicehub/meta"
	"devicehub/meta/metatest"
)

func TestMain(m *testing.M) { testkit.Main(m) }

// line as the receiver reads it.
type got struct {
	RuleID     string         `json:"ruleId"`
	Seq        uint64         `json:"seq"`
	ProductID  string         `json:"productId"`
	DeviceID   string         `json:"deviceId"`
	Type       string         `json:"type"`
	EventID    string         `json:"eventId"`
	MessageID  string         `json:"messageId"`
	Time       int64          `json:"time"`
	Received   int64          `json:"received"`
	Properties map[string]any `json:"properties"`
	Data       map[string]any `json:"data"`
}

// receiver is a real HTTP server taking JSON lines, answering status
// (200 unless set), recording what a 2xx answer accepted.
type receiver struct {
	t      *testing.T
	srv    *httptest.Server
	mu     sync.Mutex
	status int
	lines  []got
	reqs   []*http.Request
	bodies [][]byte
	calls  atomic.Int64
}

func newReceiver(t *testing.T) *receiver {
	r := &receiver{t: t, status: 200}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.calls.Add(1)
		body, err := io.ReadAll(req.Body)
		if err != nil {
			// A body cut short (the sender stopped mid-request, as a
			// crash does): not accepted, as a real receiver would not;
			// the sender saw no answer and sends the batch again.
			return
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		w.WriteHeader(r.status)
		if r.status < 200 || r.status > 299 {
			return
		}
		r.reqs, r.bodies = append(r.reqs, req), append(r.bodies, body)
		sc := bufio.NewScanner(bytes.NewReader(body))
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			var g got
			if err := json.Unmarshal(sc.Bytes(), &g); err != nil {
				t.Errorf("a line that is not JSON: %q", sc.Text())
				continue
			}
			r.lines = append(r.lines, g)
		}
	}))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *receiver) set(status int) {
	r.mu.Lock()
	r.status = status
	r.mu.Unlock()
}

func (r *receiver) got() []got {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]got(nil), r.lines...)
}

// distinct messages received (by messageId).
func (r *receiver) distinct() int {
	seen := map[string]bool{}
	for _, g := range r.got() {
		seen[g.DeviceID+"/"+g.MessageID] = true
	}
	return len(seen)
}

// rig: a product in a database of its own, a gateway publishing for its
// devices on a broker, and a forwarder on that broker.
type rig struct {
	t        *testing.T
	ms       *meta.Store
	store    *Store
	product  string
	broker   string
	clientID string
	dir      string
	pub      mqtt.Client
}

func newRig(t *testing.T, broker string, products int) *rig {
	t.Helper()
	g := &rig{t: t, ms: metatest.NewStore(t), product: testkit.RandID("fwd"), broker: broker,
		clientID: testkit.RandID("test-forward-"), dir: t.TempDir()}
	g.store = NewStore(g.ms)
	for i := range products {
		if _, err := g.ms.CreateProduct(context.Background(), meta.NewProduct{ID: g.productN(i), Name: "Meter", ClassifiedID: "c",
			AccessID: "mqtt", ModelFrom: "custom", DeviceType: "device", Metadata: `{"properties":[]}`}, "admin"); err != nil {
			t.Fatal(err)
		}
	}
	gw := mqtttest.Gateway(t, broker)
	o := mqtt.NewClientOptions().AddBroker(broker).SetClientID(testkit.RandID("test-gw-")).SetCleanSession(true).
		SetAutoReconnect(true).SetMaxReconnectInterval(250 * time.Millisecond).SetConnectRetry(true)
	gw(o)
	g.pub = mqtt.NewClient(o)
	if err := mqttconn.WaitToken(g.pub.Connect(), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		g.pub.Disconnect(0)
		c := mqtt.NewClient(mqtttest.ServiceOptions(broker, g.clientID).SetCleanSession(true))
		if c.Connect().WaitTimeout(5*time.Second) && c.IsConnected() {
			c.Disconnect(0)
		}
	})
	return g
}

func (g *rig) productN(i int) string {
	if i == 0 {
		return g.product
	}
	return fmt.Sprintf("%s-%d", g.product, i)
}

func (g *rig) rule(r Rule) Rule {
	g.t.Helper()
	if r.Name == "" {
		r.Name = "rule"
	}
	if r.ProductID == "" {
		r.ProductID = g.product
	}
	r.Enabled = true
	saved, err := g.store.SaveRule(context.Background(), r, "test", true, nil)
	if err != nil {
		g.t.Fatal(err)
	}
	return saved
}

func webhookTo(rcv *receiver, path string) *WebhookSink {
	return &WebhookSink{URL: rcv.srv.URL + path, BatchSize: 100, BatchMs: 20}
}

// forwarder starts one; stop cancels it and waits.
func (g *rig) forwarder(tweak func(*Options), hook func(*Forwarder)) (*Forwarder, func()) {
	g.t.Helper()
	u, p := mqtttest.Service()
	opt := Options{BrokerURL: g.broker, Login: mqttconn.Login{Username: u, Password: p}, ClientID: g.clientID, Dir: g.dir,
		FlushInterval: 10 * time.Millisecond, PollInterval: 100 * time.Millisecond, BackoffMin: 20 * time.Millisecond,
		BackoffMax: 200 * time.Millisecond, Retry: 50 * time.Millisecond, Instance: "test"}
	if tweak != nil {
		tweak(&opt)
	}
	f, err := New(g.ms, opt)
	if err != nil {
		g.t.Fatal(err)
	}
	if hook != nil {
		hook(f)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		f.Run(ctx)
	}()
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); <-done }) }
	g.t.Cleanup(stop)
	testkit.Eventually(g.t, 20*time.Second, "the forwarder subscribed", f.Ready)
	return f, stop
}

func (g *rig) publishTo(product, dev, level, payload string) {
	g.t.Helper()
	if err := mqttconn.WaitToken(g.pub.Publish("/"+product+"/"+dev+"/"+level, 1, false, payload), 10*time.Second); err != nil {
		g.t.Fatal(err)
	}
}

// reports publishes n reports per device, interleaved, messageId
// "<dev>-<i>", property temp = i.
func (g *rig) reports(devs []string, from, n int) {
	g.t.Helper()
	for i := from; i < from+n; i++ {
		for _, d := range devs {
			g.publishTo(g.product, d, "properties/report", fmt.Sprintf(`{"messageId":"%s-%d","properties":{"temp":%d}}`, d, i, i))
		}
	}
}

// inOrder checks that each device's first arrivals are its messages
// 0..n-1 in order, and returns how many lines were repeats.
func inOrder(t *testing.T, lines []got, devs []string, n int) (dups int) {
	t.Helper()
	next := map[string]int{}
	seen := map[string]bool{}
	for _, l := range lines {
		if seen[l.MessageID] {
			dups++
			continue
		}
		seen[l.MessageID] = true
		want := fmt.Sprintf("%s-%d", l.DeviceID, next[l.DeviceID])
		if l.MessageID != want {
			t.Fatalf("device %s: %s arrived where %s was due", l.DeviceID, l.MessageID, want)
		}
		next[l.DeviceID]++
	}
	for _, d := range devs {
		if next[d] != n {
			t.Fatalf("device %s: %d of %d messages arrived", d, next[d], n)
		}
	}
	return dups
}

func (g *rig) status(id string) Status {
	g.t.Helper()
	r, err := g.store.Rule(context.Background(), id, nil)
	if err != nil {
		g.t.Fatal(err)
	}
	if r.Status == nil {
		return Status{}
	}
	return *r.Status
}

// Reports through MQTT reach the webhook in order per device, each once,
// as JSON lines with the rule, a seq, the values and a valid signature;
// the status and the metrics say what was sent.
func TestForwardWebhook(t *testing.T) {
	g := newRig(t, mqtttest.SharedURL(), 1)
	rcv := newReceiver(t)
	w := webhookTo(rcv, "/in")
	w.Headers = map[string]string{"X-Team": "data"}
	r := g.rule(Rule{Webhook: w, Secret: "k1"})
	reg := prometheus.NewRegistry()
	f, _ := g.forwarder(func(o *Options) { o.Registerer = reg }, nil)
	devs := []string{"d1", "d2", "d3"}
	g.reports(devs, 0, 200)
	testkit.Eventually(t, 30*time.Second, "600 messages", func() bool { return len(rcv.got()) >= 600 })
	lines := rcv.got()
	if dups := inOrder(t, lines, devs, 200); dups != 0 {
		t.Fatalf("%d repeats without a failure", dups)
	}
	for i, l := range lines {
		if l.RuleID != r.ID || l.Seq != uint64(i+1) || l.ProductID != g.product || l.Type != TypeProperty || l.Received == 0 {
			t.Fatalf("line %d: %+v", i, l)
		}
		if v, _ := l.Properties["temp"].(float64); fmt.Sprintf("%s-%v", l.DeviceID, v) != l.MessageID {
			t.Fatalf("line %d: temp %v for %s", i, l.Properties["temp"], l.MessageID)
		}
	}
	rcv.mu.Lock()
	req, body := rcv.reqs[0], rcv.bodies[0]
	rcv.mu.Unlock()
	if req.Header.Get("X-Devicehub-Signature") != Sign("k1", body) || Sign("k2", body) == Sign("k1", body) ||
		req.Header.Get("Content-Type") != "application/x-ndjson" || req.Header.Get("X-Team") != "data" {
		t.Fatalf("headers %v", req.Header)
	}
	testkit.Eventually(t, 10*time.Second, "the status", func() bool {
		st := g.status(r.ID)
		return st.Sent == 600 && st.Pending == 0 && st.LagMs == 0 && st.Owner == "test"
	})
	if st, ok := f.Status(r.ID); !ok || st.Sent != 600 {
		t.Fatalf("status %+v", st)
	}
	want := map[string]float64{"devicehub_forward_sent_total": 600, "devicehub_forward_pending_messages": 0,
		"devicehub_forward_lag_seconds": 0, "devicehub_forward_dropped_total": 0, "devicehub_forward_owner": 1}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			v := m.GetGauge().GetValue() + m.GetCounter().GetValue()
			if w, ok := want[mf.GetName()]; ok {
				if v != w {
					t.Errorf("%s = %v, want %v", mf.GetName(), v, w)
				}
				delete(want, mf.GetName())
			}
		}
	}
	if len(want) > 0 {
		t.Errorf("metrics missing: %v", want)
	}
}

// Two instances: only the lock's holder forwards (each message once while
// it runs); when it stops, the other takes over the broker session and
// the spool directory (shared storage), and nothing is lost or reordered.
func TestForwardTwoInstances(t *testing.T) {
	g := newRig(t, mqtttest.SharedURL(), 1)
	rcv := newReceiver(t)
	g.rule(Rule{Webhook: webhookTo(rcv, "/in")})
	a, stopA := g.forwarder(func(o *Options) { o.Instance = "a" }, nil)
	u, p := mqtttest.Service()
	b, err := New(g.ms, Options{BrokerURL: g.broker, Login: mqttconn.Login{Username: u, Password: p}, ClientID: g.clientID, Dir: g.dir,
		FlushInterval: 10 * time.Millisecond, PollInterval: 100 * time.Millisecond, BackoffMin: 20 * time.Millisecond,
		Retry: 50 * time.Millisecond, Instance: "b"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	doneB := make(chan struct{})
	go func() { defer close(doneB); b.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-doneB })
	devs := []string{"d1", "d2"}
	g.reports(devs, 0, 200)
	testkit.Eventually(t, 20*time.Second, "the first half", func() bool { return rcv.distinct() == 400 })
	if !a.Owner() || b.Owner() {
		t.Fatalf("owners: a %v, b %v", a.Owner(), b.Owner())
	}
	if n := len(rcv.got()); n != 400 {
		t.Fatalf("%d lines for 400 messages with one owner", n)
	}
	stopA()
	g.reports(devs, 200, 200)
	testkit.Eventually(t, 20*time.Second, "b owns", b.Owner)
	testkit.Eventually(t, 20*time.Second, "the second half", func() bool { return rcv.distinct() == 800 })
	inOrder(t, rcv.got(), devs, 400)
	var seqs []uint64
	for _, l := range rcv.got() {
		seqs = append(seqs, l.Seq)
	}
	for i := 1; i < len(seqs); i++ {
		if seqs[i] <= seqs[i-1] {
			t.Fatalf("seq %d after %d: b did not continue a's spool", seqs[i], seqs[i-1])
		}
	}
}

// A receiver that is down (refusing connections), answering 503 or
// answering 404: nothing counts as sent, the failures are counted, the
// lag grows; once it answers 2xx the backlog arrives whole and in order.
func TestForwardReceiverDown(t *testing.T) {
	for _, c := range []struct {
		name string
		down func(*receiver)
	}{
		{"404", func(r *receiver) { r.set(http.StatusNotFound) }},
		{"503", func(r *receiver) { r.set(http.StatusServiceUnavailable) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			g := newRig(t, mqtttest.SharedURL(), 1)
			rcv := newReceiver(t)
			c.down(rcv)
			r := g.rule(Rule{Webhook: webhookTo(rcv, "/in")})
			g.forwarder(nil, nil)
			devs := []string{"a", "b"}
			g.reports(devs, 0, 150)
			testkit.Eventually(t, 20*time.Second, "failures counted and lag", func() bool {
				st := g.status(r.ID)
				return st.Failed >= 3 && st.Pending == 300 && st.LagMs > 0 && st.Sent == 0
			})
			if n := len(rcv.got()); n != 0 {
				t.Fatalf("%d messages taken while refused", n)
			}
			rcv.set(http.StatusOK)
			testkit.Eventually(t, 20*time.Second, "the backlog", func() bool { return rcv.distinct() == 300 })
			if dups := inOrder(t, rcv.got(), devs, 150); dups != 0 {
				t.Fatalf("%d repeats", dups)
			}
			testkit.Eventually(t, 10*time.Second, "caught up", func() bool {
				st := g.status(r.ID)
				return st.Pending == 0 && st.LagMs == 0 && st.Sent == 300
			})
		})
	}
	t.Run("closed", func(t *testing.T) {
		g := newRig(t, mqtttest.SharedURL(), 1)
		rcv := newReceiver(t)
		url := rcv.srv.URL
		rcv.srv.Close() // nothing listens: connection refused
		r := g.rule(Rule{Webhook: &WebhookSink{URL: url + "/in", BatchSize: 50, BatchMs: 10}})
		g.forwarder(nil, nil)
		g.reports([]string{"a"}, 0, 100)
		testkit.Eventually(t, 20*time.Second, "failures", func() bool { st := g.status(r.ID); return st.Failed >= 2 && st.Pending == 100 })
		// Back on another port: the rule follows its URL (a sink change).
		rcv2 := newReceiver(t)
		r.Webhook.URL = rcv2.srv.URL + "/in"
		if _, err := g.store.SaveRule(context.Background(), r, "test", false, nil); err != nil {
			t.Fatal(err)
		}
		testkit.Eventually(t, 20*time.Second, "the backlog", func() bool { return rcv2.distinct() == 100 })
		inOrder(t, rcv2.got(), []string{"a"}, 100)
	})
}

// Why nothing is lost and repeats are only of unacknowledged batches,
// broken on purpose: the owner crashes with appends not yet synced (they
// are dropped, as a killed process's buffer is), between the spools'
// sync and the broker acks, and between the sink's acceptance and the
// cursor's save; each time it comes back (the spool reopened from disk,
// the broker session resumed). Every message arrives, first arrivals in
// order per device, and the repeats are at most the messages in flight
// at the crashes.
func TestForwardCrash(t *testing.T) {
	g := newRig(t, mqtttest.SharedURL(), 1)
	rcv := newReceiver(t)
	g.rule(Rule{Webhook: webhookTo(rcv, "/in")})
	var crashes, unacked atomic.Int64
	var armSync, armAck atomic.Bool
	// Acks the client had queued in the moments before a crash may not
	// have reached the broker: those messages are unacknowledged too.
	var mu sync.Mutex
	type flush struct {
		at time.Time
		n  int
	}
	var flushes []flush
	crash := func(n int) {
		mu.Lock()
		defer mu.Unlock()
		crashes.Add(1)
		unacked.Add(int64(n))
		for _, fl := range flushes {
			if time.Since(fl.at) < 200*time.Millisecond {
				unacked.Add(int64(fl.n))
			}
		}
	}
	f, _ := g.forwarder(nil, func(f *Forwarder) {
		f.kill = make(chan struct{}, 1)
		f.onKill = crash
		f.afterSync = func(n int) error {
			if armSync.CompareAndSwap(true, false) {
				crash(n)
				return errCrash
			}
			mu.Lock()
			flushes = append(flushes, flush{time.Now(), n})
			mu.Unlock()
			return nil
		}
		f.beforeAck = func(_ string, n int) error {
			if armAck.CompareAndSwap(true, false) {
				crash(n)
				return errCrash
			}
			return nil
		}
	})
	devs := []string{"d1", "d2", "d3", "d4"}
	// Reports flow until every crash happened (and at least 300 a device).
	done := make(chan struct{})
	var rounds atomic.Int64
	go func() {
		defer close(done)
		for i := 0; i < 300 || crashes.Load() < 5; i++ {
			g.reports(devs, i, 1)
			rounds.Add(1)
			time.Sleep(time.Millisecond)
		}
	}()
	for _, arm := range []*atomic.Bool{nil, &armSync, &armAck, &armSync, &armAck} {
		time.Sleep(150 * time.Millisecond)
		if arm == nil {
			f.kill <- struct{}{}
			continue
		}
		arm.Store(true)
		testkit.Eventually(t, 10*time.Second, "the crash", func() bool { return !arm.Load() })
	}
	<-done
	per := int(rounds.Load())
	testkit.Eventually(t, 30*time.Second, "every message", func() bool { return rcv.distinct() == len(devs)*per })
	dups := inOrder(t, rcv.got(), devs, per)
	sameSeq, newSeq := repeats(rcv.got())
	t.Logf("%d crashes, %d messages unacknowledged at them, %d repeats: %d with their seq (batches sent again), %d with a new seq, of %d the broker redelivered",
		crashes.Load(), unacked.Load(), dups, sameSeq, newSeq, f.redelivered.Load())
	if crashes.Load() != 5 {
		t.Fatalf("%d crashes", crashes.Load())
	}
	if int64(dups) > unacked.Load() {
		t.Fatalf("%d repeats, more than in flight", dups)
	}
	// A message spooled twice came back from the broker, flagged DUP
	// and counted (devicehub_forward_redelivered_total).
	if int64(newSeq) > f.redelivered.Load() {
		t.Fatalf("%d repeats with a new seq, %d redelivered by the broker", newSeq, f.redelivered.Load())
	}
}

// repeats splits the lines whose message arrived before: sent again with
// the seq of its first arrival (a batch whose cursor was not saved), or
// with a new seq (spooled again: redelivered by the broker).
func repeats(lines []got) (sameSeq, newSeq int) {
	first := map[string]uint64{}
	for _, l := range lines {
		k := l.DeviceID + "/" + l.MessageID
		s, ok := first[k]
		switch {
		case !ok:
			first[k] = l.Seq
		case s == l.Seq:
			sameSeq++
		default:
			newSeq++
		}
	}
	return sameSeq, newSeq
}

// The bound: with the receiver refusing, a spool over MaxBytes drops its
// oldest segments, counting their messages; once the receiver answers
// the newest messages arrive, in order, and sent + dropped is every
// message taken. Ingest is never refused.
func TestForwardBound(t *testing.T) {
	g := newRig(t, mqtttest.SharedURL(), 1)
	rcv := newReceiver(t)
	rcv.set(http.StatusServiceUnavailable)
	r := g.rule(Rule{Webhook: webhookTo(rcv, "/in")})
	const bound = 128 << 10
	g.forwarder(func(o *Options) { o.MaxBytes = bound }, nil)
	const n = 3000
	g.reports([]string{"d1"}, 0, n)
	var st Status
	testkit.Eventually(t, 20*time.Second, "every message taken", func() bool {
		st = g.status(r.ID)
		return st.Pending+st.Dropped == n
	})
	if st.Dropped == 0 || st.SpooledBytes > bound+minSegment || st.Sent != 0 {
		t.Fatalf("at the bound: %+v", st)
	}
	rcv.set(http.StatusOK)
	testkit.Eventually(t, 20*time.Second, "caught up", func() bool {
		st = g.status(r.ID)
		return st.Pending == 0 && st.Sent+st.Dropped == n
	})
	lines := rcv.got()
	if len(lines) != int(st.Sent) {
		t.Fatalf("%d received, %d sent", len(lines), st.Sent)
	}
	// What arrived is the newest messages, in order.
	for i, l := range lines {
		if want := fmt.Sprintf("d1-%d", int(st.Dropped)+i); l.MessageID != want {
			t.Fatalf("line %d is %s, want %s", i, l.MessageID, want)
		}
	}
	t.Logf("dropped %d, sent %d", st.Dropped, st.Sent)
}

// Each filter narrows what a rule forwards; each case fails when its
// filter is removed.
func TestForwardFilters(t *testing.T) {
	g := newRig(t, mqtttest.SharedURL(), 2)
	rcv := newReceiver(t)
	other := g.productN(1)
	cases := []struct {
		name string
		rule Rule
		want []string // messageIds
	}{
		{"product", Rule{}, []string{"r1", "r2", "r3", "e1", "on", "off"}},
		{"device", Rule{DeviceIDs: []string{"d2"}}, []string{"r3"}},
		{"type", Rule{Types: []string{TypeEvent, TypeOffline}}, []string{"e1", "off"}},
		{"property", Rule{Properties: []string{"hum"}}, []string{"r2", "e1", "on", "off"}},
		{"other product", Rule{ProductID: other}, []string{"x1"}},
	}
	for i := range cases {
		c := &cases[i]
		c.rule.Name = c.name
		c.rule.Webhook = webhookTo(rcv, "/"+c.name[:1])
		c.rule = g.rule(c.rule)
	}
	g.forwarder(nil, nil)
	g.publishTo(g.product, "d1", "properties/report", `{"messageId":"r1","properties":{"temp":1}}`)
	g.publishTo(g.product, "d1", "properties/report", `{"messageId":"r2","properties":{"temp":2,"hum":40}}`)
	g.publishTo(other, "d1", "properties/report", `{"messageId":"x1","properties":{"temp":3,"hum":41}}`)
	g.publishTo(g.product, "d2", "properties/report", `{"messageId":"r3","properties":{"temp":4}}`)
	g.publishTo(g.product, "d1", "event/alert", `{"messageId":"e1","data":{"level":"high"}}`)
	g.publishTo(g.product, "d1", "online", `{"messageId":"on"}`)
	g.publishTo(g.product, "d1", "offline", `{"messageId":"off"}`)
	g.publishTo(g.product, "d1", "properties/read/reply", `{"messageId":"rr","success":true,"properties":{"temp":5}}`)
	// The last message every rule but device's takes: when it is there,
	// everything before it is.
	testkit.Eventually(t, 20*time.Second, "the offline messages", func() bool {
		n := 0
		for _, l := range rcv.got() {
			if l.MessageID == "off" {
				n++
			}
		}
		return n == 3
	})
	testkit.Eventually(t, 10*time.Second, "the device rule's message", func() bool {
		for _, l := range rcv.got() {
			if l.RuleID == cases[1].rule.ID {
				return true
			}
		}
		return false
	})
	byRule := map[string][]got{}
	for _, l := range rcv.got() {
		byRule[l.RuleID] = append(byRule[l.RuleID], l)
	}
	for _, c := range cases {
		var ids []string
		for _, l := range byRule[c.rule.ID] {
			ids = append(ids, l.MessageID)
		}
		if fmt.Sprint(ids) != fmt.Sprint(c.want) {
			t.Errorf("%s: forwarded %v, want %v", c.name, ids, c.want)
		}
	}
	for _, l := range byRule[cases[3].rule.ID] {
		if l.MessageID == "r2" && (len(l.Properties) != 1 || l.Properties["hum"] != float64(40)) {
			t.Errorf("property filter kept %v", l.Properties)
		}
	}
	for _, l := range byRule[cases[0].rule.ID] {
		if l.MessageID == "e1" && (l.Type != TypeEvent || l.EventID != "alert" || l.Data["level"] != "high") {
			t.Errorf("event forwarded as %+v", l)
		}
		if l.MessageID == "on" && l.Type != TypeOnline || l.MessageID == "off" && l.Type != TypeOffline {
			t.Errorf("state change forwarded as %+v", l)
		}
	}
}

// A rule publishing to a second Mosquitto: QoS 1, the topic from its
// template, in order; the broker's password is the rule's secret.
func TestForwardMQTTSink(t *testing.T) {
	b := mqtttest.StartBroker(t)
	gw := mqtttest.Gateway(t, b.URL())
	login := mqtt.NewClientOptions()
	gw(login)
	sub, err := mqtttest.Dial(b.URL(), testkit.RandID("sub"), login.Username, login.Password, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Disconnect(0)
	var mu sync.Mutex
	var topics []string
	var lines []got
	if tok := sub.Subscribe("/fwdsink/+/event/+", 1, func(_ mqtt.Client, m mqtt.Message) {
		var l got
		if err := json.Unmarshal(m.Payload(), &l); err != nil {
			t.Errorf("payload %q", m.Payload())
		}
		mu.Lock()
		topics, lines = append(topics, m.Topic()), append(lines, l)
		mu.Unlock()
	}); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	g := newRig(t, mqtttest.SharedURL(), 1)
	g.rule(Rule{Secret: login.Password, MQTT: &MQTTSink{Broker: b.URL(), Topic: "/fwdsink/{deviceId}/event/{type}", Username: login.Username}})
	g.forwarder(nil, nil)
	devs := []string{"m1", "m2"}
	g.reports(devs, 0, 100)
	testkit.Eventually(t, 20*time.Second, "200 messages", func() bool { mu.Lock(); defer mu.Unlock(); return len(lines) >= 200 })
	mu.Lock()
	defer mu.Unlock()
	inOrder(t, lines, devs, 100)
	for i, l := range lines {
		if topics[i] != "/fwdsink/"+l.DeviceID+"/event/property" {
			t.Fatalf("topic %s for %+v", topics[i], l)
		}
	}
}

// A disabled rule takes nothing new and sends nothing; its spool waits
// with its lag showing, and _enable sends it.
func TestForwardDisabled(t *testing.T) {
	g := newRig(t, mqtttest.SharedURL(), 1)
	rcv := newReceiver(t)
	rcv.set(http.StatusServiceUnavailable)
	r := g.rule(Rule{Webhook: webhookTo(rcv, "/in")})
	f, _ := g.forwarder(nil, nil)
	g.reports([]string{"d1"}, 0, 50)
	testkit.Eventually(t, 20*time.Second, "spooled", func() bool { return g.status(r.ID).Pending == 50 })
	ctx := context.Background()
	if _, err := g.store.SetEnabled(ctx, r.ID, false, "test", nil); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "the rule's subscription gone", func() bool { return len(f.sub.Load().Filters()) == 0 })
	rcv.set(http.StatusOK)
	g.reports([]string{"d1"}, 50, 10) // not taken
	testkit.Eventually(t, 20*time.Second, "the lag of a waiting spool", func() bool {
		st := g.status(r.ID)
		return st.Pending == 50 && st.LagMs > 500
	})
	if n := len(rcv.got()); n != 0 {
		t.Fatalf("%d sent while disabled", n)
	}
	if _, err := g.store.SetEnabled(ctx, r.ID, true, "test", nil); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 20*time.Second, "the spool sent", func() bool { return rcv.distinct() == 50 })
	inOrder(t, rcv.got(), []string{"d1"}, 50)
	g.reports([]string{"d1"}, 60, 1)
	testkit.Eventually(t, 20*time.Second, "taking again", func() bool { return rcv.distinct() == 51 })
	if l := rcv.got(); l[len(l)-1].MessageID != "d1-60" {
		t.Fatalf("last %s", l[len(l)-1].MessageID)
	}
}
