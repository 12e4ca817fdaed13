package notify_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"devicehub/bench/testkit"
	"devicehub/ingest/notify"
	"devicehub/meta"
	"devicehub/meta/metatest"
)

// checkOrder fails t unless, per alarm record, the first arrival of each
// key follows the transitions' order.
func checkOrder(t *testing.T, gs []got) {
	t.Helper()
	seen := map[string]bool{}
	last := map[float64]float64{}
	for _, g := range gs {
		if seen[g.Key] {
			continue
		}
		seen[g.Key] = true
		rec, _ := g.N.Alarm["recordId"].(float64)
		tr, _ := g.N.Alarm["transitionId"].(float64)
		if tr <= last[rec] {
			t.Fatalf("record %v: transition %v arrived after %v", rec, tr, last[rec])
		}
		last[rec] = tr
	}
}

// A receiver down, then back: every notification arrives, in order per
// alarm, each with its idempotency key in the header and the body.
// (Fails with the claim's NOT EXISTS removed: retries with jitter
// reorder an alarm's notifications.)
func TestReceiverDownThenBack(t *testing.T) {
	g := newRig(t)
	rcv := newReceiver(t)
	ch := g.webhook(t, rcv.URL("/hook"), "")
	g.subscribe(t, notify.Subscription{Products: []string{"p1"}, Kinds: notify.TransitionKinds, Channels: []string{ch.ID}})
	rcv.Down()
	g.run(t, fast())
	const alarms = 5
	want := 0
	for i := range alarms {
		id := g.alarms.raise("r1", fmt.Sprintf("d%d", i), "p1", "minor")
		g.alarms.transition(id, "escalated", "major")
		g.alarms.transition(id, "deescalated", "minor")
		g.alarms.transition(id, "acknowledged", "minor")
		g.alarms.transition(id, "cleared", "minor")
		want += 5
	}
	// Another product's alarm: not subscribed.
	g.alarms.raise("r1", "d0", "p2", "critical")
	testkit.Eventually(t, 10*time.Second, "failed attempts while down", func() bool {
		return g.outboxCount(t, "attempts >= 2") >= alarms
	})
	rcv.Up()
	testkit.Eventually(t, 20*time.Second, "every notification", func() bool { return len(distinct(rcv.requests())) == want })
	testkit.Eventually(t, 5*time.Second, "all marked delivered", func() bool { return g.outboxCount(t, "state = 'delivered'") == want })
	gs := rcv.requests()
	for _, r := range gs {
		if r.Key == "" || r.Key != r.N.IdempotencyKey {
			t.Fatalf("header key %q, body key %q", r.Key, r.N.IdempotencyKey)
		}
		if r.N.Alarm["productId"] != "p1" {
			t.Fatalf("notified of %v", r.N.Alarm["productId"])
		}
	}
	checkOrder(t, gs)
}

