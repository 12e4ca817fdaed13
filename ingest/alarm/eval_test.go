package alarm

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"devicehub/schema"
)

var t0 = time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC)

// harness drives one evaluator for device d1 of product p1.
type harness struct {
	t   *testing.T
	e   *Evaluator
	seq int
	got []string // "kind severity value" of every transition
	trs []Transition
}

func newHarness(t *testing.T, rules ...string) *harness {
	t.Helper()
	h := &harness{t: t, e: New(func(dev, kind, id string) (Value, bool) {
		if kind == "tag" && id == "maxTemp" {
			return NumberValue(50), true
		}
		return Value{}, false
	})}
	h.setRules(rules...)
	return h
}

func (h *harness) setRules(rules ...string) {
	h.t.Helper()
	m := model(h.t)
	var rs []Rule
	for i, body := range rules {
		r, err := ParseRule([]byte(body))
		if err != nil {
			h.t.Fatal(err)
		}
		if r.ID == "" {
			r.ID = fmt.Sprintf("r%d", i+1)
		}
		r.Name, r.ProductID, r.Enabled = "rule "+r.ID, "p1", true
		if r.Severity == "" {
			r.Severity = SeverityMajor
		}
		if err := r.Validate(m); err != nil {
			h.t.Fatalf("%s: %v", body, err)
		}
		rs = append(rs, r)
	}
	h.e.SetRules(rs, map[string]*schema.ThingModel{"p1": m})
}

func (h *harness) collect() {
	for _, tr := range h.e.Transitions() {
		h.trs = append(h.trs, tr)
		h.got = append(h.got, strings.TrimSpace(tr.Kind+" "+tr.Severity+" "+tr.Value))
	}
}

// report sends properties "temp=31" at t0+sec.
func (h *harness) report(sec float64, kv ...any) bool {
	var ps []Prop
	for i := 0; i+1 < len(kv); i += 2 {
		var v Value
		switch x := kv[i+1].(type) {
		case float64:
			v = NumberValue(x)
		case int:
			v = NumberValue(float64(x))
		case string:
			v = StringValue(x)
		case bool:
			v = BoolValue(x)
		}
		ps = append(ps, Prop{ID: kv[i].(string), Value: v})
	}
	h.seq++
	ok := h.e.Apply(Message{Kind: MsgReport, ProductID: "p1", DeviceID: "d1", At: at(sec), Key: fmt.Sprint("m", h.seq), KeyUnique: true, Props: ps})
	h.collect()
	return ok
}

func (h *harness) event(sec float64, id string, fields map[string]Value) {
	h.seq++
	h.e.Apply(Message{Kind: MsgEvent, ProductID: "p1", DeviceID: "d1", At: at(sec), Key: fmt.Sprint("m", h.seq), KeyUnique: true, Event: id, Fields: fields})
	h.collect()
}

func (h *harness) presence(sec float64, online bool) {
	k := MsgOffline
	if online {
		k = MsgOnline
	}
	h.e.Apply(Message{Kind: k, ProductID: "p1", DeviceID: "d1", At: at(sec)})
	h.collect()
}

func (h *harness) tick(sec float64) int {
	n := h.e.Tick(at(sec))
	h.collect()
	return n
}

func at(sec float64) time.Time { return t0.Add(time.Duration(sec * float64(time.Second))) }

func (h *harness) want(want ...string) {
	h.t.Helper()
	if want == nil {
		want = []string{}
	}
	got := h.got
	if got == nil {
		got = []string{}
	}
	if !reflect.DeepEqual(got, want) {
		h.t.Errorf("transitions:\n got %q\nwant %q", got, want)
	}
	h.got = nil
}

func ts(sec float64) string { return at(sec).UTC().Format(time.RFC3339Nano) }

func TestEvalProperty(t *testing.T) {
	h := newHarness(t, `{"trigger":{"type":"property","all":[{"property":"temp","op":"gt","value":30}]}}`)
	h.report(1, "temp", 25)
	h.report(2, "label", "x") // not a property the rule reads: not evaluated
	h.want()
	h.report(3, "temp", 31)
	h.want("raised major temp=31")
	h.report(4, "temp", 32)
	h.want("repeated major temp=32")
	h.report(5, "temp", 30)
	h.want("cleared major temp=30")
	h.report(6, "temp", 31)
	h.want("raised major temp=31") // a new alarm after a clear
}

