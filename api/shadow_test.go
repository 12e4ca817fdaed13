package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"devicehub/api"
	"devicehub/bench/testkit"
	"devicehub/ingest"
	"devicehub/ingest/link"
	"devicehub/ingest/mqtttest"
	"devicehub/ingest/shadow"
	"devicehub/ingest/wire"
	"devicehub/meta"
	"devicehub/tsdb"
	"devicehub/tsdb/tsdbtest"
)

// shadowEnv is linkEnv with shadows: the API's, and an ingest pipeline on
// the same private broker whose births and shadow requests go to a shadow
// service of its own, as on another instance. Ingest can be stopped and
// started again with the same broker session (a devicehub restart).
type shadowEnv struct {
	*linkEnv
	store *meta.Store
	ch    *tsdb.DB
	iopt  ingest.Options

	mu   sync.Mutex
	ing  *ingest.Ingester
	hook *shadow.Service
}

func newShadowEnv(t *testing.T) *shadowEnv {
	t.Helper()
	return newShadowEnvPool(t, []*mqtttest.Broker{mqtttest.StartBroker(t)})
}

// newShadowEnvPool is newShadowEnv on a broker pool: the device link and
// ingest connect to every broker.
func newShadowEnvPool(t *testing.T, brokers []*mqtttest.Broker) *shadowEnv {
	t.Helper()
	se := &shadowEnv{ch: tsdbtest.NewDB(t, time.UTC)}
	se.linkEnv = newLinkEnvPool(t, brokers, func(store *meta.Store, deps *api.Deps) {
		se.store = store
		svc := shadow.New(shadow.NewStore(store, 0), se.ch, deps.Commands.(*link.Commands), shadow.Options{})
		t.Cleanup(svc.Close)
		deps.Shadows = svc
	})
	se.ok("POST", "/api/device-product/"+se.product+"/deploy", nil, nil)
	se.iopt = ingest.DefaultOptions()
	urls := make([]string, len(brokers))
	for i, br := range brokers {
		urls[i] = br.URL()
	}
	se.iopt.BrokerURL = strings.Join(urls, ",")
	se.iopt.ClientID = testkit.RandID("shadow-ingest-")
	se.iopt.ProductIDs = []string{se.product}
	se.iopt.Writer.FlushInterval = 50 * time.Millisecond
	se.iopt.StateFlushInterval = 50 * time.Millisecond
	se.iopt.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	se.startIngest()
	t.Cleanup(se.stopIngest)
	return se
}

// startIngest starts ingest with its shadow hook: one worker, so that a
// device's birth is answered before its later request (the tests count
// what arrived before the answer to a request).
func (se *shadowEnv) startIngest() {
	se.t.Helper()
	se.mu.Lock()
	defer se.mu.Unlock()
	se.hook = shadow.New(shadow.NewStore(se.store, 0), se.ch, se.cmds, shadow.Options{Workers: 1})
	opt := se.iopt
	opt.Shadow = se.hook
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ing, err := ingest.New(ctx, opt, se.ch, se.store, se.store)
	if err != nil {
		se.t.Fatal(err)
	}
	se.ing = ing
}

// stopIngest stops ingest as a devicehub shutdown does.
func (se *shadowEnv) stopIngest() {
	se.mu.Lock()
	defer se.mu.Unlock()
	if se.ing == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = se.ing.Close(ctx)
	se.hook.Close()
	se.ing, se.hook = nil, nil
}

// addDeployed creates a device and deploys it (ingest drops what
// notActive devices send).
func (se *shadowEnv) addDeployed(id string) {
	se.t.Helper()
	se.addDevice(id)
	se.ok("POST", "/api/device/instance/"+id+"/deploy", nil, nil)
}

// shadowView is GET .../shadow's result.
type shadowView struct {
	DeviceID string `json:"deviceId"`
	Version  int64  `json:"version"`
	Desired  map[string]struct {
		Value any    `json:"value"`
		Time  int64  `json:"time"`
		By    string `json:"by"`
	} `json:"desired"`
	Reported map[string]struct {
		Value any   `json:"value"`
		Time  int64 `json:"time"`
	} `json:"reported"`
	Delta map[string]any `json:"delta"`
}

