package ingest

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"go.uber.org/goleak"

	"devicehub/bench/testkit"
	"devicehub/ingest/mqtttest"
	"devicehub/meta"
	"devicehub/meta/metatest"
	"devicehub/tsdb"
	"devicehub/tsdb/tsdbtest"
)

// Integration tests use the project's services (start them with
// .ci/services): Mosquitto at $DEVICEHUB_TEST_MQTT_URL (default
// tcp://127.0.0.1:1884), ClickHouse at $DEVICEHUB_CLICKHOUSE_ADDR (default
// 127.0.0.1:9000) and PostgreSQL through metatest. Every test has its own
// PostgreSQL and ClickHouse databases, product ids, client ids and share
// group, so tests do not see each other's traffic.

func TestMain(m *testing.M) {
	testkit.MainNoLeaks(m, goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"))
}

func brokerURL() string { return mqtttest.SharedURL() }

func randID(prefix string) string { return testkit.RandID(prefix) }

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// env is one test's world: its PostgreSQL store and ClickHouse database.
type env struct {
	t     testing.TB
	store *meta.Store
	ch    *tsdb.DB
}

func newEnv(t testing.TB) *env {
	t.Helper()
	return &env{t: t, store: metatest.NewStore(t), ch: tsdbtest.NewDB(t, time.UTC)}
}

// newEnvOneDevice is a new env with one product and one deployed device
// of it, "<product>-d", offline.
func newEnvOneDevice(t testing.TB) (e *env, product, device string) {
	t.Helper()
	e = newEnv(t)
	product = randID("p")
	e.product(product)
	device = product + "-d"
	e.device(device, product, "offline")
	return e, product, device
}

func (e *env) exec(q string, args ...any) {
	e.t.Helper()
	if _, err := e.store.DB().Exec(q, args...); err != nil {
		e.t.Fatalf("%s: %v", q, err)
	}
}

func (e *env) product(id string) {
	e.exec(`INSERT INTO products (id, name, device_type, state) VALUES ($1, $1, 'device', 1)`, id)
}

// device adds a device in state (notActive, offline or online).
func (e *env) device(id, product, state string) {
	e.exec(`INSERT INTO devices (id, name, product_id, state) VALUES ($1, $1, $2, $3)`, id, product, state)
}

// devices adds n deployed devices of product, "<product>-d0" to
// "<product>-d<n-1>".
func (e *env) devices(product string, n int) {
	for i := range n {
		e.device(fmt.Sprintf("%s-d%d", product, i), product, "offline")
	}
}

func (e *env) count(q string, args ...any) uint64 {
	e.t.Helper()
	var n uint64
	if err := e.ch.Conn().QueryRow(context.Background(), q, args...).Scan(&n); err != nil {
		e.t.Fatalf("%s: %v", q, err)
	}
	return n
}

// testOptions are ingest options private to one test.
func testOptions(products ...string) Options {
	opt := DefaultOptions()
	opt.BrokerURL = brokerURL()
	opt.ClientID = randID("ingest-test-")
	opt.ShareGroup = randID("g")
	opt.ProductIDs = products
	opt.Writer.FlushInterval = 50 * time.Millisecond
	opt.StateFlushInterval = 50 * time.Millisecond
	opt.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	return opt
}

// startIngester starts an ingester on e; it is closed and its broker
// sessions removed at the end of the test.
func (e *env) startIngester(opt Options) *Ingester {
	e.t.Helper()
	return e.startIngesterWith(opt, e.store)
}

// startIngesterWith is startIngester writing device state through states.
func (e *env) startIngesterWith(opt Options, states StateApplier) *Ingester {
	e.t.Helper()
	in, err := New(ctxT(e.t, 30*time.Second), opt, e.ch, e.store, states)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = in.Close(ctx)
		purgeSessions(e.t, opt)
	})
	return in
}

// purgeSessions removes the persistent sessions of opt's clients from the
// broker (a clean-session connect with the same ids).
func purgeSessions(t testing.TB, opt Options) {
	for _, id := range SessionIDs(opt) {
		c := mqtt.NewClient(mqtttest.ServiceOptions(opt.BrokerURL, id).
			SetCleanSession(true))
		if tok := c.Connect(); tok.WaitTimeout(5*time.Second) && tok.Error() == nil {
			c.Disconnect(0)
		}
	}
}

// newPublisher connects a simulated device (mqtttest.Device) with a
// random client id to the test broker, logged in as a gateway.
func newPublisher(t testing.TB, configure func(*mqtt.ClientOptions)) *mqtttest.Device {
	t.Helper()
	gw := mqtttest.Gateway(t, brokerURL())
	return mqtttest.ConnectDevice(t, brokerURL(), randID("dev-"), func(o *mqtt.ClientOptions) {
		gw(o)
		if configure != nil {
			configure(o)
		}
	})
}
