package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"devicehub/api"
	"devicehub/api/live"
	"devicehub/bench/testkit"
	"devicehub/ingest/alarm"
	"devicehub/ingest/mqttconn"
	"devicehub/ingest/mqtttest"
	"devicehub/meta"
	"devicehub/tsdb/tsdbtest"
)

// Alarms end to end: rules written over HTTP, devices publishing over
// MQTT on the shared broker, the evaluator (ingest/alarm's Runner) on its
// own database, the records, their transitions, the audit trail and
// /api/live read back over HTTP. Each test owns its database, its
// products (random ids, so its topics) and its evaluator's session.

// alarmE2E is a server with alarms wired as cmd/devicehub wires them,
// without the PostgreSQL relay between instances: the evaluator's
// committed transitions and the routes' acks and clears by hand go to
// the live hub (announceAlarms, as cmd/devicehub's alarmTransitions).
type alarmE2E struct {
	*env
	hub    *live.Hub
	suffix string
	pub    mqtt.Client
	mu     sync.Mutex
	ts     map[string]int64 // the latest timestamp sent per device
	n      int              // message ids
}

var quietLog = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

// announceAlarms hands transitions to the hub as cmd/devicehub's relay
// does (repeats are counts, not transitions).
func announceAlarms(hub *live.Hub, trs []alarm.Transition) {
	for _, t := range trs {
		if t.Kind == alarm.KindRepeated {
			continue
		}
		hub.AlarmChanged(live.AlarmEvent{DeviceID: t.DeviceID, ProductID: t.ProductID, RuleID: t.RuleID, RuleName: t.RuleName,
			Kind: t.Kind, Severity: t.Severity, Value: t.Value, Timestamp: t.At.UnixMilli()})
	}
}

// newAlarmE2E starts the server (with endpoint 14's dependencies when
// dashboard is set) and a gateway publisher; the evaluator starts with
// startEvaluator, once the test's rules exist.
func newAlarmE2E(t *testing.T, dashboard bool) *alarmE2E {
	t.Helper()
	a := &alarmE2E{suffix: liveSuffix(), ts: map[string]int64{}}
	opts := api.DefaultOptions()
	opts.AuditFlushInterval = 20 * time.Millisecond
	a.env = newEnvOpts(t, opts, func(store *meta.Store, deps *api.Deps) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		hub, err := live.New(ctx, live.Options{Logger: quietLog})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(hub.Close)
		a.hub = hub
		deps.Alarms = alarm.NewStore(store)
		deps.Live, deps.LiveDevices = hub, store
		deps.AlarmHandled = func(tr alarm.Transition) { announceAlarms(hub, []alarm.Transition{tr}) }
		if dashboard {
			deps.Dashboard, deps.Models = tsdbtest.NewDB(t, time.UTC), store
		}
	})
	gw := mqtttest.Gateway(t, brokerURL())
	o := mqtt.NewClientOptions().AddBroker(brokerURL()).SetClientID("test-gw-" + a.suffix).SetCleanSession(true).
		SetAutoReconnect(true).SetMaxReconnectInterval(250 * time.Millisecond).SetConnectRetry(true)
	gw(o)
	a.pub = mqtt.NewClient(o)
	if err := mqttconn.WaitToken(a.pub.Connect(), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.pub.Disconnect(0) })
	return a
}

// startEvaluator runs the evaluator until the test ends and waits until
// it owns the evaluation with the rules that exist now subscribed.
func (a *alarmE2E) startEvaluator() { a.t.Helper(); a.startEvaluatorPoll(200 * time.Millisecond) }

// startEvaluatorPoll is startEvaluator whose evaluator reads rule changes
// and clears by hand every poll.
func (a *alarmE2E) startEvaluatorPoll(poll time.Duration) {
	t := a.t
	t.Helper()
	u, p := mqtttest.Service()
	clientID := "test-alarms-" + a.suffix
	r, err := alarm.NewRunner(a.store, alarm.Options{BrokerURL: brokerURL(), Login: mqttconn.Login{Username: u, Password: p},
		ClientID: clientID, FlushInterval: 20 * time.Millisecond, TickInterval: 50 * time.Millisecond,
		PollInterval: poll, Retry: 100 * time.Millisecond, Logger: quietLog,
		OnTransitions: func(trs []alarm.Transition) { announceAlarms(a.hub, trs) }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
		// remove the evaluator's persistent session from the broker
		c := mqtt.NewClient(mqtttest.ServiceOptions(brokerURL(), clientID).SetCleanSession(true))
		if c.Connect().WaitTimeout(5*time.Second) && c.IsConnected() {
			c.Disconnect(0)
		}
	})
	testkit.Eventually(t, 20*time.Second, "the evaluator to own the evaluation", r.Ready)
}

// product creates a product of a random id with the alarm test model.
func (a *alarmE2E) product(name string) string {
	a.t.Helper()
	id := name + "-" + a.suffix
	a.createProduct(id, "Product "+id, map[string]any{"metadata": alarmModel})
	return id
}

// rule creates a rule of product from its fields; id, name, productId
// and enabled are added.
func (a *alarmE2E) rule(id, product string, fields map[string]any) string {
	a.t.Helper()
	r := map[string]any{"id": id, "name": "Rule " + id, "productId": product, "enabled": true}
	for k, v := range fields {
		r[k] = v
	}
	a.ok("POST", "/api/alarm/config", r, nil)
	return id
}

// publish sends payload to /{product}/{device}/{level}, QoS 1.
func (a *alarmE2E) publish(t *testing.T, product, device, level, payload string) {
	t.Helper()
	if err := mqttconn.WaitToken(a.pub.Publish("/"+product+"/"+device+"/"+level, 1, false, payload), 10*time.Second); err != nil {
		t.Fatal(err)
	}
}

// next is a message id and a timestamp after device's previous one.
func (a *alarmE2E) next(device string) (string, int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.n++
	ts := max(time.Now().UnixMilli(), a.ts[device]+1)
	a.ts[device] = ts
	return "m" + strconv.Itoa(a.n), ts
}

