package notify_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"devicehub/bench/testkit"
	"devicehub/ingest/alarm"
	"devicehub/ingest/mqttconn"
	"devicehub/ingest/mqtttest"
	"devicehub/ingest/notify"
	"devicehub/meta"
	"devicehub/meta/metatest"
	"devicehub/schema"
)

// End to end through the real evaluator (the test, not the package,
// imports ingest/alarm): devices' reports over MQTT cross a threshold and
// fall back, the alarm runner raises and clears, the trigger enqueues, the
// dispatcher delivers to a real receiver, raised before cleared for each
// device. It logs how long a crossing takes to reach the receiver with
// devicehub's defaults (the evaluator's flush here 20 ms).
func TestThroughEvaluator(t *testing.T) {
	ctx := context.Background()
	dsn := metatest.NewDatabase(t)
	mopts := meta.DefaultOptions()
	mopts.DSN = dsn
	ms, err := meta.Open(ctx, mopts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ms.Close() })
	g := rig{ms: ms, store: notify.NewStore(ms), alarms: alarms{t: t, db: ms.DB()}}
	product := testkit.RandID("notify")
	model := `{"properties":[{"id":"temp","name":"Temperature","valueType":{"type":"float","scale":1}}],"events":[],"functions":[],"tags":[]}`
	if _, err := g.ms.CreateProduct(ctx, meta.NewProduct{ID: product, Name: "Meter", ClassifiedID: "c", AccessID: "mqtt",
		ModelFrom: "custom", DeviceType: "device", Metadata: model}, "admin"); err != nil {
		t.Fatal(err)
	}
	tm, err := schema.ParseThingModelString(model)
	if err != nil {
		t.Fatal(err)
	}
	rule, err := alarm.ParseRule([]byte(`{"trigger":{"type":"property","all":[{"property":"temp","op":"gt","value":30}]}}`))
	if err != nil {
		t.Fatal(err)
	}
	rule.ID, rule.Name, rule.ProductID, rule.Enabled, rule.Severity = product+"-hot", "Hot", product, true, alarm.SeverityMajor
	if err := rule.Validate(tm); err != nil {
		t.Fatal(err)
	}
	ast := alarm.NewStore(g.ms)
	if _, err := ast.PutRule(ctx, rule, true, alarm.Actor{ID: "u1", Name: "admin"}); err != nil {
		t.Fatal(err)
	}
	rcv := newReceiver(t)
	ch := g.webhook(t, rcv.URL("/e2e"), "k")
	g.subscribe(t, notify.Subscription{Products: []string{product}, Kinds: []string{"raised", "cleared"}, Channels: []string{ch.ID}})

	broker := mqtttest.SharedURL()
	clientID := testkit.RandID("test-alarms-")
	u, p := mqtttest.Service()
	runner, err := alarm.NewRunner(g.ms, alarm.Options{BrokerURL: broker, Login: mqttconn.Login{Username: u, Password: p}, ClientID: clientID,
		FlushInterval: 20 * time.Millisecond, TickInterval: 50 * time.Millisecond, PollInterval: 200 * time.Millisecond, Retry: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stopRunner := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); runner.Run(rctx) }()
	t.Cleanup(func() {
		stopRunner()
		wg.Wait()
		c := mqtt.NewClient(mqtttest.ServiceOptions(broker, clientID).SetCleanSession(true)) // drop the owner's session
		if c.Connect().WaitTimeout(5*time.Second) && c.IsConnected() {
			c.Disconnect(0)
		}
	})
	testkit.Eventually(t, 20*time.Second, "the runner to own the evaluation", runner.Ready)
	o := notify.DefaultOptions() // as devicehub runs it: woken by the trigger, a 200 ms poll behind
	o.DSN = dsn
	g.run(t, o)

	gw := mqtttest.Gateway(t, broker)
	po := mqtt.NewClientOptions().AddBroker(broker).SetClientID(testkit.RandID("test-gw-")).SetCleanSession(true)
	gw(po)
	pub := mqtt.NewClient(po)
	if err := mqttconn.WaitToken(pub.Connect(), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	defer pub.Disconnect(0)
	report := func(dev string, n int, v float64) {
		t.Helper()
		payload := fmt.Sprintf(`{"messageId":"%s-%d","timestamp":%d,"properties":{"temp":%v}}`, dev, n, time.Now().UnixMilli(), v)
		if err := mqttconn.WaitToken(pub.Publish("/"+product+"/"+dev+"/properties/report", 1, false, payload), 10*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	const devices = 50
	sent := map[string]time.Time{}
	for i := range devices {
		dev := fmt.Sprintf("d%02d", i)
		report(dev, 1, 25)
		sent[dev] = time.Now()
		report(dev, 2, 31)
		testkit.Eventually(t, 10*time.Second, "the raise of "+dev, func() bool {
			for _, r := range rcv.requests() {
				if r.N.Alarm["deviceId"] == dev {
					return true
				}
			}
			return false
		})
		report(dev, 3, 20)
	}
	testkit.Eventually(t, 20*time.Second, "every raise and clear", func() bool { return len(distinct(rcv.requests())) == 2*devices })
	var lat []time.Duration
	kinds := map[string][]string{}
	for _, r := range rcv.requests() {
		dev := r.N.Alarm["deviceId"].(string)
		if r.Signature != notify.Sign("k", r.Body) {
			t.Fatalf("signature of %s", r.Key)
		}
		kinds[dev] = append(kinds[dev], r.N.Kind)
		if r.N.Kind == "raised" {
			lat = append(lat, r.At.Sub(sent[dev]))
		}
	}
	for dev, ks := range kinds {
		if !slices.Equal(ks, []string{"raised", "cleared"}) {
			t.Fatalf("%s: %v", dev, ks)
		}
	}
	slices.Sort(lat)
	t.Logf("crossing report published -> webhook received, %d alarms: p50 %v, p90 %v, max %v", len(lat), lat[len(lat)/2], lat[len(lat)*9/10], lat[len(lat)-1])
}
