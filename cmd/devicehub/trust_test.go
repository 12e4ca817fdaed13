package main

import (
	"context"
	"crypto/md5"
	"crypto/tls"
	"crypto/x509"
	"database/sql"
	"encoding/hex"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	_ "github.com/lib/pq"

	"devicehub/bench/sim"
	"devicehub/bench/testkit"
	"devicehub/ingest/mqtttest"
	"devicehub/schema"
	"devicehub/tsdb"
	"devicehub/tsdb/tsdbtest"
)

// trustEnv is the real binary on a broker of its own (with a TLS
// listener), a product and its deployed devices created through the API.
type trustEnv struct {
	t       *testing.T
	broker  *mqtttest.Broker
	bin     string
	env     []string
	srv     *server
	token   string
	product string
	db      *tsdb.DB
}

// device is a device's login as its creator saw it.
type device struct{ id, secureID, key string }

func newTrustEnv(t *testing.T) *trustEnv {
	t.Helper()
	e := &trustEnv{t: t, broker: mqtttest.StartBrokerTLS(t), bin: testkit.Devicehub(t)}
	e.start("trust", e.broker.URL())
	return e
}

// start runs the binary with -mqtt-url brokers and creates the product.
func (e *trustEnv) start(name, brokers string, env ...string) {
	t := e.t
	t.Helper()
	var chDB, suffix string
	e.env, chDB, suffix = testEnv(t, brokers, name)
	e.env = append(e.env, env...)
	e.srv = startServer(t, e.bin, e.env, name)
	e.db = tsdbtest.OpenDB(t, chDB, nil)
	t.Cleanup(func() { // before OpenDB's drop: the server stops first
		e.srv.signal(syscall.SIGTERM)
		e.srv.wait(15 * time.Second)
	})
	e.token = login(t, e.srv.base)
	e.product = "tp" + suffix
	e.srv.call(t, e.token, "POST", "/api/device/product", map[string]any{
		"id": e.product, "name": "Trust", "classifiedId": "test", "modelFrom": "custom", "accessId": "mqtt", "deviceType": "device",
		"metadata": `{"properties":[{"id":"temp","name":"T","valueType":{"type":"float"}}]}`})
	e.srv.call(t, e.token, "POST", "/api/device-product/"+e.product+"/deploy", nil)
}

// newDevice creates and deploys a device; the create response is the one
// place (with rotation) its key is shown.
func (e *trustEnv) newDevice(id string) device {
	e.t.Helper()
	var d struct {
		Configuration struct {
			SecureID  string `json:"secureId"`
			SecureKey string `json:"secureKey"`
		} `json:"configuration"`
	}
	e.srv.do(e.t, e.token, "POST", "/api/device/instance", map[string]any{"id": id, "name": id, "productId": e.product}, &d)
	if d.Configuration.SecureID != id || len(d.Configuration.SecureKey) < 16 || strings.Contains(d.Configuration.SecureKey, "*") {
		e.t.Fatalf("create response login: %+v", d.Configuration)
	}
	if status, code := e.srv.statusCode(e.t, e.token, "POST", "/api/device/instance/"+id+"/deploy"); status != 200 {
		e.t.Fatalf("deploy %s: %d %s\n%s", id, status, code, e.srv.logTail())
	}
	dev := device{id, d.Configuration.SecureID, d.Configuration.SecureKey}
	e.connectsAtOnce(dev, "its deploy call returned")
	return dev
}

// connectsAtOnce asserts that d's login works now, at the first try: a
// device write answers only once the broker holds its change.
func (e *trustEnv) connectsAtOnce(d device, after string) {
	e.t.Helper()
	c, err := dial(e.broker.URL(), d.id, d.secureID, d.key, nil)
	if err != nil {
		e.t.Fatalf("device %s refused right after %s: %v\n%s", d.id, after, err, e.srv.logTail())
	}
	c.Disconnect(0)
}

func (e *trustEnv) topic(id, suffix string) string { return "/" + e.product + "/" + id + "/" + suffix }

// dial connects as clientID with a login; the error is the broker's
// refusal, if any. lost, if not nil, is closed when the broker drops the
// connection.
func dial(url, clientID, username, password string, lost chan struct{}, configure ...func(*mqtt.ClientOptions)) (mqtt.Client, error) {
	return mqtttest.Dial(url, clientID, username, password, lost, configure...)
}