func (a *alarmE2E) report(t *testing.T, product, device string, temp float64) {
	t.Helper()
	id, ts := a.next(device)
	a.publish(t, product, device, "properties/report", fmt.Sprintf(`{"messageId":%q,"timestamp":%d,"properties":{"temp":%v}}`, id, ts, temp))
}

func (a *alarmE2E) fault(t *testing.T, product, device string, code int) {
	t.Helper()
	id, ts := a.next(device)
	a.publish(t, product, device, "event/fault", fmt.Sprintf(`{"messageId":%q,"timestamp":%d,"data":{"code":%d}}`, id, ts, code))
}

// recordsOf returns the records of rule (and of device, when rule is
// "rule/device"), newest first, as token sees them.
func (a *alarmE2E) recordsOf(t *testing.T, token, rule string) []recordOut {
	t.Helper()
	terms := []any{}
	rule, dev, _ := strings.Cut(rule, "/")
	terms = append(terms, map[string]any{"column": "ruleId", "value": rule})
	if dev != "" {
		terms = append(terms, map[string]any{"column": "deviceId", "value": dev})
	}
	r := a.do("POST", "/api/alarm/record/_query", map[string]any{"pageSize": 100, "terms": terms}, token)
	if r.HTTPStatus != 200 {
		t.Fatalf("records: %d %s", r.HTTPStatus, r.raw)
	}
	var page struct {
		Data []recordOut `json:"data"`
	}
	if err := json.Unmarshal(r.Result, &page); err != nil {
		t.Fatal(err)
	}
	return page.Data
}

// waitRecords waits (10 s) until rule's records (recordsOf) satisfy cond.
func (a *alarmE2E) waitRecords(t *testing.T, rule, what string, cond func([]recordOut) bool) []recordOut {
	t.Helper()
	var recs []recordOut
	if !testkit.Within(10*time.Second, func() bool { recs = a.recordsOf(t, a.token, rule); return cond(recs) }) {
		t.Fatalf("%s: timed out; records %+v", what, recs)
	}
	return recs
}

// record is GET /api/alarm/record/{id}: the record and its transitions.
func (a *alarmE2E) record(t *testing.T, id string) recordOut {
	t.Helper()
	r := a.do("GET", "/api/alarm/record/"+id, nil, a.token)
	if r.HTTPStatus != 200 {
		t.Fatalf("record %s: %d %s", id, r.HTTPStatus, r.raw)
	}
	var rec recordOut
	if err := json.Unmarshal(r.Result, &rec); err != nil {
		t.Fatal(err)
	}
	return rec
}

// handle is POST /api/alarm/record/{id}/_ack or _clear with a comment,
// as the admin.
func (a *alarmE2E) handle(t *testing.T, id, action, comment string) recordOut {
	t.Helper()
	r := a.do("POST", "/api/alarm/record/"+id+"/"+action, map[string]string{"comment": comment}, a.token)
	if r.HTTPStatus != 200 {
		t.Fatalf("%s %s: %d %s", action, id, r.HTTPStatus, r.raw)
	}
	var rec recordOut
	if err := json.Unmarshal(r.Result, &rec); err != nil {
		t.Fatal(err)
	}
	return rec
}

// transitionsText is a record's transitions, "kind severity value" each.
func transitionsText(rec recordOut) []string {
	var out []string
	for _, tr := range rec.Transitions {
		out = append(out, strings.TrimSpace(tr.Kind+" "+tr.Severity+" "+tr.Value+tr.Comment))
	}
	return out
}

// prefixes reports whether got and want have the same length and each
// got[i] begins with want[i].
func prefixes(got, want []string) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range got {
		if !strings.HasPrefix(got[i], want[i]) {
			return false
		}
	}
	return true
}

// nextAlarm is the next alarm event of s, "kind severity value", failing
// after 10 s; other events are skipped.
func nextAlarm(t *testing.T, s *sseStream) (string, live.AlarmEvent) {
	t.Helper()
	for {
		ev := s.next(10 * time.Second)
		if ev.Name != live.EventAlarm {
			continue
		}
		var ae live.AlarmEvent
		if err := json.Unmarshal([]byte(ev.Data), &ae); err != nil {
			t.Fatalf("alarm event %s: %v", ev.Data, err)
		}
		return strings.TrimSpace(ae.Kind + " " + ae.Severity + " " + ae.Value), ae
	}
}

// wantAlarms reads len(want) alarm events of s and requires each to
// begin with its want, about device and rule.
func wantAlarms(t *testing.T, s *sseStream, device, rule string, want ...string) {
	t.Helper()
	var got []string
	for range want {
		txt, ae := nextAlarm(t, s)
		if ae.DeviceID != device || ae.RuleID != rule || ae.Timestamp == 0 {
			t.Errorf("alarm event about %s/%s (%d), want %s/%s", ae.DeviceID, ae.RuleID, ae.Timestamp, device, rule)
		}
		got = append(got, txt)
	}
	if !prefixes(got, want) {
		t.Errorf("live alarm events\n got %q\nwant %q", got, want)
	}
}

// kindRun is one trigger kind's product, rule and device.
type kindRun struct {
	a                     *alarmE2E
	t                     *testing.T
	product, rule, device string
}

func (k *kindRun) report(v float64) { k.t.Helper(); k.a.report(k.t, k.product, k.device, v) }
func (k *kindRun) fault(code int)   { k.t.Helper(); k.a.fault(k.t, k.product, k.device, code) }
func (k *kindRun) online()          { k.t.Helper(); k.a.publish(k.t, k.product, k.device, "online", "") }
func (k *kindRun) offline()         { k.t.Helper(); k.a.publish(k.t, k.product, k.device, "offline", "") }

// alarmStep is a message that changes an active alarm's severity.
type alarmStep struct {
	do       func(k *kindRun)
	severity string
}