func (se *shadowEnv) shadow(id string) shadowView {
	se.t.Helper()
	var v shadowView
	se.ok("GET", "/api/device/instance/"+id+"/shadow", nil, &v)
	return v
}

// askShadow publishes .../shadow/get with a messageId and waits for the
// answer carrying it; it returns the messages the device had received
// before that answer, and the answer.
func (d *testDevice) askShadow(id string) ([]shadowMsg, shadowMsg) {
	d.t.Helper()
	d.publish(wire.LevelShadowGet, fmt.Sprintf(`{"messageId":%q}`, id))
	var before []shadowMsg
	var answer shadowMsg
	testkit.Eventually(d.t, 10*time.Second, "the answer to "+id, func() bool {
		before = before[:0]
		for _, m := range d.received() {
			if m.MessageID == id {
				answer = m
				return true
			}
			before = append(before, m)
		}
		return false
	})
	return before, answer
}

// askShadowAfterBirth publishes .../shadow/get right after the device's
// birth and waits for both the answer carrying id and a delta at version
// v; it returns the other messages the device got (its deltas), and the
// answer. Ingest takes the birth on its presence session and the request
// on a data session, so the two may be handled in either order (and, in
// a share group, by different instances); a device applies a version
// once, whichever message brings it first (ingest/shadow's doc: the
// version, not the arrival order, decides), so either order is right.
func (d *testDevice) askShadowAfterBirth(id string, v int64) ([]shadowMsg, shadowMsg) {
	d.t.Helper()
	d.publish(wire.LevelShadowGet, fmt.Sprintf(`{"messageId":%q}`, id))
	var others []shadowMsg
	var answer shadowMsg
	testkit.Eventually(d.t, 10*time.Second, fmt.Sprintf("the answer to %s and a delta at version %d", id, v), func() bool {
		others, answer = others[:0], shadowMsg{}
		delta := false
		for _, m := range d.received() {
			if m.MessageID == id {
				answer = m
				continue
			}
			others = append(others, m)
			delta = delta || (m.MessageType == "SHADOW_DELTA" && m.Version == v)
		}
		return answer.MessageID == id && delta
	})
	return others, answer
}

// TestShadowOfflineDevice: a device offline while its desired state
// changes three times gets one delta when it connects, with the last
// values and the last version; asked, it gets its whole shadow with that
// version. Then again across a restart of ingest: a device that connects
// while devicehub is down gets its delta once devicehub is back.
func TestShadowOfflineDevice(t *testing.T) {
	t.Parallel()
	se := newShadowEnv(t)
	se.addDeployed("s1")
	for i, body := range []string{
		`{"desired":{"target":20}}`,
		`{"desired":{"target":21,"mode":"eco"}}`,
		`{"desired":{"target":22.5,"mode":null,"fan":2}}`,
	} {
		var v shadowView
		se.ok("PUT", "/api/device/instance/s1/shadow", body, &v)
		if v.Version != int64(i+1) {
			t.Fatalf("change %d: version %d", i+1, v.Version)
		}
	}
	v := se.shadow("s1")
	if v.Version != 3 || len(v.Desired) != 2 || v.Desired["target"].Value != 22.5 || v.Desired["fan"].Value != 2.0 ||
		v.Desired["target"].By == "" || v.Desired["target"].Time == 0 || len(v.Delta) != 2 || v.Delta["target"] != 22.5 {
		t.Fatalf("shadow: %+v", v)
	}

	dev := connectTestDevice(t, se.broker.URL(), se.product, "s1", se.gateway)
	before, answer := dev.askShadowAfterBirth("ask-1", 3)
	if len(before) != 1 {
		t.Fatalf("besides its answer the device got %d messages, want its one delta: %+v", len(before), before)
	}
	delta := before[0]
	if delta.MessageType != "SHADOW_DELTA" || !strings.HasSuffix(delta.Topic, "/shadow/delta") || delta.Version != 3 ||
		len(delta.State) != 2 || delta.State["target"] != 22.5 || delta.State["fan"] != 2.0 {
		t.Fatalf("delta: %+v", delta)
	}
	if answer.MessageType != "SHADOW_GET_REPLY" || !strings.HasSuffix(answer.Topic, "/shadow/get/reply") || answer.Version != 3 {
		t.Fatalf("answer: %+v", answer)
	}
	if d, _ := answer.State["desired"].(map[string]any); len(d) != 2 {
		t.Fatalf("answer without desired: %+v", answer)
	}

	// While the device is connected, a change reaches it at once.
	se.ok("PUT", "/api/device/instance/s1/shadow", `{"desired":{"fan":3}}`, nil)
	testkit.Eventually(t, 10*time.Second, "the connected device's delta", func() bool {
		got := dev.received()
		last := got[len(got)-1]
		return last.MessageType == "SHADOW_DELTA" && last.Version == 4 && last.State["fan"] == 3.0
	})
	dev.disconnect()

	// A restart: the device connects while ingest is down, after three
	// more changes; its birth waits in ingest's broker session.
	se.stopIngest()
	for _, body := range []string{`{"desired":{"fan":4}}`, `{"desired":{"fan":5}}`, `{"desired":{"target":18}}`} {
		se.ok("PUT", "/api/device/instance/s1/shadow", body, nil)
	}
	dev = connectTestDevice(t, se.broker.URL(), se.product, "s1", se.gateway)
	se.startIngest()
	before, answer = dev.askShadowAfterBirth("ask-2", 7)
	if len(before) != 1 || before[0].Version != 7 || before[0].State["fan"] != 5.0 || before[0].State["target"] != 18.0 {
		t.Fatalf("after the restart the device got %+v besides its answer, want one delta at version 7", before)
	}
	if answer.Version != 7 {
		t.Fatalf("answer after the restart: %+v", answer)
	}
}

