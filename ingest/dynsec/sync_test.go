package dynsec_test

import (
	"context"
	"crypto/rand"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"devicehub/ingest/dynsec"
	"devicehub/ingest/mqtttest"
	"devicehub/meta"
	"devicehub/meta/metatest"
)

func randID(prefix string) string { return prefix + strings.ToLower(rand.Text()[:8]) }

// world is a private broker and a PostgreSQL database of one test.
type world struct {
	t      *testing.T
	broker *mqtttest.Broker
	store  *meta.Store
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

// device adds a device with its login, in state.
func (w *world) device(id, key, state string) meta.DeviceLogin {
	w.exec(`INSERT INTO devices (id, name, product_id, state, secure_id, secure_key) VALUES ($1, $1, 'p', $2, $1, $3)`, id, state, key)
	return meta.DeviceLogin{ID: id, ProductID: "p", SecureID: id, SecureKey: key, Deployed: state != meta.StateNotActive}
}

// syncer runs a syncer until the test ends.
func (w *world) syncer() *dynsec.Syncer {
	u, p := mqtttest.Service()
	s := dynsec.New(w.store, dynsec.Options{BrokerURL: w.broker.URL(), Username: u, Password: p, Retry: 200 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx) }()
	w.t.Cleanup(func() { cancel(); <-done })
	return s
}

func (w *world) admin() *dynsec.Client {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := dynsec.Dial(ctx, mqtttest.ServiceOptions(w.broker.URL(), randID("admin-")), nil)
	if err != nil {
		w.t.Fatal(err)
	}
	w.t.Cleanup(c.Close)
	return c
}

func (w *world) do(cmds ...dynsec.Command) {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rs, err := w.admin().Do(ctx, cmds...)
	if err != nil {
		w.t.Fatal(err)
	}
	for _, r := range rs {
		if err := r.Err(); err != nil {
			w.t.Fatal(err)
		}
	}
}

// connects reports whether the broker lets d in with its login.
func (w *world) connects(d meta.DeviceLogin) bool {
	c := mqtt.NewClient(mqtt.NewClientOptions().AddBroker(w.broker.URL()).SetClientID(d.ID).
		SetUsername(d.SecureID).SetPassword(d.SecureKey).SetConnectTimeout(5 * time.Second))
	tok := c.Connect()
	if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		return false
	}
	c.Disconnect(0)
	return true
}