// alarmKindCase is one trigger kind's lifecycle.
type alarmKindCase struct {
	name string
	rule map[string]any // severity, trigger, clear, ladder
	// raise does what raises the alarm; after is how long after it the
	// alarm must come (offline and no-data: D, within a second).
	raise func(k *kindRun)
	after time.Duration
	steps []alarmStep // escalations and de-escalations, in order
	// clear does what clears it; clearAfter is how long after the last
	// step (or raise) the clear must come at the soonest.
	clear      func(k *kindRun)
	clearAfter time.Duration
	// want: the first record's transitions and live events, each the
	// beginning of "kind severity value".
	want []string
	// again raises a second alarm after the clear (nil: the clear's own
	// message starts the next one, as a report does for no data);
	// afterHand the third, after a hand cleared the second.
	again, afterHand func(k *kindRun)
	severity         string // the severity of the second alarm
}

// TestAlarmE2ETriggerKinds: for each trigger kind, through MQTT and
// HTTP: the alarm raised (offline and no data within a second of D, not
// before), escalated and de-escalated by its ladder (property and event
// triggers; the others have none, TestAlarmE2EBadRules), cleared by its
// rule; each transition in the record and on /api/live. Then a second
// alarm (a new record) acknowledged and cleared by hand over HTTP: the
// record, its transitions, the audit trail and /api/live say so; nothing
// raises it again by itself, and the next time the trigger is met is a
// third record.
func TestAlarmE2ETriggerKinds(t *testing.T) {
	t.Parallel()
	cond := func(prop, op string, v any) map[string]any {
		return map[string]any{"property": prop, "op": op, "value": v}
	}
	all := func(c ...any) []any { return c }
	cases := []alarmKindCase{{
		name: "property",
		rule: map[string]any{"severity": "major",
			"trigger": map[string]any{"type": "property", "all": all(cond("temp", "gt", 30))},
			"ladder":  []any{map[string]any{"severity": "critical", "all": all(cond("temp", "gt", 50))}}},
		raise: func(k *kindRun) { k.report(25); k.report(31) },
		steps: []alarmStep{{func(k *kindRun) { k.report(55) }, "critical"}, {func(k *kindRun) { k.report(35) }, "major"}},
		clear: func(k *kindRun) { k.report(20) },
		want:  []string{"raised major temp=31", "escalated critical temp=55", "deescalated major temp=35", "cleared major temp=20"},
		again: func(k *kindRun) { k.report(40) }, afterHand: func(k *kindRun) { k.report(41) }, severity: "major",
	}, {
		name: "event",
		rule: map[string]any{"severity": "minor",
			"trigger": map[string]any{"type": "event", "event": "fault", "all": all(cond("code", "ge", 100))},
			"ladder": []any{map[string]any{"severity": "major", "all": all(cond("code", "ge", 500))},
				map[string]any{"severity": "critical", "all": all(cond("code", "ge", 900))}},
			// long enough for the second alarm to stay active until the hand clears it
			"clear": map[string]any{"for": "3s"}},
		raise: func(k *kindRun) { k.fault(50); k.fault(404) }, // 50 is not such an event
		steps: []alarmStep{{func(k *kindRun) { k.fault(503) }, "major"}, {func(k *kindRun) { k.fault(950) }, "critical"},
			{func(k *kindRun) { k.fault(200) }, "minor"}},
		clear:      func(k *kindRun) { k.fault(60) }, // not such an event: the quiet second goes on
		clearAfter: 3 * time.Second,
		want: []string{"raised minor event fault code=404", "escalated major event fault code=503", "escalated critical event fault code=950",
			"deescalated minor event fault code=200", "cleared minor"},
		again: func(k *kindRun) { k.fault(700) }, afterHand: func(k *kindRun) { k.fault(100) }, severity: "major",
	}, {
		name:  "offline",
		rule:  map[string]any{"severity": "major", "trigger": map[string]any{"type": "offline", "for": "1s"}},
		raise: func(k *kindRun) { k.online(); k.offline() },
		after: time.Second,
		clear: func(k *kindRun) { k.online() },
		want:  []string{"raised major offline", "cleared major"},
		again: func(k *kindRun) { k.offline() }, afterHand: func(k *kindRun) { k.online(); k.offline() }, severity: "major",
	}, {
		name: "nodata",
		rule: map[string]any{"severity": "warning", "trigger": map[string]any{"type": "nodata", "for": "1s", "property": "temp"}},
		raise: func(k *kindRun) {
			k.report(1)
		},
		after: time.Second,
		clear: func(k *kindRun) { k.report(2) },
		want:  []string{"raised warning no data", "cleared warning"},
		again: nil, afterHand: func(k *kindRun) { k.report(3) }, severity: "warning",
	}}
	a := newAlarmE2E(t, false)
	runs := make([]*kindRun, len(cases))
	for i, c := range cases {
		k := &kindRun{a: a, product: a.product("p" + c.name), device: c.name + "-1"}
		k.rule = a.rule(c.name+"-rule", k.product, c.rule)
		a.createDevice(k.device, k.device, k.product, nil)
		runs[i] = k
	}
	a.startEvaluator()
	for i, c := range cases {
		k := runs[i]
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			k := &kindRun{a: a, t: t, product: k.product, rule: k.rule, device: k.device}
			stream := openLive(t, a.base, liveQuery(a.token, []string{k.device}), "")
			active := func(n int) func([]recordOut) bool {
				return func(rs []recordOut) bool { return len(rs) == n && rs[0].State == "active" }
			}

			// Raised, stepped up and down its ladder, cleared by its rule.
			// quiet is taken before the last message that resets the quiet
			// time of a rule's clear.for is sent: the clear comes no
			// sooner than clear.for after quiet.
			quiet := time.Now()
			c.raise(k)
			recs := a.waitRecords(t, k.rule, "the alarm", active(1))
			seen := time.Now()
			first := recs[0]
			// A timed raise's time is its deadline: D after the last
			// message arrived (so no sooner than D after it was sent), and
			// the alarm is there within a second of it. The second counts
			// from the server's deadline, not from the publish: the way
			// from the publish to ingest is ingest's latency, not the
			// timer's (bench alarms measures that one).
			if c.after > 0 {
				deadline := time.UnixMilli(first.RaisedTime)
				if early := quiet.Add(c.after - time.Millisecond).Sub(deadline); early > 0 {
					t.Errorf("raised at %v, %v before D %v after the message was sent", deadline, early, c.after)
				}
				if late := seen.Sub(deadline); late > time.Second {
					t.Errorf("raised %v after its deadline (D %v)", late, c.after)
				}
			}
			if first.DeviceID != k.device || first.ProductID != k.product || first.Severity != c.rule["severity"] {
				t.Errorf("record %+v", first)
			}
			for _, s := range c.steps {
				quiet = time.Now()
				s.do(k)
				a.waitRecords(t, k.rule, "severity "+s.severity, func(rs []recordOut) bool { return len(rs) == 1 && rs[0].Severity == s.severity })
			}
			c.clear(k)
			recs = a.waitRecords(t, k.rule, "the clear", func(rs []recordOut) bool { return len(rs) >= 1 && rs[len(rs)-1].State == "cleared" })
			seen = time.Now()
			// A clear held for clear.for is timed like the raise above:
			// its time is its deadline, clear.for after the last such
			// event arrived.
			if c.clearAfter > 0 {
				deadline := time.UnixMilli(recs[len(recs)-1].ClearedTime)
				if early := quiet.Add(c.clearAfter - time.Millisecond).Sub(deadline); early > 0 {
					t.Errorf("cleared at %v, %v before clear.for %v after the last such event was sent", deadline, early, c.clearAfter)
				}
				if late := seen.Sub(deadline); late > time.Second {
					t.Errorf("cleared %v after its deadline (clear.for %v)", late, c.clearAfter)
				}
			}
			rec := a.record(t, first.ID)
			if got := transitionsText(rec); !prefixes(got, c.want) {
				t.Errorf("transitions\n got %q\nwant %q", got, c.want)
			}
			if want := 1 + len(c.steps); rec.Count < want {
				t.Errorf("count %d, want at least %d", rec.Count, want)
			}
			wantAlarms(t, stream, k.device, k.rule, c.want...)

			// A second alarm: a new record, acknowledged and cleared by hand.
			if c.again != nil {
				c.again(k)
			}
			recs = a.waitRecords(t, k.rule, "a second alarm", active(2))
			second := recs[0]
			if second.ID == first.ID || second.Severity != c.severity || second.Acked {
				t.Errorf("second alarm %+v", second)
			}
			wantAlarms(t, stream, k.device, k.rule, "raised "+c.severity)
			got := a.handle(t, second.ID, "_ack", "on it")
			if !got.Acked || got.AckedBy != "admin" || got.AckComment != "on it" || got.AckedTime == 0 || got.State != "active" {
				t.Errorf("acknowledged %+v", got)
			}
			wantAlarms(t, stream, k.device, k.rule, "acknowledged "+c.severity+" on it")
			got = a.handle(t, second.ID, "_clear", "reset by hand")
			if got.State != "cleared" || got.ClearedBy != "admin" || got.ClearValue != "reset by hand" || got.ClearedTime == 0 || !got.Acked {
				t.Errorf("cleared by hand %+v", got)
			}
			wantAlarms(t, stream, k.device, k.rule, "cleared "+c.severity+" reset by hand")
			rec = a.record(t, second.ID)
			trs := transitionsText(rec)
			if !prefixes(trs, []string{"raised " + c.severity, "acknowledged " + c.severity + " on it", "cleared " + c.severity + " reset by hand"}) ||
				rec.Transitions[1].Username != "admin" || rec.Transitions[2].Username != "admin" {
				t.Errorf("the second alarm's transitions %q (%+v)", trs, rec.Transitions)
			}
			for _, action := range []string{"_ack", "_clear"} {
				a.waitAudit(fmt.Sprintf(`[{"column":"route","value":"/api/alarm/record/:id/%s"},{"column":"objectId","value":%q},{"column":"status","value":200}]`,
					action, second.ID), 1)
			}
			a.fails("POST", "/api/alarm/record/"+second.ID+"/_clear", nil, 400, "illegal_argument") // not active

			// Nothing raises it again by itself (the evaluator learns of
			// the clear within its poll; a timer that fired stays fired).
			stream.quiet(1500 * time.Millisecond)
			if recs := a.recordsOf(t, a.token, k.rule); len(recs) != 2 || recs[0].State != "cleared" {
				t.Fatalf("after the clear by hand: %+v", recs)
			}
			// The next time the trigger is met: a third record; the
			// hand-cleared one is not reused.
			c.afterHand(k)
			recs = a.waitRecords(t, k.rule, "a third alarm", active(3))
			if recs[1].ID != second.ID || recs[1].State != "cleared" || recs[1].Count != second.Count || recs[1].ClearedBy != "admin" {
				t.Errorf("the hand-cleared alarm changed: %+v", recs[1])
			}
			wantAlarms(t, stream, k.device, k.rule, "raised")
		})
	}
}

