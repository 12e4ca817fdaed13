package api_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"devicehub/api"
	"devicehub/bench/testkit"
	"devicehub/ingest/link"
	"devicehub/ingest/mqtttest"
	"devicehub/ingest/wire"
	"devicehub/meta"
)

// thermostatModel has a writable property of each kind the checks cover,
// and a read-only one.
const thermostatModel = `{"properties":[
{"id":"target","name":"Target","valueType":{"type":"float"},"expands":{"type":["read","write"]}},
{"id":"fan","name":"Fan","valueType":{"type":"int"},"expands":{"type":["write"]}},
{"id":"mode","name":"Mode","valueType":{"type":"enum","elements":[{"value":"eco","text":"Eco"},{"value":"comfort","text":"Comfort"}]},"expands":{"type":["read","write","report"]}},
{"id":"label","name":"Label","valueType":{"type":"string","expands":{"maxLength":8}},"expands":{"type":["write"]}},
{"id":"on","name":"On","valueType":{"type":"boolean","trueValue":"1","falseValue":"0"},"expands":{"type":["write"]}},
{"id":"temp","name":"Temperature","valueType":{"type":"float"},"expands":{"type":["read","report"]}}
]}`

// linkEnv is a server whose device link runs on a private broker (the
// test may give devicehub's service login new rights there without
// touching the shared broker), with a product of thermostatModel.
type linkEnv struct {
	*env
	broker   *mqtttest.Broker
	presence *link.Presence
	cmds     *link.Commands
	product  string
	gateway  func(*mqtt.ClientOptions)
}

func newLinkEnv(t *testing.T, with func(store *meta.Store, deps *api.Deps)) *linkEnv {
	t.Helper()
	return newLinkEnvPool(t, []*mqtttest.Broker{mqtttest.StartBroker(t)}, with)
}

// newLinkEnvPool is newLinkEnv on a broker pool: the device link connects
// to every broker; broker and gateway are the first's.
func newLinkEnvPool(t *testing.T, brokers []*mqtttest.Broker, with func(store *meta.Store, deps *api.Deps)) *linkEnv {
	t.Helper()
	var b [4]byte
	_, _ = rand.Read(b[:])
	suffix := hex.EncodeToString(b[:])
	le := &linkEnv{broker: brokers[0]}
	urls := make([]string, len(brokers))
	for i, br := range brokers {
		urls[i] = br.URL()
	}
	le.env = newEnvWith(t, func(store *meta.Store, deps *api.Deps) {
		popt := link.DefaultPresenceOptions()
		popt.BrokerURL, popt.ClientID = strings.Join(urls, ","), "api-test-"+suffix
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var err error
		if le.presence, err = link.NewPresence(ctx, popt, noOnline{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(le.presence.Close)
		copt := link.DefaultCommandOptions()
		copt.Registerer = deps.Registry
		if le.cmds, err = link.NewCommands(le.presence, nil, copt); err != nil {
			t.Fatal(err)
		}
		deps.Models = store
		deps.Commands = le.cmds
		if with != nil {
			with(store, deps)
		}
	})
	le.product = "thermo" + suffix
	p := le.createProduct(le.product, "Thermostat", nil)
	p["metadata"] = thermostatModel
	le.ok("PATCH", "/api/device-product", p, nil)
	le.gateway = mqtttest.Gateway(t, le.broker.URL())
	return le
}

// addDevice creates (and deploys) a device of the product.
func (le *linkEnv) addDevice(id string) {
	le.t.Helper()
	le.ok("POST", "/api/device/instance", map[string]any{"id": id, "name": id, "productId": le.product}, nil)
}

// testDevice is a device on the broker as DESIGN.md's wire format has
// it: it subscribes to its downlinks (property writes, shadow deltas,
// answers to its shadow requests), then publishes its birth. It answers a
// write with success and the written values (or, told to, stays silent),
// and keeps every shadow message it gets.
type testDevice struct {
	t       testing.TB
	id      string
	product string
	client  mqtt.Client

	mu      sync.Mutex
	writes  []map[string]any
	shadows []shadowMsg // delta and get-reply messages, in arrival order
	silent  bool
}

// shadowMsg is a shadow message as the device reads it.
type shadowMsg struct {
	Topic       string         `json:"-"`
	MessageID   string         `json:"messageId"`
	MessageType string         `json:"messageType"`
	Version     int64          `json:"version"`
	State       map[string]any `json:"state"`
}

func connectTestDevice(t testing.TB, brokerURL, product, id string, login func(*mqtt.ClientOptions)) *testDevice {
	t.Helper()
	d := &testDevice{t: t, id: id, product: product}
	o := mqtt.NewClientOptions().AddBroker(brokerURL).SetClientID("dev-"+id+"-"+strings.ToLower(rand.Text()[:6])).
		SetCleanSession(true).SetAutoReconnect(false).
		SetWill(wire.DeviceTopic(product, id, wire.LevelOffline), `{}`, 1, false)
	login(o)
	d.client = mqtt.NewClient(o)
	if tok := d.client.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("device %s connect: %v", id, tok.Error())
	}
	subs := map[string]byte{
		wire.DeviceTopic(product, id, wire.LevelWrite):          1,
		wire.DeviceTopic(product, id, wire.LevelShadowDelta):    1,
		wire.DeviceTopic(product, id, wire.LevelShadowGetReply): 1,
	}
	if tok := d.client.SubscribeMultiple(subs, d.onMessage); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("device %s subscribe: %v", id, tok.Error())
	}
	d.publish(wire.LevelOnline, `{}`)
	t.Cleanup(func() { d.client.Disconnect(0) })
	return d
}