// A 404 is a failure: retried up to the limit, then a dead letter, listed
// and replayed by hand with the same key. (Fails when a 4xx counts as
// success: the first attempt would be delivered.)
func TestNotFoundIsDeadThenReplayed(t *testing.T) {
	g := newRig(t)
	rcv := newReceiver(t)
	rcv.set(http.StatusNotFound, 0)
	ch := g.webhook(t, rcv.URL("/gone"), "")
	g.subscribe(t, notify.Subscription{Products: []string{"p1"}, Channels: []string{ch.ID}})
	o := fast()
	o.MaxAttempts = 3
	reg := prometheus.NewRegistry()
	o.Registerer = reg
	g.run(t, o)
	g.alarms.raise("r1", "d1", "p1", "major")
	ctx := context.Background()
	var dead []notify.Dead
	testkit.Eventually(t, 10*time.Second, "a dead letter", func() bool {
		d, total, err := g.store.DeadLetters(ctx, notify.DeadQuery{})
		if err != nil {
			t.Fatal(err)
		}
		dead = d
		return total == 1
	})
	if d := dead[0]; d.Attempts != 3 || d.ChannelID != ch.ID || d.Kind != "raised" || d.Alarm["deviceId"] != "d1" {
		t.Fatalf("dead letter %+v", d)
	}
	if n := len(rcv.requests()); n != 3 {
		t.Fatalf("%d attempts, want 3", n)
	}
	for name, want := range map[string]float64{"devicehub_notify_failed_total": 3, "devicehub_notify_retried_total": 2,
		"devicehub_notify_dead_total": 1, "devicehub_notify_sent_total": 0} {
		if got := metric(t, reg, name, ch.ID); got != want {
			t.Errorf("%s %v, want %v", name, got, want)
		}
	}
	// Scoped: a caller limited to another product sees none and cannot replay it.
	if _, total, _ := g.store.DeadLetters(ctx, notify.DeadQuery{Products: []string{"p2"}}); total != 0 {
		t.Fatalf("p2 sees %d dead letters", total)
	}
	if err := g.store.Replay(ctx, dead[0].ID, []string{"p2"}); err == nil {
		t.Fatal("replayed outside the caller's products")
	}
	rcv.set(http.StatusAccepted, 0)
	if err := g.store.Replay(ctx, dead[0].ID, nil); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 5*time.Second, "the replay", func() bool { return g.outboxCount(t, "state = 'delivered'") == 1 })
	gs := rcv.requests()
	if len(gs) != 4 || len(distinct(gs)) != 1 || gs[3].Key != fmt.Sprint(dead[0].ID) {
		t.Fatalf("requests %d, keys %d", len(gs), len(distinct(gs)))
	}
	if _, total, _ := g.store.DeadLetters(ctx, notify.DeadQuery{}); total != 0 {
		t.Fatalf("%d dead letters after the replay", total)
	}
	if got := metric(t, reg, "devicehub_notify_sent_total", ch.ID); got != 1 {
		t.Errorf("sent %v, want 1", got)
	}
	if got := metric(t, reg, "devicehub_notify_send_seconds", ch.ID); got != 4 {
		t.Errorf("%v attempts timed, want 4", got)
	}
}

