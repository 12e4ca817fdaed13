package alarm

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/lib/pq"

	"devicehub/bench/testkit"
	"devicehub/ingest/mqttconn"
	"devicehub/ingest/mqtttest"
	"devicehub/ingest/wire"
	"devicehub/meta"
	"devicehub/meta/metatest"
)

func TestMain(m *testing.M) { testkit.Main(m) }

// rig is a product with rules in a database of its own, a gateway login
// publishing for its devices, and runners evaluating it through a broker.
type rig struct {
	t        testing.TB
	ms       *meta.Store
	store    *Store
	product  string
	broker   string
	clientID string
	pub      mqtt.Client
}

func newRig(t testing.TB, broker string, rules ...string) *rig {
	t.Helper()
	ctx := context.Background()
	g := &rig{t: t, ms: metatest.NewStore(t), product: testkit.RandID("alarm"), broker: broker, clientID: testkit.RandID("test-alarms-")}
	g.store = NewStore(g.ms)
	if _, err := g.ms.CreateProduct(ctx, meta.NewProduct{ID: g.product, Name: "Meter", ClassifiedID: "c", AccessID: "mqtt",
		ModelFrom: "custom", DeviceType: "device", Metadata: testModel}, "admin"); err != nil {
		t.Fatal(err)
	}
	for i, body := range rules {
		r, err := ParseRule([]byte(body))
		if err != nil {
			t.Fatal(err)
		}
		if r.ID == "" {
			r.ID = "r" + strconv.Itoa(i+1)
		}
		r.ID = g.product + "-" + r.ID
		r.Name, r.ProductID, r.Enabled = "rule "+r.ID, g.product, true
		if r.Severity == "" {
			r.Severity = SeverityMajor
		}
		if err := r.Validate(model(t)); err != nil {
			t.Fatal(err)
		}
		if _, err := g.store.PutRule(ctx, r, true, Actor{ID: "u1", Name: "admin"}); err != nil {
			t.Fatal(err)
		}
	}
	gw := mqtttest.Gateway(t, broker)
	o := mqtt.NewClientOptions().AddBroker(broker).SetClientID(testkit.RandID("test-gw-")).SetCleanSession(true).SetAutoReconnect(true).
		SetMaxReconnectInterval(250 * time.Millisecond).SetConnectRetry(true)
	gw(o)
	g.pub = mqtt.NewClient(o)
	if err := mqttconn.WaitToken(g.pub.Connect(), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		g.pub.Disconnect(0)
		// remove the owners' persistent session from the broker
		o := mqtttest.ServiceOptions(broker, g.clientID).SetCleanSession(true)
		c := mqtt.NewClient(o)
		if c.Connect().WaitTimeout(5*time.Second) && c.IsConnected() {
			c.Disconnect(0)
		}
	})
	return g
}

// runner starts a runner; stop cancels it and waits for it to return.
func (g *rig) runner(tweak func(*Runner)) (r *Runner, stop func()) {
	g.t.Helper()
	u, p := mqtttest.Service()
	r, err := NewRunner(g.ms, Options{BrokerURL: g.broker, Login: mqttconn.Login{Username: u, Password: p}, ClientID: g.clientID,
		FlushInterval: 20 * time.Millisecond, TickInterval: 50 * time.Millisecond,
		PollInterval: 200 * time.Millisecond, Retry: 100 * time.Millisecond})
	if err != nil {
		g.t.Fatal(err)
	}
	if tweak != nil {
		tweak(r)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.Run(ctx)
	}()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	g.t.Cleanup(stop)
	return r, stop
}

func (g *rig) publish(dev, level, payload string) {
	g.t.Helper()
	if err := mqttconn.WaitToken(g.pub.Publish("/"+g.product+"/"+dev+"/"+level, 1, false, payload), 10*time.Second); err != nil {
		g.t.Fatal(err)
	}
}

// report publishes {"messageId", "timestamp", "properties": {prop: v}}.
func (g *rig) report(dev, id string, ts time.Time, prop string, v float64) {
	g.t.Helper()
	g.publish(dev, "properties/report", fmt.Sprintf(`{"messageId":%q,"timestamp":%d,"properties":{%q:%v}}`, id, ts.UnixMilli(), prop, v))
}

// settledRecords waits up to within for devices alarm records each
// counting count (and extra, if given, to hold). It gives up at once when
// there are more records or a larger count, which no wait undoes. It
// returns the records last read and whether they settled so.
func (g *rig) settledRecords(devices int, count int64, within time.Duration, extra func() bool) ([]Record, bool) {
	var recs []Record
	settled := false
	testkit.Within(within, func() bool {
		recs, settled = g.records(nil), false
		if len(recs) != devices {
			return len(recs) > devices
		}
		for _, r := range recs {
			if r.Count != count {
				return r.Count > count
			}
		}
		settled = extra == nil || extra()
		return settled
	})
	return recs, settled
}

func (g *rig) records(q *meta.Query) []Record {
	g.t.Helper()
	if q == nil {
		q = &meta.Query{Paging: new(bool)}
	}
	p, err := g.store.QueryRecords(context.Background(), q)
	if err != nil {
		g.t.Fatal(err)
	}
	return p.Data
}

func (g *rig) waitRecords(what string, cond func([]Record) bool) []Record {
	g.t.Helper()
	var recs []Record
	testkit.Eventually(g.t, 20*time.Second, what, func() bool {
		recs = g.records(nil)
		return cond(recs)
	})
	return recs
}

func (g *rig) waitOwner(r *Runner) {
	g.t.Helper()
	testkit.Eventually(g.t, 20*time.Second, "the runner to own the evaluation", r.Ready)
}

