package alarm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lib/pq"

	"devicehub/meta"
	"devicehub/meta/metatest"
	"devicehub/schema"
)

func newStore(t testing.TB) *Store {
	t.Helper()
	return NewStore(metatest.NewStore(t))
}

// writerStore is newStore with enabled rules r1 and r2 of product p1, so
// that the evaluator's writes of their transitions are taken.
func writerStore(t testing.TB) *Store {
	t.Helper()
	s := newStore(t)
	for _, id := range []string{"r1", "r2"} {
		r := Rule{ID: id, Name: "rule " + id, ProductID: "p1", Severity: SeverityMajor, Enabled: true,
			Trigger: Trigger{Type: TriggerNoData, For: Duration(time.Minute)}}
		if _, err := s.PutRule(context.Background(), r, true, Actor{}); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

func tr(kind, rule, dev, sev, val string, sec float64) Transition {
	return Transition{Kind: kind, RuleID: rule, RuleName: "rule " + rule, ProductID: "p1", DeviceID: dev, Severity: sev, At: at(sec), Value: val}
}

func kinds(t *testing.T, s *Store, id int64) []string {
	t.Helper()
	rows, err := s.Transitions(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range rows {
		out = append(out, r.Kind+" "+r.Severity+" "+r.Value+r.Username+r.Comment)
	}
	return out
}

func records(t *testing.T, s *Store, ctx context.Context) []Record {
	t.Helper()
	p, err := s.QueryRecords(ctx, &meta.Query{})
	if err != nil {
		t.Fatal(err)
	}
	return p.Data
}

// TestStoreRecordLifecycle: raised, repeats folded into the count,
// escalated, cleared by a value, a new alarm after it; acknowledged and
// cleared by hand with who and a comment; every transition kept.
func TestStoreRecordLifecycle(t *testing.T) {
	s := writerStore(t)
	ctx := context.Background()
	epoch, err := s.Claim(ctx)
	if err != nil {
		t.Fatal(err)
	}
	w := func(trs ...Transition) WriteResult {
		t.Helper()
		res, err := s.Write(ctx, epoch, trs, nil)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	w(tr(KindRaised, "r1", "d1", "major", "temp=31", 1),
		tr(KindRepeated, "r1", "d1", "major", "temp=32", 2),
		tr(KindRepeated, "r1", "d1", "major", "temp=33", 3))
	w(tr(KindRepeated, "r1", "d1", "major", "temp=45", 4), tr(KindEscalated, "r1", "d1", "critical", "temp=45", 4))
	recs := records(t, s, ctx)
	if len(recs) != 1 {
		t.Fatalf("records %+v", recs)
	}
	r := recs[0]
	if r.State != StateActive || r.Count != 4 || r.Severity != "critical" || r.FirstValue != "temp=31" || r.LastValue != "temp=45" || !r.LastTime.Equal(at(4)) {
		t.Errorf("record %+v", r)
	}
	w(tr(KindCleared, "r1", "d1", "critical", "temp=20", 5), tr(KindRaised, "r1", "d1", "major", "temp=31", 6))
	recs = records(t, s, ctx)
	if len(recs) != 2 || recs[0].State != StateActive || recs[1].State != StateCleared || recs[1].ClearValue != "temp=20" {
		t.Fatalf("after a clear and a raise: %+v", recs)
	}
	if got, want := kinds(t, s, r.ID), []string{"raised major temp=31", "escalated critical temp=45", "cleared critical temp=20"}; !reflect.DeepEqual(got, want) {
		t.Errorf("transitions %q, want %q", got, want)
	}
	// by hand
	bob := Actor{ID: "u1", Name: "bob"}
	if _, err := s.Ack(ctx, recs[0].ID, bob, "seen"); err != nil {
		t.Fatal(err)
	}
	c, err := s.ClearByHand(ctx, recs[0].ID, bob, "fixed the fan")
	if err != nil {
		t.Fatal(err)
	}
	if !c.Acked || c.AckedBy != "bob" || c.AckComment != "seen" || c.State != StateCleared || c.ClearedBy != "bob" || c.ClearValue != "fixed the fan" {
		t.Errorf("by hand: %+v", c)
	}
	if _, err := s.ClearByHand(ctx, recs[0].ID, bob, "again"); !errors.Is(err, ErrNotActive) {
		t.Errorf("second clear: %v", err)
	}
	if got, want := kinds(t, s, recs[0].ID), []string{"raised major temp=31", "acknowledged major bobseen", "cleared major bobfixed the fan"}; !reflect.DeepEqual(got, want) {
		t.Errorf("transitions %q, want %q", got, want)
	}
	// The evaluator did not know: its escalation finds no active alarm
	// and is dropped; its repeat is a new alarm.
	res := w(tr(KindEscalated, "r1", "d1", "critical", "temp=55", 7))
	if !reflect.DeepEqual(res, WriteResult{Gone: []HandClear{{RuleID: "r1", DeviceID: "d1"}}}) {
		t.Errorf("escalation of a cleared alarm: %+v", res)
	}
	res = w(tr(KindRepeated, "r1", "d1", "major", "temp=35", 8), tr(KindRepeated, "r1", "d1", "major", "temp=36", 9))
	if !reflect.DeepEqual(res, WriteResult{Reraised: []HandClear{{RuleID: "r1", DeviceID: "d1", RaisedAt: at(8)}},
		Written: []Transition{tr(KindRaised, "r1", "d1", "major", "temp=35", 8)}}) {
		t.Errorf("repeat of a cleared alarm: %+v", res)
	}
	hc, last, err := s.HandClears(ctx, 0)
	if err != nil || !reflect.DeepEqual(hc, []HandClear{{"r1", "d1", at(6)}}) || last == 0 {
		t.Errorf("hand clears %v %d %v", hc, last, err)
	}
	if hc, _, _ := s.HandClears(ctx, last); len(hc) != 0 {
		t.Errorf("hand clears after %d: %v", last, hc)
	}
	if recs := records(t, s, ctx); len(recs) != 3 || recs[0].Count != 2 || recs[0].FirstValue != "temp=35" || recs[0].LastValue != "temp=36" {
		t.Errorf("records %+v", recs)
	}
}

// TestStoreOneActive: the database holds at most one active alarm per
// (rule, device), whatever the writers believe: a second raise is a
// repeat of the first; a row inserted past the store is refused.
func TestStoreOneActive(t *testing.T) {
	s := writerStore(t)
	ctx := context.Background()
	epoch, _ := s.Claim(ctx)
	for range 2 {
		if _, err := s.Write(ctx, epoch, []Transition{tr(KindRaised, "r1", "d1", "major", "v", 1)}, nil); err != nil {
			t.Fatal(err)
		}
	}
	recs := records(t, s, ctx)
	if len(recs) != 1 || recs[0].Count != 2 {
		t.Fatalf("records %+v", recs)
	}
	_, err := s.db.Exec(`INSERT INTO alarm_records (rule_id, rule_name, product_id, device_id, severity, state, raised_time, last_time)
		VALUES ('r1', 'x', 'p1', 'd1', 'major', 'active', now(), now())`)
	if err == nil {
		t.Error("a second active alarm of (r1, d1) was stored")
	}
}

// TestStoreFencing: once another owner claimed, the old owner's writes
// are refused and change nothing: a batch with transitions (a
// transaction) and one of state rows only (one statement, writeRows).
func TestStoreFencing(t *testing.T) {
	row := []DeviceRow{{DeviceID: "d1", ProductID: "p1", Data: []byte(`{}`)}}
	for _, c := range []struct {
		name string
		trs  []Transition
	}{
		{"transitions and rows", []Transition{tr(KindRaised, "r1", "d1", "major", "v", 1)}},
		{"rows only", nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := writerStore(t)
			ctx := context.Background()
			old, _ := s.Claim(ctx)
			if _, err := s.Claim(ctx); err != nil {
				t.Fatal(err)
			}
			_, err := s.Write(ctx, old, c.trs, row)
			if !errors.Is(err, ErrNotOwner) {
				t.Fatalf("stale owner's write: %v", err)
			}
			if n := len(records(t, s, ctx)); n != 0 {
				t.Errorf("%d records written by a stale owner", n)
			}
			var n int
			if err := s.db.Get(&n, `SELECT count(*) FROM alarm_state`); err != nil {
				t.Fatal(err)
			}
			if n != 0 {
				t.Errorf("%d state rows written by a stale owner", n)
			}
		})
	}
}

// TestStoreState: the evaluator's state goes in with a batch and comes
// back; a state whose alarm a hand cleared comes back inactive.
func TestStoreState(t *testing.T) {
	s := writerStore(t)
	ctx := context.Background()
	epoch, _ := s.Claim(ctx)
	h := newHarness(t, `{"trigger":{"type":"property","all":[{"property":"temp","op":"gt","value":30}]}}`,
		`{"id":"off","trigger":{"type":"offline","for":"1m"}}`)
	h.report(1, "temp", 31)
	h.presence(2, false)
	if _, err := s.Write(ctx, epoch, h.trs, h.e.Dirty()); err != nil {
		t.Fatal(err)
	}
	ld, err := s.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	h2 := newHarness(t, `{"trigger":{"type":"property","all":[{"property":"temp","op":"gt","value":30}]}}`,
		`{"id":"off","trigger":{"type":"offline","for":"1m"}}`)
	if err := h2.e.Restore(ld); err != nil {
		t.Fatal(err)
	}
	if ok, _ := h2.e.Active("r1", "d1"); !ok {
		t.Error("the active alarm was not restored")
	}
	if !h2.e.NextDeadline().Equal(at(62)) {
		t.Errorf("the offline timer came back as %v", h2.e.NextDeadline())
	}
	// a hand clears it while no owner runs
	recs := records(t, s, ctx)
	if _, err := s.ClearByHand(ctx, recs[0].ID, Actor{ID: "u", Name: "u"}, ""); err != nil {
		t.Fatal(err)
	}
	ld, _ = s.Load(ctx)
	h3 := newHarness(t, `{"trigger":{"type":"property","all":[{"property":"temp","op":"gt","value":30}]}}`)
	if err := h3.e.Restore(ld); err != nil {
		t.Fatal(err)
	}
	if ok, _ := h3.e.Active("r1", "d1"); ok {
		t.Error("an alarm cleared by hand came back active")
	}
	// and the removed rule's state is deleted by the next write
	if _, err := s.Write(ctx, epoch, nil, h3.e.Dirty()); err != nil {
		t.Fatal(err)
	}
	var n int
	_ = s.db.Get(&n, "SELECT count(*) FROM alarm_state WHERE data::jsonb -> 'r' ? 'off'")
	if n != 0 {
		t.Error("the state of a rule that is gone stayed")
	}
}

// TestStoreRules: create, duplicate, update, enable, delete, query and
// import, each within the caller's products only.
func TestStoreRules(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	m := model(t)
	rule := func(id, product string) Rule {
		r, err := ParseRule([]byte(`{"id":"` + id + `","name":"Hot","productId":"` + product + `","severity":"major","trigger":{"type":"property","all":[{"property":"temp","op":"gt","value":30}]}}`))
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	by := Actor{ID: "u1", Name: "bob"}
	if _, err := s.PutRule(ctx, rule("a", "p1"), true, by); err != nil {
		t.Fatal(err)
	}
	if _, err := s.PutRule(ctx, rule("a", "p1"), true, by); !errors.Is(err, meta.ErrDuplicateKey) {
		t.Errorf("duplicate: %v", err)
	}
	if _, err := s.PutRule(ctx, rule("b", "p2"), true, by); err != nil {
		t.Fatal(err)
	}
	if _, err := s.PutRule(ctx, rule("zz", "p1"), false, by); !errors.Is(err, meta.ErrNotFound) {
		t.Errorf("update of a missing rule: %v", err)
	}
	v1, _ := s.RulesVersion(ctx)
	got, err := s.SetEnabled(ctx, "a", true, by)
	if err != nil || !got.Enabled {
		t.Fatalf("enable: %+v %v", got, err)
	}
	if v2, _ := s.RulesVersion(ctx); v2 == v1 {
		t.Error("the rules version did not change")
	}
	// scoped to p1
	p1 := meta.LimitProducts(ctx, false, []string{"p1"})
	if _, err := s.GetRule(p1, "b"); !errors.Is(err, meta.ErrNotFound) {
		t.Errorf("p2's rule seen from p1: %v", err)
	}
	if _, err := s.PutRule(p1, rule("b", "p1"), false, by); !errors.Is(err, meta.ErrNotFound) {
		t.Errorf("p2's rule moved from p1: %v", err)
	}
	if _, err := s.DeleteRule(p1, "b", Actor{}); !errors.Is(err, meta.ErrNotFound) {
		t.Errorf("p2's rule deleted from p1: %v", err)
	}
	page, err := s.QueryRules(p1, &meta.Query{})
	if err != nil || page.Total != 1 || page.Data[0].ID != "a" {
		t.Errorf("p1's query: %+v %v", page, err)
	}
	if err := s.ImportRules(p1, "p2", m, []Rule{rule("c", "x")}, by); !errors.Is(err, meta.ErrNotFound) {
		t.Errorf("import into p2 from p1: %v", err)
	}
	// import: all or nothing, errors per rule
	bad := rule("d", "")
	bad.Trigger.All[0].Property = "nope"
	err = s.ImportRules(ctx, "p1", m, []Rule{rule("c", "x"), bad, rule("b", "")}, by)
	var ie *ImportError
	if !errors.As(err, &ie) || !errors.Is(err, schema.ErrIllegalArgument) || len(ie.Errors) != 2 || ie.Errors[1] == nil || ie.Errors[2] == nil {
		t.Fatalf("import: %v", err)
	}
	if _, err := s.GetRule(ctx, "c"); !errors.Is(err, meta.ErrNotFound) {
		t.Error("a refused import wrote a rule")
	}
	if err := s.ImportRules(ctx, "p3", m, []Rule{rule("c", "x"), rule("e", "y")}, by); err != nil {
		t.Fatal(err)
	}
	rs, err := s.ProductRules(ctx, "p3")
	if err != nil || len(rs) != 2 || rs[0].ProductID != "p3" {
		t.Errorf("p3's rules %+v %v", rs, err)
	}
	if _, err := s.DeleteRule(ctx, "a", Actor{ID: "u1", Name: "ann"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetRule(ctx, "a"); !errors.Is(err, meta.ErrNotFound) {
		t.Error("a deleted rule is there")
	}
	_ = time.Second
}

// TestStoreRuleGone: disabling or deleting a rule clears its active
// alarms, each with a cleared transition naming the reason and who; the
// evaluator's writes for a rule disabled or deleted are refused (a batch
// evaluated before the owner reloaded its rules raises nothing again).
func TestStoreRuleGone(t *testing.T) {
	s := writerStore(t)
	ctx := context.Background()
	epoch, err := s.Claim(ctx)
	if err != nil {
		t.Fatal(err)
	}
	w := func(trs ...Transition) {
		t.Helper()
		if _, err := s.Write(ctx, epoch, trs, nil); err != nil {
			t.Fatal(err)
		}
	}
	w(tr(KindRaised, "r1", "d1", SeverityMajor, "temp=31", 1), tr(KindRaised, "r2", "d1", SeverityMajor, "temp=31", 1))
	ann := Actor{ID: "u1", Name: "ann"}
	if _, err := s.SetEnabled(ctx, "r1", false, ann); err != nil {
		t.Fatal(err)
	}
	if _, err := s.DeleteRule(ctx, "r2", ann); err != nil {
		t.Fatal(err)
	}
	recs := records(t, s, ctx)
	if len(recs) != 2 {
		t.Fatalf("records %+v", recs)
	}
	for _, r := range recs {
		want := map[string]string{"r1": ReasonRuleDisabled, "r2": ReasonRuleDeleted}[r.RuleID]
		if r.State != StateCleared || r.ClearValue != want || r.ClearedBy != "ann" {
			t.Errorf("%s: state %s, clear value %q by %q; want cleared %q by ann", r.RuleID, r.State, r.ClearValue, r.ClearedBy, want)
		}
		if k := kinds(t, s, r.ID); len(k) != 2 || k[1] != "cleared major "+want+"ann" {
			t.Errorf("%s: transitions %q", r.RuleID, k)
		}
	}
	hc, _, err := s.HandClears(ctx, 0)
	if err != nil || len(hc) != 2 {
		t.Errorf("the owner sees %d clears (%v), not 2", len(hc), err)
	}
	// The owner's batch evaluated before it reloaded: a repeat and a raise
	// of the rules gone write nothing.
	w(tr(KindRepeated, "r1", "d1", SeverityMajor, "temp=32", 2), tr(KindRaised, "r2", "d2", SeverityMajor, "temp=33", 2))
	if recs := records(t, s, ctx); len(recs) != 2 {
		t.Errorf("a disabled or deleted rule raised again: %+v", recs)
	}
	// Enabled again, its alarms come as before.
	if _, err := s.SetEnabled(ctx, "r1", true, ann); err != nil {
		t.Fatal(err)
	}
	w(tr(KindRaised, "r1", "d1", SeverityMajor, "temp=34", 3))
	if recs := records(t, s, ctx); len(recs) != 3 || recs[0].State != StateActive {
		t.Errorf("enabled again: %+v", recs)
	}
}

// TestStoreStateRows: the rows a batch writes come back from Load byte
// for byte (rows of every kind of field, texts to escape in their JSON
// and in the device ids), after their insert and after their update; the
// array literals they are sent in are what pq.StringArray sends.
func TestStoreStateRows(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 9))
	ids := []string{"", `q"uote`, `back\slash`, "a,b", "{x}", "NULL", "sp ace", "Żółw 电表 🚀", `\"`, "null"}
	for range 200 {
		var rows []DeviceRow
		var want pq.StringArray
		for range r.IntN(5) {
			id := ids[r.IntN(len(ids))] + randText(r)
			rows = append(rows, DeviceRow{DeviceID: id})
			want = append(want, id)
		}
		wv, err := want.Value()
		if err != nil {
			t.Fatal(err)
		}
		if want == nil {
			wv = "{}"
		}
		if got := textArray(rows, func(d *DeviceRow) string { return d.DeviceID }); got != wv {
			t.Fatalf("textArray(%q) = %s, want %s", want, got, wv)
		}
	}

	s := writerStore(t)
	ctx := context.Background()
	epoch, _ := s.Claim(ctx)
	for round := range 2 {
		var devs []DeviceRow
		for i, id := range ids {
			row := randRow(r)
			for _, sd := range row.Rules {
				sd.Active = false // no record: Load would clear it (a hand's clear)
			}
			devs = append(devs, DeviceRow{DeviceID: fmt.Sprintf("%s-%d", id, i), ProductID: "p" + id, Data: row.appendJSON(nil)})
		}
		if _, err := s.Write(ctx, epoch, nil, devs); err != nil {
			t.Fatal(err)
		}
		ld, err := s.Load(ctx)
		if err != nil {
			t.Fatal(err)
		}
		slices.SortFunc(ld, func(a, b DeviceRow) int { return strings.Compare(a.DeviceID, b.DeviceID) })
		slices.SortFunc(devs, func(a, b DeviceRow) int { return strings.Compare(a.DeviceID, b.DeviceID) })
		if len(ld) != len(devs) {
			t.Fatalf("round %d: %d rows loaded of %d", round, len(ld), len(devs))
		}
		for i := range devs {
			if ld[i].DeviceID != devs[i].DeviceID || ld[i].ProductID != devs[i].ProductID || !bytes.Equal(ld[i].Data, devs[i].Data) {
				t.Fatalf("round %d: loaded %q %q %s\nwant %q %q %s", round, ld[i].DeviceID, ld[i].ProductID, ld[i].Data, devs[i].DeviceID, devs[i].ProductID, devs[i].Data)
			}
		}
	}
}