func (e *trustEnv) connect(d device, lost chan struct{}) mqtt.Client {
	e.t.Helper()
	c, err := dial(e.broker.URL(), d.id, d.secureID, d.key, lost)
	if err != nil {
		e.t.Fatalf("device %s with its own login: %v", d.id, err)
	}
	e.t.Cleanup(func() { c.Disconnect(0) })
	return c
}

// waitConnects waits (2 s, the promised bound) until d's login works.
func (e *trustEnv) waitConnects(d device) {
	e.t.Helper()
	var err error
	if !testkit.Within(2*time.Second, func() bool {
		var c mqtt.Client
		if c, err = dial(e.broker.URL(), d.id, d.secureID, d.key, nil); err == nil {
			c.Disconnect(0)
		}
		return err == nil
	}) {
		e.t.Fatalf("device %s cannot connect 2s after its deploy: %v\n%s", d.id, err, e.srv.logTail())
	}
}

// refused asserts that the broker refuses the login.
func (e *trustEnv) refused(what, url, clientID, username, password string, configure ...func(*mqtt.ClientOptions)) {
	e.t.Helper()
	c, err := dial(url, clientID, username, password, nil, configure...)
	if err == nil {
		c.Disconnect(0)
		e.t.Fatalf("%s: the broker accepted the connection", what)
	}
}

func publish(t *testing.T, c mqtt.Client, topic, payload string) {
	t.Helper()
	tok := c.Publish(topic, 1, false, payload)
	if !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("publish %s: %v", topic, tok.Error())
	}
}