// TestRunnerProperty: through the broker, a crossing raises, repeats
// count, a ladder escalates and steps down, the trigger ending clears;
// a hand's clear makes the next crossing a new alarm.
func TestRunnerProperty(t *testing.T) {
	g := newRig(t, mqtttest.SharedURL(), `{"trigger":{"type":"property","all":[{"property":"temp","op":"gt","value":30}]},"ladder":[{"severity":"critical","all":[{"property":"temp","op":"gt","value":50}]}]}`)
	r, _ := g.runner(nil)
	g.waitOwner(r)
	base := time.Now().Add(-time.Minute)
	g.report("d1", "a", base, "temp", 25)
	g.report("d1", "b", base.Add(time.Second), "temp", 31)
	recs := g.waitRecords("the alarm", func(rs []Record) bool { return len(rs) == 1 })
	if recs[0].State != StateActive || recs[0].Severity != SeverityMajor || recs[0].DeviceID != "d1" || recs[0].LastValue != "temp=31" {
		t.Fatalf("record %+v", recs[0])
	}
	g.report("d1", "c", base.Add(2*time.Second), "temp", 55)
	g.waitRecords("the escalation", func(rs []Record) bool { return rs[0].Severity == SeverityCritical && rs[0].Count == 2 })
	g.report("d1", "d", base.Add(3*time.Second), "temp", 35)
	g.waitRecords("the step down", func(rs []Record) bool { return rs[0].Severity == SeverityMajor && rs[0].Count == 3 })
	g.report("d1", "e", base.Add(4*time.Second), "temp", 20)
	recs = g.waitRecords("the clear", func(rs []Record) bool { return rs[0].State == StateCleared })
	if got := kinds(t, g.store, recs[0].ID); fmt.Sprint(got) != "[raised major temp=31 escalated critical temp=55 deescalated major temp=35 cleared major temp=20]" {
		t.Errorf("transitions %q", got)
	}
	// by hand: acknowledged and cleared, then a new alarm
	g.report("d1", "f", base.Add(5*time.Second), "temp", 40)
	recs = g.waitRecords("a second alarm", func(rs []Record) bool { return len(rs) == 2 })
	if _, err := g.store.Ack(context.Background(), recs[0].ID, Actor{ID: "u1", Name: "ann"}, "on it"); err != nil {
		t.Fatal(err)
	}
	if _, err := g.store.ClearByHand(context.Background(), recs[0].ID, Actor{ID: "u1", Name: "ann"}, "reset"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(0) // the owner learns of the clear by its poll; the next crossing must not repeat the cleared alarm
	g.report("d1", "g", base.Add(6*time.Second), "temp", 41)
	recs = g.waitRecords("a third alarm after the hand's clear", func(rs []Record) bool { return len(rs) == 3 && rs[0].State == StateActive })
	if recs[1].Count != 1 || recs[1].ClearedBy != "ann" || !recs[1].Acked {
		t.Errorf("the hand-cleared alarm: %+v", recs[1])
	}
}

// TestRunnerTimers: offline for D and no data for D fire within a second
// of their deadline; a birth and a report clear them.
func TestRunnerTimers(t *testing.T) {
	g := newRig(t, mqtttest.SharedURL(), `{"id":"off","trigger":{"type":"offline","for":"1s"}}`,
		`{"id":"quiet","trigger":{"type":"nodata","for":"1500ms","property":"temp"}}`,
		`{"id":"fault","trigger":{"type":"event","event":"fault","all":[{"property":"code","op":"ge","value":500}]},"clear":{"for":"1s"}}`)
	r, _ := g.runner(nil)
	g.waitOwner(r)
	g.publish("d1", "online", "")
	g.publish("d1", "offline", "")
	offAt := time.Now()
	g.report("d2", "x", time.Now(), "temp", 1)
	dataAt := time.Now()
	g.publish("d3", "event/fault", `{"messageId":"e1","data":{"code":404}}`)
	g.publish("d3", "event/fault", `{"messageId":"e2","data":{"code":503,"text":"overheat"}}`)
	seen := map[string]time.Time{}
	testkit.Eventually(t, 20*time.Second, "offline, no-data and event alarms", func() bool {
		for _, rec := range g.records(nil) {
			if _, ok := seen[rec.RuleID]; !ok {
				seen[rec.RuleID] = time.Now()
			}
		}
		return len(seen) == 3
	})
	if late := seen[g.product+"-off"].Sub(offAt.Add(time.Second)); late > time.Second {
		t.Errorf("offline alarm %v after its deadline", late)
	}
	if late := seen[g.product+"-quiet"].Sub(dataAt.Add(1500 * time.Millisecond)); late > time.Second {
		t.Errorf("no-data alarm %v after its deadline", late)
	}
	g.publish("d1", "online", "")
	g.report("d2", "y", time.Now(), "temp", 2)
	recs := g.waitRecords("the clears", func(rs []Record) bool {
		for _, r := range rs {
			if r.State != StateCleared {
				return false
			}
		}
		return true // the event alarm clears after a quiet second
	})
	for _, r := range recs {
		if r.RuleID == g.product+"-fault" && r.FirstValue != "event fault code=503" {
			t.Errorf("event alarm %+v", r)
		}
	}
}

// TestRunnerBounce: a value bouncing around the threshold 10 times a
// second for 60 s (device time) with hysteresis is one alarm whose count
// grows (300 crossings above), not 600 alarms.
func TestRunnerBounce(t *testing.T) {
	g := newRig(t, mqtttest.SharedURL(), `{"trigger":{"type":"property","all":[{"property":"temp","op":"gt","value":30}]},"clear":{"type":"condition","all":[{"property":"temp","op":"lt","value":28}]}}`)
	r, _ := g.runner(nil)
	g.waitOwner(r)
	base := time.Now().Add(-2 * time.Minute)
	const n = 600
	for i := range n {
		v := 29.5
		if i%2 == 0 {
			v = 30.5
		}
		g.report("d1", strconv.Itoa(i), base.Add(time.Duration(i)*100*time.Millisecond), "temp", v)
	}
	recs := g.waitRecords("every crossing counted", func(rs []Record) bool { return len(rs) == 1 && rs[0].Count == n/2 })
	if recs[0].State != StateActive {
		t.Errorf("%+v", recs[0])
	}
}

// TestRunnerExact is the exactness argument broken on purpose: two
// runners share the evaluation of many devices that cross at once; the
// owner dies mid-stream three ways (before a write, between a write and
// its acks, and with its database session gone), the broker restarts;
// every device ends with exactly one alarm whose count is the number of
// its reports above the threshold: none lost, none doubled.
func TestRunnerExact(t *testing.T) {
	b := mqtttest.StartBroker(t)
	g := newRig(t, b.URL(), `{"trigger":{"type":"property","all":[{"property":"temp","op":"gt","value":30}]},"clear":{"type":"manual"}}`)
	var crashNext atomic.Bool // the owner's next write is committed, then it dies before its acks
	type live struct {
		r    *Runner
		stop func()
	}
	var runners []live
	start := func() {
		r, stop := g.runner(func(r *Runner) {
			r.afterWrite = func(*batch) error {
				if crashNext.CompareAndSwap(true, false) {
					return errors.New("test crash between a write and its acks")
				}
				return nil
			}
		})
		runners = append(runners, live{r, stop})
	}
	owner := func() int {
		var i int
		testkit.Eventually(t, 20*time.Second, "an owner", func() bool {
			for i = range runners {
				if runners[i].r.Ready() {
					return true
				}
			}
			return false
		})
		return i
	}
	start()
	owner()
	start()
	const devices, rounds = 100, 12
	base := time.Now().Add(-time.Hour)
	above := 0
	for round := range rounds {
		v := 31.0
		if round%3 == 2 {
			v = 20 // not counted
		} else {
			above++
		}
		if round == 3 || round == 7 { // committed, not acknowledged: the next owner gets it again
			crashNext.Store(true)
		}
		var toks []mqtt.Token
		for d := range devices {
			topic := fmt.Sprintf("/%s/dev%03d/properties/report", g.product, d)
			payload := fmt.Sprintf(`{"messageId":"m%d","timestamp":%d,"properties":{"temp":%v}}`, round, base.Add(time.Duration(round)*time.Second).UnixMilli(), v)
			toks = append(toks, g.pub.Publish(topic, 1, false, payload))
		}
		for _, tok := range toks {
			if err := mqttconn.WaitToken(tok, 30*time.Second); err != nil {
				t.Fatal(err)
			}
		}
		if round == 3 || round == 7 {
			// The crashed batch ends with this round's reports, counted
			// ones whose redelivery only their message ids tell apart.
			testkit.Eventually(t, 20*time.Second, "the crash", func() bool { return !crashNext.Load() })
		}
		switch round {
		case 4, 10: // the owner dies with its batch in memory only; another takes over
			i := owner()
			runners[i].stop()
			runners = append(runners[:i], runners[i+1:]...)
			start()
		case 5: // the broker restarts under the owner
			b.Stop(syscall.SIGTERM)
			b.Start()
			testkit.Eventually(t, 20*time.Second, "the publisher back", g.pub.IsConnectionOpen)
		}
	}
	var recs []Record
	ok := testkit.Within(30*time.Second, func() bool {
		recs = g.records(nil)
		if len(recs) != devices {
			return len(recs) > devices // more is a failure at once
		}
		for _, r := range recs {
			if r.Count != int64(above) {
				return false
			}
		}
		return true
	})
	if !ok || len(recs) != devices {
		t.Errorf("%d alarms for %d devices", len(recs), devices)
	}
	for _, r := range recs {
		if r.Count != int64(above) || r.State != StateActive {
			t.Errorf("%s: count %d state %s, want %d active", r.DeviceID, r.Count, r.State, above)
		}
	}
	if crashNext.Load() {
		t.Error("a crash between a write and its acks did not happen")
	}
}

// TestRunnerRuleChanges: with no rule the evaluator subscribes to
// nothing; a rule created while it runs is evaluated within a poll; the
// product's last rule disabled, its subscription goes.
func TestRunnerRuleChanges(t *testing.T) {
	g := newRig(t, mqtttest.SharedURL())
	r, _ := g.runner(nil)
	g.waitOwner(r)
	if f := r.sub.Load().Filters(); len(f) != 0 {
		t.Errorf("subscribed with no rule: %v", f)
	}
	rule, err := ParseRule([]byte(`{"id":"` + g.product + `-hot","name":"Hot","productId":"` + g.product + `","severity":"minor","enabled":true,"trigger":{"type":"property","all":[{"property":"temp","op":"gt","value":30}]}}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.store.PutRule(context.Background(), rule, true, Actor{}); err != nil {
		t.Fatal(err)
	}
	n := 0
	testkit.Eventually(t, 20*time.Second, "the new rule's alarm", func() bool {
		n++
		g.report("d1", "m"+strconv.Itoa(n), time.Now(), "temp", 40)
		return len(g.records(nil)) == 1
	})
	if _, err := g.store.SetEnabled(context.Background(), rule.ID, false, Actor{ID: "u1", Name: "ann"}); err != nil {
		t.Fatal(err)
	}
	if recs := g.records(nil); len(recs) != 1 || recs[0].State != StateCleared || recs[0].ClearValue != ReasonRuleDisabled || recs[0].ClearedBy != "ann" {
		t.Errorf("the disabled rule's alarm: %+v", recs)
	}
	testkit.Eventually(t, 20*time.Second, "the unsubscription", func() bool { return len(r.sub.Load().Filters()) == 0 })
}

// TestRunnerPool: with a broker pool, a will counts only from the broker
// of the device's last birth (ingest.BornAt, the pipeline's rule): a
// stale will from the broker it left raises no offline alarm.
func TestRunnerPool(t *testing.T) {
	b1, b2 := mqtttest.StartBroker(t), mqtttest.StartBroker(t)
	g := newRig(t, b1.URL(), `{"id":"off","trigger":{"type":"offline","for":"300ms"}}`)
	pub2 := newRig(t, b2.URL()).pub // a publisher on the second broker (its own empty database is not used)
	g.broker = b1.URL() + "," + b2.URL()
	r, _ := g.runner(nil)
	g.waitOwner(r)
	on := func(c mqtt.Client, dev, level string) {
		t.Helper()
		if err := mqttconn.WaitToken(c.Publish("/"+g.product+"/"+dev+"/"+level, 1, false, ""), 10*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	// The runner reads each broker on its own connection, so two brokers'
	// messages reach it in either order. A sentinel behind each step, on
	// the step's connection, goes offline for real: once its alarm is
	// raised, the step before it on that connection was applied.
	has := func(rs []Record, dev string) bool {
		for _, r := range rs {
			if r.DeviceID == dev {
				return true
			}
		}
		return false
	}
	sentinel := func(c mqtt.Client, dev string) []Record {
		t.Helper()
		on(c, dev, "online")
		on(c, dev, "offline")
		return g.waitRecords(dev+"'s offline alarm", func(rs []Record) bool { return has(rs, dev) })
	}
	on(g.pub, "d1", "online") // born on broker 1
	sentinel(g.pub, "s1")
	on(pub2, "d1", "online") // moved to broker 2
	sentinel(pub2, "s2")
	on(g.pub, "d1", "offline") // broker 1's will for the lost connection: stale
	// When s3's alarm is raised, a counted stale will (earlier, with an
	// earlier deadline) would have raised d1's.
	if recs := sentinel(g.pub, "s3"); has(recs, "d1") {
		t.Fatalf("a stale will raised an alarm: %+v", recs)
	}
	on(pub2, "d1", "offline") // d1's real will, from the broker of its last birth
	g.waitRecords("d1's offline alarm", func(rs []Record) bool { return has(rs, "d1") })
}

// TestRunnerDeviceValues: thresholds naming a device's tag and
// configuration key are read from the device (and follow its change); a
// device without them raises nothing.
func TestRunnerDeviceValues(t *testing.T) {
	g := newRig(t, mqtttest.SharedURL(),
		`{"id":"tag","trigger":{"type":"property","all":[{"property":"temp","op":"gt","ref":"tag.limit"}]}}`,
		`{"id":"conf","trigger":{"type":"property","all":[{"property":"temp","op":"gt","ref":"config.max"}]}}`)
	db := g.ms.DB()
	if _, err := db.Exec(`INSERT INTO devices (id, name, product_id, state, tags, configuration) VALUES
		('d1', 'd1', $1, 'online', '[{"key":"limit","value":"50"}]', '{"max":70}'), ('d2', 'd2', $1, 'online', '[]', '{}')`, g.product); err != nil {
		t.Fatal(err)
	}
	r, _ := g.runner(nil)
	g.waitOwner(r)
	g.report("d2", "a1", time.Now(), "temp", 99) // no tag, no configuration: not evaluated
	g.report("d1", "b1", time.Now(), "temp", 60) // above the tag's 50, below the configuration's 70
	g.report("d1", "b2", time.Now(), "temp", 80) // above both
	recs := g.waitRecords("d1's two alarms", func(rs []Record) bool { return len(rs) >= 2 })
	for _, rec := range recs {
		if rec.DeviceID != "d1" {
			t.Errorf("a device without the threshold's value raised: %+v", rec)
		}
	}
	if len(recs) != 2 || recs[0].FirstValue == recs[1].FirstValue {
		t.Errorf("records %+v", recs)
	}
	// The tag changed: the next report compares with the new value.
	if _, err := db.Exec(`UPDATE devices SET tags = '[{"key":"limit","value":"90"}]', modify_time = clock_timestamp() WHERE id = 'd1'`); err != nil {
		t.Fatal(err)
	}
	n := 2
	g.waitRecords("the tag rule's alarm cleared under the new limit", func(rs []Record) bool {
		n++
		g.report("d1", "b"+strconv.Itoa(n), time.Now(), "temp", 85)
		for _, rec := range rs {
			if rec.RuleID == g.product+"-tag" && rec.State == StateCleared {
				return true
			}
		}
		return false
	})
}

// TestRunnerNoDataRestart: no-data timers are restored from what is
// stored. A device silent across a quick restart fires within 1 s of its
// deadline; after a restart longer than D, a device silent throughout
// fires at once, and one that reported while no owner ran (its report
// queued in the session) does not: its report is applied before any timer
// fires (the backlog marker).
func TestRunnerNoDataRestart(t *testing.T) {
	const d = 3 * time.Second
	g := newRig(t, mqtttest.SharedURL(), `{"id":"quiet","trigger":{"type":"nodata","for":"3s"}}`)
	rule := g.product + "-quiet"
	stored := func(devs ...string) func() bool {
		return func() bool {
			var n int
			err := g.ms.DB().Get(&n, `SELECT count(*) FROM alarm_state WHERE device_id = ANY($2) AND data->'r'->$1->>'l' IS NOT NULL`, rule, pq.StringArray(devs))
			return err == nil && n == len(devs)
		}
	}
	has := func(recs []Record, dev string) bool {
		for _, rec := range recs {
			if rec.DeviceID == dev {
				return true
			}
		}
		return false
	}
	a, stopA := g.runner(nil)
	g.waitOwner(a)
	g.report("d1", "a1", time.Now(), "temp", 1)
	at1 := time.Now()
	testkit.Eventually(t, 10*time.Second, "d1's state stored", stored("d1"))
	stopA()
	b, stopB := g.runner(nil)
	g.waitOwner(b)
	recs := g.waitRecords("d1's no-data alarm", func(rs []Record) bool { return has(rs, "d1") })
	if late := time.Since(at1) - d; late > time.Second || late < -100*time.Millisecond {
		t.Errorf("d1's alarm came %v after its deadline, across a restart", late)
	}
	_ = recs

	g.report("d2", "b1", time.Now(), "temp", 1)
	g.report("d3", "c1", time.Now(), "temp", 1)
	testkit.Eventually(t, 10*time.Second, "d2's and d3's state stored", stored("d2", "d3"))
	stopB()
	// While no owner runs, queued in the session: another device's 5,000
	// reports, then d3's (a backlog long enough that a timer checked
	// before it is applied would fire).
	var last mqtt.Token
	for i := range 5000 {
		last = g.pub.Publish("/"+g.product+"/f1/properties/report", 1, false, fmt.Sprintf(`{"messageId":"f%d","properties":{"temp":%d}}`, i, i))
	}
	if err := mqttconn.WaitToken(last, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	g.report("d3", "c2", time.Now(), "temp", 2)
	time.Sleep(d + 500*time.Millisecond) // a restart longer than D (arranges the case; proves nothing)
	c, _ := g.runner(nil)
	g.waitOwner(c)
	start := time.Now()
	recs = g.waitRecords("d2's no-data alarm", func(rs []Record) bool { return has(rs, "d2") })
	if took := time.Since(start); took > time.Second+500*time.Millisecond {
		t.Errorf("d2, silent across the restart, fired %v after the owner started", took)
	}
	if has(recs, "d3") {
		t.Error("d3 reported while no owner ran and fired anyway: its restored timer beat its queued report")
	}
}

func first(r *Runner, _ func()) *Runner { return r }

// batchDevices is every device b holds: of its messages (by topic),
// transitions and rows.
func batchDevices(b *batch) map[string]bool {
	devs := map[string]bool{}
	for _, m := range b.msgs {
		if t, ok := wire.ParseTopic(m.Msg.Topic()); ok && t.DeviceID != wire.MarkerDevice { // not a backlog marker
			devs[t.DeviceID] = true
		}
	}
	for i := range b.trs {
		devs[b.trs[i].DeviceID] = true
	}
	for i := range b.devs {
		devs[b.devs[i].DeviceID] = true
	}
	return devs
}

// sharesDevice says whether a and b hold a device in common.
func sharesDevice(a, b *batch) bool {
	bd := batchDevices(b)
	for d := range batchDevices(a) {
		if bd[d] {
			return true
		}
	}
	return false
}

// TestRunnerPipelineFailure breaks the pipeline's ordering rule on
// purpose: the write of the batch holding the first report of round 2
// fails while the whole of round 3 has been evaluated on top of it in
// memory. No later batch of that turn for its writer or holding one of
// its devices may be written (nor, so, acknowledged): the owner ends its
// turn, reloads what is stored and is given again every message not
// acknowledged. (The other writers' batches being written at the failure
// hold other devices, evaluated on committed state only: they may
// commit.) Each device ends with one
// alarm counting each of its reports exactly once; a later runner (a new
// session's redeliveries) changes nothing. Without the rule (the loop
// going on after a failed write) round 3's batch commits over the lost
// one and round 2's reports, redelivered older than the device's latest,
// are skipped: counts fall short.
func TestRunnerPipelineFailure(t *testing.T) {
	g := newRig(t, mqtttest.SharedURL(), `{"trigger":{"type":"property","all":[{"property":"temp","op":"gt","value":30}]},"clear":{"type":"manual"}}`)
	const devices, rounds = 20, 6
	var (
		mu      sync.Mutex
		failed  uint64 // the failed batch's seq in its turn, 0 before
		failedB *batch
		after   []uint64
		done    = make(chan struct{})
		sawOnce bool
		failing bool // a batch of round 2 is the one that fails: another writer's may hold round 2 too
	)
	r, stop := g.runner(func(rr *Runner) {
		rr.beforeWrite = func(b *batch) error {
			mu.Lock()
			defer mu.Unlock()
			if failed != 0 {
				if b.seq > failed && !sawOnce && ((b.express == failedB.express && b.writer == failedB.writer) || sharesDevice(b, failedB)) { // the same turn: seqs restart at 1 in the next
					after = append(after, b.seq)
				}
				if b.seq <= failed {
					sawOnce = true
				}
				return nil
			}
			if failing {
				return nil
			}
			for _, m := range b.msgs {
				if bytes.Contains(m.Msg.Payload(), []byte(`"messageId":"m2"`)) {
					// Round 3 evaluated in memory behind this batch, then
					// its write fails.
					failing = true
					mu.Unlock()
					if !testkit.Within(20*time.Second, func() bool { return rr.evaluated.Load() >= devices*4 }) { // rounds 0 to 3
						t.Error("round 3 not evaluated behind the failing batch")
					}
					mu.Lock()
					failed, failedB = b.seq, b
					close(done)
					return errors.New("test: the batch's write fails")
				}
			}
			return nil
		}
	})
	g.waitOwner(r)
	base := time.Now().Add(-time.Hour)
	for round := range rounds {
		var toks []mqtt.Token
		for d := range devices {
			toks = append(toks, g.pub.Publish(fmt.Sprintf("/%s/dev%02d/properties/report", g.product, d), 1, false,
				fmt.Sprintf(`{"messageId":"m%d","timestamp":%d,"properties":{"temp":31}}`, round, base.Add(time.Duration(round)*time.Second).UnixMilli())))
		}
		for _, tok := range toks {
			if err := mqttconn.WaitToken(tok, 30*time.Second); err != nil {
				t.Fatal(err)
			}
		}
		if round == 3 {
			select {
			case <-done:
			case <-time.After(20 * time.Second):
				t.Fatal("no batch of round 2 failed")
			}
		}
	}
	exact := func(what string) {
		t.Helper()
		recs, ok := g.settledRecords(devices, rounds, 20*time.Second, nil)
		if !ok {
			for _, rec := range recs {
				if rec.Count != rounds {
					t.Errorf("%s: %s: count %d, want %d", what, rec.DeviceID, rec.Count, rounds)
				}
			}
			t.Fatalf("%s: %d alarms for %d devices", what, len(recs), devices)
		}
	}
	exact("after the failed write")
	mu.Lock()
	if len(after) > 0 {
		t.Errorf("batches %v of its lane or devices written in the turn after batch %d's write failed", after, failed)
	}
	mu.Unlock()
	// A new owner resumes the session: anything left unacknowledged comes
	// again, and is recognised.
	stop()
	g.waitOwner(first(g.runner(nil)))
	exact("after a second runner")
}

// TestRunnerHandClearPipelined: a hand clears an alarm while the
// evaluator works on the belief that it is active, in the three ways the
// pipeline allows; each time the evaluator must end up holding what
// PostgreSQL holds, seen here as the trigger's end clearing the alarm
// the store raised anew. Each case fails without its rule (the alarm
// then stays active forever):
//   - gone: the clear's write finds the alarm cleared by hand
//     (WriteResult.Gone) while the next batch, behind it, raised a new
//     one: the evaluator forgets only alarms no untaken transition is of;
//   - deferred: the poll comes while a repeat's batch is written (its
//     write raises the alarm anew): the clears by hand are read only
//     once the writer is idle, after the write's result;
//   - untaken: the poll reads the clear after a repeat was evaluated and
//     before its batch is handed: it is not forgotten, the repeat's write
//     raises the alarm anew and says so.
func TestRunnerHandClearPipelined(t *testing.T) {
	rule := `{"trigger":{"type":"property","all":[{"property":"temp","op":"gt","value":30}]}}`
	base := time.Now().Add(-time.Minute)
	// run: the alarm raised, then before(g, r) the case, ending with the
	// hand's clear; then the trigger's end must clear the newest alarm.
	run := func(t *testing.T, flush time.Duration, block string, before func(g *rig, r *Runner, clear func(), blocked <-chan struct{})) {
		g := newRig(t, mqtttest.SharedURL(), rule)
		blocked, release := make(chan struct{}), make(chan struct{})
		var once sync.Once
		r, _ := g.runner(func(r *Runner) {
			r.opt.FlushInterval = flush
			r.beforeWrite = func(b *batch) error {
				for _, m := range b.msgs {
					if block != "" && bytes.Contains(m.Msg.Payload(), []byte(`"messageId":"`+block+`"`)) {
						once.Do(func() { close(blocked); <-release })
					}
				}
				return nil
			}
		})
		g.waitOwner(r)
		g.report("d1", "up", base, "temp", 31)
		recs := g.waitRecords("the alarm", func(rs []Record) bool { return len(rs) == 1 })
		clear := func() {
			if _, err := g.store.ClearByHand(context.Background(), recs[0].ID, Actor{ID: "u1", Name: "ann"}, "reset"); err != nil {
				t.Fatal(err)
			}
		}
		before(g, r, clear, blocked)
		if block != "" {
			close(release)
		}
		g.waitRecords("a new alarm", func(rs []Record) bool { return len(rs) == 2 && rs[0].State == StateActive })
		g.report("d1", "end", base.Add(10*time.Second), "temp", 20)
		g.waitRecords("the new alarm cleared by the trigger's end", func(rs []Record) bool { return len(rs) == 2 && rs[0].State == StateCleared })
	}
	evaluated := func(t *testing.T, g *rig, r *Runner, id string, ts time.Duration, v float64) {
		at := r.evaluated.Load()
		g.report("d1", id, base.Add(ts), "temp", v)
		testkit.Eventually(t, 10*time.Second, id+" evaluated", func() bool { return r.evaluated.Load() > at })
	}
	t.Run("gone", func(t *testing.T) {
		run(t, 20*time.Millisecond, "low", func(g *rig, r *Runner, clear func(), blocked <-chan struct{}) {
			g.report("d1", "low", base.Add(time.Second), "temp", 20) // the clear, handed at once, written after the hand's
			<-blocked
			clear()
			evaluated(t, g, r, "up2", 2*time.Second, 31) // a new raise behind it
		})
	})
	t.Run("deferred", func(t *testing.T) {
		run(t, 20*time.Millisecond, "rep", func(g *rig, r *Runner, clear func(), blocked <-chan struct{}) {
			g.report("d1", "rep", base.Add(time.Second), "temp", 32) // a repeat, written after the hand's clear
			<-blocked
			clear()
			time.Sleep(300 * time.Millisecond) // a poll comes while the writer is busy (arranges the case; proves nothing)
		})
	})
	t.Run("untaken", func(t *testing.T) {
		run(t, 5*time.Second, "", func(g *rig, r *Runner, clear func(), _ <-chan struct{}) {
			evaluated(t, g, r, "rep", time.Second, 32) // a repeat, waiting for the next flush
			clear()
			time.Sleep(300 * time.Millisecond) // a poll comes before the flush (arranges the case; proves nothing)
		})
	})
}

// TestMessageKey: a message without a messageId is keyed "h" and the
// hex of FNV-1a 64 over topic, a 0 byte and payload (the keys stored in
// the devices' rows, compared after a restart); one with an id by it.
func TestMessageKey(t *testing.T) {
	for i := range 300 {
		topic := "/p1/d" + strconv.Itoa(i) + "/properties/report"
		payload := bytes.Repeat([]byte{byte(i), '{', 0xff, '"'}, i%17)
		h := fnv.New64a()
		h.Write([]byte(topic))
		h.Write([]byte{0})
		h.Write(payload)
		if key, unique := messageKey("", topic, payload); key != "h"+hex.EncodeToString(h.Sum(nil)) || unique {
			t.Fatalf("messageKey(%q, %q) = %q, %v; want h%x", topic, payload, key, unique, h.Sum(nil))
		}
	}
	if key, unique := messageKey("m1", "/p1/d1/properties/report", []byte(`{"messageId":"m1"}`)); key != "im1" || !unique {
		t.Errorf("with its id: %q, %v", key, unique)
	}
}

// TestRunnerExpress: while a batch is being written (held here), an alarm
// of a device it holds nothing of is written ahead of it, by the express
// lane; an alarm of a device it does hold waits for it. Breaking that
// rule on purpose (the express lane taking d1 while d1's earlier report
// is being written) commits d1's newer row first and then the held
// batch's older one over it: the stored state says no alarm is active,
// and after a restart the report that ends the trigger clears nothing
// (the alarm stays active forever). Without the express lane, d2's alarm
// waits for the held batch and the first check fails.
func TestRunnerExpress(t *testing.T) {
	g := newRig(t, mqtttest.SharedURL(), `{"trigger":{"type":"property","all":[{"property":"temp","op":"gt","value":30}]}}`)
	hold := newWriterHold(false)
	var expressOfD1, released atomic.Bool
	r, stop := g.runner(func(r *Runner) {
		r.beforeWrite = func(b *batch) error {
			for _, m := range b.msgs {
				if b.express && strings.Contains(m.Msg.Topic(), "/d1/") && !released.Load() {
					expressOfD1.Store(true)
				}
			}
			hold.check(b)
			return nil
		}
	})
	g.waitOwner(r)
	base := time.Now().Add(-time.Minute)
	g.report("d1", "hold", base, "temp", 20) // its batch is held in the writer
	hold.wait(t, "d1's first report")
	g.report("d2", "up", base.Add(time.Second), "temp", 31)
	g.waitRecords("d2's alarm written while the batch of d1's report is held", func(rs []Record) bool {
		return len(rs) == 1 && rs[0].DeviceID == "d2"
	})
	g.report("d1", "up", base.Add(2*time.Second), "temp", 31)
	// d1's raise is evaluated behind the held batch; give the express
	// lane time to take it (it must not).
	testkit.Eventually(t, 20*time.Second, "d1's raise evaluated", func() bool { return r.evaluated.Load() >= 3 })
	time.Sleep(300 * time.Millisecond)
	released.Store(true)
	hold.release()
	g.waitRecords("d1's alarm too", func(rs []Record) bool { return len(rs) == 2 })
	if expressOfD1.Load() {
		t.Error("the express lane took d1 while the batch being written held d1's earlier report")
	}
	// A restart: the next owner holds what is stored. The trigger's end
	// must clear d1's alarm.
	stop()
	g.waitOwner(first(g.runner(nil)))
	g.report("d1", "down", base.Add(3*time.Second), "temp", 20)
	g.waitRecords("d1's alarm cleared by its trigger's end after the restart", func(rs []Record) bool {
		for _, rec := range rs {
			if rec.DeviceID == "d1" {
				return rec.State == StateCleared
			}
		}
		return false
	})
}

// TestRunnerExpressKeepsAlarms: while every writer of the express lane
// writes an alarm's batch, another device's raise waits for one of them
// rather than go in the batch lane's batch with every device's rows
// (runner.go, hand). Without the rule d4's raise is written by the batch
// lane while the express writers are held.
func TestRunnerExpressKeepsAlarms(t *testing.T) {
	g := newRig(t, mqtttest.SharedURL(), `{"trigger":{"type":"property","all":[{"property":"temp","op":"gt","value":30}]}}`)
	hold := newWriterHold(true)
	var mu sync.Mutex
	var batchLane []string // alarm changes the batch lane wrote
	r, _ := g.runner(func(r *Runner) {
		r.beforeWrite = func(b *batch) error {
			for _, tr := range b.trs {
				if !b.express && tr.Kind != KindRepeated {
					mu.Lock()
					batchLane = append(batchLane, tr.Kind+" "+tr.DeviceID)
					mu.Unlock()
				}
			}
			hold.check(b)
			return nil
		}
	})
	g.waitOwner(r)
	base := time.Now().Add(-time.Minute)
	for i := range expressWriters { // one raise held in each express writer
		dev := fmt.Sprintf("h%d", i)
		g.report(dev, "hold-"+dev, base, "temp", 31)
		hold.wait(t, dev+"'s raise")
	}
	g.report("d4", "up", base.Add(time.Second), "temp", 31)
	g.report("d5", "calm", base.Add(time.Second), "temp", 20)
	// Both evaluated and the flush interval passed several times: the
	// batch lane has had its chances to take d4's raise.
	testkit.Eventually(t, 20*time.Second, "d4's and d5's reports evaluated", func() bool {
		return r.evaluated.Load() >= expressWriters+2
	})
	testkit.Eventually(t, 20*time.Second, "d5's report written by the batch lane", func() bool { return r.committed.Load() >= 1 })
	time.Sleep(300 * time.Millisecond)
	hold.release()
	g.waitRecords("every alarm", func(rs []Record) bool { return len(rs) == expressWriters+1 })
	mu.Lock()
	defer mu.Unlock()
	if len(batchLane) > 0 {
		t.Errorf("the batch lane wrote alarm changes while the express writers were busy: %q", batchLane)
	}
}

// holdD1Raise starts a runner (see, when not nil, is shown each batch
// before its write) and holds d1's raise, reported at base, in an
// express writer until the hold's release.
func (g *rig) holdD1Raise(see func(*batch)) (*Runner, *writerHold, time.Time) {
	g.t.Helper()
	hold := newWriterHold(true)
	r, _ := g.runner(func(r *Runner) {
		r.beforeWrite = func(b *batch) error {
			if see != nil {
				see(b)
			}
			hold.check(b)
			return nil
		}
	})
	g.waitOwner(r)
	base := time.Now().Add(-time.Minute)
	g.report("d1", "hold", base, "temp", 31)
	hold.wait(g.t, "d1's raise")
	return r, hold, base
}

// TestRunnerExpressWriters: while one express writer writes an alarm's
// batch (held here), another device's raise is written by another express
// writer: an alarm does not wait for another's write. With one express
// writer d2's raise waits for d1's and the check fails.
func TestRunnerExpressWriters(t *testing.T) {
	g := newRig(t, mqtttest.SharedURL(), `{"trigger":{"type":"property","all":[{"property":"temp","op":"gt","value":30}]}}`)
	_, hold, base := g.holdD1Raise(nil)
	g.report("d2", "up", base.Add(time.Second), "temp", 31)
	g.waitRecords("d2's alarm written while d1's is held", func(rs []Record) bool {
		return len(rs) == 1 && rs[0].DeviceID == "d2"
	})
	hold.release()
	g.waitRecords("both alarms", func(rs []Record) bool { return len(rs) == 2 })
}

// TestRunnerExpressOneDevice: while an express writer writes a device's
// raise (held here), the device's clear waits for it rather than go to
// another express writer. Breaking the rule on purpose (inExpress not
// checked) writes the clear first, which finds no active record, and
// then the raise: the alarm stays active with its trigger ended.
func TestRunnerExpressOneDevice(t *testing.T) {
	g := newRig(t, mqtttest.SharedURL(), `{"trigger":{"type":"property","all":[{"property":"temp","op":"gt","value":30}]}}`)
	var twice, released atomic.Bool
	r, hold, base := g.holdD1Raise(func(b *batch) {
		if b.express && !released.Load() {
			for _, m := range b.msgs {
				if bytes.Contains(m.Msg.Payload(), []byte(`"messageId":"down"`)) {
					twice.Store(true)
				}
			}
		}
	})
	g.report("d1", "down", base.Add(time.Second), "temp", 20)
	testkit.Eventually(t, 20*time.Second, "d1's clear evaluated", func() bool { return r.evaluated.Load() >= 2 })
	time.Sleep(300 * time.Millisecond)
	released.Store(true)
	hold.release()
	g.waitRecords("d1's alarm raised and cleared", func(rs []Record) bool {
		return len(rs) == 1 && rs[0].State == StateCleared
	})
	if twice.Load() {
		t.Error("a second express writer took d1 while the first wrote its raise")
	}
}

// TestRunnerPollBeside: the poll's reads that decide nothing the
// evaluator holds (here the active counts, held) run beside its loop:
// while one hangs, a report still raises its alarm. With the poll on the
// loop, the loop waits for the read, and the alarm with it.
func TestRunnerPollBeside(t *testing.T) {
	g := newRig(t, mqtttest.SharedURL(), `{"trigger":{"type":"property","all":[{"property":"temp","op":"gt","value":30}]}}`)
	held, rel := make(chan struct{}), make(chan struct{})
	var once sync.Once
	r, _ := g.runner(func(r *Runner) {
		r.store.beforeCounts = func() {
			once.Do(func() {
				close(held)
				select {
				case <-rel:
				case <-time.After(40 * time.Second):
				}
			})
		}
	})
	defer close(rel)
	g.waitOwner(r)
	select {
	case <-held:
	case <-time.After(20 * time.Second):
		t.Fatal("the active counts were never read")
	}
	g.report("d1", "up", time.Now().Add(-time.Minute), "temp", 31)
	g.waitRecords("d1's alarm raised while the counts' read hangs", func(rs []Record) bool { return len(rs) == 1 })
}

// writerHold holds each writer of one lane (express or not) handed a
// batch with a message whose messageId begins with "hold", until release
// (or 40 s, when the test failed and ends): a runner's beforeWrite calls
// check. Once released, such batches pass.
type writerHold struct {
	express bool
	held    chan struct{} // a token each batch held
	rel     chan struct{}
}

func newWriterHold(express bool) *writerHold {
	return &writerHold{express: express, held: make(chan struct{}, 64), rel: make(chan struct{})}
}

func (h *writerHold) check(b *batch) {
	if b.express != h.express {
		return
	}
	for _, m := range b.msgs {
		if bytes.Contains(m.Msg.Payload(), []byte(`"messageId":"hold`)) {
			select {
			case <-h.rel:
				return
			default:
			}
			h.held <- struct{}{}
			select {
			case <-h.rel:
			case <-time.After(40 * time.Second):
			}
			return
		}
	}
}

// wait returns once a writer holds what's message, or fails t.
func (h *writerHold) wait(t testing.TB, what string) {
	t.Helper()
	select {
	case <-h.held:
	case <-time.After(20 * time.Second):
		t.Fatal(what + " never reached the writer")
	}
}

func (h *writerHold) release() { close(h.rel) }

// TestUnacknowledgedBound: what the runner has read and not acknowledged
// stays under the 65,535 messages after which Mosquitto reuses a
// session's packet ids (package doc, "Acknowledged out of order, within
// a bound"): the lanes acknowledge out of order, which is safe only
// below it. A change of maxPending or of the writers must keep it so.
func TestUnacknowledgedBound(t *testing.T) {
	if n := (2 + expressWriters) * maxPending; n >= 65535 {
		t.Fatalf("up to %d messages read and not acknowledged: a PUBACK could take an older message with its packet id off the broker", n)
	}
}
