package link

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/prometheus/client_golang/prometheus"

	"devicehub/bench/sim"
	"devicehub/bench/testkit"
	"devicehub/ingest/mqtttest"
	"devicehub/schema"
)

const cmdModel = `{"properties":[
 {"id":"temp","name":"T","valueType":{"type":"float","scale":1}},
 {"id":"tag","name":"Tag","valueType":{"type":"string"}},
 {"id":"on","name":"On","valueType":{"type":"boolean"}}]}`

// cmdEnv is a Presence + Commands on the real broker and a fleet of
// simulated devices of a fresh product.
type cmdEnv struct {
	product  string
	presence *Presence
	cmds     *Commands
	reg      *prometheus.Registry // both register their metrics here
}

func newCmdEnv(t testing.TB) *cmdEnv {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	opt := DefaultPresenceOptions()
	opt.BrokerURL = brokerURL()
	opt.ClientID = randID("cmd-test")
	reg := prometheus.NewRegistry()
	opt.Registerer = reg
	p, err := NewPresence(ctx, opt, staticLister(nil))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	copt := DefaultCommandOptions() // the QoS the server uses
	copt.Timeout = 3 * time.Second
	copt.Registerer = reg
	c, err := NewCommands(p, nil, copt)
	if err != nil {
		t.Fatal(err)
	}
	return &cmdEnv{product: randID("cp"), presence: p, cmds: c, reg: reg}
}

func (e *cmdEnv) fleet(t testing.TB, ids []string, opts sim.Options) *sim.Fleet {
	t.Helper()
	m, err := schema.ParseThingModelString(cmdModel)
	if err != nil {
		t.Fatal(err)
	}
	opts.BrokerURL, opts.ProductID, opts.DeviceIDs, opts.Model = brokerURL(), e.product, ids, m
	if opts.ValueFunc == nil {
		opts.ValueFunc = func(dev, prop string, vt *schema.ValueType) (any, bool) {
			switch vt.Type {
			case "float":
				return 21.5, true
			case "boolean":
				return true, true
			}
			return dev + ":" + prop, true
		}
	}
	f := mqtttest.StartFleet(t, opts)
	for _, id := range ids {
		testkit.Eventually(t, 5*time.Second, "device "+id+" online", func() bool { return e.presence.IsOnline(id) })
	}
	return f
}

func (e *cmdEnv) target(id string) Target {
	return Target{DeviceID: id, DeviceName: "Device " + id, ProductID: e.product, ProductName: "P", CreatorID: "admin"}
}

// downlinkSpy records what the platform publishes to devices of a product.
func downlinkSpy(t *testing.T, product string) chan mqtt.Message {
	t.Helper()
	ch := make(chan mqtt.Message, 100)
	o := mqtt.NewClientOptions().AddBroker(brokerURL()).SetClientID(randID("spy"))
	mqtttest.Gateway(t, brokerURL())(o)
	c := mqtt.NewClient(o)
	if tok := c.Connect(); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("spy connect: %v", tok.Error())
	}
	t.Cleanup(func() { c.Disconnect(100) })
	filters := map[string]byte{"/" + product + "/+/properties/read": 1, "/" + product + "/+/function/invoke": 1}
	if tok := c.SubscribeMultiple(filters, func(_ mqtt.Client, m mqtt.Message) { ch <- m }); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("spy subscribe: %v", tok.Error())
	}
	return ch
}