// TestAlarmE2EScope: a user whose role is limited to product A, her
// stream on /api/live open while alarms of A's and B's devices are
// raised, escalated, acknowledged and cleared through MQTT and HTTP,
// receives A's transitions and none of B's (which the admin's stream,
// following both, receives); she cannot follow B's device; B's alarms are
// absent from her records (_query, by id, _active), her endpoint 14
// alarm counts and her rule export.
func TestAlarmE2EScope(t *testing.T) {
	t.Parallel()
	a := newAlarmE2E(t, true)
	pa, pb := a.product("pa"), a.product("pb")
	hot := map[string]any{"severity": "major",
		"trigger": map[string]any{"type": "property", "all": []any{map[string]any{"property": "temp", "op": "gt", "value": 30}}},
		"ladder":  []any{map[string]any{"severity": "critical", "all": []any{map[string]any{"property": "temp", "op": "gt", "value": 50}}}}}
	ra, rb := a.rule("hot-a", pa, hot), a.rule("hot-b", pb, hot)
	da, db := "dev-a", "dev-b"
	a.createDevice(da, da, pa, nil)
	a.createDevice(db, db, pb, nil)
	a.ok("POST", "/api/role", map[string]any{"id": "only-a", "name": "Only A", "products": []string{pa},
		"permissions": []string{"product:read", "device:read", "alarm:read", "alarm:write", "dashboard:read"}}, nil)
	_, alice := a.addUser("alice", "only-a")
	a.startEvaluator()

	// She may not follow B's device, alone or beside her own.
	liveRefused(t, a.env, "B's device", liveQuery("", []string{db}), alice, 400, "illegal_argument", db)
	liveRefused(t, a.env, "A's and B's devices", liveQuery("", []string{da, db}), alice, 400, "illegal_argument", db)
	hers := openLive(t, a.base, liveQuery("", []string{da}), alice)
	admins := openLive(t, a.base, liveQuery("", []string{da, db}), a.token)

	// B's transitions come before A's last one, from the same publisher
	// (one session, in order): had any reached her stream, it would be
	// there before that last one.
	a.report(t, pb, db, 31)
	a.report(t, pa, da, 31)
	a.report(t, pb, db, 60)
	recB := a.waitRecords(t, rb, "B's alarm", func(rs []recordOut) bool { return len(rs) == 1 && rs[0].Severity == "critical" })[0]
	recA := a.waitRecords(t, ra, "A's alarm", func(rs []recordOut) bool { return len(rs) == 1 })[0]
	a.handle(t, recB.ID, "_ack", "b seen")
	a.handle(t, recB.ID, "_clear", "b done")
	a.handle(t, recA.ID, "_ack", "a seen")
	a.report(t, pa, da, 55)
	wantAlarms(t, hers, da, ra, "raised major temp=31", "acknowledged major a seen", "escalated critical temp=55")
	hers.quiet(300 * time.Millisecond)
	// The admin's stream, following both, had B's.
	var bs int
	for range 7 {
		_, ev := nextAlarm(t, admins)
		if ev.DeviceID == db {
			bs++
		}
	}
	if bs != 4 {
		t.Errorf("the admin's stream: %d of B's events, want 4 (raised, escalated, acknowledged, cleared)", bs)
	}

	// Records: hers only, whatever she asks.
	recsOf := func(body string) []string {
		t.Helper()
		r := a.do("POST", "/api/alarm/record/_query", json.RawMessage(body), alice)
		if r.HTTPStatus != 200 {
			t.Fatalf("her records %s: %d %s", body, r.HTTPStatus, r.raw)
		}
		var page struct {
			Total int         `json:"total"`
			Data  []recordOut `json:"data"`
		}
		_ = json.Unmarshal(r.Result, &page)
		var out []string
		for _, rec := range page.Data {
			out = append(out, rec.ProductID+"/"+rec.DeviceID)
		}
		if page.Total != len(out) {
			t.Errorf("%s: total %d, %d records", body, page.Total, len(out))
		}
		return out
	}
	for _, body := range []string{`{}`, `{"terms":[{"column":"productId","value":"` + pb + `"}]}`,
		`{"terms":[{"column":"deviceId","value":"` + db + `"}]}`, `{"terms":[{"column":"ruleId","value":"` + rb + `"}]}`,
		`{"terms":[{"column":"severity","value":"critical"}]}`, `{"terms":[{"column":"acknowledged","value":true}]}`} {
		for _, got := range recsOf(body) {
			if got != pa+"/"+da {
				t.Errorf("%s: she sees %s", body, got)
			}
		}
	}
	if got := recsOf(`{}`); len(got) != 1 {
		t.Errorf("her records: %v", got)
	}
	for _, c := range [][2]string{{"GET", "/api/alarm/record/" + recB.ID}, {"POST", "/api/alarm/record/" + recB.ID + "/_ack"},
		{"POST", "/api/alarm/record/" + recB.ID + "/_clear"}, {"GET", "/api/alarm/config/" + rb}, {"GET", "/api/alarm/config/_export/" + pb}} {
		if r := a.do(c[0], c[1], nil, alice); r.HTTPStatus != 404 || r.Code != "not_found" {
			t.Errorf("her %s %s: %d %s, want 404", c[0], c[1], r.HTTPStatus, r.Code)
		}
	}
	var counts map[string]int
	_ = json.Unmarshal(a.do("GET", "/api/alarm/record/_active", nil, alice).Result, &counts)
	if counts["critical"] != 1 || counts["major"] != 0 {
		t.Errorf("her active counts %v, want A's one critical", counts)
	}
	// Her rule export: A's rule only.
	var doc struct {
		Rules []struct {
			ID        string `json:"id"`
			ProductID string `json:"productId"`
		} `json:"rules"`
	}
	_ = json.Unmarshal(a.do("GET", "/api/alarm/config/_export/"+pa, nil, alice).Result, &doc)
	if len(doc.Rules) != 1 || doc.Rules[0].ID != ra {
		t.Errorf("her export of %s: %+v", pa, doc)
	}

	// Endpoint 14: alarms raised per hour, hers only.
	count := func(token string, params map[string]any) (int, int) {
		t.Helper()
		p := map[string]any{"time": "1h", "format": "HH", "from": time.Now().Add(-2 * time.Hour).UnixMilli(), "to": time.Now().Add(time.Minute).UnixMilli()}
		for k, v := range params {
			p[k] = v
		}
		r := a.do("POST", "/api/dashboard/_multi", []map[string]any{{"dashboard": "device", "object": "alarm", "measurement": "quantity",
			"dimension": "agg", "group": "alarms", "params": p}}, token)
		var items []struct {
			Data struct {
				Value int `json:"value"`
			} `json:"data"`
		}
		_ = json.Unmarshal(r.Result, &items)
		n := 0
		for _, it := range items {
			n += it.Data.Value
		}
		return r.HTTPStatus, n
	}
	if st, n := count(a.token, nil); st != 200 || n != 2 {
		t.Errorf("the admin's alarm count: %d %d, want 2", st, n)
	}
	if st, n := count(alice, nil); st != 200 || n != 1 {
		t.Errorf("her alarm count: %d %d, want 1", st, n)
	}
	for _, p := range []map[string]any{{"productId": pb}, {"deviceId": db}} {
		if st, n := count(alice, p); st != 404 || n != 0 {
			t.Errorf("her alarm count of %v: %d %d, want 404", p, st, n)
		}
	}
	// Alarm counts are not exported, for anyone.
	if r := a.do("POST", "/api/dashboard/_export", map[string]any{"dashboard": "device", "object": "alarm", "measurement": "quantity",
		"dimension": "agg", "params": map[string]any{"productId": pb}}, alice); r.HTTPStatus == 200 {
		t.Errorf("her export of B's alarm counts: %d", r.HTTPStatus)
	}
}