// TestShadowVersionConflict: a change conditional on a version the shadow
// no longer has is 409 version_conflict and changes nothing.
func TestShadowVersionConflict(t *testing.T) {
	t.Parallel()
	se := newShadowEnv(t)
	se.addDeployed("v1")
	// No shadow yet: only version 0 (or none) may be named.
	se.fails("PUT", "/api/device/instance/v1/shadow", `{"desired":{"target":20},"version":2}`, 409, "version_conflict")
	if v := se.shadow("v1"); v.Version != 0 || len(v.Desired) != 0 {
		t.Fatalf("a refused change changed the shadow: %+v", v)
	}
	se.ok("PUT", "/api/device/instance/v1/shadow", `{"desired":{"target":20},"version":0}`, nil)
	se.ok("PUT", "/api/device/instance/v1/shadow", `{"desired":{"target":21},"version":1}`, nil)
	before := se.shadow("v1")
	r := se.fails("PUT", "/api/device/instance/v1/shadow", `{"desired":{"target":25,"fan":1},"version":1}`, 409, "version_conflict")
	if !strings.Contains(r.Message, "version 2") {
		t.Errorf("conflict message %q does not say the version", r.Message)
	}
	after := se.shadow("v1")
	if after.Version != 2 || after.Desired["target"].Value != 21.0 || after.Desired["target"].Time != before.Desired["target"].Time || len(after.Desired) != 1 {
		t.Fatalf("a refused change changed the shadow: %+v", after)
	}
	// Refusals of the body: 400 naming the property, nothing changed.
	for _, c := range []struct{ body, mention string }{
		{`{"desired":{"temp":20}}`, "temp"},        // not writable
		{`{"desired":{"target":"hot"}}`, "target"}, // not its type
		{`{"desired":{"mode":"turbo"}}`, "mode"},
		{`{"desired":{}}`, "desired"},
		{`{"target":20}`, "desired"},
		{`{"desired":{"target":20},"version":-1}`, "version"},
	} {
		r := se.fails("PUT", "/api/device/instance/v1/shadow", c.body, 400, "illegal_argument")
		if !strings.Contains(r.Message, c.mention) {
			t.Errorf("%s: message %q does not name %s", c.body, r.Message, c.mention)
		}
	}
	if v := se.shadow("v1"); v.Version != 2 {
		t.Fatalf("refused bodies changed the shadow: %+v", v)
	}
	se.fails("GET", "/api/device/instance/nope/shadow", nil, 404, "not_found")
	se.fails("PUT", "/api/device/instance/nope/shadow", `{"desired":{"target":20}}`, 404, "not_found")
}