func (d *testDevice) publish(level, payload string) {
	d.t.Helper()
	tok := d.client.Publish(wire.DeviceTopic(d.product, d.id, level), 1, false, payload)
	if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		d.t.Fatalf("device %s publish %s: %v", d.id, level, tok.Error())
	}
}

// disconnect leaves as a device that loses power would: its will says so.
func (d *testDevice) disconnect() {
	d.publish(wire.LevelOffline, `{}`)
	d.client.Disconnect(0)
}

func (d *testDevice) onMessage(_ mqtt.Client, m mqtt.Message) {
	switch {
	case strings.HasSuffix(m.Topic(), "/"+wire.LevelWrite):
		var msg struct {
			MessageID   string         `json:"messageId"`
			MessageType string         `json:"messageType"`
			Properties  map[string]any `json:"properties"`
		}
		if json.Unmarshal(m.Payload(), &msg) != nil || msg.MessageType != "WRITE_PROPERTY" {
			return
		}
		d.mu.Lock()
		d.writes = append(d.writes, msg.Properties)
		silent := d.silent
		d.mu.Unlock()
		if silent {
			return
		}
		body, _ := json.Marshal(map[string]any{"messageId": msg.MessageID, "deviceId": d.id, "success": true, "properties": msg.Properties})
		d.client.Publish(wire.DeviceTopic(d.product, d.id, wire.LevelWriteReply), 1, false, body)
	default:
		var msg shadowMsg
		if json.Unmarshal(m.Payload(), &msg) != nil {
			return
		}
		msg.Topic = m.Topic()
		d.mu.Lock()
		d.shadows = append(d.shadows, msg)
		d.mu.Unlock()
	}
}

func (d *testDevice) written() []map[string]any {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]map[string]any(nil), d.writes...)
}

func (d *testDevice) received() []shadowMsg {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]shadowMsg(nil), d.shadows...)
}

// TestWriteProperties: PUT .../property sends WRITE_PROPERTY to the
// device and answers with its reply; a property the thing model does not
// let be written, a value not of its type and an offline device are
// refused, and nothing reaches the device.
func TestWriteProperties(t *testing.T) {
	t.Parallel()
	le := newLinkEnv(t, nil)
	le.addDevice("w1")
	le.addDevice("w2") // never connects
	le.addDevice("w3")
	dev := connectTestDevice(t, le.broker.URL(), le.product, "w1", le.gateway)
	mute := connectTestDevice(t, le.broker.URL(), le.product, "w3", le.gateway)
	mute.silent = true
	testkit.Eventually(t, 5*time.Second, "w1 and w3 online", func() bool {
		return le.presence.IsOnline("w1") && le.presence.IsOnline("w3")
	})

	// A successful write: the device gets the values, the caller its reply.
	var got map[string]any
	le.ok("PUT", "/api/device/instance/w1/property", `{"target":21.5,"mode":"eco","fan":3,"label":"hall","on":"1"}`, &got)
	if got["target"] != 21.5 || got["mode"] != "eco" || got["fan"] != 3.0 || got["label"] != "hall" || got["on"] != "1" {
		t.Fatalf("reply: %v", got)
	}
	if w := dev.written(); len(w) != 1 || w[0]["target"] != 21.5 || len(w[0]) != 5 {
		t.Fatalf("device got %v", w)
	}

	// Refusals: 400 naming the property, nothing sent.
	for _, c := range []struct{ body, mention string }{
		{`{"temp":20}`, "temp"},                   // read-only (read, report)
		{`{"target":"warm"}`, "target"},           // not a number
		{`{"fan":2.5}`, "fan"},                    // not an integer
		{`{"fan":3000000000}`, "fan"},             // outside int
		{`{"mode":"turbo"}`, "mode"},              // not an element
		{`{"label":"too long a label"}`, "label"}, // over maxLength
		{`{"on":"yes"}`, "on"},                    // neither trueValue nor falseValue
		{`{"target":null}`, "target"},             // no value
		{`{"nope":1}`, "nope"},                    // not in the model
		{`{"target":20,"temp":20}`, "temp"},       // one bad property refuses the whole write
		{`{}`, "body"},                            // nothing to write
		{`[1]`, "body"},                           // not an object
	} {
		r := le.fails("PUT", "/api/device/instance/w1/property", c.body, 400, "illegal_argument")
		if !strings.Contains(r.Message, c.mention) {
			t.Errorf("%s: message %q does not name %s", c.body, r.Message, c.mention)
		}
	}
	if w := dev.written(); len(w) != 1 {
		t.Fatalf("refused writes reached the device: %v", w)
	}

	// Offline, silent, unknown.
	le.fails("PUT", "/api/device/instance/w2/property", `{"target":20}`, 500, "client_offline")
	le.fails("PUT", "/api/device/instance/w3/property?timeout=300", `{"target":20}`, 500, "time_out")
	le.fails("PUT", "/api/device/instance/nope/property", `{"target":20}`, 404, "not_found")
	if w := mute.written(); len(w) != 1 {
		t.Fatalf("the silent device got %v", w)
	}
	if !strings.Contains(le.metrics(), `devicehub_commands_total{kind="write",outcome="answered"} 1`) {
		t.Errorf("metrics do not count the write")
	}
}
