package devauth_test

import (
	"context"
	"crypto/rand"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/prometheus/client_golang/prometheus"

	"devicehub/bench/testkit"
	"devicehub/ingest/devauth"
	"devicehub/ingest/dynsec"
	"devicehub/ingest/mqtttest"
	"devicehub/meta"
	"devicehub/meta/metatest"
)

func randID(prefix string) string { return prefix + strings.ToLower(rand.Text()[:8]) }

// world is a private broker with devicehub's plugin and a PostgreSQL
// database of one test.
type world struct {
	t      *testing.T
	broker *mqtttest.Broker
	store  *meta.Store
	logs   *logLines            // if set, the syncers log here too
	reg    *prometheus.Registry // if set, the syncers' metrics
}

// logLines keeps what a syncer logs, for a test that waits for an event
// only the log shows.
type logLines struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (l *logLines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, _ = os.Stderr.Write(p)
	return l.buf.Write(p)
}

func (l *logLines) has(s string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Contains(l.buf.String(), s)
}

func newWorld(t *testing.T) *world {
	w := &world{t: t, broker: mqtttest.StartBroker(t), store: metatest.NewStore(t)}
	w.exec(`INSERT INTO products (id, name, device_type, state) VALUES ('p', 'p', 'device', 1)`)
	return w
}

func (w *world) exec(q string, args ...any) {
	w.t.Helper()
	if _, err := w.store.DB().Exec(q, args...); err != nil {
		w.t.Fatalf("%s: %v", q, err)
	}
}

// device adds a device in state with a login of its own.
func (w *world) device(id, state string) meta.DeviceLogin {
	w.t.Helper()
	key := strings.ToLower(rand.Text())
	w.exec(`INSERT INTO devices (id, name, product_id, state, secure_id, secure_key) VALUES ($1, $1, 'p', $2, $1, $3)`, id, state, key)
	return meta.DeviceLogin{ID: id, ProductID: "p", SecureID: id, SecureKey: key, Deployed: state != meta.StateNotActive}
}

// version is a device's login_version now.
func (w *world) version(id string) int64 {
	w.t.Helper()
	var v int64
	if err := w.store.DB().Get(&v, `SELECT login_version FROM devices WHERE id = $1`, id); err != nil {
		w.t.Fatal(err)
	}
	return v
}

// syncer runs a syncer until the test ends or stop is called.
func (w *world) syncer() (s *devauth.Syncer, stop func()) {
	u, p := mqtttest.Service()
	opt := devauth.Options{BrokerURL: w.broker.URL(), Username: u, Password: p, Retry: 200 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(w.logOut(), &slog.HandlerOptions{Level: slog.LevelWarn}))}
	if w.reg != nil {
		opt.Registerer = w.reg
	}
	s = devauth.New(w.store, opt)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx) }()
	stop = func() { cancel(); <-done }
	w.t.Cleanup(stop)
	return s, stop
}

func (w *world) logOut() io.Writer {
	if w.logs != nil {
		return w.logs
	}
	return os.Stderr
}

// eventually waits (10 s) until d's login is admitted or, with admitted
// false, refused: for the full sync of a syncer that starts, which no
// writer awaits.
func (w *world) eventually(d meta.DeviceLogin, admitted bool) {
	w.t.Helper()
	var err error
	if !testkit.Within(10*time.Second, func() bool {
		var c mqtt.Client
		if c, err = w.dial(d, nil); err == nil {
			c.Disconnect(0)
		}
		return (err == nil) == admitted
	}) {
		w.t.Fatalf("device %s: admitted %v after 10s, want %v (%v)", d.ID, err == nil, admitted, err)
	}
}

// await waits (5 s) for the broker to hold device id's login as it is now.
func (w *world) await(s *devauth.Syncer, id string) {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.Await(ctx, []meta.LoginChange{{ID: id, Version: w.version(id)}}); err != nil {
		w.t.Fatalf("await %s: %v", id, err)
	}
}

// dial connects as d once, no retry; lost (if not nil) is closed when the
// broker drops the connection.
func (w *world) dial(d meta.DeviceLogin, lost chan struct{}) (mqtt.Client, error) {
	c, err := mqtttest.Dial(w.broker.URL(), d.ID, d.SecureID, d.SecureKey, lost)
	if err == nil {
		w.t.Cleanup(func() { c.Disconnect(0) })
	}
	return c, err
}

