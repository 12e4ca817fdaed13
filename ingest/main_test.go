package ingest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"sync"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"go.uber.org/goleak"

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
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener")); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

func brokerURL() string {
	if v := os.Getenv("DEVICEHUB_TEST_MQTT_URL"); v != "" {
		return v
	}
	return "tcp://127.0.0.1:1884"
}

func randID(prefix string) string {
	var b [5]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

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

// eventually polls cond until it holds or the deadline passes.
func eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
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
	in, err := New(ctxT(e.t, 30*time.Second), opt, e.ch, e.store, e.store)
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
	for n := range opt.Connections {
		c := mqtt.NewClient(mqtt.NewClientOptions().AddBroker(opt.BrokerURL).
			SetClientID(fmt.Sprintf("%s-%d", opt.ClientID, n)).SetCleanSession(true))
		if tok := c.Connect(); tok.WaitTimeout(5*time.Second) && tok.Error() == nil {
			c.Disconnect(0)
		}
	}
}

// device is a simulated device: a paho client whose TCP connection can be
// cut without an MQTT DISCONNECT, so that the broker sends its last will.
type simDevice struct {
	mqtt.Client
	mu   sync.Mutex
	conn net.Conn
}

func newPublisher(t testing.TB, configure func(*mqtt.ClientOptions)) *simDevice {
	t.Helper()
	d := &simDevice{}
	o := mqtt.NewClientOptions().AddBroker(brokerURL()).SetClientID(randID("dev-")).
		SetCleanSession(true).SetAutoReconnect(false).
		SetCustomOpenConnectionFn(func(uri *url.URL, _ mqtt.ClientOptions) (net.Conn, error) {
			c, err := net.DialTimeout("tcp", uri.Host, 5*time.Second)
			d.mu.Lock()
			d.conn = c
			d.mu.Unlock()
			return c, err
		})
	if configure != nil {
		configure(o)
	}
	d.Client = mqtt.NewClient(o)
	if err := waitToken(d.Connect(), 10*time.Second); err != nil {
		t.Fatalf("device connect: %v", err)
	}
	t.Cleanup(func() { d.Disconnect(0) })
	return d
}

// cut closes the TCP connection under the client: no DISCONNECT is sent.
func (d *simDevice) cut() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.conn.Close()
}

func (d *simDevice) publish(t testing.TB, topic string, qos byte, payload string) {
	t.Helper()
	if err := waitToken(d.Publish(topic, qos, false, payload), 10*time.Second); err != nil {
		t.Fatalf("publish %s: %v", topic, err)
	}
}
