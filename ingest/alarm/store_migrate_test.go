package alarm

import (
	"context"
	"encoding/json"
	"reflect"
	"testing"

	"devicehub/meta"
	"devicehub/meta/metatest"
)

// TestMigrateAlarmState: an upgrade keeps the evaluator's state. Rows in
// the layout before 00034 (a row per device, alarm_device_state, and one
// per (rule, device), alarm_rule_state, as the evaluator wrote them) come
// back from Store.Load as they were, folded into one row per device: an
// active alarm stays active, a timer keeps its deadline, the latest
// values and message keys stay; a rule state whose alarm a hand cleared
// comes back inactive, and one without its device's row (never restored)
// is dropped. The migration's Down splits the rows again.
func TestMigrateAlarmState(t *testing.T) {
	ctx := context.Background()
	m := metatest.Migrations(t, "_alarm_state.sql") // Before: the old layout
	db, p, dsn, before := m.DB, m.Provider, m.DSN, m.Before

	// The state of an evaluator: d1 with an active alarm (r1) and an
	// offline timer ("off"); d3 with an alarm a hand cleared (r1).
	rules := []string{`{"trigger":{"type":"property","all":[{"property":"temp","op":"gt","value":30}]}}`,
		`{"id":"off","trigger":{"type":"offline","for":"1m"}}`}
	h := newHarness(t, rules...)
	h.report(0, "temp", 22)
	h.report(1, "temp", 31)
	h.presence(2, false)
	h.e.Apply(Message{Kind: MsgReport, ProductID: "p1", DeviceID: "d3", At: at(3), Key: "x1", KeyUnique: true,
		Props: []Prop{{ID: "temp", Value: NumberValue(35)}}})
	h.collect()
	rows := h.e.Dirty()
	want := map[string]devRow{}
	for _, r := range rows {
		var row devRow
		if err := json.Unmarshal(r.Data, &row); err != nil {
			t.Fatal(err)
		}
		want[r.DeviceID] = row
	}
	if len(want) != 2 || want["d1"].Rules["r1"] == nil || !want["d1"].Rules["r1"].Active || want["d1"].Rules["off"] == nil ||
		want["d3"].Rules["r1"] == nil || !want["d3"].Rules["r1"].Active {
		t.Fatalf("the evaluator's rows: %+v", want)
	}

	if _, err := p.UpTo(ctx, before); err != nil {
		t.Fatal(err)
	}
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := db.ExecContext(ctx, q, args...); err != nil {
			t.Fatalf("%.60s: %v", q, err)
		}
	}
	// The old layout, as the evaluator before 00034 wrote it: the device's
	// part, and each rule state in a row of its own.
	for id, row := range want {
		dev, _ := json.Marshal(&row.devData)
		exec(`INSERT INTO alarm_device_state (device_id, product_id, data) VALUES ($1, 'p1', $2)`, id, dev)
		for rule, sd := range row.Rules {
			b, _ := json.Marshal(sd)
			exec(`INSERT INTO alarm_rule_state (device_id, rule_id, data) VALUES ($1, $2, $3)`, id, rule, b)
		}
	}
	exec(`INSERT INTO alarm_rule_state (device_id, rule_id, data) VALUES ('d2', 'r1', '{"a":true}')`) // no device row
	exec(`INSERT INTO alarm_records (rule_id, rule_name, product_id, device_id, severity, state, raised_time, last_time)
		VALUES ('r1', 'rule r1', 'p1', 'd1', 'major', 'active', $1, $1)`, at(1))

	opts := meta.DefaultOptions()
	opts.DSN = dsn
	ms, err := meta.Open(ctx, opts) // the migration, and whatever follows
	if err != nil {
		t.Fatal(err)
	}
	defer ms.Close()
	loaded, err := NewStore(ms).Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]devRow{}
	for _, r := range loaded {
		var row devRow
		if err := json.Unmarshal(r.Data, &row); err != nil || r.ProductID != "p1" {
			t.Fatalf("%s: %s %s (%v)", r.DeviceID, r.ProductID, r.Data, err)
		}
		got[r.DeviceID] = row
	}
	cleared := *want["d3"].Rules["r1"]
	cleared.Active, cleared.Sev, cleared.ClearSince, cleared.Deadline = false, 0, 0, 0 // Load's reset of a hand's clear
	wantLoaded := map[string]devRow{"d1": want["d1"], "d3": {devData: want["d3"].devData, Rules: map[string]*stateData{"r1": &cleared}}}
	if !reflect.DeepEqual(got, wantLoaded) {
		g, _ := json.Marshal(got)
		w, _ := json.Marshal(wantLoaded)
		t.Errorf("loaded after the migration:\n got %s\nwant %s", g, w)
	}
	h2 := newHarness(t, rules...)
	if err := h2.e.Restore(loaded); err != nil {
		t.Fatal(err)
	}
	if ok, _ := h2.e.Active("r1", "d1"); !ok {
		t.Error("the active alarm was not restored")
	}
	if ok, _ := h2.e.Active("r1", "d3"); ok {
		t.Error("the alarm a hand cleared came back active")
	}
	if !h2.e.NextDeadline().Equal(at(62)) {
		t.Errorf("the offline timer came back as %v", h2.e.NextDeadline())
	}
	if h2.report(0.5, "temp", 40) { // d1's latest report was at 1 s
		t.Error("a report older than the restored latest one was evaluated")
	}

	if _, err := p.DownTo(ctx, before); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM alarm_device_state d JOIN alarm_rule_state r USING (device_id)
		WHERE d.device_id = 'd1' AND r.rule_id IN ('r1', 'off') AND NOT d.data ? 'r'`).Scan(&n); err != nil || n != 2 {
		t.Errorf("down: d1's rows split into %d (%v), want 2 rule states", n, err)
	}
}