// metric is the value of a counter (a histogram's count) of channel.
func metric(t *testing.T, reg *prometheus.Registry, name, channel string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "channel" && l.GetValue() == channel {
					if h := m.GetHistogram(); h != nil {
						return float64(h.GetSampleCount())
					}
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// A dispatcher stopped with notifications queued and in flight, another
// started: all delivered, a duplicate only with its key and body.
// Two dispatchers at once (two instances) never send one row twice.
// (Fails without FOR UPDATE SKIP LOCKED: both instances send the same
// rows.)
func TestRestartAndTwoInstances(t *testing.T) {
	g := newRig(t)
	rcv := newReceiver(t)
	rcv.set(http.StatusOK, 3*time.Millisecond)
	ch := g.webhook(t, rcv.URL("/hook"), "")
	g.subscribe(t, notify.Subscription{Products: []string{"p1"}, Kinds: notify.TransitionKinds, Channels: []string{ch.ID}})
	const n = 300
	for i := range n / 2 {
		id := g.alarms.raise("r1", fmt.Sprintf("d%d", i), "p1", "minor")
		g.alarms.transition(id, "cleared", "minor")
	}
	stop := g.run(t, fast())
	testkit.Eventually(t, 10*time.Second, "some delivered", func() bool { return len(rcv.requests()) >= 40 })
	stop() // mid-stream: rows in flight roll back and stay pending
	if got := len(distinct(rcv.requests())); got >= n {
		t.Fatalf("all %d delivered before the stop", got)
	}
	g.run(t, fast())
	g.run(t, fast())
	testkit.Eventually(t, 30*time.Second, "every notification", func() bool { return g.outboxCount(t, "state = 'delivered'") == n })
	gs := rcv.requests()
	byKey := distinct(gs)
	if len(byKey) != n {
		t.Fatalf("%d distinct keys, want %d", len(byKey), n)
	}
	for _, r := range gs {
		if string(byKey[r.Key].Body) != string(r.Body) {
			t.Fatalf("key %s with two bodies", r.Key)
		}
	}
	dups := len(gs) - n
	// At most one row per worker was in flight at the stop.
	if dups > notify.DefaultOptions().Workers {
		t.Fatalf("%d duplicates", dups)
	}
	checkOrder(t, gs)
	t.Logf("%d duplicates after the stop", dups)
}

// The signature verifies with the channel's secret and not with another;
// a template makes the body.
func TestSignature(t *testing.T) {
	g := newRig(t)
	rcv := newReceiver(t)
	c, err := g.store.SaveChannel(context.Background(), notify.Channel{Name: "signed", Secret: "s3cret",
		Webhook: &notify.Webhook{URL: rcv.URL("/signed"), Headers: map[string]string{"X-Extra": "1"},
			Template: `{"key":"{{.IdempotencyKey}}","device":"{{.Alarm.deviceId}}","kind":"{{.Kind}}"}`}}, "test", true)
	if err != nil {
		t.Fatal(err)
	}
	if !c.HasSecret {
		t.Fatal("no secret stored")
	}
	g.subscribe(t, notify.Subscription{Products: []string{"p1"}, Channels: []string{c.ID}})
	g.run(t, fast())
	g.alarms.raise("r1", "dev-7", "p1", "critical")
	testkit.Eventually(t, 5*time.Second, "the notification", func() bool { return len(rcv.requests()) == 1 })
	r := rcv.requests()[0]
	if want := fmt.Sprintf(`{"key":"%s","device":"dev-7","kind":"raised"}`, r.Key); string(r.Body) != want {
		t.Fatalf("body %s, want %s", r.Body, want)
	}
	if r.Signature != notify.Sign("s3cret", r.Body) {
		t.Fatalf("signature %q does not verify with the channel's secret", r.Signature)
	}
	if r.Signature == notify.Sign("other", r.Body) || r.Signature == notify.Sign("s3cret", append(r.Body, ' ')) {
		t.Fatal("signature verifies with another secret or body")
	}
}

// A value bouncing at a threshold raises and clears again and again: one
// notification per quiet time, however many alarms. (Fails without the
// quiet rule: 2 x 1000 notifications.)
func TestQuietBouncingAlarm(t *testing.T) {
	g := newRig(t)
	rcv := newReceiver(t)
	ch := g.webhook(t, rcv.URL("/q"), "")
	g.subscribe(t, notify.Subscription{Products: []string{"p1"}, Kinds: []string{"raised", "cleared"}, Channels: []string{ch.ID}, QuietMs: 3_600_000})
	// Another subscription without a quiet time hears them all.
	ch2 := g.webhook(t, rcv.URL("/all"), "")
	g.subscribe(t, notify.Subscription{Products: []string{"p1"}, Kinds: []string{"raised"}, Channels: []string{ch2.ID}})
	const bounces = 1000
	for range bounces {
		id := g.alarms.raise("r1", "d1", "p1", "minor")
		g.alarms.transition(id, "cleared", "minor")
	}
	// Another device of the same rule has its own quiet time.
	g.alarms.raise("r1", "d2", "p1", "minor")
	g.run(t, fast())
	testkit.Eventually(t, 20*time.Second, "everything sent", func() bool {
		return g.outboxCount(t, "state = 'delivered'") > 0 && g.outboxCount(t, "state <> 'delivered'") == 0
	})
	var quiet []string
	for _, r := range rcv.requests() {
		if r.Path == "/q" {
			quiet = append(quiet, fmt.Sprint(r.N.Alarm["deviceId"], " ", r.N.Kind))
		}
	}
	slices.Sort(quiet)
	if !slices.Equal(quiet, []string{"d1 raised", "d2 raised"}) {
		t.Fatalf("quiet subscription heard %d: %v", len(quiet), quiet[:min(len(quiet), 6)])
	}
	if n := g.outboxCount(t, "true"); n != 2+bounces+1 {
		t.Fatalf("%d notifications, want %d", n, 2+bounces+1)
	}
}

// Escalation: not acknowledged within T1, the second channel; T2, the
// third; reminders every R to the channel reached; each within 1 s of
// its time; none after the acknowledgement. A second scheduler (another
// instance) enqueues nothing twice. (Fails when the scheduler does not
// skip acknowledged alarms: a reminder after the acknowledgement.)
func TestEscalationAndReminders(t *testing.T) {
	g := newRig(t)
	rcv := newReceiver(t)
	c1, c2, c3 := g.webhook(t, rcv.URL("/1"), ""), g.webhook(t, rcv.URL("/2"), ""), g.webhook(t, rcv.URL("/3"), "")
	g.subscribe(t, notify.Subscription{Products: []string{"p1"}, Channels: []string{c1.ID, c2.ID, c3.ID},
		EscalateMs: []int64{700, 1400}, RemindMs: 1000})
	g.run(t, fast())
	g.run(t, fast()) // two instances
	ctx := context.Background()
	// The scheduler's SQL itself, called at once by a third party.
	for range 3 {
		if _, err := g.store.Tick(ctx); err != nil {
			t.Fatal(err)
		}
	}
	raised := time.Now()
	id := g.alarms.raise("r1", "d1", "p1", "major")
	testkit.Eventually(t, 5*time.Second, "raised, two escalations and two reminders", func() bool { return len(rcv.requests()) >= 5 })
	g.alarms.transition(id, "acknowledged", "major")
	at := map[string]time.Duration{}
	paths := map[string]string{}
	for _, r := range rcv.requests() {
		step := r.N.Step
		if r.N.Kind == "raised" {
			step = "raised"
		}
		if _, dup := at[step]; dup {
			t.Fatalf("step %s twice", step)
		}
		at[step] = r.At.Sub(raised)
		paths[step] = r.Path
	}
	want := []struct {
		step, path string
		after      time.Duration
	}{{"raised", "/1", 0}, {"e1", "/2", 700 * time.Millisecond}, {"e2", "/3", 1400 * time.Millisecond},
		{"r1", "/2", time.Second}, {"r2", "/3", 2 * time.Second}}
	for _, w := range want {
		d, ok := at[w.step]
		if !ok {
			t.Fatalf("no %s; got %v", w.step, at)
		}
		if paths[w.step] != w.path || d < w.after-50*time.Millisecond || d > w.after+time.Second {
			t.Fatalf("%s to %s after %v, want %s after %v (+1s)", w.step, paths[w.step], d, w.path, w.after)
		}
	}
	// Acknowledged: no further reminder (r3 would be due at 3 s).
	time.Sleep(1500 * time.Millisecond) // waiting for something that must not happen
	for _, r := range rcv.requests() {
		if r.N.Step == "r3" {
			t.Fatal("a reminder after the acknowledgement")
		}
	}
	if n := g.outboxCount(t, "step LIKE 'e%' OR step LIKE 'r%'"); n != 4 {
		t.Fatalf("%d escalation and reminder rows, want 4", n)
	}
}

// newListeningRig is a rig whose database's DSN is known, for a
// dispatcher that LISTENs.
func newListeningRig(t *testing.T) (rig, string) {
	dsn := metatest.NewDatabase(t)
	opts := meta.DefaultOptions()
	opts.DSN = dsn
	ms, err := meta.Open(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ms.Close() })
	return rig{ms: ms, store: notify.NewStore(ms), alarms: alarms{t: t, db: ms.DB()}}, dsn
}

// With the database's DSN, workers are woken by the trigger's
// announcement at commit, and by a replay, not by their poll (an hour
// here). (Fails without the trigger's pg_notify: nothing is delivered
// within the wait.)
func TestWokenByTrigger(t *testing.T) {
	g, dsn := newListeningRig(t)
	rcv := newReceiver(t)
	rcv.set(http.StatusNotFound, 0)
	ch := g.webhook(t, rcv.URL("/w"), "")
	g.subscribe(t, notify.Subscription{Products: []string{"p1"}, Channels: []string{ch.ID}})
	o := fast()
	o.Poll, o.MaxAttempts, o.DSN = time.Hour, 1, dsn
	g.run(t, o)
	time.Sleep(300 * time.Millisecond) // the workers' first look has passed; they now wait for an hour or a wake
	for i := range 3 {
		g.alarms.raise("r1", fmt.Sprintf("d%d", i), "p1", "major")
		testkit.Eventually(t, 3*time.Second, "a delivery attempt", func() bool { return len(rcv.requests()) == i+1 })
	}
	rcv.set(http.StatusOK, 0)
	var dead []notify.Dead
	testkit.Eventually(t, 3*time.Second, "three dead letters", func() bool { // the last is recorded just after its answer
		d, _, err := g.store.DeadLetters(context.Background(), notify.DeadQuery{})
		if err != nil {
			t.Fatal(err)
		}
		dead = d
		return len(d) == 3
	})
	if err := g.store.Replay(context.Background(), dead[0].ID, nil); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 3*time.Second, "the replay's delivery", func() bool { return g.outboxCount(t, "state = 'delivered'") == 1 })
}