// eventually waits up to 2 s, the bound promised for a change.
func (w *world) eventually(what string, cond func() bool) {
	w.t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			w.t.Fatalf("not within 2s: %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func waitStarted(t *testing.T, s *dynsec.Syncer) {
	t.Helper()
	select {
	case <-s.Started():
	case <-time.After(10 * time.Second):
		t.Fatal("the syncer did not sync within 10s")
	}
}

// TestSyncAllMendsTheBroker: a full sync removes what it manages and
// PostgreSQL no longer has, mends a changed key, adds what is missing and
// leaves every login it does not manage alone.
func TestSyncAllMendsTheBroker(t *testing.T) {
	w := newWorld(t)
	d1 := w.device("d1", "key-one-0123456789", "offline")
	d2 := w.device("d2", "key-two-0123456789", "online")
	d3 := w.device("d3", "key-three-012345678", meta.StateNotActive)
	// What an earlier devicehub left: d3 deployed then, d2 with an older
	// key, a device since deleted; and an operator's own login.
	old := d2
	old.SecureKey = "the-old-key-012345"
	stale := d3
	stale.Deployed = true
	gone := meta.DeviceLogin{ID: "gone", ProductID: "p", SecureID: "gone", SecureKey: "gone-key-012345678", Deployed: true}
	inst, err := w.store.InstallationID(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []meta.DeviceLogin{old, stale, gone} {
		w.do(createCommands(inst, d)...)
	}
	w.do(dynsec.Command{"command": "createClient", "username": "operator", "password": "operator-pw"})
	// Another deployment's device on the same broker stays as it is.
	other := meta.DeviceLogin{ID: "other", ProductID: "p", SecureID: "other", SecureKey: "other-key-0123456", Deployed: true}
	w.do(createCommands("another", other)...)

	waitStarted(t, w.syncer())
	for _, c := range []struct {
		d    meta.DeviceLogin
		want bool
	}{{d1, true}, {d2, true}, {old, false}, {d3, false}, {gone, false}} {
		if got := w.connects(c.d); got != c.want {
			t.Errorf("%s with key %s connects: %v, want %v", c.d.ID, c.d.SecureKey, got, c.want)
		}
	}
	if !w.connects(meta.DeviceLogin{ID: randID("op-"), SecureID: "operator", SecureKey: "operator-pw"}) {
		t.Error("the operator's own login was changed")
	}
	if !w.connects(other) {
		t.Error("another deployment's device login was removed")
	}
}

// createCommands are what the syncer of installation inst sends for a new
// device (white box: the same names and fingerprint).
func createCommands(inst string, d meta.DeviceLogin) []dynsec.Command {
	return []dynsec.Command{
		{"command": "createRole", "rolename": dynsec.RoleName(inst, d.ID), "acls": dynsec.DeviceACLs(d.ProductID, d.ID)},
		{"command": "createClient", "username": d.SecureID, "password": d.SecureKey, "clientid": d.ID,
			"textname": dynsec.DeviceText(inst), "textdescription": dynsec.Fingerprint(d),
			"roles": []map[string]any{{"rolename": dynsec.RoleName(inst, d.ID)}}},
	}
}

// TestSyncFollowsChanges: deploy, key rotation, a new secureId, undeploy
// and delete, written to PostgreSQL by anyone, reach the broker within 2 s.
func TestSyncFollowsChanges(t *testing.T) {
	w := newWorld(t)
	waitStarted(t, w.syncer())
	d := w.device("d1", "first-key-01234567", meta.StateNotActive)
	if w.connects(d) {
		t.Fatal("a notActive device connects")
	}
	w.exec(`UPDATE devices SET state = 'offline' WHERE id = 'd1'`)
	w.eventually("deployed device connects", func() bool { return w.connects(d) })

	detail, err := w.store.RotateDeviceSecret(context.Background(), "d1", meta.User{ID: "u"})
	if err != nil {
		t.Fatal(err)
	}
	w.eventually("old key refused", func() bool { return !w.connects(d) })
	d.SecureKey = detail.Configuration.SecureKey
	w.eventually("new key accepted", func() bool { return w.connects(d) })

	w.exec(`UPDATE devices SET secure_id = 'sid-1' WHERE id = 'd1'`)
	w.eventually("old username refused", func() bool { return !w.connects(d) })
	d.SecureID = "sid-1"
	w.eventually("new username accepted", func() bool { return w.connects(d) })

	w.exec(`UPDATE devices SET state = 'notActive' WHERE id = 'd1'`)
	w.eventually("undeployed device refused", func() bool { return !w.connects(d) })
	w.exec(`UPDATE devices SET state = 'offline' WHERE id = 'd1'`)
	w.eventually("redeployed device connects", func() bool { return w.connects(d) })
	w.exec(`DELETE FROM devices WHERE id = 'd1'`)
	w.eventually("deleted device refused", func() bool { return !w.connects(d) })
}

// TestOneLeader: of two syncers on one database only one writes; when it
// stops, the other takes over.
func TestOneLeader(t *testing.T) {
	w := newWorld(t)
	u, p := mqtttest.Service()
	run := func() (*dynsec.Syncer, context.CancelFunc, chan struct{}) {
		s := dynsec.New(w.store, dynsec.Options{BrokerURL: w.broker.URL(), Username: u, Password: p, Retry: 100 * time.Millisecond})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); s.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-done })
		return s, cancel, done
	}
	first, stopFirst, firstDone := run()
	waitStarted(t, first)
	second, _, _ := run()
	select {
	case <-second.Started():
		t.Fatal("a second syncer led while the first holds the lock")
	case <-time.After(500 * time.Millisecond):
	}
	stopFirst()
	<-firstDone
	waitStarted(t, second)
	d := w.device("d1", "key-0123456789abcd", "offline")
	w.eventually("the new leader applies a deploy", func() bool { return w.connects(d) })
}