// stored is the number of temp values stored for device with value v.
func (e *trustEnv) stored(deviceID string, v float64) uint64 {
	e.t.Helper()
	var n uint64
	if err := e.db.Conn().QueryRow(context.Background(),
		`SELECT count() FROM device_property WHERE device_id = ? AND property = 'temp' AND num_value = ?`,
		deviceID, v).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

func (e *trustEnv) waitStored(deviceID string, v float64) {
	e.t.Helper()
	testkit.Eventually(e.t, 10*time.Second, "value stored", func() bool { return e.stored(deviceID, v) > 0 })
}

func report(v float64) string {
	return `{"properties":{"temp":` + strconv.FormatFloat(v, 'f', -1, 64) + `}}`
}

// waitLost waits for the client to see the connection its broker cut
// before the call that changed its login returned (the client's reader
// notices within moments).
func waitLost(t *testing.T, lost chan struct{}, what string) {
	t.Helper()
	select {
	case <-lost:
	case <-time.After(time.Second):
		t.Fatalf("%s: the device's session was not cut", what)
	}
}

// TestDeviceTrust attacks the broker as devices would: every refusal here
// is the broker's, with the logins and rights devicehub keeps in its own
// broker plugin (ingest/devauth).
func TestDeviceTrust(t *testing.T) {
	t.Parallel()
	e := newTrustEnv(t)
	url := e.broker.URL()
	a, b := e.newDevice("ta-"+randHex()), e.newDevice("tb-"+randHex())

	t.Run("refused logins", func(t *testing.T) {
		e.refused("anonymous", url, a.id, "", "")
		e.refused("wrong key", url, a.id, a.secureID, a.key+"x")
		e.refused("another device's client id", url, b.id, a.secureID, a.key)
		e.refused("unknown username", url, a.id, "nobody-"+randHex(), a.key)
		e.refused("10 kB key", url, a.id, a.secureID, strings.Repeat("k", 10<<10))
		e.refused("10 kB username", url, a.id, strings.Repeat("u", 10<<10), a.key)
		e.refused("non-UTF-8 username", url, a.id, "\xff\xfe"+a.secureID, a.key)
		e.refused("a device id that is no device", url, "no-such-device", a.secureID, a.key)
	})

	t.Run("TLS with its own login", func(t *testing.T) {
		ca, err := os.ReadFile(e.broker.CAFile())
		if err != nil {
			t.Fatal(err)
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(ca)
		withTLS := func(o *mqtt.ClientOptions) { o.SetTLSConfig(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}) }
		e.refused("anonymous over TLS", e.broker.TLSURL(), a.id, "", "", withTLS)
		c, err := dial(e.broker.TLSURL(), a.id, a.secureID, a.key, nil, withTLS)
		if err != nil {
			t.Fatalf("TLS connect: %v", err)
		}
		defer c.Disconnect(0)
		publish(t, c, e.topic(a.id, "properties/report"), report(11.5))
		e.waitStored(a.id, 11.5)
	})

	t.Run("another device's topics", func(t *testing.T) {
		// A forges B's report and birth. The broker drops them (Mosquitto
		// 2.0 also drops the connection of a client that publishes where
		// it may not).
		forger := e.connect(a, nil)
		for _, tp := range []string{"properties/report", "online", "properties/read/reply"} {
			forger.Publish(e.topic(b.id, tp), 1, false, report(666)).WaitTimeout(2 * time.Second)
		}
		forger.Disconnect(0)
		ca := e.connect(a, nil)
		var stolen atomic.Int64
		var own atomic.Int64
		seen := func(_ mqtt.Client, m mqtt.Message) {
			if strings.Contains(m.Topic(), "/"+b.id+"/") {
				stolen.Add(1)
			} else if strings.Contains(m.Topic(), "/"+a.id+"/") {
				own.Add(1)
			}
		}
		for _, f := range []string{"#", "/+/+/#", "/" + e.product + "/#", e.topic(b.id, "#"), e.topic(b.id, "properties/read")} {
			tok := ca.Subscribe(f, 1, seen)
			tok.WaitTimeout(5 * time.Second)
		}
		if tok := ca.Subscribe(e.topic(a.id, "#"), 1, seen); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
			t.Fatalf("subscribe own topics: %v", tok.Error())
		}
		// B's own traffic and a command to B.
		cb := e.connect(b, nil)
		publish(t, cb, e.topic(b.id, "properties/report"), report(22.5))
		e.srv.doStatus(t, e.token, "GET", "/api/device/standard/"+b.id+"/property/temp?timeout=300", nil)
		e.waitStored(b.id, 22.5)
		// A's own report, stored after the forged one would have been: a
		// barrier for the count below.
		publish(t, ca, e.topic(a.id, "properties/report"), report(12.5))
		e.waitStored(a.id, 12.5)
		if n := e.stored(b.id, 666); n != 0 {
			t.Fatalf("a report device A published on device B's topic was stored (%d rows)", n)
		}
		// A command to A reaches A: its subscriptions work, and B's
		// traffic would have arrived before this. (Its own uplinks never
		// come back to it: a device receives only its downlinks.) Online
		// first, so that the command is sent.
		if own.Load() != 0 {
			t.Fatalf("device A received %d of its own uplinks", own.Load())
		}
		publish(t, ca, e.topic(a.id, "online"), "{}")
		testkit.Eventually(t, 5*time.Second, "A's own downlink", func() bool {
			e.srv.doStatus(t, e.token, "GET", "/api/device/standard/"+a.id+"/property/temp?timeout=300", nil)
			return own.Load() > 0
		})
		if n := stolen.Load(); n != 0 {
			t.Fatalf("device A received %d messages of device B", n)
		}
	})

	t.Run("commands with its own login", func(t *testing.T) {
		c := e.newDevice("tc-" + randHex())
		m, err := schema.ParseThingModelString(`{"properties":[{"id":"temp","name":"T","valueType":{"type":"float"}}]}`)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		f, err := sim.Start(ctx, sim.Options{BrokerURL: url, ProductID: e.product, DeviceIDs: []string{c.id}, Model: m,
			Login:     sim.OwnLogins(map[string]sim.Credential{c.id: {SecureID: c.secureID, SecureKey: c.key}}),
			ValueFunc: func(string, string, *schema.ValueType) (any, bool) { return 42.5, true }})
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		var one map[string]any
		testkit.Eventually(t, 5*time.Second, "device online", func() bool {
			return e.srv.doStatus(t, e.token, "GET", "/api/device/standard/"+c.id+"/property/temp", nil) == 200
		})

		e.srv.do(t, e.token, "GET", "/api/device/standard/"+c.id+"/property/temp", nil, &one)
		var many map[string]any
		e.srv.do(t, e.token, "POST", "/api/device/instance/"+c.id+"/properties/_read", []string{"temp"}, &many)
		if one["temp"] != 42.5 || many["temp"] != 42.5 {
			t.Fatalf("endpoint 10 %v, endpoint 11 %v", one, many)
		}
	})

	t.Run("rotation", func(t *testing.T) {
		lost := make(chan struct{})
		e.connect(a, lost)
		var d struct {
			Configuration struct {
				SecureKey string `json:"secureKey"`
			} `json:"configuration"`
		}
		e.srv.do(t, e.token, "POST", "/api/device/instance/"+a.id+"/secret", nil, &d)
		if d.Configuration.SecureKey == a.key || len(d.Configuration.SecureKey) < 16 {
			t.Fatalf("rotated key %q", d.Configuration.SecureKey)
		}
		e.refused("the old key", url, a.id, a.secureID, a.key)
		waitLost(t, lost, "rotation")
		a.key = d.Configuration.SecureKey
		e.connectsAtOnce(a, "its rotation returned")
		// Elsewhere the key stays masked.
		var detail struct {
			Configuration struct {
				SecureKey string `json:"secureKey"`
			} `json:"configuration"`
		}
		e.srv.do(t, e.token, "GET", "/api/device/instance/"+a.id+"/detail", nil, &detail)
		if detail.Configuration.SecureKey == a.key {
			t.Fatal("the detail shows the key")
		}
	})

	t.Run("undeploy and delete", func(t *testing.T) {
		d := e.newDevice("td-" + randHex())
		lost := make(chan struct{})
		e.connect(d, lost)
		e.srv.call(t, e.token, "POST", "/api/device/instance/"+d.id+"/undeploy", nil)
		e.refused("undeployed", url, d.id, d.secureID, d.key)
		waitLost(t, lost, "undeploy")
		e.srv.call(t, e.token, "POST", "/api/device/instance/"+d.id+"/deploy", nil)
		e.connectsAtOnce(d, "its deploy returned")
		lost = make(chan struct{})
		e.connect(d, lost)
		e.srv.call(t, e.token, "POST", "/api/device/instance/"+d.id+"/undeploy", nil)
		e.srv.call(t, e.token, "DELETE", "/api/device/instance/"+d.id, nil)
		e.refused("deleted", url, d.id, d.secureID, d.key)
		waitLost(t, lost, "delete")
	})

	t.Run("signed login", func(t *testing.T) {
		// JetLinks' form: username secureId|<epoch ms>, password the md5
		// of secureId|<epoch ms>|secureKey, within 5 minutes of now.
		signed := func(at time.Time, key string) (string, string) {
			ms := strconv.FormatInt(at.UnixMilli(), 10)
			sum := md5.Sum([]byte(b.secureID + "|" + ms + "|" + key))
			return b.secureID + "|" + ms, hex.EncodeToString(sum[:])
		}
		u, p := signed(time.Now(), b.key)
		c, err := dial(url, b.id, u, p, nil)
		if err != nil {
			t.Fatalf("signed login refused: %v", err)
		}
		publish(t, c, e.topic(b.id, "properties/report"), report(33.5))
		e.waitStored(b.id, 33.5)
		c.Disconnect(0)
		u, p = signed(time.Now().Add(-time.Hour), b.key)
		e.refused("signed an hour ago", url, b.id, u, p)
		u, p = signed(time.Now(), b.key+"x")
		e.refused("signed with another key", url, b.id, u, p)
		u, p = signed(time.Now(), b.key)
		e.refused("signed, another device's client id", url, a.id, u, p)
	})

	t.Run("broker away: the write is stored and applied later", func(t *testing.T) {
		d := e.newDevice("tw-" + randHex())
		e.srv.call(t, e.token, "POST", "/api/device/instance/"+d.id+"/undeploy", nil)
		e.broker.Stop(syscall.SIGTERM)
		status, code := e.srv.statusCode(t, e.token, "POST", "/api/device/instance/"+d.id+"/deploy")
		if status != 503 || code != "broker_timeout" {
			t.Fatalf("deploy with the broker away: %d %q, want 503 broker_timeout", status, code)
		}
		e.broker.Start()
		e.waitConnects(d) // applied once the broker is back
		var detail struct {
			State struct {
				Value string `json:"value"`
			} `json:"state"`
		}
		e.srv.do(t, e.token, "GET", "/api/device/instance/"+d.id+"/detail", nil, &detail)
		if detail.State.Value == "notActive" {
			t.Fatal("the deploy answered 503 was not stored")
		}
	})

	t.Run("a thousand failed logins", func(t *testing.T) {
		rss := func() int {
			b, err := os.ReadFile("/proc/" + strconv.Itoa(e.srv.cmd.Process.Pid) + "/status")
			if err != nil {
				t.Fatal(err)
			}
			for _, l := range strings.Split(string(b), "\n") {
				if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
					n, _ := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
					return n
				}
			}
			return 0
		}
		before := rss()
		for i := range 1000 {
			if c, err := dial(url, a.id, a.secureID, "wrong-"+strconv.Itoa(i), nil); err == nil {
				c.Disconnect(0)
				t.Fatalf("attempt %d accepted", i)
			}
		}
		e.waitConnects(a)
		if after := rss(); after > before+8<<10 {
			t.Fatalf("devicehub's RSS grew from %d kB to %d kB", before, after)
		}
	})

	t.Run("restarts keep every rule", func(t *testing.T) {
		gone := e.newDevice("tg-" + randHex())
		// A device connected across a devicehub restart stays connected:
		// the restarted instance's full sync changes nothing it holds.
		lost := make(chan struct{})
		e.connect(b, lost)
		e.srv.signal(syscall.SIGTERM)
		if code, ok := e.srv.wait(20 * time.Second); !ok || code != 0 {
			t.Fatalf("devicehub exit %d (exited %v)", code, ok)
		}
		e.srv = startServer(t, e.bin, e.env, "trust-1")
		probe := e.newDevice("tp-" + randHex()) // the restarted instance leads
		select {
		case <-lost:
			t.Fatal("a devicehub restart cut a connected device")
		default:
		}
		e.srv.signal(syscall.SIGTERM)
		if code, ok := e.srv.wait(20 * time.Second); !ok || code != 0 {
			t.Fatalf("devicehub exit %d (exited %v)", code, ok)
		}
		// While devicehub is down, an operator undeploys a device in SQL:
		// the restarted instance must carry it to the broker.
		pg := envValue(e.env, "DEVICEHUB_POSTGRES_DSN")
		execSQL(t, pg, `UPDATE devices SET state = 'notActive' WHERE id = $1`, gone.id)
		e.broker.Stop(syscall.SIGTERM)
		e.broker.Start()
		e.refused("anonymous after a broker restart", url, a.id, "", "")
		// The broker kept the logins without devicehub (its plugin's
		// snapshot): every device at the first try.
		e.connectsAtOnce(a, "a broker restart")
		e.connectsAtOnce(probe, "a broker restart")
		e.refused("wrong key after a broker restart", url, a.id, a.secureID, b.key)
		e.srv = startServer(t, e.bin, e.env, "trust-2")
		testkit.Eventually(t, 5*time.Second, "the undeployed device refused", func() bool {
			c, err := dial(url, gone.id, gone.secureID, gone.key, nil)
			if err == nil {
				c.Disconnect(0)
			}
			return err != nil
		})

		e.waitConnects(a)
		e.waitConnects(b)
	})
}

func envValue(env []string, name string) string {
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, name+"="); ok {
			return v
		}
	}
	return ""
}

func execSQL(t *testing.T, dsn, q string, args ...any) {
	t.Helper()
	db, err := sql.Open("postgres", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(q, args...); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

// statusCode sends a request without a body and returns its HTTP status
// and envelope code.
func (s *server) statusCode(t *testing.T, token, method, path string) (int, string) {
	t.Helper()
	r := s.api(token).Send(t, method, path, nil)
	return r.HTTPStatus, r.Code
}

// doStatus sends a request and returns its HTTP status, whatever it is.
func (s *server) doStatus(t *testing.T, token, method, path string, body any) int {
	t.Helper()
	return s.api(token).Send(t, method, path, body).HTTPStatus
}
