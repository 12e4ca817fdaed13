package alarm

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"unicode/utf8"
)

// refRow is a device's row as encoding/json writes it by reflection from
// the struct tags: the format of the rows stored so far (a devRow with its
// props as an object by id, each a propJSON, and its rule states by id).
// The fields of devData, propJSON, value and stateData are checked to be
// those appendRow writes, so that a field added to one of them and not to
// appendRow fails the tests that compare with refRow.
func refRow(t *testing.T, dd *devData, rules map[string]*stateData) []byte {
	t.Helper()
	for typ, want := range map[reflect.Type][]string{
		reflect.TypeFor[devData]():   {"t,omitempty", "k,omitempty", "p,omitempty"},
		reflect.TypeFor[propJSON]():  {"c", "t", "p,omitempty", "q,omitempty"},
		reflect.TypeFor[value]():     {"n,omitempty", "s,omitempty", "k,omitempty"},
		reflect.TypeFor[stateData](): {"s,omitempty", "h,omitempty", "a,omitempty", "v,omitempty", "c,omitempty", "d,omitempty", "o,omitempty", "l,omitempty", "r,omitempty"},
	} {
		var tags []string
		for f := range typ.Fields() {
			tags = append(tags, f.Tag.Get("json"))
		}
		if !slices.Equal(tags, want) {
			t.Fatalf("%s's fields are %q: appendRow writes %q", typ, tags, want)
		}
	}
	var ps map[string]*propJSON
	for _, p := range dd.Props {
		if ps == nil {
			ps = map[string]*propJSON{}
		}
		j := &propJSON{Cur: p.Cur, At: p.At, PrevAt: p.PrevAt}
		if p.hasPrev {
			prev := p.Prev
			j.Prev = &prev
		}
		ps[p.ID] = j
	}
	row := struct {
		LastAt int64                 `json:"t,omitempty"`
		Keys   []string              `json:"k,omitempty"`
		Props  map[string]*propJSON  `json:"p,omitempty"`
		Rules  map[string]*stateData `json:"r,omitempty"`
	}{dd.LastAt, dd.Keys, ps, rules}
	b, err := json.Marshal(&row)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// rowTexts are ids, keys and values whose JSON has escapes.
var rowTexts = []string{"", "temp", "h0123456789abcdef", `q"uote\`, "<b>&amp;", "\x00\x1f\n\t", "\u2028\u2029", "Żółw 电表 🚀", "\xff bad", "i42"}

func randText(r *rand.Rand) string {
	return rowTexts[r.IntN(len(rowTexts))] + rowTexts[r.IntN(len(rowTexts))]
}

// randInt is 0 (omitted), a time in ms, or any int64.
func randInt(r *rand.Rand) int64 {
	switch r.IntN(4) {
	case 0:
		return 0
	case 1:
		return 1764374400000 + r.Int64N(1e9)
	case 2:
		return -r.Int64N(1e12)
	}
	return int64(r.Uint64())
}

func randValue(r *rand.Rand) value {
	var v value
	switch r.IntN(5) {
	case 0:
		v = NumberValue([]float64{0, math.Copysign(0, -1), 20.5, -10, 1e-7, 3e21, 1.0 / 3, math.MaxFloat64}[r.IntN(8)]).v
	case 1:
		v = NumberValue(r.NormFloat64() * math.Pow(10, float64(r.IntN(40)-20))).v
	case 2:
		v = StringValue(randText(r)).v
	case 3:
		v = BoolValue(r.IntN(2) == 0).v
	default: // any combination
		v = value{Num: float64(r.IntN(3)), Str: randText(r), Kind: uint8(r.IntN(256))}
	}
	return v
}

func randState(r *rand.Rand) *stateData {
	s := &stateData{}
	if r.IntN(2) == 0 {
		s.Since = randInt(r)
	}
	for range r.IntN(3) {
		s.Hits = append(s.Hits, randInt(r))
	}
	s.Active, s.Offline = r.IntN(2) == 0, r.IntN(2) == 0
	if r.IntN(2) == 0 {
		s.Sev = uint8(r.IntN(256))
	}
	s.ClearSince, s.Deadline, s.LastSeen, s.RaisedAt = randInt(r), randInt(r), randInt(r), randInt(r)
	return s
}

// randRow is a device's part and rule states, each field set or not.
func randRow(r *rand.Rand) devRow {
	var row devRow
	row.LastAt = randInt(r)
	for range r.IntN(4) {
		row.Keys = append(row.Keys, randText(r))
	}
	for range r.IntN(4) {
		id := randText(r)
		if row.Props.find(id) != nil {
			continue
		}
		p := row.Props.add(id)
		p.Cur, p.At, p.PrevAt = randValue(r), randInt(r), randInt(r)
		if r.IntN(2) == 0 {
			p.Prev, p.hasPrev = randValue(r), true
		}
	}
	for range r.IntN(4) {
		if row.Rules == nil {
			row.Rules = map[string]*stateData{}
		}
		row.Rules[randText(r)] = randState(r)
	}
	return row
}

// TestRowEncoding: appendRow writes what encoding/json writes for every
// field of a row, set or not (omitempty), with texts to escape and
// numbers of every form, and so does json.Marshal of a devRow (props'
// MarshalJSON); json.Unmarshal (Restore's reader) gives the same state
// back. A rule state the store reads as null (Store.Load) is written null.
func TestRowEncoding(t *testing.T) {
	r := rand.New(rand.NewPCG(29, 11))
	for i := range 20000 {
		row := randRow(r)
		if i%100 == 0 && row.Rules != nil {
			row.Rules["null"] = nil
		}
		got := row.appendJSON([]byte("x"))
		if !bytes.HasPrefix(got, []byte("x")) {
			t.Fatal("appendJSON dropped what the buffer held")
		}
		got = got[1:]
		if want := refRow(t, &row.devData, row.Rules); !bytes.Equal(got, want) {
			t.Fatalf("row %d:\n got %s\nwant %s", i, got, want)
		}
		if m, err := json.Marshal(&row); err != nil || !bytes.Equal(m, got) {
			t.Fatalf("row %d: json.Marshal (props' MarshalJSON) writes %s (%v), appendJSON %s", i, m, err, got)
		}
		var back devRow
		if err := json.Unmarshal(got, &back); err != nil {
			t.Fatalf("row %d: %s: %v", i, got, err)
		}
		if !utf8.ValidString(fmt.Sprint(row.Keys, row.Props, slices.Collect(maps.Keys(row.Rules)))) {
			continue // read back with U+FFFD for the bytes that are not UTF-8
		}
		if !reflect.DeepEqual(back, row) {
			t.Fatalf("row %d read back:\n got %+v\nwant %+v", i, back, row)
		}
		if again := back.appendJSON(nil); !bytes.Equal(again, got) {
			t.Fatalf("row %d read back and written again:\n got %s\nwant %s", i, again, got)
		}
	}
}

// TestRowGolden: a row of every kind of field as the evaluator stored
// it when encoding/json wrote its rows (devRow marshaled by reflection,
// props by their MarshalJSON): appendRow writes the same bytes, and
// json.Unmarshal reads them back to the same state.
func TestRowGolden(t *testing.T) {
	row := devRow{
		devData: devData{LastAt: 1764374400123, Keys: []string{"h0123456789abcdef", "i<&>\u2028", "p\xff"}},
		Rules: map[string]*stateData{
			"z-silent": {Deadline: 1764378000123, LastSeen: 1764374400123},
			"a-hot":    {Since: 1, Hits: []int64{5, -6}, Active: true, Sev: 3, ClearSince: 7, Deadline: 8, Offline: true, LastSeen: 9, RaisedAt: 10},
			"m-empty":  {},
		},
	}
	p := row.Props.add("temp")
	p.Cur, p.At, p.Prev, p.PrevAt, p.hasPrev = NumberValue(20.5).v, 1764374400123, NumberValue(-1e-7).v, 1764374399123, true
	p = row.Props.add("label")
	p.Cur, p.At = StringValue("\"<tag>\"\n").v, 1764374400123
	p = row.Props.add("on")
	p.Cur, p.At, p.Prev, p.hasPrev = BoolValue(true).v, 1, BoolValue(false).v, true
	p = row.Props.add("big")
	p.Cur, p.At = NumberValue(3e21).v, 0
	const want = `{"t":1764374400123,"k":["h0123456789abcdef","i\u003c\u0026\u003e\u2028","p\ufffd"],` +
		`"p":{"big":{"c":{"n":3e+21},"t":0},"label":{"c":{"s":"\"\u003ctag\u003e\"\n","k":1},"t":1764374400123},` +
		`"on":{"c":{"n":1,"s":"true","k":2},"t":1,"p":{"s":"false","k":2}},` +
		`"temp":{"c":{"n":20.5},"t":1764374400123,"p":{"n":-1e-7},"q":1764374399123}},` +
		`"r":{"a-hot":{"s":1,"h":[5,-6],"a":true,"v":3,"c":7,"d":8,"o":true,"l":9,"r":10},"m-empty":{},"z-silent":{"d":1764378000123,"l":1764374400123}}}`
	if got := row.appendJSON(nil); string(got) != want {
		t.Errorf("\n got %s\nwant %s", got, want)
	}
	var back devRow
	if err := json.Unmarshal([]byte(want), &back); err != nil {
		t.Fatal(err)
	}
	row.Keys[2] = "p\ufffd"
	if !reflect.DeepEqual(back, row) {
		t.Errorf("read back:\n got %+v\nwant %+v", back, row)
	}
}

// TestEvalRowsRestore: over random messages and timers on rules of every
// kind, each row Dirty returns is what encoding/json writes for the
// device's state, and the rows restored into a new evaluator give the
// same state (values, keys, rule states, timers), which then decides the
// same transitions as the evaluator that never stopped.
func TestEvalRowsRestore(t *testing.T) {
	rules := append(slices.Clone(benchRules),
		`{"id":"off","trigger":{"type":"offline","for":"5s"},"clear":{"for":"2s"}}`,
		`{"id":"fault","trigger":{"type":"event","event":"fault","all":[{"property":"code","op":"ge","value":500}]},"clear":{"for":"1m"}}`,
		`{"id":"mode","trigger":{"type":"property","all":[{"property":"mode","op":"eq","value":"manual"}]},"clear":{"type":"trigger","for":"3s"}}`,
		`{"id":"label","trigger":{"type":"property","all":[{"property":"label","op":"changed"}]},"clear":{"type":"manual"}}`,
		`{"id":"on","trigger":{"type":"property","all":[{"property":"on","op":"eq","value":true},{"property":"temp","op":"gt","ref":"tag.maxTemp","value":10}]}}`,
	)
	h := newHarness(t, rules...)
	e := h.e
	labels := []string{"", "a", `q"uote\`, "<b>&amp;", "\x00\n", "\u2028", "Żółw 电表 🚀"}
	r := rand.New(rand.NewPCG(5, 8))
	sec := 0.0
	seq := 0
	msg := func() Message {
		seq++
		sec += r.Float64() * 3
		dev := fmt.Sprintf("d%d", r.IntN(6))
		m := Message{ProductID: "p1", DeviceID: dev, At: at(sec), Key: fmt.Sprintf("m%d", seq), KeyUnique: true}
		switch r.IntN(6) {
		case 0:
			m.Kind, m.Event = MsgEvent, "fault"
			m.Fields = map[string]Value{"code": NumberValue(float64(r.IntN(1000)))}
		case 1:
			m.Kind = MsgOnline
			if r.IntN(2) == 0 {
				m.Kind = MsgOffline
			}
			m.Key = ""
		default:
			m.Kind = MsgReport
			m.Props = []Prop{{ID: "temp", Value: NumberValue(r.NormFloat64()*60 + 60)}}
			if r.IntN(2) == 0 {
				m.Props = append(m.Props, Prop{ID: "limit", Value: NumberValue(r.NormFloat64()*200 + 50)})
			}
			if r.IntN(3) == 0 {
				m.Props = append(m.Props, Prop{ID: "mode", Value: StringValue([]string{"auto", "manual"}[r.IntN(2)])})
			}
			if r.IntN(3) == 0 {
				m.Props = append(m.Props, Prop{ID: "label", Value: StringValue(labels[r.IntN(len(labels))])})
			}
			if r.IntN(3) == 0 {
				m.Props = append(m.Props, Prop{ID: "on", Value: BoolValue(r.IntN(2) == 0)})
			}
		}
		return m
	}
	stored := map[string]DeviceRow{}
	rows := 0
	take := func(step int) {
		for _, row := range e.Dirty() {
			d := e.devices[row.DeviceID]
			states := map[string]*stateData{}
			for _, st := range d.rules {
				states[st.rule.ID] = &st.S
			}
			if len(states) == 0 {
				states = nil
			}
			if want := refRow(t, &d.D, states); !bytes.Equal(row.Data, want) {
				t.Fatalf("step %d, %s:\n got %s\nwant %s", step, row.DeviceID, row.Data, want)
			}
			stored[row.DeviceID] = row
			rows++
		}
	}
	for step := range 3000 {
		e.Apply(msg())
		if step%7 == 0 {
			e.Tick(at(sec))
		}
		if step%13 == 0 {
			take(step)
		}
	}
	take(3000)
	kinds := map[string]bool{}
	for _, d := range e.devices {
		for _, st := range d.rules {
			kinds[st.rule.ID] = true
		}
	}
	if len(stored) != 6 || len(kinds) < 8 {
		t.Fatalf("the run stored %d devices' rows (%d), states of %d rules: %v", len(stored), rows, len(kinds), kinds)
	}

	h2 := newHarness(t, rules...)
	e2 := h2.e
	if err := e2.Restore(slices.Collect(maps.Values(stored))); err != nil {
		t.Fatal(err)
	}
	if rows := e2.Dirty(); len(rows) != 0 {
		t.Errorf("restored rows written again: %d", len(rows))
	}
	for id, d := range e.devices {
		d2 := e2.devices[id]
		if d2 == nil || !reflect.DeepEqual(d2.D, d.D) {
			t.Fatalf("%s restored:\n got %+v\nwant %+v", id, d2, d.D)
		}
		if len(d2.rules) != len(d.rules) {
			t.Fatalf("%s: %d rule states restored of %d", id, len(d2.rules), len(d.rules))
		}
		for _, st := range d.rules {
			if st2 := d2.rule(st.rule.ID); st2 == nil || !reflect.DeepEqual(st2.S, st.S) {
				t.Fatalf("%s %s restored:\n got %+v\nwant %+v", id, st.rule.ID, st2, st.S)
			}
		}
	}
	if !e2.NextDeadline().Equal(e.NextDeadline()) {
		t.Errorf("next deadline %v restored, want %v", e2.NextDeadline(), e.NextDeadline())
	}
	e.Transitions()
	for step := range 500 {
		m := msg()
		e.Apply(m)
		e2.Apply(m)
		e.Tick(at(sec))
		e2.Tick(at(sec))
		a, b := e.Transitions(), e2.Transitions()
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("step %d after the restore:\n got %+v\nwant %+v", step, b, a)
		}
	}
}