// TestShadowDeltaEmpties: the delta holds the desired properties whose
// reported value differs, and empties once the device reports them.
func TestShadowDeltaEmpties(t *testing.T) {
	t.Parallel()
	se := newShadowEnv(t)
	se.addDeployed("r1")
	dev := connectTestDevice(t, se.broker.URL(), se.product, "r1", se.gateway)
	dev.publish(wire.LevelReport, `{"properties":{"target":19,"temp":18.5}}`)
	testkit.Eventually(t, 10*time.Second, "the report stored", func() bool { return len(se.shadow("r1").Reported) == 2 })
	se.ok("PUT", "/api/device/instance/r1/shadow", `{"desired":{"target":21.5,"mode":"eco"}}`, nil)
	v := se.shadow("r1")
	if len(v.Delta) != 2 || v.Reported["temp"].Value != 18.5 {
		t.Fatalf("shadow: %+v", v)
	}
	dev.publish(wire.LevelReport, `{"properties":{"target":21.5}}`)
	testkit.Eventually(t, 10*time.Second, "target out of the delta", func() bool {
		v := se.shadow("r1")
		_, has := v.Delta["target"]
		return !has && len(v.Delta) == 1
	})
	dev.publish(wire.LevelReport, `{"properties":{"mode":"eco"}}`)
	testkit.Eventually(t, 10*time.Second, "an empty delta", func() bool { return len(se.shadow("r1").Delta) == 0 })
	if v := se.shadow("r1"); v.Version != 1 || len(v.Desired) != 2 {
		t.Fatalf("desired changed by reports: %+v", v)
	}
	// A device that connects with nothing to do is sent no delta.
	dev.disconnect()
	dev = connectTestDevice(t, se.broker.URL(), se.product, "r1", se.gateway)
	if before, answer := dev.askShadow("ask"); len(before) != 0 || answer.Version != 1 {
		t.Fatalf("a device with an empty delta got %+v, then %+v", before, answer)
	}
	// The product's other setting: a reported desired value leaves
	// desired, a change of it (version 2).
	var set struct{ ClearReached bool }
	se.ok("GET", "/api/device-product/"+se.product+"/shadow", nil, &set)
	if set.ClearReached {
		t.Fatal("clearReached is on by default")
	}
	se.ok("PUT", "/api/device-product/"+se.product+"/shadow", `{"clearReached":true}`, &set)
	// Every view clears what is reached, conditionally on the version it
	// read: a view that loses that race to another (the reconnected
	// device's birth computes one) shows the shadow as it read it, and the
	// next one shows it cleared.
	testkit.Eventually(t, 10*time.Second, "reached properties out of desired with clearReached", func() bool {
		v := se.shadow("r1")
		return v.Version == 2 && len(v.Desired) == 0 && len(v.Delta) == 0
	})
	se.ok("PUT", "/api/device/instance/r1/shadow", `{"desired":{"target":23,"fan":1}}`, nil)
	dev.publish(wire.LevelReport, `{"properties":{"target":23}}`)
	testkit.Eventually(t, 10*time.Second, "target cleared once reached", func() bool {
		v := se.shadow("r1")
		_, has := v.Desired["target"]
		return !has && len(v.Desired) == 1 && v.Version == 4 && len(v.Delta) == 1
	})
	se.fails("PUT", "/api/device-product/"+se.product+"/shadow", `{}`, 400, "illegal_argument")
	se.fails("PUT", "/api/device-product/nope/shadow", `{"clearReached":true}`, 404, "not_found")
}

