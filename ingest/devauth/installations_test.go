package devauth_test

import (
	"context"
	"crypto/rand"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"devicehub/bench/testkit"
	"devicehub/ingest/devauth"
	"devicehub/ingest/dynsec"
	"devicehub/ingest/mqtttest"
	"devicehub/meta"
	"devicehub/meta/metatest"
)

// installation is one devicehub database whose syncer feeds a broker pool
// that other installations feed too.
type installation struct {
	t     *testing.T
	store *meta.Store
	id    string // installation id
	urls  []string
	logs  *logLines
	reg   *prometheus.Registry
}

func newInstallation(t *testing.T, urls []string) *installation {
	t.Helper()
	in := &installation{t: t, store: metatest.NewStore(t), urls: urls, logs: &logLines{}}
	if _, err := in.store.DB().Exec(`INSERT INTO products (id, name, device_type, state) VALUES ('p', 'p', 'device', 1)`); err != nil {
		t.Fatal(err)
	}
	if err := in.store.DB().Get(&in.id, `SELECT id FROM installation`); err != nil {
		t.Fatal(err)
	}
	return in
}

// device adds a deployed device of this installation; secureID "" is id.
func (in *installation) device(id, secureID string) meta.DeviceLogin {
	in.t.Helper()
	if secureID == "" {
		secureID = id
	}
	key := strings.ToLower(rand.Text())
	if _, err := in.store.DB().Exec(`INSERT INTO devices (id, name, product_id, state, secure_id, secure_key) VALUES ($1, $1, 'p', 'offline', $2, $3)`,
		id, secureID, key); err != nil {
		in.t.Fatal(err)
	}
	return meta.DeviceLogin{ID: id, ProductID: "p", SecureID: secureID, SecureKey: key, Deployed: true}
}

// syncer runs this installation's syncer (a fresh registry each) until
// the test ends or stop is called; every start is a full sync.
func (in *installation) syncer(check time.Duration) (stop func()) {
	u, p := mqtttest.Service()
	in.reg = prometheus.NewRegistry()
	s := devauth.New(in.store, devauth.Options{BrokerURL: strings.Join(in.urls, ","), Username: u, Password: p,
		Retry: 200 * time.Millisecond, CheckInterval: check, Registerer: in.reg,
		Logger: slog.New(slog.NewTextHandler(in.logs, &slog.HandlerOptions{Level: slog.LevelInfo}))})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx) }()
	stop = func() { cancel(); <-done }
	in.t.Cleanup(stop)
	return stop
}

