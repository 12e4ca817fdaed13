package notify_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"devicehub/bench/testkit"
	"devicehub/ingest/notify"
	"devicehub/meta"
	"devicehub/meta/metatest"
)

// Tests run against the real PostgreSQL (each its own database), real
// HTTP receivers (a net/http server on a port of the test's), a real SMTP
// server (Debian's aiosmtpd) and a private Mosquitto. Alarms are produced
// as the evaluator writes them: a record and its transitions inserted in
// one transaction, which is what the outbox trigger reads.

func TestMain(m *testing.M) { testkit.MainNoLeaks(m) }

// alarms writes alarm records and transitions as ingest/alarm does.
type alarms struct {
	t  testing.TB
	db *sqlx.DB
}

// raise inserts an active record and its raised transition in one
// transaction and returns the record's id.
func (a alarms) raise(rule, device, product, severity string) int64 {
	a.t.Helper()
	return a.raiseAt(rule, device, product, severity, 0)
}

// raiseAt is raise with the device's clock off by skew: the alarm's
// times are the message's (ingest/alarm).
func (a alarms) raiseAt(rule, device, product, severity string, skew time.Duration) int64 {
	a.t.Helper()
	tx := a.db.MustBegin()
	var id int64
	at := `now() + make_interval(secs => $5)`
	if err := tx.Get(&id, `INSERT INTO alarm_records (rule_id, rule_name, product_id, device_id, severity, state, raised_time, last_time, first_value, last_value)
		VALUES ($1, $1, $2, $3, $4, 'active', `+at+`, `+at+`, '31', '31') RETURNING id`, rule, product, device, severity, skew.Seconds()); err != nil {
		a.t.Fatal(err)
	}
	tx.MustExec(`INSERT INTO alarm_transitions (record_id, time, kind, severity, value) VALUES ($1, now() + make_interval(secs => $3), 'raised', $2, '31')`,
		id, severity, skew.Seconds())
	if err := tx.Commit(); err != nil {
		a.t.Fatal(err)
	}
	return id
}

// transition applies kind (escalated, deescalated, acknowledged, cleared)
// to record id as the alarm store does: the record and its transition in
// one transaction.
func (a alarms) transition(id int64, kind, severity string) {
	a.t.Helper()
	tx := a.db.MustBegin()
	switch kind {
	case "cleared":
		tx.MustExec(`UPDATE alarm_records SET state = 'cleared', cleared_time = now() WHERE id = $1`, id)
	case "acknowledged":
		tx.MustExec(`UPDATE alarm_records SET acked = true, acked_time = now(), acked_by = 'op' WHERE id = $1`, id)
	default:
		tx.MustExec(`UPDATE alarm_records SET severity = $2 WHERE id = $1`, id, severity)
	}
	tx.MustExec(`INSERT INTO alarm_transitions (record_id, time, kind, severity, username) VALUES ($1, now(), $2, $3, 'op')`, id, kind, severity)
	if err := tx.Commit(); err != nil {
		a.t.Fatal(err)
	}
}

// got is one request a receiver took.
type got struct {
	Path      string
	Key       string // Idempotency-Key header
	Signature string
	Body      []byte
	N         notify.Notification
	At        time.Time
}

// receiver is a real HTTP server on a port of its own that can go down
// (its listener closed: connections refused) and come back on that port.
type receiver struct {
	t      testing.TB
	addr   string
	mu     sync.Mutex
	srv    *http.Server
	status int // the answer; 200 unless set
	delay  time.Duration
	got    []got
}

func newReceiver(t testing.TB) *receiver {
	r := &receiver{t: t, status: http.StatusOK}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r.addr = ln.Addr().String()
	r.serve(ln)
	t.Cleanup(r.Down)
	return r
}

func (r *receiver) serve(ln net.Listener) {
	srv := &http.Server{Handler: http.HandlerFunc(r.handle)}
	r.mu.Lock()
	r.srv = srv
	r.mu.Unlock()
	go func() { _ = srv.Serve(ln) }()
}

func (r *receiver) handle(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	g := got{Path: req.URL.Path, Key: req.Header.Get("Idempotency-Key"), Signature: req.Header.Get("X-Devicehub-Signature"), Body: body, At: time.Now()}
	_ = json.Unmarshal(body, &g.N)
	r.mu.Lock()
	status, delay := r.status, r.delay
	r.mu.Unlock()
	time.Sleep(delay) // a slow receiver
	r.mu.Lock()
	r.got = append(r.got, g)
	r.mu.Unlock()
	w.WriteHeader(status)
	_, _ = w.Write([]byte("answer " + strconv.Itoa(status)))
}

// URL is the receiver's URL with path.
func (r *receiver) URL(path string) string { return "http://" + r.addr + path }

// Down closes the listener and every connection.
func (r *receiver) Down() {
	r.mu.Lock()
	srv := r.srv
	r.srv = nil
	r.mu.Unlock()
	if srv != nil {
		_ = srv.Close()
	}
}

// Up listens again on the same port.
func (r *receiver) Up() {
	r.t.Helper()
	ln, err := net.Listen("tcp", r.addr)
	if err != nil {
		r.t.Fatal(err)
	}
	r.serve(ln)
}

func (r *receiver) set(status int, delay time.Duration) {
	r.mu.Lock()
	r.status, r.delay = status, delay
	r.mu.Unlock()
}

func (r *receiver) requests() []got {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]got(nil), r.got...)
}

// distinct is the requests by idempotency key (the last of each).
func distinct(gs []got) map[string]got {
	m := map[string]got{}
	for _, g := range gs {
		m[g.Key] = g
	}
	return m
}

// rig is a migrated database, its store and an alarm writer.
type rig struct {
	ms     *meta.Store
	store  *notify.Store
	alarms alarms
}

func newRig(t testing.TB) rig {
	ms := metatest.NewStore(t)
	return rig{ms: ms, store: notify.NewStore(ms), alarms: alarms{t: t, db: ms.DB()}}
}

func (g rig) webhook(t testing.TB, url, secret string) notify.Channel {
	t.Helper()
	c, err := g.store.SaveChannel(context.Background(), notify.Channel{Name: "hook " + url, Secret: secret,
		Webhook: &notify.Webhook{URL: url, TimeoutMs: 2000}}, "test", true)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (g rig) subscribe(t testing.TB, s notify.Subscription) notify.Subscription {
	t.Helper()
	s.Enabled = true
	if s.Name == "" {
		s.Name = "sub"
	}
	s, err := g.store.SaveSubscription(context.Background(), s, "test", true, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// run starts a dispatcher with opt until the test ends or stop is called.
func (g rig) run(t testing.TB, opt notify.Options) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	d := notify.NewDispatcher(g.ms, opt)
	done := make(chan struct{})
	go func() { defer close(done); d.Run(ctx) }()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return stop
}

func fast() notify.Options {
	o := notify.DefaultOptions()
	o.Poll = 20 * time.Millisecond
	o.Tick = 50 * time.Millisecond
	o.BackoffBase = 20 * time.Millisecond
	o.BackoffMax = 200 * time.Millisecond
	o.MaxAttempts = 1000
	return o
}

func (g rig) outboxCount(t testing.TB, cond string) int {
	t.Helper()
	var n int
	if err := g.ms.DB().Get(&n, `SELECT count(*) FROM notify_outbox WHERE `+cond); err != nil {
		t.Fatal(err)
	}
	return n
}