func TestEvalOperators(t *testing.T) {
	f := func(cond string, kv []any, want bool) {
		t.Helper()
		h := newHarness(t, `{"trigger":{"type":"property",`+cond+`}}`)
		h.report(0, "temp", 20, "limit", 35, "mode", "auto", "on", false, "label", "a")
		h.got = nil
		h.report(10, kv...)
		if got := len(h.got) == 1 && strings.HasPrefix(h.got[0], "raised"); got != want {
			t.Errorf("%s on %v: raised %v, want %v (%q)", cond, kv, got, want, h.got)
		}
	}
	f(`"all":[{"property":"temp","op":"ge","value":30}]`, []any{"temp", 30}, true)
	f(`"all":[{"property":"temp","op":"gt","value":30}]`, []any{"temp", 30}, false)
	f(`"all":[{"property":"temp","op":"lt","value":10}]`, []any{"temp", 9.5}, true)
	f(`"all":[{"property":"temp","op":"le","value":10}]`, []any{"temp", 10.5}, false)
	f(`"all":[{"property":"temp","op":"eq","value":7}]`, []any{"temp", 7}, true)
	f(`"all":[{"property":"temp","op":"ne","value":20}]`, []any{"temp", 20}, false)
	f(`"all":[{"property":"temp","op":"between","value":[10,19]}]`, []any{"temp", 15}, true)
	f(`"all":[{"property":"temp","op":"between","value":[10,20]}]`, []any{"temp", 21}, false)
	f(`"all":[{"property":"mode","op":"eq","value":"manual"}]`, []any{"mode", "manual"}, true)
	f(`"all":[{"property":"mode","op":"ne","value":"auto"}]`, []any{"mode", "auto"}, false)
	f(`"all":[{"property":"on","op":"eq","value":true}]`, []any{"on", true}, true)
	f(`"all":[{"property":"on","op":"eq","value":"1"}]`, []any{"on", true}, true)
	f(`"all":[{"property":"label","op":"changed"}]`, []any{"label", "b"}, true)
	f(`"all":[{"property":"label","op":"changed"}]`, []any{"label", "a"}, false)
	// change and rate against the previous value (20 at 0 s)
	f(`"all":[{"property":"temp","op":"ge","of":"change","value":5}]`, []any{"temp", 25}, true)
	f(`"all":[{"property":"temp","op":"ge","of":"change","value":5}]`, []any{"temp", 24}, false)
	f(`"all":[{"property":"temp","op":"gt","of":"rate","value":0.4}]`, []any{"temp", 25}, true) // 5 in 10 s
	f(`"all":[{"property":"temp","op":"gt","of":"rate","value":0.6}]`, []any{"temp", 25}, false)
	// thresholds from the device: its own property, a tag, a fallback
	f(`"all":[{"property":"temp","op":"gt","ref":"property.limit"}]`, []any{"temp", 36}, true)
	f(`"all":[{"property":"temp","op":"gt","ref":"property.limit"}]`, []any{"temp", 34}, false)
	f(`"all":[{"property":"temp","op":"gt","ref":"tag.maxTemp","value":10}]`, []any{"temp", 45}, false) // tag 50 wins
	f(`"all":[{"property":"temp","op":"gt","ref":"tag.maxTemp","value":10}]`, []any{"temp", 51}, true)
	f(`"all":[{"property":"temp","op":"gt","ref":"tag.other","value":25}]`, []any{"temp", 26}, true) // no tag: the value
	// all/any, one level nested, over values reported in other messages
	f(`"all":[{"property":"temp","op":"gt","value":30},{"property":"mode","op":"eq","value":"auto"}]`, []any{"temp", 31}, true)
	f(`"all":[{"property":"temp","op":"gt","value":30},{"property":"mode","op":"eq","value":"manual"}]`, []any{"temp", 31}, false)
	f(`"any":[{"property":"temp","op":"gt","value":30},{"all":[{"property":"mode","op":"eq","value":"manual"},{"property":"on","op":"eq","value":false}]}]`, []any{"mode", "manual"}, true)
	f(`"any":[{"property":"temp","op":"gt","value":30},{"all":[{"property":"mode","op":"eq","value":"manual"},{"property":"on","op":"eq","value":true}]}]`, []any{"mode", "manual"}, false)
}

