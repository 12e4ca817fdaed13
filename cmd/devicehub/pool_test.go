package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"devicehub/bench/sim"
	"devicehub/bench/testkit"
	"devicehub/ingest/mqttconn"
	"devicehub/ingest/mqtttest"
	"devicehub/schema"
)

// TestBrokerPool runs the real binary on two private brokers, each with
// devicehub's plugin (-mqtt-url A,B), and devices on each, with their own
// logins, through HTTP and MQTT:
//   - a deploy, a rotation and an undeploy answer only once both brokers'
//     plugins hold the change: the device connects (or is refused) at both
//     at the first try;
//   - reports and births of devices on A and on B are stored, and both
//     devices are online (endpoint 8);
//   - a command reaches a device connected to B;
//   - a device that moves from A to B (its connection to A cut after its
//     birth on B, so that A publishes its will last) stays online, in
//     PostgreSQL and in the presence view;
//   - with B stopped, /readyz names B's checks down and A's up, devices on
//     A are still stored, and a deploy answers 503 broker_timeout; B back,
//     it gets the full sync: the device deployed meanwhile connects there.
func TestBrokerPool(t *testing.T) {
	t.Parallel()
	a, b := mqtttest.StartBroker(t), mqtttest.StartBroker(t)
	e := &trustEnv{t: t, broker: a, bin: testkit.Devicehub(t)}
	e.start("pool", a.URL()+","+b.URL(), "DEVICEHUB_LOGIN_WAIT=2s")
	t.Cleanup(func() {
		e.srv.signal(syscall.SIGTERM)
		e.srv.wait(15 * time.Second)
	})
	brokers := map[string]*mqtttest.Broker{"A": a, "B": b}
	connectsAtOnce := func(d device, after string) {
		t.Helper()
		for _, name := range []string{"A", "B"} {
			c, err := dial(brokers[name].URL(), d.id, d.secureID, d.key, nil)
			if err != nil {
				t.Fatalf("device %s refused by broker %s right after %s: %v\n%s", d.id, name, after, err, e.srv.logTail())
			}
			c.Disconnect(0)
		}
	}
	refusedAtOnce := func(d device, key, after string) {
		t.Helper()
		for _, name := range []string{"A", "B"} {
			e.refused("broker "+name+" right after "+after, brokers[name].URL(), d.id, d.secureID, key)
		}
	}

	// --- login changes reach both plugins before the write answers ------
	dA, dB, dM := e.newDevice("pa-"+randHex()), e.newDevice("pb-"+randHex()), e.newDevice("pm-"+randHex())
	connectsAtOnce(dA, "its deploy returned")
	connectsAtOnce(dB, "its deploy returned")
	var rotated struct {
		Configuration struct {
			SecureKey string `json:"secureKey"`
		} `json:"configuration"`
	}
	e.srv.do(t, e.token, "POST", "/api/device/instance/"+dB.id+"/secret", nil, &rotated)
	refusedAtOnce(dB, dB.key, "its rotation returned (old key)")
	dB.key = rotated.Configuration.SecureKey
	connectsAtOnce(dB, "its rotation returned")
	dU := e.newDevice("pu-" + randHex())
	e.srv.call(t, e.token, "POST", "/api/device/instance/"+dU.id+"/undeploy", nil)
	refusedAtOnce(dU, dU.key, "its undeploy returned")

	// --- devices on A and on B: stored and online -----------------------
	model, err := schema.ParseThingModelString(`{"properties":[{"id":"temp","name":"T","valueType":{"type":"float"}}]}`)
	if err != nil {
		t.Fatal(err)
	}
	startSim := func(broker *mqtttest.Broker, d device, v float64) *sim.Fleet {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		f, err := sim.Start(ctx, sim.Options{BrokerURL: broker.URL(), ProductID: e.product, DeviceIDs: []string{d.id}, Model: model,
			Login:          sim.OwnLogins(map[string]sim.Credential{d.id: {SecureID: d.secureID, SecureKey: d.key}}),
			ReportInterval: 250 * time.Millisecond, QoS: 1,
			ValueFunc: func(string, string, *schema.ValueType) (any, bool) { return v, true }})
		if err != nil {
			t.Fatalf("device %s on %s: %v", d.id, broker.URL(), err)
		}
		t.Cleanup(f.Close)
		return f
	}
	state := func(id string) string {
		var d struct {
			State struct {
				Value string `json:"value"`
			} `json:"state"`
		}
		e.srv.do(t, e.token, "GET", "/api/device/instance/"+id+"/detail", nil, &d)
		return d.State.Value
	}
	startSim(a, dA, 11.5)
	startSim(b, dB, 22.5)
	for _, d := range []device{dA, dB} {
		testkit.Eventually(t, 15*time.Second, d.id+" online (endpoint 8)", func() bool { return state(d.id) == "online" })
	}
	// Their reports, from each broker.
	e.waitStored(dA.id, 11.5)
	e.waitStored(dB.id, 22.5)

	// --- a command reaches the device on B (and on A) -------------------
	for _, c := range []struct {
		d device
		v float64
	}{{dB, 22.5}, {dA, 11.5}} {
		var got map[string]any
		e.srv.do(t, e.token, "GET", "/api/device/standard/"+c.d.id+"/property/temp", nil, &got)
		if got["temp"] != c.v {
			t.Fatalf("read of %s: %v, want %v", c.d.id, got, c.v)
		}
	}

	// --- a device moving from A to B stays online -----------------------
	cutA := cutter(t, a.URL(), dM, e.topic(dM.id, "offline"))
	publish(t, cutA.Client, e.topic(dM.id, "online"), `{}`)
	testkit.Eventually(t, 15*time.Second, "the mover online at A", func() bool { return state(dM.id) == "online" })
	startSim(b, dM, 33.5) // its birth on B
	testkit.Eventually(t, 15*time.Second, "the mover's birth on B stored", func() bool { return e.messages(dM.id, "/online") >= 2 })
	cutA.Cut() // A publishes the will now, after the birth on B
	testkit.Eventually(t, 15*time.Second, "the will from A stored", func() bool { return e.messages(dM.id, "/offline") >= 1 })
	// A sentinel behind the will on A's connections: the birth on A of a
	// device offline so far. Once a command to it is answered, the
	// presence view has taken the will; once it is online in PostgreSQL,
	// so has ingest (one worker per device, but the will's state was
	// decided before its row was stored, above).
	dS := e.newDevice("ps-" + randHex())
	startSim(a, dS, 44.5)
	testkit.Eventually(t, 15*time.Second, "a command to the sentinel answered", func() bool {
		return e.srv.doStatus(t, e.token, "GET", "/api/device/standard/"+dS.id+"/property/temp", nil) == http.StatusOK
	})
	if got := onlineGauge(t, e.srv.base); got != 4 {
		t.Fatalf("devicehub_devices_online %d after the mover's stale will and the sentinel's birth, want 4 (A, B, the mover, the sentinel)", got)
	}
	testkit.Eventually(t, 15*time.Second, "the sentinel online in PostgreSQL", func() bool { return state(dS.id) == "online" })
	if s := state(dM.id); s != "online" {
		t.Fatalf("the mover is %s after the stale will of the broker it left", s)
	}
	var got map[string]any
	e.srv.do(t, e.token, "GET", "/api/device/standard/"+dM.id+"/property/temp", nil, &got)
	if got["temp"] != 33.5 {
		t.Fatalf("read of the mover on B: %v", got)
	}

	// --- broker B down ----------------------------------------------------
	b.Stop(syscall.SIGTERM)
	nameA, nameB := mqttconn.BrokerName(a.URL()), mqttconn.BrokerName(b.URL())
	testkit.Eventually(t, 15*time.Second, "/readyz to name broker B down", func() bool {
		code, res := readyz(t, e.srv.base)
		return code == http.StatusServiceUnavailable && res["mqtt@"+nameB] == "down" && res["mqtt_ingest@"+nameB] == "down"
	})
	if _, res := readyz(t, e.srv.base); res["mqtt@"+nameA] != "up" || res["mqtt_ingest@"+nameA] != "up" || res["mqtt_backlog@"+nameA] != "up" {
		t.Fatalf("/readyz with B down: %v", res)
	}
	gw := mqtttest.Gateway(t, a.URL())
	rep := mqtttest.ConnectDevice(t, a.URL(), "pr-"+randHex(), gw)
	rep.MustPublish(t, e.topic(dA.id, "properties/report"), 1, report(55.5))
	e.waitStored(dA.id, 55.5)
	dL := "pl-" + randHex()
	var created struct {
		Configuration struct {
			SecureID  string `json:"secureId"`
			SecureKey string `json:"secureKey"`
		} `json:"configuration"`
	}
	e.srv.do(t, e.token, "POST", "/api/device/instance", map[string]any{"id": dL, "name": dL, "productId": e.product}, &created)
	if status, code := e.srv.statusCode(t, e.token, "POST", "/api/device/instance/"+dL+"/deploy"); status != http.StatusServiceUnavailable || code != "broker_timeout" {
		t.Fatalf("deploy with broker B down: %d %s, want 503 broker_timeout", status, code)
	}
	late := device{dL, created.Configuration.SecureID, created.Configuration.SecureKey}
	// A holds it (the change is applied where the broker answers).
	testkit.Eventually(t, 5*time.Second, "the late device admitted by A", func() bool {
		c, err := dial(a.URL(), late.id, late.secureID, late.key, nil)
		if err == nil {
			c.Disconnect(0)
		}
		return err == nil
	})

	b.Start()
	testkit.Eventually(t, 30*time.Second, "/readyz up with B back", func() bool {
		code, _ := readyz(t, e.srv.base)
		return code == http.StatusOK
	})
	testkit.Eventually(t, 10*time.Second, "the late device admitted by B after its full sync", func() bool {
		c, err := dial(b.URL(), late.id, late.secureID, late.key, nil)
		if err == nil {
			c.Disconnect(0)
		}
		return err == nil
	})
}