// TestShadowBulk: one bulk change reaches every device of a product, each
// with its own version, and each device is sent its delta.
func TestShadowBulk(t *testing.T) {
	t.Parallel()
	se := newShadowEnv(t)
	const n = 10000 // the size: one bulk call, every device its delta
	devices := make([]map[string]any, n)
	for i := range devices {
		devices[i] = map[string]any{"id": fmt.Sprintf("b%04d", i), "name": "b", "productId": se.product}
	}
	se.ok("POST", "/api/device/instance/batch/_create?deploy=true", devices, nil)
	se.ok("PUT", "/api/device/instance/b0007/shadow", `{"desired":{"fan":1}}`, nil) // b0007 at version 1 before

	// One client stands in for the devices (the gateway login): it sees
	// every delta of the product.
	var mu sync.Mutex
	got := map[string]shadowMsg{}
	o := mqtt.NewClientOptions().AddBroker(se.broker.URL()).SetClientID(testkit.RandID("bulk-"))
	se.gateway(o)
	c := mqtt.NewClient(o)
	if tok := c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatal(tok.Error())
	}
	defer c.Disconnect(0)
	tok := c.Subscribe(wire.DeviceTopic(se.product, "+", wire.LevelShadowDelta), 1, func(_ mqtt.Client, m mqtt.Message) {
		var msg shadowMsg
		if json.Unmarshal(m.Payload(), &msg) == nil {
			mu.Lock()
			got[strings.Split(m.Topic(), "/")[2]] = msg
			mu.Unlock()
		}
	})
	if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatal(tok.Error())
	}

	// b0003 already reports the value the bulk change desires: its delta
	// is empty (the reported values of the bulk's devices are read in a
	// batch).
	if tok := c.Publish(wire.DeviceTopic(se.product, "b0003", wire.LevelReport), 1, false, `{"properties":{"target":19.5}}`); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatal(tok.Error())
	}
	testkit.Eventually(t, 10*time.Second, "b0003's report stored", func() bool { return len(se.shadow("b0003").Reported) == 1 })

	var res struct{ Total, Changed int }
	se.ok("POST", "/api/device/instance/batch/_shadow", map[string]any{"productId": se.product, "desired": map[string]any{"target": 19.5}}, &res)
	if res.Total != n || res.Changed != n {
		t.Fatalf("bulk: %+v", res)
	}
	testkit.Eventually(t, 60*time.Second, "every device's delta", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) == n
	})
	for id, m := range got {
		want := int64(1)
		if id == "b0007" {
			want = 2
		}
		if id == "b0003" {
			if m.Version != 1 || len(m.State) != 0 {
				t.Fatalf("b0003 reports the desired value, its delta: %+v", m)
			}
			continue
		}
		if m.Version != want || m.State["target"] != 19.5 {
			t.Fatalf("%s: %+v", id, m)
		}
	}
	if v := se.shadow("b0007"); v.Version != 2 || len(v.Desired) != 2 {
		t.Fatalf("b0007 after the bulk change: %+v", v)
	}
	// Listed devices: an unknown id or one twice changes nothing.
	r := se.fails("POST", "/api/device/instance/batch/_shadow", `{"deviceIds":["b0001","nope","b0001"],"desired":{"target":1}}`, 400, "illegal_argument")
	if !strings.Contains(string(r.Result), "nope") {
		t.Errorf("the refusal does not list the unknown id: %s", r.raw)
	}
	se.ok("POST", "/api/device/instance/batch/_shadow", `{"deviceIds":["b0001","b0002"],"desired":{"target":2}}`, &res)
	if res.Total != 2 || res.Changed != 2 || se.shadow("b0001").Version != 2 || se.shadow("b0003").Version != 1 {
		t.Fatalf("listed bulk change: %+v", res)
	}
	se.fails("POST", "/api/device/instance/batch/_shadow", `{"productId":"nope","desired":{"target":1}}`, 404, "not_found")
	se.fails("POST", "/api/device/instance/batch/_shadow", `{"productId":"x","deviceIds":["b0001"],"desired":{"target":1}}`, 400, "illegal_argument")
}