// TestAlarmE2EHysteresisRepeat through MQTT and HTTP: with hysteresis
// (raise above 30, clear below 28) values between the two neither clear
// the alarm nor raise another; N within W (3 within 1.5 s) raises at the
// third report within the window, not at reports spread wider. A probe
// rule on each product (temp at least 1000, raised at once) is the
// sentinel: its alarm is written once every alarm change evaluated
// before it is, of a device no batch being written holds (the express
// lane, ingest/alarm doc.go "Two lanes"); a repeat's count may be
// written after it, so a count is waited for, and a device's changes are
// written in its order: a wrong clear at 28 is written before the repeat
// at 31 (which would then raise a second alarm instead).
func TestAlarmE2EHysteresisRepeat(t *testing.T) {
	t.Parallel()
	a := newAlarmE2E(t, false)
	gt30 := []any{map[string]any{"property": "temp", "op": "gt", "value": 30}}
	ph, pr := a.product("hyst"), a.product("rep")
	hyst := a.rule("hyst", ph, map[string]any{"severity": "minor", "trigger": map[string]any{"type": "property", "all": gt30},
		"clear": map[string]any{"type": "condition", "all": []any{map[string]any{"property": "temp", "op": "lt", "value": 28}}}})
	rep := a.rule("rep", pr, map[string]any{"severity": "major", "trigger": map[string]any{"type": "property", "all": gt30},
		"repeat": map[string]any{"count": 3, "within": "1500ms"}, "clear": map[string]any{"type": "manual"}})
	probe := map[string]any{"severity": "info", "trigger": map[string]any{"type": "property",
		"all": []any{map[string]any{"property": "temp", "op": "ge", "value": 1000}}}, "clear": map[string]any{"type": "manual"}}
	a.rule("probe-h", ph, probe)
	a.rule("probe-r", pr, probe)
	a.startEvaluator()
	hyst, rep = hyst+"/h1", rep+"/r1" // the probes meet these rules too: h1's and r1's records
	probes := 0
	// settled waits until a probe alarm raised after every report sent so
	// far is written.
	settled := func(product, rule string) {
		t.Helper()
		probes++
		dev := "probe-" + strconv.Itoa(probes)
		a.report(t, product, dev, 1000)
		a.waitRecords(t, rule, "the probe "+dev, func(rs []recordOut) bool { return len(rs) > 0 && rs[0].DeviceID == dev })
	}
	t.Run("hysteresis", func(t *testing.T) {
		t.Parallel()
		a.report(t, ph, "h1", 31)
		a.waitRecords(t, hyst, "the raise", func(rs []recordOut) bool { return len(rs) == 1 })
		for _, v := range []float64{29, 28, 30, 31, 29.5} { // between: no clear; 31 a repeat
			a.report(t, ph, "h1", v)
		}
		settled(ph, "probe-h")
		recs := a.waitRecords(t, hyst, "the repeat at 31 counted", func(rs []recordOut) bool { return len(rs) != 1 || rs[0].Count >= 2 })
		if len(recs) != 1 || recs[0].State != "active" || recs[0].Count != 2 {
			t.Fatalf("between the thresholds: %+v", recs)
		}
		a.report(t, ph, "h1", 27.9)
		recs = a.waitRecords(t, hyst, "the clear below 28", func(rs []recordOut) bool { return rs[0].State == "cleared" })
		if got := transitionsText(a.record(t, recs[0].ID)); fmt.Sprint(got) != "[raised minor temp=31 cleared minor temp=27.9]" {
			t.Errorf("transitions %q", got)
		}
		a.report(t, ph, "h1", 29) // below the raise: nothing
		settled(ph, "probe-h")
		if recs := a.recordsOf(t, a.token, hyst); len(recs) != 1 {
			t.Fatalf("29 after the clear raised: %+v", recs)
		}
		a.report(t, ph, "h1", 30.5)
		a.waitRecords(t, hyst, "a new alarm above 30", func(rs []recordOut) bool { return len(rs) == 2 && rs[0].State == "active" })
	})
	t.Run("repeat", func(t *testing.T) {
		t.Parallel()
		none := func(what string) {
			t.Helper()
			settled(pr, "probe-r")
			if recs := a.recordsOf(t, a.token, rep); len(recs) != 0 {
				t.Fatalf("%s raised: %+v", what, recs)
			}
		}
		a.report(t, pr, "r1", 31)
		a.report(t, pr, "r1", 20) // not met: not counted, and does not reset the window
		a.report(t, pr, "r1", 32)
		none("two within the window")
		time.Sleep(1600 * time.Millisecond) // the window passes (arranges the case)
		a.report(t, pr, "r1", 33)
		none("a third report, the first two out of the window")
		a.report(t, pr, "r1", 34)
		a.report(t, pr, "r1", 35)
		recs := a.waitRecords(t, rep, "three within the window", func(rs []recordOut) bool { return len(rs) == 1 })
		if recs[0].State != "active" || recs[0].Severity != "major" {
			t.Errorf("record %+v", recs[0])
		}
		if got := transitionsText(a.record(t, recs[0].ID)); fmt.Sprint(got) != "[raised major temp=35]" {
			t.Errorf("transitions %q", got)
		}
	})
}