// TestEvalHysteresis: a value bouncing around the threshold raises one
// alarm whose repeats are counted; it clears only below the clear value.
func TestEvalHysteresis(t *testing.T) {
	h := newHarness(t, `{"trigger":{"type":"property","all":[{"property":"temp","op":"gt","value":30}]},"clear":{"type":"condition","all":[{"property":"temp","op":"lt","value":28}]}}`)
	raised, repeated := 0, 0
	for i := range 600 {
		v := 29.5
		if i%2 == 0 {
			v = 30.5
		}
		h.report(float64(i)/10, "temp", v)
	}
	for _, g := range h.got {
		switch {
		case strings.HasPrefix(g, "raised"):
			raised++
		case strings.HasPrefix(g, "repeated"):
			repeated++
		default:
			t.Fatalf("unexpected %q", g)
		}
	}
	if raised != 1 || repeated != 299 {
		t.Errorf("raised %d repeated %d, want 1 and 299", raised, repeated)
	}
	h.got = nil
	h.report(61, "temp", 28)
	h.want()
	h.report(62, "temp", 27.9)
	h.want("cleared major temp=27.9")
}

func TestEvalDuration(t *testing.T) {
	h := newHarness(t, `{"trigger":{"type":"property","all":[{"property":"temp","op":"gt","value":30}]},"duration":"10s","clear":{"for":"5s"}}`)
	h.report(0, "temp", 31)
	if h.tick(9.999) != 0 {
		t.Error("fired before the duration")
	}
	h.report(5, "temp", 29) // not held: starts over
	h.report(6, "temp", 31)
	h.tick(15.9)
	h.want()
	if next := h.e.NextDeadline(); !next.Equal(at(16)) {
		t.Errorf("next deadline %v, want %v", next, at(16))
	}
	h.tick(16)
	h.want("raised major temp=31")
	h.report(17, "temp", 20) // clear needs 5 s of not holding
	h.tick(21.9)
	h.report(21.95, "temp", 33) // holds again: the clear starts over
	h.report(22, "temp", 20)
	h.tick(26.9)
	h.want("repeated major temp=33")
	h.tick(27)
	h.want("cleared major temp=20")
	// a report after the deadline raises at the deadline without a tick
	h.report(30, "temp", 31)
	h.report(41, "temp", 31)
	h.want("raised major temp=31")
	if tr := h.e.out; len(tr) != 0 {
		t.Error(tr)
	}
}

func TestEvalRepeat(t *testing.T) {
	h := newHarness(t, `{"trigger":{"type":"property","all":[{"property":"temp","op":"gt","value":30}]},"repeat":{"count":3,"within":"10s"},"clear":{"type":"manual"}}`)
	h.report(0, "temp", 31)
	h.report(1, "temp", 20)
	h.report(5, "temp", 31)
	h.report(10, "temp", 31) // the first hit (0 s) left the window
	h.want()
	h.report(11, "temp", 32)
	h.want("raised major temp=32")
	h.report(12, "temp", 10) // manual: the trigger ending clears nothing
	h.want()
	h.e.Forget("r1", "d1", time.Time{})
	h.report(13, "temp", 31)
	h.want() // a new alarm needs three hits again
}

func TestEvalLadder(t *testing.T) {
	h := newHarness(t, `{"severity":"minor","trigger":{"type":"property","all":[{"property":"temp","op":"gt","value":30}]},"ladder":[{"severity":"major","all":[{"property":"temp","op":"gt","value":40}]},{"severity":"critical","all":[{"property":"temp","op":"gt","value":50}]}]}`)
	h.report(0, "temp", 45)
	h.want("raised major temp=45")
	h.report(1, "temp", 55)
	h.want("repeated major temp=55", "escalated critical temp=55")
	h.report(2, "temp", 35)
	h.want("repeated critical temp=35", "deescalated minor temp=35")
	h.report(3, "temp", 20)
	h.want("cleared minor temp=20")
	// a step on another property is evaluated on that property's reports
	h.setRules(`{"severity":"minor","trigger":{"type":"property","all":[{"property":"temp","op":"gt","value":30}]},"ladder":[{"severity":"critical","all":[{"property":"mode","op":"eq","value":"manual"}]}]}`)
	h.report(4, "temp", 35)
	h.want("raised minor temp=35")
	h.report(5, "mode", "manual")
	h.want("escalated critical temp=35") // not a repeat: no new temperature
}