// TestShadowBrokerPool: a device that was connected to one broker of the
// pool, and is offline while its desired state changes three times, gets
// one delta with the last version when it connects to another broker.
func TestShadowBrokerPool(t *testing.T) {
	t.Parallel()
	a, b := mqtttest.StartBroker(t), mqtttest.StartBroker(t)
	se := newShadowEnvPool(t, []*mqtttest.Broker{a, b})
	gwB := mqtttest.Gateway(t, b.URL())
	se.addDeployed("p1")
	dev := connectTestDevice(t, a.URL(), se.product, "p1", se.gateway)
	testkit.Eventually(t, 10*time.Second, "p1 online", func() bool { return se.presence.IsOnline("p1") })
	dev.disconnect()
	testkit.Eventually(t, 10*time.Second, "p1 offline", func() bool { return !se.presence.IsOnline("p1") })
	for _, body := range []string{`{"desired":{"fan":1}}`, `{"desired":{"fan":2,"target":20}}`, `{"desired":{"fan":3}}`} {
		se.ok("PUT", "/api/device/instance/p1/shadow", body, nil)
	}
	dev = connectTestDevice(t, b.URL(), se.product, "p1", gwB)
	before, answer := dev.askShadowAfterBirth("ask-b", 3)
	if len(before) != 1 || before[0].Version != 3 || before[0].State["fan"] != 3.0 || before[0].State["target"] != 20.0 {
		t.Fatalf("on the other broker the device got %+v besides its answer, want one delta at version 3", before)
	}
	if answer.Version != 3 {
		t.Fatalf("answer: %+v", answer)
	}
}

// TestShadowReportedOutsideModel: the shadow's reported values that do
// not fit the device's current thing model are marked as endpoint 14
// marks them (an enum value none of its elements has, a value of another
// type, a desired property since taken out of the model); values that fit
// are not, and devices are sent their shadow unmarked.
func TestShadowReportedOutsideModel(t *testing.T) {
	t.Parallel()
	se := newShadowEnv(t)
	se.addDeployed("om1")
	se.ok("PUT", "/api/device/instance/om1/shadow", `{"desired":{"fan":2,"target":21.5}}`, nil)
	now := time.Now()
	if err := se.ch.Insert(context.Background(), nil, []tsdb.PropertyValue{
		{Time: now, ProductID: se.product, DeviceID: "om1", Property: "target", ValueType: "number", Num: 21.5},
		{Time: now, ProductID: se.product, DeviceID: "om1", Property: "temp", ValueType: "string", Str: "hot"},
		{Time: now, ProductID: se.product, DeviceID: "om1", Property: "mode", ValueType: "string", Str: "boost"},
		{Time: now, ProductID: se.product, DeviceID: "om1", Property: "fan", ValueType: "number", Num: 3},
	}); err != nil {
		t.Fatal(err)
	}
	marks := func() map[string]string {
		t.Helper()
		var v struct {
			Reported map[string]struct {
				Value        any `json:"value"`
				OutsideModel *struct {
					Text  string `json:"text"`
					Value string `json:"value"`
				} `json:"outsideModel"`
			} `json:"reported"`
		}
		se.ok("GET", "/api/device/instance/om1/shadow", nil, &v)
		got := map[string]string{}
		for id, r := range v.Reported {
			got[id] = ""
			if m := r.OutsideModel; m != nil {
				if m.Text == "" {
					t.Fatalf("%s marked %q without a text", id, m.Value)
				}
				got[id] = m.Value
			}
		}
		return got
	}
	want := map[string]string{"target": "", "temp": "wrong_type", "mode": "not_in_enum", "fan": ""}
	if got := marks(); !maps.Equal(got, want) {
		t.Fatalf("reported marks %v, want %v", got, want)
	}
	// fan leaves the thing model; it is still desired, and so reported.
	var p map[string]any
	se.ok("GET", "/api/device-product/"+se.product, nil, &p)
	p["metadata"] = strings.Replace(thermostatModel, `{"id":"fan","name":"Fan","valueType":{"type":"int"},"expands":{"type":["write"]}},`, "", 1)
	se.ok("PATCH", "/api/device-product", p, nil)
	want["fan"] = "undeclared"
	testkit.Eventually(t, 10*time.Second, "fan marked undeclared", func() bool { return marks()["fan"] == "undeclared" })
	if got := marks(); !maps.Equal(got, want) {
		t.Fatalf("reported marks %v, want %v", got, want)
	}
	// The device's own copy (.../shadow/get) carries values only.
	dev := connectTestDevice(t, se.broker.URL(), se.product, "om1", se.gateway)
	_, answer := dev.askShadow("whole")
	if raw, _ := json.Marshal(answer); strings.Contains(string(raw), "outsideModel") {
		t.Fatalf("the device was sent marks: %s", raw)
	}
}