// metric is the value of a counter of the syncer's registry, by its name
// and one label's value ("" for none).
func (in *installation) metric(name, label string) float64 {
	in.t.Helper()
	mfs, err := in.reg.Gather()
	if err != nil {
		in.t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			match := label == ""
			for _, l := range m.GetLabel() {
				match = match || l.GetValue() == label
			}
			if match {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// admitted reports whether d logs in at broker url.
func admitted(t *testing.T, url string, d meta.DeviceLogin) bool {
	t.Helper()
	c, err := mqtttest.Dial(url, d.ID, d.SecureID, d.SecureKey, nil)
	if err == nil {
		c.Disconnect(0)
	}
	return err == nil
}

func pluginAt(t *testing.T, url string) *dynsec.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := dynsec.DialTopic(ctx, mqtttest.ServiceConfig(url, randID("ctl-")), devauth.ControlTopic, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// TestInstallationsShareBrokers: two devicehubs with their own databases
// feed one broker pool. Each keeps every login of its own through the
// other's full syncs; a device id or username the other holds is refused
// (logged, counted), never taken over; a login removed behind an
// installation's back is restored by its regular check.
func TestInstallationsShareBrokers(t *testing.T) {
	t.Parallel()
	b1, b2 := mqtttest.StartBroker(t), mqtttest.StartBroker(t)
	urls := []string{b1.URL(), b2.URL()}
	a, b := newInstallation(t, urls), newInstallation(t, urls)
	aDevs := []meta.DeviceLogin{a.device(randID("a-"), ""), a.device(randID("a-"), ""), a.device(randID("a-"), "")}
	bDevs := []meta.DeviceLogin{b.device(randID("b-"), ""), b.device(randID("b-"), "")}
	// b's rows that clash with a's logins: the same device id, and
	// another device with a's username.
	sameID := b.device(aDevs[0].ID, randID("u-"))
	sameUser := b.device(randID("b-"), aDevs[1].SecureID)
	everyone := func(what string, devs ...meta.DeviceLogin) {
		t.Helper()
		for _, url := range urls {
			for _, d := range devs {
				testkit.Eventually(t, 10*time.Second, what+": "+d.ID+" at "+url, func() bool { return admitted(t, url, d) })
			}
		}
	}
	check := 300 * time.Millisecond
	a.syncer(check)
	everyone("a's devices after a's sync", aDevs...)

	stopB := b.syncer(check)
	everyone("b's devices after b's sync", bDevs...)
	// b's full sync is over at every broker: a's logins are all there.
	testkit.Eventually(t, 10*time.Second, "b's refusals counted", func() bool {
		return b.metric("devicehub_devauth_refused_logins_total", "other_installation") >= 4 // 2 devices x 2 brokers
	})
	for _, url := range urls {
		for _, d := range aDevs {
			if !admitted(t, url, d) {
				t.Errorf("%s of installation a refused at %s after b's full sync", d.ID, url)
			}
		}
		if admitted(t, url, sameID) || admitted(t, url, sameUser) {
			t.Errorf("a device of b took a login of a at %s", url)
		}
	}
	if !b.logs.has("another installation") {
		t.Error("b's log does not say why its devices were refused")
	}

	// b syncs again (a restart): a keeps every login.
	stopB()
	b.syncer(check)
	testkit.Eventually(t, 10*time.Second, "b's second sync refusals counted", func() bool {
		return b.metric("devicehub_devauth_refused_logins_total", "other_installation") >= 4
	})
	everyone("b's devices after b's second sync", bDevs...)
	for _, url := range urls {
		for _, d := range aDevs {
			if !admitted(t, url, d) {
				t.Errorf("%s of installation a refused at %s after b's second full sync", d.ID, url)
			}
		}
	}

	// Another installation's deleteDevice (or an older devicehub's,
	// without one) is refused.
	ctl := pluginAt(t, b2.URL())
	for _, cmd := range []dynsec.Command{
		{"command": "deleteDevice", "id": aDevs[2].ID, "installation": b.id},
		{"command": "deleteDevice", "id": aDevs[2].ID},
	} {
		if r := do(t, ctl, cmd)[0]; !strings.Contains(r.Error, "another installation") {
			t.Errorf("%v: %+v", cmd, r)
		}
	}
	if !admitted(t, b2.URL(), aDevs[2]) {
		t.Fatal("another installation's deleteDevice removed a login")
	}

	// Removed behind a's back (a command in a's name): a's check restores
	// it within its interval.
	// Nothing so far changed what a synced: its checks found each
	// broker's count and digest equal to its own, computed apart (Go
	// here, C there).
	testkit.Eventually(t, 10*time.Second, "a's checks at both brokers", func() bool {
		return a.metric("devicehub_devauth_checks_total", "") >= 4
	})
	before := a.metric("devicehub_devauth_resyncs_total", "mismatch")
	if before != 0 || b.metric("devicehub_devauth_resyncs_total", "") != 0 {
		t.Errorf("resyncs before anything was removed: a %v, b %v", before, b.metric("devicehub_devauth_resyncs_total", ""))
	}
	if r := do(t, ctl, dynsec.Command{"command": "deleteDevice", "id": aDevs[2].ID, "installation": a.id})[0]; r.Error != "" {
		t.Fatal(r.Error)
	}
	if admitted(t, b2.URL(), aDevs[2]) {
		t.Fatal("the login removed in a's name still logs in")
	}
	testkit.Eventually(t, 10*time.Second, "the removed login restored by a's check", func() bool {
		return admitted(t, b2.URL(), aDevs[2])
	})
	if got := a.metric("devicehub_devauth_resyncs_total", "mismatch"); got <= before {
		t.Errorf("resyncs{reason=mismatch} %v, was %v", got, before)
	}
	if !a.logs.has("does not hold what was synced") {
		t.Error("a's log does not say why it synced again")
	}
	// A key changed behind a's back: the digest differs, the count not.
	set := dynsec.Command{"command": "setDevice", "id": aDevs[1].ID, "product": "p", "username": aDevs[1].SecureID,
		"key": "changed-behind-its-back", "installation": a.id}
	if r := do(t, ctl, set)[0]; r.Error != "" {
		t.Fatal(r.Error)
	}
	testkit.Eventually(t, 10*time.Second, "the changed login restored by a's check", func() bool {
		return admitted(t, b2.URL(), aDevs[1])
	})
	everyone("every device of both after all that", append(append([]meta.DeviceLogin{}, aDevs...), bDevs...)...)
}

// TestReservedUsernames: a device whose secureId is another login of the
// broker (an operator's, an integration's: a dynamic-security client)
// never takes it, whether the device came first or the login did: the
// operator's own password keeps working and the device is refused.
func TestReservedUsernames(t *testing.T) {
	t.Parallel()
	b := mqtttest.StartBroker(t)
	in := newInstallation(t, []string{b.URL()})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin, err := dynsec.Dial(ctx, mqtttest.ServiceConfig(b.URL(), randID("admin-")), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	operator := func(username string) {
		t.Helper()
		if err := dynsec.AddGateway(ctx, admin, username, "operator-password"); err != nil {
			t.Fatal(err)
		}
	}
	operatorIn := func(username string) bool {
		c, err := mqtttest.Dial(b.URL(), randID("op-"), username, "operator-password", nil)
		if err == nil {
			c.Disconnect(0)
		}
		return err == nil
	}
	// An operator's login exists; a device is given its name as secureId.
	early := randID("op-")
	operator(early)
	taker := in.device(randID("d-"), early)
	// A device has a name first; an operator's login is made with it.
	late := randID("op-")
	first := in.device(randID("d-"), late)
	plain := in.device(randID("d-"), "")
	in.syncer(300 * time.Millisecond)
	testkit.Eventually(t, 10*time.Second, "the plain device admitted", func() bool { return admitted(t, b.URL(), plain) })
	testkit.Eventually(t, 10*time.Second, "the device with a free name admitted", func() bool { return admitted(t, b.URL(), first) })
	if admitted(t, b.URL(), taker) {
		t.Error("a device logged in with an operator's username")
	}
	if !operatorIn(early) {
		t.Error("the operator's own password refused once a device was given its username")
	}
	if in.metric("devicehub_devauth_refused_logins_total", "reserved") < 1 {
		t.Error("the refusal is not counted")
	}
	operator(late)
	testkit.Eventually(t, 10*time.Second, "the operator made after the device logs in", func() bool { return operatorIn(late) })
	if admitted(t, b.URL(), first) {
		t.Error("the device still logs in with a name an operator's login now has")
	}
	if !admitted(t, b.URL(), plain) {
		t.Error("another device lost its login")
	}
	// The plugin refuses it too, whoever asks.
	r := do(t, pluginAt(t, b.URL()), dynsec.Command{"command": "setDevice", "id": "x", "product": "p", "username": early,
		"key": "attacker-key-0123456789", "installation": in.id})[0]
	if !strings.Contains(r.Error, "reserved") {
		t.Errorf("setDevice with an operator's username: %+v", r)
	}
}