func TestEvalEvent(t *testing.T) {
	h := newHarness(t, `{"trigger":{"type":"event","event":"fault","all":[{"property":"code","op":"ge","value":500}]},"clear":{"for":"1m"},"ladder":[{"severity":"critical","all":[{"property":"code","op":"ge","value":900}]}]}`)
	h.event(0, "fault", map[string]Value{"code": NumberValue(404)})
	h.event(1, "boot", nil)
	h.want()
	h.event(2, "fault", map[string]Value{"code": NumberValue(503), "text": StringValue("x")})
	h.want("raised major event fault code=503")
	h.event(30, "fault", map[string]Value{"code": NumberValue(950)})
	h.want("repeated major event fault code=950", "escalated critical event fault code=950")
	h.tick(89.9) // quiet for a minute since 30 s
	h.want()
	h.tick(90)
	h.want("cleared critical no event fault for 1m0s")
}

func TestEvalOffline(t *testing.T) {
	h := newHarness(t, `{"trigger":{"type":"offline","for":"30s"}}`)
	h.presence(0, true)
	h.presence(10, false)
	h.presence(20, false) // a repeated will changes nothing
	h.tick(39.9)
	h.want()
	h.tick(40)
	h.want("raised major offline since " + ts(10))
	h.presence(50, true)
	h.want("cleared major online")
	h.presence(60, false)
	h.presence(70, true) // back before D: nothing
	h.tick(100)
	h.want()
}

func TestEvalNoData(t *testing.T) {
	h := newHarness(t, `{"trigger":{"type":"nodata","for":"1m","property":"temp"}}`, `{"id":"any","trigger":{"type":"nodata","for":"2m"}}`)
	h.report(0, "temp", 20)
	h.report(30, "label", "x") // not temp: r1 still silent since 0; "any" since 30
	h.tick(59.9)
	h.want()
	h.tick(60)
	h.want("raised major no data since " + ts(0))
	h.report(70, "temp", 21)
	h.want("cleared major no data since " + ts(70))
	h.tick(150) // temp silent since 70 (r1); "any" heard temp at 70 too
	h.want("raised major no data since " + ts(70))
	h.tick(190)
	h.want("raised major no data since " + ts(70))
}

// TestEvalRedelivery: a message applied already is skipped by its key; a
// report older than the latest applied is not evaluated.
func TestEvalRedelivery(t *testing.T) {
	h := newHarness(t, `{"trigger":{"type":"property","all":[{"property":"temp","op":"gt","value":30}]},"repeat":{"count":2,"within":"1m"}}`)
	m := Message{Kind: MsgReport, ProductID: "p1", DeviceID: "d1", At: at(1), Key: "a", KeyUnique: true, Props: []Prop{{"temp", NumberValue(31)}}}
	if !h.e.Apply(m) || h.e.Apply(m) {
		t.Fatal("the redelivered message was applied again")
	}
	h.collect()
	h.want() // one hit, not two
	// the same key from a device without message ids, not marked a
	// redelivery: a new message with the same payload
	m2 := m
	m2.Key, m2.KeyUnique, m2.At = "hash", false, at(2)
	h.e.Apply(m2)
	h.collect()
	h.want("raised major temp=31")
	m3 := m
	m3.Key, m3.At, m3.Props = "b", at(1.5), []Prop{{"temp", NumberValue(10)}}
	if h.e.Apply(m3) {
		t.Error("a report older than the latest applied was evaluated")
	}
}

// TestEvalRestore: state written by Dirty and read by Restore continues
// as if nothing had happened: the duration's timer, the repeat window,
// the active alarm, the previous value.
func TestEvalRestore(t *testing.T) {
	rules := []string{
		`{"id":"dur","trigger":{"type":"property","all":[{"property":"temp","op":"gt","value":30}]},"duration":"10s"}`,
		`{"id":"rep","trigger":{"type":"property","all":[{"property":"temp","op":"gt","value":20}]},"repeat":{"count":3,"within":"1m"}}`,
		`{"id":"chg","trigger":{"type":"property","all":[{"property":"temp","op":"ge","of":"change","value":10}]}}`,
		`{"id":"off","trigger":{"type":"offline","for":"5s"}}`,
	}
	run := func(restart bool) []string {
		h := newHarness(t, rules...)
		h.report(0, "temp", 22)
		h.report(1, "temp", 31)
		h.presence(2, false)
		if restart {
			devs := h.e.Dirty()
			h2 := newHarness(t, rules...)
			if err := h2.e.Restore(devs); err != nil {
				t.Fatal(err)
			}
			h2.got, h2.seq = h.got, h.seq
			h = h2
		}
		h.tick(7)
		h.report(3, "temp", 41) // change +10: chg; third hit: rep
		h.tick(11)
		return h.got
	}
	plain, restarted := run(false), run(true)
	if !reflect.DeepEqual(plain, restarted) {
		t.Errorf("after a restore:\n got %q\nwant %q", restarted, plain)
	}
	if len(plain) != 4 {
		t.Errorf("the scenario raised %q", plain)
	}
}