// TestAlarmE2EBadRules: a rule the model refuses is 400 illegal_argument
// whose message begins with the field at fault, on create and on
// replace; nothing is stored. (TestAlarmRulesAPI has the first ones.)
func TestAlarmE2EBadRules(t *testing.T) {
	t.Parallel()
	a := newAlarmE2E(t, false)
	p := a.product("bad")
	leaf := func(prop, op string, v any) map[string]any {
		return map[string]any{"property": prop, "op": op, "value": v}
	}
	prop := map[string]any{"type": "property", "all": []any{leaf("temp", "gt", 30)}}
	event := map[string]any{"type": "event", "event": "fault", "all": []any{leaf("code", "ge", 500)}}
	offline := map[string]any{"type": "offline", "for": "1s"}
	nodata := map[string]any{"type": "nodata", "for": "1s"}
	step := func(sev string, l ...any) map[string]any { return map[string]any{"severity": sev, "all": l} }
	for _, c := range []struct {
		field string
		rule  map[string]any // over a valid property rule
	}{
		{"id", map[string]any{"id": "has space"}},
		{"name", map[string]any{"name": " "}},
		{"enabled", map[string]any{"enabled": "yes"}},
		{"severity", map[string]any{"severity": 3}},
		{"trigger.type", map[string]any{"trigger": map[string]any{"type": "sometimes"}}},
		{"trigger.type", map[string]any{"trigger": map[string]any{"all": []any{leaf("temp", "gt", 1)}}}},
		{"trigger.any", map[string]any{"trigger": map[string]any{"type": "property", "all": []any{leaf("temp", "gt", 1)}, "any": []any{leaf("temp", "lt", 0)}}}},
		{"trigger.all[0].all[0]", map[string]any{"trigger": map[string]any{"type": "property",
			"all": []any{map[string]any{"all": []any{map[string]any{"any": []any{leaf("temp", "gt", 1)}}}}}}}},
		{"trigger.all[0].value", map[string]any{"trigger": map[string]any{"type": "property", "all": []any{leaf("temp", "between", []int{5, 1})}}}},
		{"trigger.all[0].ref", map[string]any{"trigger": map[string]any{"type": "property", "all": []any{map[string]any{"property": "temp", "op": "gt", "ref": "shadow.x"}}}}},
		{"trigger.all[0].of", map[string]any{"trigger": map[string]any{"type": "property", "all": []any{map[string]any{"property": "label", "op": "gt", "of": "rate", "value": 1}}}}},
		{"trigger.event", map[string]any{"trigger": map[string]any{"type": "property", "event": "fault", "all": []any{leaf("temp", "gt", 1)}}}},
		// event triggers
		{"trigger.all[0].property", map[string]any{"trigger": map[string]any{"type": "event", "event": "fault", "all": []any{leaf("temp", "gt", 1)}}, "clear": map[string]any{"for": "1s"}}},
		{"trigger.all[0].of", map[string]any{"trigger": map[string]any{"type": "event", "event": "fault", "all": []any{map[string]any{"property": "code", "op": "gt", "of": "change", "value": 1}}}, "clear": map[string]any{"for": "1s"}}},
		{"trigger.all[0].op", map[string]any{"trigger": map[string]any{"type": "event", "event": "fault", "all": []any{map[string]any{"property": "code", "op": "changed"}}}, "clear": map[string]any{"for": "1s"}}},
		{"clear.for", map[string]any{"trigger": event}},
		{"duration", map[string]any{"trigger": event, "clear": map[string]any{"for": "1s"}, "duration": "5s"}},
		{"clear.type", map[string]any{"trigger": event, "clear": map[string]any{"type": "condition", "all": []any{leaf("code", "lt", 1)}}}},
		// presence and no data
		{"trigger.for", map[string]any{"trigger": map[string]any{"type": "nodata"}}},
		{"trigger.for", map[string]any{"trigger": map[string]any{"type": "offline", "for": "soon"}}},
		{"trigger.all", map[string]any{"trigger": map[string]any{"type": "offline", "for": "1s", "all": []any{leaf("temp", "gt", 1)}}}},
		{"trigger.property", map[string]any{"trigger": map[string]any{"type": "offline", "for": "1s", "property": "temp"}}},
		{"trigger.property", map[string]any{"trigger": map[string]any{"type": "nodata", "for": "1s", "property": "pressure"}}},
		{"duration", map[string]any{"trigger": nodata, "duration": "1s"}},
		{"duration", map[string]any{"trigger": offline, "repeat": map[string]any{"count": 2, "within": "1m"}}},
		{"ladder", map[string]any{"trigger": offline, "ladder": []any{step("critical", leaf("temp", "gt", 1))}}},
		{"ladder", map[string]any{"trigger": nodata, "ladder": []any{step("critical", leaf("temp", "gt", 1))}}},
		// the ladder
		{"ladder", map[string]any{"trigger": prop, "ladder": []any{step("minor", leaf("temp", "gt", 31)), step("major", leaf("temp", "gt", 32)),
			step("critical", leaf("temp", "gt", 33)), step("critical", leaf("temp", "gt", 34)), step("critical", leaf("temp", "gt", 35))}}},
		{"ladder[0].severity", map[string]any{"severity": "major", "trigger": prop, "ladder": []any{step("major", leaf("temp", "gt", 50))}}},
		{"ladder[1].severity", map[string]any{"severity": "minor", "trigger": prop, "ladder": []any{step("critical", leaf("temp", "gt", 50)), step("major", leaf("temp", "gt", 60))}}},
		{"ladder[0].severity", map[string]any{"trigger": prop, "ladder": []any{step("urgent", leaf("temp", "gt", 50))}}},
		{"ladder[0].all", map[string]any{"trigger": prop, "ladder": []any{step("critical")}}},
		{"ladder[0].all[0].property", map[string]any{"trigger": prop, "ladder": []any{step("critical", leaf("pressure", "gt", 50))}}},
		{"ladder[0].all[0].property", map[string]any{"trigger": event, "clear": map[string]any{"for": "1s"}, "ladder": []any{step("critical", leaf("temp", "gt", 50))}}},
		{"ladder[0].all[0].ref", map[string]any{"trigger": event, "clear": map[string]any{"for": "1s"},
			"ladder": []any{step("critical", map[string]any{"property": "code", "op": "gt", "ref": "property.temp"})}}},
		// N within W
		{"repeat.count", map[string]any{"trigger": prop, "repeat": map[string]any{"count": 0, "within": "1m"}}},
		{"repeat.count", map[string]any{"trigger": prop, "repeat": map[string]any{"count": 1001, "within": "1m"}}},
		{"repeat.within", map[string]any{"trigger": prop, "repeat": map[string]any{"count": 3}}},
		{"repeat.within", map[string]any{"trigger": prop, "repeat": map[string]any{"count": 3, "within": "a while"}}},
		{"repeat", map[string]any{"trigger": prop, "repeat": map[string]any{"count": 3, "within": "1m"}, "duration": "10s"}},
		// clears
		{"clear.type", map[string]any{"clear": map[string]any{"type": "sometimes"}}},
		{"clear.type", map[string]any{"clear": map[string]any{"type": "manual", "for": "1s"}}},
		{"clear.all", map[string]any{"clear": map[string]any{"all": []any{leaf("temp", "lt", 28)}}}},
		{"clear.all[0].value", map[string]any{"clear": map[string]any{"type": "condition", "all": []any{leaf("mode", "eq", "turbo")}}}},
		{"clear.for", map[string]any{"clear": map[string]any{"for": -5}}},
	} {
		r := map[string]any{"id": "bad", "name": "Bad", "productId": p, "severity": "major", "enabled": true, "trigger": prop}
		for k, v := range c.rule {
			r[k] = v
		}
		body, _ := json.Marshal(r)
		for _, call := range [][2]string{{"POST", "/api/alarm/config"}, {"PUT", "/api/alarm/config/good"}} {
			if call[0] == "PUT" {
				if _, has := c.rule["id"]; has {
					continue // PUT names the rule by its path
				}
				r["id"] = "good"
				body, _ = json.Marshal(r)
				a.ok("POST", "/api/alarm/config", map[string]any{"id": "good", "name": "Good", "productId": p, "severity": "minor", "enabled": true, "trigger": prop}, nil)
			}
			res := a.call(call[0], call[1], json.RawMessage(body))
			if res.HTTPStatus != 400 || res.Code != "illegal_argument" || !strings.HasPrefix(res.Message, c.field+": ") {
				t.Errorf("%s %s %s: %d %s %q, want 400 naming %s", call[0], call[1], body, res.HTTPStatus, res.Code, res.Message, c.field)
			}
			if call[0] == "PUT" {
				var got map[string]any
				a.ok("GET", "/api/alarm/config/good", nil, &got)
				if got["severity"] != "minor" {
					t.Errorf("a refused replace changed the rule: %v", got)
				}
				a.ok("DELETE", "/api/alarm/config/good", nil, nil)
			}
		}
	}
	var page struct {
		Total int `json:"total"`
	}
	a.ok("POST", "/api/alarm/config/_query", `{}`, &page)
	if page.Total != 0 {
		t.Errorf("%d rules stored", page.Total)
	}
}