// Escalations and the quiet time run on the server's clock, not the
// device's: an alarm from a device an hour behind escalates after T1, not
// at once; one from a device an hour ahead does not silence the next
// alarm once the quiet time has passed. (Fails with the device's times:
// the escalation at once, the second alarm quieted.)
func TestServerClock(t *testing.T) {
	g := newRig(t)
	rcv := newReceiver(t)
	c1, c2 := g.webhook(t, rcv.URL("/1"), ""), g.webhook(t, rcv.URL("/2"), "")
	g.subscribe(t, notify.Subscription{Products: []string{"p1"}, Kinds: []string{"raised", "cleared"}, Channels: []string{c1.ID, c2.ID},
		EscalateMs: []int64{800}, QuietMs: 1000})
	g.run(t, fast())
	raised := time.Now()
	id := g.alarms.raiseAt("r1", "behind", "p1", "major", -time.Hour)
	testkit.Eventually(t, 5*time.Second, "the escalation", func() bool {
		for _, r := range rcv.requests() {
			if r.Path == "/2" {
				return true
			}
		}
		return false
	})
	for _, r := range rcv.requests() {
		if d := r.At.Sub(raised); r.Path == "/2" && d < 750*time.Millisecond {
			t.Fatalf("escalated %v after the raise, want 800ms", d)
		}
	}
	g.alarms.transition(id, "acknowledged", "major")

	ahead := g.alarms.raiseAt("r2", "ahead", "p1", "major", time.Hour)
	g.alarms.transition(ahead, "cleared", "major")
	// The quiet time passes on the server's clock.
	g.ms.DB().MustExec(`UPDATE notify_quiet SET last_time = last_time - interval '2 seconds' WHERE rule_id = 'r2'`)
	g.alarms.raise("r2", "ahead", "p1", "major")
	testkit.Eventually(t, 5*time.Second, "both raises of the device ahead", func() bool {
		n := 0
		for _, r := range rcv.requests() {
			if r.N.Alarm["deviceId"] == "ahead" && r.N.Kind == "raised" {
				n++
			}
		}
		return n == 2
	})
}