// TestEvalSetRules: a rule that goes drops its states; one that stays
// keeps them.
func TestEvalSetRules(t *testing.T) {
	a := `{"id":"a","trigger":{"type":"property","all":[{"property":"temp","op":"gt","value":30}]}}`
	b := `{"id":"b","trigger":{"type":"offline","for":"5s"}}`
	h := newHarness(t, a, b)
	h.report(0, "temp", 31)
	h.presence(1, false)
	h.want("raised major temp=31")
	h.e.Dirty()
	h.setRules(a)
	if h.tick(100) != 0 {
		t.Error("the removed rule's timer fired")
	}
	devs := h.e.Dirty()
	var row devRow
	if len(devs) != 1 || json.Unmarshal(devs[0].Data, &row) != nil || row.Rules["b"] != nil || row.Rules["a"] == nil {
		t.Errorf("rows to write: %+v", devs)
	}
	if ok, sev := h.e.Active("a", "d1"); !ok || sev != SeverityMajor {
		t.Error("the kept rule lost its alarm")
	}
}

// TestEvalArrival: durations and timers run on arrival: a device whose
// clock lags an hour is not judged to have held its condition for an
// hour; the rate uses the device's own times.
func TestEvalArrival(t *testing.T) {
	h := newHarness(t, `{"trigger":{"type":"property","all":[{"property":"temp","op":"gt","value":30}]},"duration":"10s"}`,
		`{"id":"rate","trigger":{"type":"property","all":[{"property":"temp","op":"gt","of":"rate","value":0.5}]}}`)
	send := func(deviceSec, arrivedSec, v float64) {
		h.seq++
		h.e.Apply(Message{Kind: MsgReport, ProductID: "p1", DeviceID: "d1", At: at(deviceSec), Arrived: at(arrivedSec),
			Key: fmt.Sprint("m", h.seq), KeyUnique: true, Props: []Prop{{"temp", NumberValue(v)}}})
		h.collect()
	}
	send(0, 3600, 20)
	send(10, 3601, 31) // rate 11/10 s on the device's clock: 1.1
	h.want("raised major temp=31")
	h.tick(3610.9)
	h.want()
	h.tick(3611)
	h.want("raised major temp=31")
	if !h.trs[len(h.trs)-1].At.Equal(at(3611)) {
		t.Errorf("raised at %v", h.trs[len(h.trs)-1].At)
	}
}

// TestEvalRefMissing: a threshold naming a device value the device lacks,
// with no default: the rule is not evaluated for that device (no raise,
// and an active alarm is neither repeated nor cleared), and it is
// counted; with a default, the default is the threshold.
func TestEvalRefMissing(t *testing.T) {
	limit := map[string]float64{"d1": 40} // tag.limit of each device
	h := newHarness(t, `{"trigger":{"type":"property","all":[{"property":"temp","op":"gt","ref":"tag.limit"}]}}`)
	h.e.refs = func(dev, kind, id string) (Value, bool) {
		v, ok := limit[dev]
		if kind != RefTag || id != "limit" || !ok {
			return Value{}, false
		}
		return NumberValue(v), true
	}
	h.report(1, "temp", 45)
	h.want("raised major temp=45")
	delete(limit, "d1") // the device's tag removed
	h.report(2, "temp", 20)
	h.want() // not cleared: nothing to compare with
	if n := h.e.Lacking(); n != 1 {
		t.Errorf("lacking %d, want 1", n)
	}
	if active, _ := h.e.Active("r1", "d1"); !active {
		t.Error("the alarm was cleared by a missing threshold")
	}
	limit["d1"] = 30
	h.report(3, "temp", 20)
	h.want("cleared major temp=20")
	// Another device without the tag: nothing raised, counted.
	h.e.Apply(Message{Kind: MsgReport, ProductID: "p1", DeviceID: "d2", At: at(4), Props: []Prop{{ID: "temp", Value: NumberValue(99)}}})
	h.want()
	if n := h.e.Lacking(); n != 2 {
		t.Errorf("lacking %d, want 2", n)
	}
}