func (w *world) connects(d meta.DeviceLogin) {
	w.t.Helper()
	if _, err := w.dial(d, nil); err != nil {
		w.t.Fatalf("device %s refused: %v", d.ID, err)
	}
}

func (w *world) refused(d meta.DeviceLogin) {
	w.t.Helper()
	if c, err := w.dial(d, nil); err == nil {
		c.Disconnect(0)
		w.t.Fatalf("device %s admitted", d.ID)
	}
}

// admin is a dynamic-security control connection with the service login.
func (w *world) admin() *dynsec.Client {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := dynsec.Dial(ctx, mqtttest.ServiceConfig(w.broker.URL(), randID("admin-")), nil)
	if err != nil {
		w.t.Fatal(err)
	}
	w.t.Cleanup(c.Close)
	return c
}

// plugin is a control connection to devicehub's plugin.
func (w *world) plugin() *dynsec.Client {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := dynsec.DialTopic(ctx, mqtttest.ServiceConfig(w.broker.URL(), randID("ctl-")), devauth.ControlTopic, nil)
	if err != nil {
		w.t.Fatal(err)
	}
	w.t.Cleanup(c.Close)
	return c
}

func do(t *testing.T, c *dynsec.Client, cmds ...dynsec.Command) []dynsec.Response {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rs, err := c.Do(ctx, cmds...)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

// TestSyncFollowsPostgres: every change of a device's login in PostgreSQL,
// whoever makes it, reaches the broker, and Await says when.
func TestSyncFollowsPostgres(t *testing.T) {
	w := newWorld(t)
	a, off := w.device(randID("a-"), meta.StateOffline), w.device(randID("n-"), meta.StateNotActive)
	s, _ := w.syncer()
	w.eventually(a, true) // the full sync on start
	w.refused(off)

	// Deployed in SQL: connects the moment Await returns, no retry.
	w.exec(`UPDATE devices SET state = 'offline' WHERE id = $1`, off.ID)
	w.await(s, off.ID)
	w.connects(off)

	// A new key: the live session is cut by the time Await returns.
	lost := make(chan struct{})
	if _, err := w.dial(a, lost); err != nil {
		t.Fatal(err)
	}
	old := a
	a.SecureKey = strings.ToLower(rand.Text())
	w.exec(`UPDATE devices SET secure_key = $2 WHERE id = $1`, a.ID, a.SecureKey)
	w.await(s, a.ID)
	select {
	case <-lost:
	case <-time.After(time.Second):
		t.Fatal("the session with the old key was not cut")
	}
	w.refused(old)
	w.connects(a)

	// Undeployed, then deleted.
	w.exec(`UPDATE devices SET state = 'notActive' WHERE id = $1`, a.ID)
	w.await(s, a.ID)
	w.refused(a)
	w.exec(`DELETE FROM devices WHERE id = $1`, off.ID)
	rs := do(t, w.plugin(), dynsec.Command{"command": "getDevice", "id": off.ID})
	if rs[0].Err() == nil {
		// The delete's notification may still be on its way: wait for it.
		if !testkit.Within(5*time.Second, func() bool {
			rs = do(t, w.plugin(), dynsec.Command{"command": "getDevice", "id": off.ID})
			return rs[0].Err() != nil
		}) {
			t.Fatalf("the plugin still holds deleted device %s: %s", off.ID, rs[0].Data)
		}
	}
}

// TestFullSyncKeepsSessions: a syncer that starts (a devicehub restart)
// removes what PostgreSQL does not have and leaves connected devices be.
func TestFullSyncKeepsSessions(t *testing.T) {
	w := newWorld(t)
	a := w.device(randID("a-"), meta.StateOffline)
	_, stop := w.syncer()
	w.eventually(a, true)
	lost := make(chan struct{})
	if _, err := w.dial(a, lost); err != nil {
		t.Fatal(err)
	}
	// A login PostgreSQL never had, put in by hand.
	stray := meta.DeviceLogin{ID: randID("s-"), ProductID: "p", SecureID: randID("u-"), SecureKey: "stray-key-0123456789"}
	rs := do(t, w.plugin(), dynsec.Command{"command": "setDevice", "id": stray.ID, "product": "p", "username": stray.SecureID, "key": stray.SecureKey})
	if err := rs[0].Err(); err != nil {
		t.Fatal(err)
	}
	w.connects(stray)
	// Another syncer takes over once the first one is gone: its full sync.
	stop()
	w.syncer()
	w.eventually(stray, false)
	select {
	case <-lost:
		t.Fatal("a full sync cut a device whose login did not change")
	default:
	}
}

// TestMigrateFromDynsec: the device clients an older devicehub kept in the
// dynamic-security plugin are removed where they would admit a device
// devicehub no longer has, and kept (untouched) where the plugin answers
// for them.
func TestMigrateFromDynsec(t *testing.T) {
	w := newWorld(t)
	var inst string
	if err := w.store.DB().Get(&inst, `SELECT id FROM installation`); err != nil {
		t.Fatal(err)
	}
	kept, gone := w.device(randID("k-"), meta.StateOffline), w.device(randID("g-"), meta.StateNotActive)
	admin := w.admin()
	for _, d := range []meta.DeviceLogin{kept, gone} {
		rs := do(t, admin,
			dynsec.Command{"command": "createRole", "rolename": dynsec.RoleName(inst, d.ID), "acls": []dynsec.ACL{
				{Type: "publishClientSend", Topic: "/p/" + d.ID + "/#", Allow: true}}},
			dynsec.Command{"command": "createClient", "username": d.SecureID, "password": d.SecureKey, "clientid": d.ID,
				"textname": dynsec.DeviceText(inst), "roles": []map[string]any{{"rolename": dynsec.RoleName(inst, d.ID)}}})
		for _, r := range rs {
			if err := r.Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Before devicehub's plugin knows them, the legacy clients admit
	// both: the state an upgrade starts from.
	w.connects(gone)
	lost := make(chan struct{})
	if _, err := w.dial(kept, lost); err != nil {
		t.Fatal(err)
	}
	s, _ := w.syncer()
	testkit.Eventually(t, 10*time.Second, "the legacy client of an undeployed device gone from the dynamic-security plugin", func() bool {
		return do(t, admin, dynsec.Command{"command": "getClient", "username": gone.SecureID})[0].Err() != nil
	})
	w.refused(gone)
	select {
	case <-lost:
		t.Fatal("the migration cut a deployed device's session")
	default:
	}
	w.connects(kept) // (its first session ends: the same client id)
	// Its login changes: the legacy client goes too.
	w.exec(`UPDATE devices SET state = 'notActive' WHERE id = $1`, kept.ID)
	w.await(s, kept.ID)
	rs := do(t, admin, dynsec.Command{"command": "getClient", "username": kept.SecureID})
	if rs[0].Err() == nil {
		t.Fatal("the legacy client of an undeployed device is still in the dynamic-security plugin")
	}
	w.refused(kept)
}

// TestRefusedLoginNotConfirmed: a login the plugin refuses (a service
// login's name, written past the API's checks) is never confirmed to its
// writer, and the service login keeps working.
func TestRefusedLoginNotConfirmed(t *testing.T) {
	w := newWorld(t)
	s, _ := w.syncer()
	svc, _ := mqtttest.Service()
	id := randID("x-")
	w.exec(`INSERT INTO devices (id, name, product_id, state, secure_id, secure_key) VALUES ($1, $1, 'p', 'notActive', $2, 'takeover-key-0123456789')`, id, svc)
	w.exec(`UPDATE devices SET state = 'offline' WHERE id = $1`, id)
	// A sentinel: a valid login deployed after it, which the syncer
	// applies with it or after it. Once that one is confirmed, the refused
	// one has been tried.
	next := randID("y-")
	w.exec(`INSERT INTO devices (id, name, product_id, state, secure_id, secure_key) VALUES ($1, $1, 'p', 'notActive', $1, 'sentinel-key-0123456789')`, next)
	w.exec(`UPDATE devices SET state = 'offline' WHERE id = $1`, next)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Await(ctx, []meta.LoginChange{{ID: next, Version: w.version(next)}}); err != nil {
		t.Fatalf("the login deployed after it: %v", err)
	}
	ended, end := context.WithCancel(context.Background())
	end() // Await answers at once: confirmed already or not
	if err := s.Await(ended, []meta.LoginChange{{ID: id, Version: w.version(id)}}); err == nil {
		t.Fatal("a login the plugin refuses was confirmed")
	}
	w.plugin() // the service login still logs in
	w.refused(meta.DeviceLogin{ID: id, SecureID: svc, SecureKey: "takeover-key-0123456789"})
}

// TestPostgresOutage: while PostgreSQL is away, connected devices stay
// connected and deployed ones keep logging in (the broker needs neither
// devicehub nor PostgreSQL to admit them); once it is back, the syncer
// leads again and follows changes.
func TestPostgresOutage(t *testing.T) {
	store, px := metatest.NewStoreBehindProxy(t)
	w := &world{t: t, broker: mqtttest.StartBroker(t), store: store, logs: &logLines{}}
	w.exec(`INSERT INTO products (id, name, device_type, state) VALUES ('p', 'p', 'device', 1)`)
	a, b := w.device(randID("a-"), meta.StateOffline), w.device(randID("b-"), meta.StateOffline)
	later := w.device(randID("l-"), meta.StateNotActive)
	s, _ := w.syncer()
	w.eventually(a, true)
	lost := make(chan struct{})
	if _, err := w.dial(a, lost); err != nil {
		t.Fatal(err)
	}
	px.Down()
	// The syncer notices: its lock's connection is gone (pinged every
	// 2 s) and it stops leading; devices keep logging in meanwhile, and
	// the one connected stays (checked at the end).
	testkit.Eventually(t, 10*time.Second, "the syncer to log that it lost the sync lock", func() bool {
		return w.logs.has("devauth: sync lock lost")
	})
	w.connects(b)
	px.Up()
	// Back: a change is applied and confirmed again (the syncer leads,
	// after its full sync).
	testkit.Eventually(t, 20*time.Second, "PostgreSQL back through the proxy (a deploy written)", func() bool {
		_, err := store.DB().Exec(`UPDATE devices SET state = 'offline' WHERE id = $1`, later.ID)
		return err == nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := s.Await(ctx, []meta.LoginChange{{ID: later.ID, Version: w.version(later.ID)}}); err != nil {
		t.Fatalf("a deploy after the outage: %v", err)
	}
	w.connects(later)
	select {
	case <-lost:
		t.Fatal("a PostgreSQL outage cut a connected device")
	default:
	}
}

// stray sets a login by hand in the plugin, one PostgreSQL never had,
// with this installation ("own") or none ("none"), and checks that it
// logs in; "" sets none.
func (w *world) stray(kind string) meta.DeviceLogin {
	w.t.Helper()
	if kind == "" {
		return meta.DeviceLogin{}
	}
	d := meta.DeviceLogin{ID: randID("s-"), ProductID: "p", SecureID: randID("u-"), SecureKey: "stray-key-0123456789"}
	cmd := dynsec.Command{"command": "setDevice", "id": d.ID, "product": "p", "username": d.SecureID, "key": d.SecureKey}
	if kind == "own" {
		var inst string
		if err := w.store.DB().Get(&inst, `SELECT id FROM installation`); err != nil {
			w.t.Fatal(err)
		}
		cmd["installation"] = inst
	}
	if err := do(w.t, w.plugin(), cmd)[0].Err(); err != nil {
		w.t.Fatal(err)
	}
	w.connects(d)
	return d
}

// deploy deploys d and waits (20 s) until s says the broker holds it;
// then d logs in.
func (w *world) deploy(s *devauth.Syncer, d meta.DeviceLogin) {
	w.t.Helper()
	w.exec(`UPDATE devices SET state = 'offline' WHERE id = $1`, d.ID)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := s.Await(ctx, []meta.LoginChange{{ID: d.ID, Version: w.version(d.ID)}}); err != nil {
		w.t.Fatalf("deploying %s: %v", d.ID, err)
	}
	w.connects(d)
}

// counter is the value of counter (or gauge) name of w's syncers.
func (w *world) counter(name string) float64 {
	w.t.Helper()
	mfs, err := w.reg.Gather()
	if err != nil {
		w.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			if g := mf.GetMetric()[0].GetGauge(); g != nil {
				return g.GetValue()
			}
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return 0
}

func (w *world) fullSyncs() float64 { return w.counter("devicehub_devauth_full_syncs_total") }

// settled ends a restart case: the login set by hand (w.stray; none when
// its ID is empty) is refused, and the syncers counted base full syncs,
// one more when full.
func (w *world) settled(stray meta.DeviceLogin, base float64, full bool) {
	w.t.Helper()
	if stray.ID != "" {
		w.refused(stray)
	}
	if full {
		base++
	}
	if got := w.fullSyncs(); got != base {
		w.t.Fatalf("%v full syncs, want %v", got, base)
	}
}

// TestBrokerRestart: a broker restarted from the snapshot its plugin
// wrote at shutdown is sent only what changed while it was away, not
// every login again; whatever it holds that devicehub did not sync (an
// older or missing snapshot, a login set by hand, with or without an
// installation) is replaced by a full sync once it is back, and a login
// changed or withdrawn while it was away is not admitted after.
func TestBrokerRestart(t *testing.T) {
	for _, tc := range []struct {
		name  string
		sig   syscall.Signal
		stray string // a login set by hand before the restart: "own" (this installation's), "none" (no installation), "": none
		away  bool   // a key changed and a device withdrawn while the broker is away: applied once it is back
		full  bool   // a full sync after the restart
	}{
		{name: "restarted from its snapshot", sig: syscall.SIGTERM},
		{name: "changes while away", sig: syscall.SIGTERM, away: true},
		{name: "killed before any snapshot", sig: syscall.SIGKILL, full: true},
		{name: "a login of this installation set by hand", sig: syscall.SIGTERM, stray: "own", full: true},
		{name: "a login of no installation set by hand", sig: syscall.SIGTERM, stray: "none", full: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t)
			w.reg = prometheus.NewRegistry()
			a, gone := w.device(randID("a-"), meta.StateOffline), w.device(randID("g-"), meta.StateOffline)
			later := w.device(randID("l-"), meta.StateNotActive)
			s, _ := w.syncer()
			w.eventually(a, true)
			w.eventually(gone, true)
			stray := w.stray(tc.stray)
			if got := w.fullSyncs(); got != 1 {
				t.Fatalf("%v full syncs before the restart, want 1 (the start's)", got)
			}

			w.broker.Stop(tc.sig)
			old := a
			if tc.away {
				a.SecureKey = strings.ToLower(rand.Text())
				w.exec(`UPDATE devices SET secure_key = $2 WHERE id = $1`, a.ID, a.SecureKey)
				w.exec(`UPDATE devices SET state = 'notActive' WHERE id = $1`, gone.ID)
			}
			w.broker.Start()
			// The syncer is back and has compared the plugin with what it
			// synced (and synced everything again if it must: in the same
			// turn of its loop, before the next change is applied).
			testkit.Eventually(t, 20*time.Second, "the syncer to compare the restarted broker's plugin", func() bool {
				return w.counter("devicehub_devauth_checks_total") >= 1
			})
			w.deploy(s, later) // confirmed: the syncer follows changes
			w.connects(a)
			if tc.away {
				w.refused(old)
				w.refused(gone)
			} else {
				w.connects(gone)
			}
			w.settled(stray, 1, tc.full)
		})
	}
}

// TestSyncerRestart: a syncer that starts (a devicehub restart, a new
// leader) and finds the plugin holding every login PostgreSQL has sends
// none; what changed while no syncer led (a key), and a login set by hand
// (with this installation or none), makes it sync everything, and the
// old key and the strays are refused after.
func TestSyncerRestart(t *testing.T) {
	for _, tc := range []struct {
		name  string
		key   bool   // a key changed while no syncer led
		stray string // a login set by hand while no syncer led: "own", "none", "": none
		full  bool   // the new syncer sends every login
	}{
		{name: "the plugin holds every login"},
		{name: "a key changed meanwhile", key: true, full: true},
		{name: "a login of this installation set by hand", stray: "own", full: true},
		{name: "a login of no installation set by hand", stray: "none", full: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t)
			a, b := w.device(randID("a-"), meta.StateOffline), w.device(randID("b-"), meta.StateOffline)
			later := w.device(randID("l-"), meta.StateNotActive)
			_, stop := w.syncer()
			w.eventually(a, true)
			w.eventually(b, true)
			stop()

			old := a
			if tc.key {
				a.SecureKey = strings.ToLower(rand.Text())
				w.exec(`UPDATE devices SET secure_key = $2 WHERE id = $1`, a.ID, a.SecureKey)
			}
			stray := w.stray(tc.stray)

			w.reg = prometheus.NewRegistry() // the new syncer's metrics
			s, _ := w.syncer()
			// The new syncer's first sync (compared, or sent) is done once
			// it says the plugin holds the two logins; then a deploy,
			// confirmed: the syncer follows changes.
			testkit.Eventually(t, 20*time.Second, "the new syncer's first sync", func() bool {
				return w.counter("devicehub_devauth_logins") == 2
			})
			w.deploy(s, later) // confirmed: the syncer follows changes
			w.connects(a)
			w.connects(b)
			if tc.key {
				w.refused(old)
			}
			w.settled(stray, 0, tc.full)
		})
	}
}