// messages counts the device_message rows of a device whose topic ends
// in suffix.
func (e *trustEnv) messages(deviceID, suffix string) uint64 {
	e.t.Helper()
	var n uint64
	if err := e.db.Conn().QueryRow(context.Background(),
		`SELECT count() FROM device_message WHERE device_id = ? AND endsWith(topic, ?)`, deviceID, suffix).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// cutter connects device d with its own login and a last will on will,
// through a connection the test can cut without a DISCONNECT.
func cutter(t *testing.T, url string, d device, will string) *mqtttest.Device {
	t.Helper()
	return mqtttest.ConnectDevice(t, url, d.id, func(o *mqtt.ClientOptions) {
		o.SetUsername(d.secureID).SetPassword(d.key)
		o.SetWill(will, `{}`, 1, false)
	})
}

// onlineGauge is devicehub_devices_online of /metrics.
func onlineGauge(t *testing.T, base string) int {
	t.Helper()
	for _, line := range strings.Split(metricsText(t, base), "\n") {
		if v, ok := strings.CutPrefix(line, "devicehub_devices_online "); ok {
			n, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			return int(n)
		}
	}
	t.Fatal("no devicehub_devices_online in /metrics")
	return 0
}

// readyz is /readyz's status and checks.
func readyz(t *testing.T, base string) (int, map[string]string) {
	t.Helper()
	resp, err := http.Get(base + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var r struct {
		Result map[string]string `json:"result"`
	}
	if err := json.Unmarshal(raw, &r); err != nil {
		t.Fatalf("/readyz: %d %s", resp.StatusCode, raw)
	}
	return resp.StatusCode, r.Result
}