// One announcement wakes one worker, and a worker that takes a row wakes
// the next: alarms committed in one transaction (one announcement) have
// every worker sending at once, with the poll an hour away. (Fails
// without the wake in deliverOne: one worker sends them one at a time.)
func TestWakeFansOut(t *testing.T) {
	g, dsn := newListeningRig(t)
	o := fast()
	o.Poll, o.DSN = time.Hour, dsn
	// The receiver holds each request until every worker has one (or 5 s).
	var mu sync.Mutex
	inFlight, most, sent, released := 0, 0, 0, false
	all := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		mu.Lock()
		inFlight++
		most = max(most, inFlight)
		if inFlight == o.Workers && !released {
			released = true
			close(all)
		}
		mu.Unlock()
		select {
		case <-all:
		case <-time.After(5 * time.Second):
		}
		mu.Lock()
		inFlight--
		sent++
		mu.Unlock()
	}))
	t.Cleanup(srv.Close)
	ch := g.webhook(t, srv.URL, "")
	g.subscribe(t, notify.Subscription{Products: []string{"p1"}, Channels: []string{ch.ID}})
	g.run(t, o)
	time.Sleep(300 * time.Millisecond) // the workers' first look has passed; they now wait for an hour or a wake
	n := 2 * o.Workers
	tx := g.ms.DB().MustBegin()
	for i := range n {
		var id int64
		if err := tx.Get(&id, `INSERT INTO alarm_records (rule_id, rule_name, product_id, device_id, severity, state, raised_time, last_time)
			VALUES ('r1', 'r1', 'p1', $1, 'major', 'active', now(), now()) RETURNING id`, fmt.Sprintf("d%d", i)); err != nil {
			t.Fatal(err)
		}
		tx.MustExec(`INSERT INTO alarm_transitions (record_id, time, kind, severity) VALUES ($1, now(), 'raised', 'major')`, id)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 15*time.Second, "every alarm sent", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return sent == n
	})
	mu.Lock()
	defer mu.Unlock()
	if most != o.Workers {
		t.Fatalf("at most %d sent at once, want %d (every worker)", most, o.Workers)
	}
}