// TestAlarmE2EHandClearRace: a report that meets the trigger after a hand
// cleared the alarm, before the evaluator's poll saw the clear (here a
// poll of a minute), is a new alarm (the store raises it, Store.Write's
// Reraised): /api/live says "raised", as for any new alarm; a clear the
// evaluator decides for an alarm a hand cleared already is dropped by the
// store (Gone) and not announced again.
//
// Fails when the runner hands OnTransitions the transitions its
// evaluator decided instead of those the store wrote (WriteResult.Written):
// the new alarm's raise then goes out as a repeat (not announced) and the
// dropped clear is announced.
func TestAlarmE2EHandClearRace(t *testing.T) {
	t.Parallel()
	a := newAlarmE2E(t, false)
	p := a.product("race")
	rule := a.rule("hot", p, map[string]any{"severity": "major",
		"trigger": map[string]any{"type": "property", "all": []any{map[string]any{"property": "temp", "op": "gt", "value": 30}}}})
	a.createDevice("d1", "d1", p, nil)
	a.startEvaluatorPoll(time.Minute)
	stream := openLive(t, a.base, liveQuery(a.token, []string{"d1"}), "")
	a.report(t, p, "d1", 31)
	first := a.waitRecords(t, rule, "the alarm", func(rs []recordOut) bool { return len(rs) == 1 })[0]
	wantAlarms(t, stream, "d1", rule, "raised major temp=31")
	a.handle(t, first.ID, "_clear", "by hand")
	wantAlarms(t, stream, "d1", rule, "cleared major by hand")
	a.report(t, p, "d1", 32) // the evaluator still holds the alarm active: a repeat, which the store makes a new alarm
	second := a.waitRecords(t, rule, "a new alarm", func(rs []recordOut) bool { return len(rs) == 2 && rs[0].State == "active" })[0]
	if got := transitionsText(a.record(t, second.ID)); fmt.Sprint(got) != "[raised major temp=32]" {
		t.Errorf("the new alarm's transitions %q", got)
	}
	wantAlarms(t, stream, "d1", rule, "raised major temp=32")
	a.handle(t, second.ID, "_clear", "again")
	wantAlarms(t, stream, "d1", rule, "cleared major again")
	a.report(t, p, "d1", 20) // the evaluator clears what a hand cleared: dropped
	a.report(t, p, "d1", 33) // the trigger met again: a third alarm
	a.waitRecords(t, rule, "a third alarm", func(rs []recordOut) bool { return len(rs) == 3 && rs[0].State == "active" })
	wantAlarms(t, stream, "d1", rule, "raised major temp=33")
}