func TestReadProperties(t *testing.T) {
	e := newCmdEnv(t)
	spy := downlinkSpy(t, e.product)
	e.fleet(t, []string{"d1"}, sim.Options{})
	got, err := e.cmds.ReadProperties(context.Background(), e.target("d1"), []string{"temp", "tag"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != "map[tag:d1:tag temp:21.5]" {
		t.Fatalf("read: %v", got)
	}
	// The downlink message is the spec's.
	m := <-spy
	var dl map[string]any
	if err := json.Unmarshal(m.Payload(), &dl); err != nil {
		t.Fatal(err)
	}
	h, _ := dl["headers"].(map[string]any)
	if dl["messageType"] != "READ_PROPERTY" || dl["deviceId"] != "d1" || dl["messageId"] == "" ||
		fmt.Sprint(dl["properties"]) != "[temp tag]" || h["productId"] != e.product || h["deviceName"] != "Device d1" ||
		h["creatorId"] != "admin" || h["traceparent"] == "" || h["_uid"] == "" || m.Topic() != "/"+e.product+"/d1/properties/read" {
		t.Fatalf("downlink %s: %s", m.Topic(), m.Payload())
	}
	// The spy subscribes at QoS 1, so it sees the QoS the read was sent at:
	// 0, as its reply confirms it.
	if m.Qos() != 0 {
		t.Fatalf("read sent at QoS %d, want 0", m.Qos())
	}
	if e.cmds.Pending() != 0 {
		t.Fatalf("%d waiters left", e.cmds.Pending())
	}
}

func TestReadErrors(t *testing.T) {
	e := newCmdEnv(t)
	spy := downlinkSpy(t, e.product)
	// Offline: nothing is published.
	if _, err := e.cmds.ReadProperties(context.Background(), e.target("ghost"), nil, 0); !errors.Is(err, ErrOffline) {
		t.Fatalf("offline device: %v", err)
	}
	select {
	case m := <-spy:
		t.Fatalf("published to an offline device: %s", m.Topic())
	case <-time.After(200 * time.Millisecond):
	}
	// Silent: time_out after the given timeout.
	e.fleet(t, []string{"mute"}, sim.Options{Silent: true})
	start := time.Now()
	if _, err := e.cmds.ReadProperties(context.Background(), e.target("mute"), nil, 300*time.Millisecond); !errors.Is(err, ErrTimeout) {
		t.Fatalf("silent device: %v", err)
	}
	if d := time.Since(start); d < 300*time.Millisecond || d > 3*time.Second {
		t.Fatalf("timeout took %v", d)
	}
	// Failing: the device's code and message.
	e2 := newCmdEnv(t)
	e2.fleet(t, []string{"bad"}, sim.Options{FailureRate: 1})
	_, err := e2.cmds.ReadProperties(context.Background(), e2.target("bad"), nil, 0)
	var de *DeviceError
	if !errors.As(err, &de) || de.Code != "simulated_failure" || de.Message == "" {
		t.Fatalf("failing device: %v", err)
	}
}

func TestInvokeFunction(t *testing.T) {
	e := newCmdEnv(t)
	spy := downlinkSpy(t, e.product)
	e.fleet(t, []string{"ctl"}, sim.Options{})
	id, err := e.cmds.InvokeFunction(context.Background(), e.target("ctl"), "DeviceCtrl", []Input{
		{Name: "Location", Value: "room-1"}, {Name: "OperCode", Value: map[string]any{"Switch": "1", "Temperature": 22}},
	})
	if err != nil || id == "" {
		t.Fatalf("invoke: %q %v", id, err)
	}
	m := <-spy
	var dl struct {
		MessageID, DeviceID, FunctionID, MessageType string
		Timestamp                                    int64
		Inputs                                       []map[string]any
		Headers                                      map[string]string
	}
	if err := json.Unmarshal(m.Payload(), &dl); err != nil {
		t.Fatal(err)
	}
	if m.Topic() != "/"+e.product+"/ctl/function/invoke" || dl.MessageID != id || dl.DeviceID != "ctl" || dl.FunctionID != "DeviceCtrl" ||
		dl.MessageType != "INVOKE_FUNCTION" || dl.Timestamp == 0 || len(dl.Inputs) != 2 || dl.Inputs[0]["name"] != "Location" ||
		dl.Inputs[0]["value"] != "room-1" || fmt.Sprint(dl.Inputs[1]["value"]) != "map[Switch:1 Temperature:22]" || dl.Headers["productId"] != e.product {
		t.Fatalf("invoke downlink %s: %s", m.Topic(), m.Payload())
	}
	// Answered before any reply: the broker's PUBACK confirms it.
	if m.Qos() != 1 {
		t.Fatalf("invoke sent at QoS %d, want 1", m.Qos())
	}
	if _, err := e.cmds.InvokeFunction(context.Background(), e.target("ghost"), "DeviceCtrl", nil); !errors.Is(err, ErrOffline) {
		t.Fatalf("invoke offline: %v", err)
	}
}

// TestConcurrentReads: 1,000 reads over 100 devices, each answered with
// the value of its own device and property.
func TestConcurrentReads(t *testing.T) {
	e := newCmdEnv(t)
	ids := make([]string, 100)
	for i := range ids {
		ids[i] = fmt.Sprintf("dev%03d", i)
	}
	e.fleet(t, ids, sim.Options{})
	var wg sync.WaitGroup
	errs := make(chan error, 1000)
	for i := 0; i < 1000; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := ids[i%len(ids)]
			got, err := e.cmds.ReadProperties(context.Background(), e.target(id), []string{"tag"}, 10*time.Second)
			if err != nil {
				errs <- fmt.Errorf("read %d: %w", i, err)
				return
			}
			if got["tag"] != id+":tag" || len(got) != 1 {
				errs <- fmt.Errorf("read %d of %s got %v", i, id, got)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if e.cmds.Pending() != 0 {
		t.Fatalf("%d waiters left", e.cmds.Pending())
	}
}

// TestReadRacingOffline: a read pending when the device dies ends in
// client_offline (or time_out), never a hang.
func TestReadRacingOffline(t *testing.T) {
	e := newCmdEnv(t)
	f := e.fleet(t, []string{"dying"}, sim.Options{Silent: true})
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		_, err := e.cmds.ReadProperties(context.Background(), e.target("dying"), nil, 10*time.Second)
		done <- err
	}()
	testkit.Eventually(t, 5*time.Second, "the read to be pending", func() bool { return e.cmds.Pending() == 1 })
	f.Device("dying").Kill() // no DISCONNECT: the broker sends the will
	select {
	case err := <-done:
		if !errors.Is(err, ErrOffline) && !errors.Is(err, ErrTimeout) {
			t.Fatalf("read racing offline: %v", err)
		}
		if time.Since(start) > 9*time.Second {
			t.Fatalf("the read waited for its timeout instead of failing at the will (%v)", time.Since(start))
		}
	case <-time.After(15 * time.Second):
		t.Fatal("read hung")
	}
	if e.presence.IsOnline("dying") {
		t.Fatal("presence still shows the dead device online")
	}
}

func TestExpire(t *testing.T) {
	e := newCmdEnv(t)
	e.fleet(t, []string{"slow"}, sim.Options{Silent: true})
	done := make(chan error, 1)
	go func() {
		_, err := e.cmds.ReadProperties(context.Background(), e.target("slow"), nil, time.Minute)
		done <- err
	}()
	testkit.Eventually(t, 5*time.Second, "the read to be pending", func() bool { return e.cmds.Pending() == 1 })
	if n := e.cmds.Expire(time.Now()); n != 0 {
		t.Fatalf("expired %d before the deadline", n)
	}
	if n := e.cmds.Expire(time.Now().Add(2 * time.Minute)); n != 1 {
		t.Fatalf("expired %d after the deadline", n)
	}
	if err := <-done; !errors.Is(err, ErrTimeout) {
		t.Fatalf("expired read: %v", err)
	}
}

// RunExpiry sweeps waiters left behind by callers that went away.
func TestRunExpiry(t *testing.T) {
	e := newCmdEnv(t)
	w := &waiter{deviceID: "gone", deadline: time.Now().Add(-time.Second), done: make(chan result, 1), stop: func() {}}
	id := newIDs(shardOf("gone")).messageID
	if !e.cmds.add(&e.cmds.shards[shardOfID(id)], id, w) {
		t.Fatal("the table refused the orphan")
	}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() { defer close(stopped); e.cmds.RunExpiry(ctx, 10*time.Millisecond) }()
	testkit.Eventually(t, 5*time.Second, "the orphan to be swept", func() bool { return e.cmds.Pending() == 0 })
	if r := <-w.done; !errors.Is(r.err, ErrTimeout) {
		t.Fatalf("swept waiter got %v", r.err)
	}
	cancel()
	<-stopped
}

// TestCommandMetrics: real commands on the real broker are counted by
// kind and outcome, timed, and their downlinks counted as sent; the
// presence gauge counts the devices online.
func TestCommandMetrics(t *testing.T) {
	e := newCmdEnv(t)
	e.fleet(t, []string{"ok"}, sim.Options{})
	e.fleet(t, []string{"mute"}, sim.Options{Silent: true})
	e.fleet(t, []string{"bad"}, sim.Options{FailureRate: 1})
	ctx := context.Background()
	if _, err := e.cmds.ReadProperties(ctx, e.target("ok"), []string{"temp"}, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := e.cmds.ReadProperties(ctx, e.target("mute"), nil, 300*time.Millisecond); !errors.Is(err, ErrTimeout) {
		t.Fatalf("silent device: %v", err)
	}
	var de *DeviceError
	if _, err := e.cmds.ReadProperties(ctx, e.target("bad"), nil, 0); !errors.As(err, &de) {
		t.Fatalf("failing device: %v", err)
	}
	if _, err := e.cmds.ReadProperties(ctx, e.target("ghost"), nil, 0); !errors.Is(err, ErrOffline) {
		t.Fatalf("offline device: %v", err)
	}
	if _, err := e.cmds.InvokeFunction(ctx, e.target("ok"), "DeviceCtrl", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := e.cmds.InvokeFunction(ctx, e.target("ghost"), "DeviceCtrl", nil); !errors.Is(err, ErrOffline) {
		t.Fatalf("invoke offline: %v", err)
	}

	f := func(want float64, name string, labels ...string) {
		t.Helper()
		if got := metricValue(t, e.reg, name, labels...); got != want {
			t.Errorf("%s%v = %v, want %v", name, labels, got, want)
		}
	}
	for _, c := range []struct {
		kind, outcome string
		n             float64
	}{
		{"read", "answered", 1}, {"read", "failed", 1}, {"read", "timeout", 1}, {"read", "offline", 1},
		{"read", "busy", 0}, {"read", "error", 0},
		{"invoke", "sent", 1}, {"invoke", "offline", 1}, {"invoke", "timeout", 0}, {"invoke", "error", 0},
	} {
		f(c.n, "devicehub_commands_total", "kind", c.kind, "outcome", c.outcome)
		f(c.n, "devicehub_command_duration_seconds", "kind", c.kind, "outcome", c.outcome) // observations
	}
	f(-1, "devicehub_commands_total", "kind", "invoke", "outcome", "answered") // invokes are not answered
	f(3, "devicehub_commands_sent_total", "kind", "read")                      // ok, mute, bad
	f(1, "devicehub_commands_sent_total", "kind", "invoke")
	f(0, "devicehub_commands_pending")
	f(3, "devicehub_devices_online")

	// The timed-out read is timed at its timeout.
	mfs, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			l := m.GetLabel() // sorted by name: kind, outcome
			if mf.GetName() == "devicehub_command_duration_seconds" && l[0].GetValue() == "read" && l[1].GetValue() == "timeout" &&
				m.GetHistogram().GetSampleSum() < 0.3 {
				t.Errorf("the timed-out read was timed %.3fs, under its 0.3s timeout", m.GetHistogram().GetSampleSum())
			}
		}
	}
}

// BenchmarkReadProperties: concurrent property reads through the real
// broker to 100 simulated devices in this process (the devices' CPU is in
// the figures); reports reads/s beside ns/op and allocations per read.
func BenchmarkReadProperties(b *testing.B) {
	e := newCmdEnv(b)
	ids := make([]string, 100)
	for i := range ids {
		ids[i] = fmt.Sprintf("dev%03d", i)
	}
	e.fleet(b, ids, sim.Options{})
	var n atomic.Int64
	b.SetParallelism(64) // many requests in flight, as an HTTP server has
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			id := ids[n.Add(1)%int64(len(ids))]
			if _, err := e.cmds.ReadProperties(context.Background(), e.target(id), []string{"temp"}, 10*time.Second); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "reads/s")
}

// TestReplyFromAnotherDevice: a reply counts only on the topic of the
// device the read went to. Another device (here a gateway publishing on
// its topic, as that device may) that sends a reply with the same
// messageId is ignored: the read takes the genuine reply that follows.
func TestReplyFromAnotherDevice(t *testing.T) {
	e := newCmdEnv(t)
	spy := downlinkSpy(t, e.product)
	e.fleet(t, []string{"victim", "other"}, sim.Options{Silent: true})
	o := mqtt.NewClientOptions().AddBroker(brokerURL()).SetClientID(randID("forger"))
	mqtttest.Gateway(t, brokerURL())(o)
	gw := mqtt.NewClient(o)
	if tok := gw.Connect(); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("gateway connect: %v", tok.Error())
	}
	defer gw.Disconnect(100)
	type res struct {
		props map[string]any
		err   error
	}
	done := make(chan res, 1)
	go func() {
		p, err := e.cmds.ReadProperties(context.Background(), e.target("victim"), []string{"temp"}, 5*time.Second)
		done <- res{p, err}
	}()
	var id string
	select {
	case m := <-spy:
		var dl struct{ MessageID string }
		if err := json.Unmarshal(m.Payload(), &dl); err != nil || dl.MessageID == "" {
			t.Fatalf("downlink %s: %v", m.Payload(), err)
		}
		id = dl.MessageID
	case <-time.After(5 * time.Second):
		t.Fatal("no downlink")
	}
	send := func(device string, temp float64) {
		t.Helper()
		body := fmt.Sprintf(`{"messageId":%q,"deviceId":"victim","success":true,"properties":{"temp":%v}}`, id, temp)
		tok := gw.Publish("/"+e.product+"/"+device+"/properties/read/reply", 1, false, body)
		if !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
			t.Fatalf("reply: %v", tok.Error())
		}
	}
	send("other", 99)    // forged: the victim's messageId from another device
	send("victim", 21.5) // genuine
	r := <-done
	if r.err != nil || fmt.Sprint(r.props) != "map[temp:21.5]" {
		t.Fatalf("read: %v %v, want the victim's own reply", r.props, r.err)
	}
}
