package alarm

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lib/pq"
)

// TestStoreSetwise: Write (a bounded number of statements per batch)
// leaves exactly what the statements one transition at a time left
// (stepwiseWrite, the writer before it, kept here as the reference):
// the same records, transition rows per record, outbox rows per record
// in the same order with the same payloads, notify_active and
// notify_quiet rows, and the same WriteResult, over random batches
// (raises, repeats, escalations, de-escalations and clears of any
// alarm in any order, active or not) with clears and acknowledgements
// by hand between them.
func TestStoreSetwise(t *testing.T) {
	ctx := context.Background()
	set, step := writerStore(t), writerStore(t)
	for _, s := range []*Store{set, step} {
		// Three subscriptions: every kind; a rule, a severity floor and an
		// escalation chain (notify_active); a quiet time (notify_quiet).
		_, err := s.db.Exec(`INSERT INTO notify_subscriptions (id, name, products, rules, min_severity, kinds, channels, escalate_ms, quiet_ms) VALUES
			('s1', 's1', '{p1}', '{}', 1, '{raised,escalated,deescalated,cleared,acknowledged}', '{c1}', '{}', 0),
			('s2', 's2', '{p1}', '{r1}', 4, '{raised,cleared}', '{c1,c2}', '{60000}', 0),
			('s3', 's3', '{p1}', '{}', 1, '{raised,escalated}', '{c2}', '{}', 3600000)`)
		if err != nil {
			t.Fatal(err)
		}
	}
	eSet, _ := set.Claim(ctx)
	eStep, _ := step.Claim(ctx)
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 7))
	t.Logf("seed %d", seed)
	keys := []HandClear{{RuleID: "r1", DeviceID: "d1"}, {RuleID: "r1", DeviceID: "d2"}, {RuleID: "r2", DeviceID: "d1"}, {RuleID: "r2", DeviceID: "d3"}}
	sevs := []string{"warning", "minor", "major", "critical"}
	sec := 0.0
	for batch := range 150 {
		var trs []Transition
		for range rng.IntN(12) {
			k := keys[rng.IntN(len(keys))]
			var kind string
			switch x := rng.IntN(20); {
			case x < 9:
				kind = KindRepeated
			case x < 13:
				kind = KindRaised
			case x < 15:
				kind = KindEscalated
			case x < 16:
				kind = KindDeescalated
			default:
				kind = KindCleared
			}
			sec += float64(rng.IntN(3)) / 2 // times may repeat
			trs = append(trs, tr(kind, k.RuleID, k.DeviceID, sevs[rng.IntN(len(sevs))], fmt.Sprintf("v%d", rng.IntN(1000)), sec))
		}
		var before int64
		if err := step.db.Get(&before, "SELECT coalesce(max(id), 0) FROM alarm_transitions"); err != nil {
			t.Fatal(err)
		}
		want, err := stepwiseWrite(ctx, step, eStep, slices.Clone(trs), nil)
		if err != nil {
			t.Fatal(err)
		}
		got, err := set.Write(ctx, eSet, slices.Clone(trs), nil)
		if err != nil {
			t.Fatal(err)
		}
		// Written: the transitions the one-at-a-time writer stored, in
		// the order it stored them (what the live feed announces).
		var stored []string
		if err := step.db.Select(&stored, `SELECT t.kind || ' ' || r.rule_id || ' ' || r.device_id || ' ' || t.severity || ' ' || t.value
			FROM alarm_transitions t JOIN alarm_records r ON r.id = t.record_id WHERE t.id > $1 ORDER BY t.id`, before); err != nil {
			t.Fatal(err)
		}
		var written []string
		for _, w := range got.Written {
			written = append(written, w.Kind+" "+w.RuleID+" "+w.DeviceID+" "+w.Severity+" "+w.Value)
		}
		if !slices.Equal(written, stored) {
			t.Fatalf("batch %d %v: Written %q, the one-at-a-time writer stored %q", batch, trs, written, stored)
		}
		got.Written = nil
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("batch %d %v: WriteResult %+v, one at a time %+v", batch, trs, got, want)
		}
		// By hand, the same in both: a clear, an acknowledgement.
		for range rng.IntN(3) {
			k := keys[rng.IntN(len(keys))]
			clear := rng.IntN(2) == 0
			for _, s := range []*Store{set, step} {
				var id int64
				err := s.db.Get(&id, "SELECT id FROM alarm_records WHERE rule_id = $1 AND device_id = $2 AND state = 'active'", k.RuleID, k.DeviceID)
				if errors.Is(err, sql.ErrNoRows) {
					continue
				}
				if err != nil {
					t.Fatal(err)
				}
				if clear {
					_, err = s.ClearByHand(ctx, id, Actor{ID: "u1", Name: "bob"}, "by hand")
				} else {
					_, err = s.Ack(ctx, id, Actor{ID: "u1", Name: "bob"}, "seen")
				}
				if err != nil {
					t.Fatal(err)
				}
			}
		}
		if a, b := dumpAlarms(t, set), dumpAlarms(t, step); a != b {
			t.Fatalf("batch %d %v: set-wise\n%s\none at a time\n%s", batch, trs, a, b)
		}
	}
	var n int
	if err := set.db.Get(&n, "SELECT count(*) FROM notify_outbox"); err != nil || n == 0 {
		t.Fatalf("%d outbox rows (%v): the comparison compared nothing", n, err)
	}
}

// dumpAlarms writes what a store holds of alarms and their notifications
// with each record named by its (rule, device) and its rank among them,
// each transition by its rank within its record (ids differ between
// stores written in another order), the times a hand's now() set left out.
func dumpAlarms(t *testing.T, s *Store) string {
	t.Helper()
	var b strings.Builder
	var recs []Record
	if err := s.db.Select(&recs, "SELECT "+recordColumns+" FROM alarm_records a ORDER BY a.id"); err != nil {
		t.Fatal(err)
	}
	name := map[int64]string{}
	rank := map[string]int{}
	for _, r := range recs {
		k := r.RuleID + "/" + r.DeviceID
		name[r.ID] = fmt.Sprintf("%s#%d", k, rank[k])
		rank[k]++
	}
	byName := func(id int64) string { return name[id] }
	sortedRecs := append([]Record(nil), recs...)
	slicesSortBy(sortedRecs, func(r Record) string { return byName(r.ID) })
	for _, r := range sortedRecs {
		cleared := ""
		if r.ClearedBy == "" && r.ClearedTime != nil {
			cleared = r.ClearedTime.UTC().String()
		}
		fmt.Fprintf(&b, "record %s %s %s count=%d first=%s last=%s raised=%s lastTime=%s cleared=%s by=%s value=%s acked=%v by=%s %s\n",
			byName(r.ID), r.State, r.Severity, r.Count, r.FirstValue, r.LastValue, r.RaisedTime.UTC(), r.LastTime.UTC(),
			cleared, r.ClearedBy, r.ClearValue, r.Acked, r.AckedBy, r.AckComment)
	}
	var trs []TransitionRow
	if err := s.db.Select(&trs, "SELECT id, record_id, time, kind, severity, value, user_id, username, comment FROM alarm_transitions ORDER BY id"); err != nil {
		t.Fatal(err)
	}
	trank := map[int64]string{}
	perRec := map[string][]string{}
	for _, x := range trs {
		n := byName(x.RecordID)
		trank[x.ID] = fmt.Sprintf("%s.t%d", n, len(perRec[n]))
		tm := x.Time.UTC().String()
		if x.UserID != "" {
			tm = "now"
		}
		perRec[n] = append(perRec[n], fmt.Sprintf("%s %s %s %s %s %s %s", tm, x.Kind, x.Severity, x.Value, x.UserID, x.Username, x.Comment))
	}
	var outbox []struct {
		ID      int64  `db:"id"`
		Record  int64  `db:"record_id"`
		Sub     string `db:"subscription_id"`
		Channel string `db:"channel_id"`
		Step    string `db:"step"`
		Kind    string `db:"kind"`
		Payload []byte `db:"payload"`
	}
	if err := s.db.Select(&outbox, "SELECT id, record_id, subscription_id, channel_id, step, kind, payload FROM notify_outbox ORDER BY id"); err != nil {
		t.Fatal(err)
	}
	for _, o := range outbox {
		n := byName(o.Record)
		step := o.Step
		if id, ok := strings.CutPrefix(step, "t"); ok {
			var tid int64
			fmt.Sscan(id, &tid)
			step = trank[tid]
		}
		var p map[string]any
		if err := json.Unmarshal(o.Payload, &p); err != nil {
			t.Fatal(err)
		}
		delete(p, "recordId")
		delete(p, "transitionId")
		if p["username"] != "" {
			delete(p, "time")
		}
		pj, _ := json.Marshal(p)
		perRec[n] = append(perRec[n], fmt.Sprintf("outbox %s %s %s %s %s", o.Sub, o.Channel, step, o.Kind, pj))
	}
	var active []struct {
		Record int64  `db:"record_id"`
		Sub    string `db:"subscription_id"`
	}
	if err := s.db.Select(&active, "SELECT record_id, subscription_id FROM notify_active ORDER BY record_id, subscription_id"); err != nil {
		t.Fatal(err)
	}
	for _, a := range active {
		n := byName(a.Record)
		perRec[n] = append(perRec[n], "notify_active "+a.Sub)
	}
	names := make([]string, 0, len(perRec))
	for n := range perRec {
		names = append(names, n)
	}
	slicesSortBy(names, func(s string) string { return s })
	for _, n := range names {
		fmt.Fprintf(&b, "%s:\n  %s\n", n, strings.Join(perRec[n], "\n  "))
	}
	var quiet []string
	if err := s.db.Select(&quiet, "SELECT subscription_id || ' ' || rule_id || ' ' || device_id FROM notify_quiet ORDER BY 1"); err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(&b, "quiet %q\n", quiet)
	return b.String()
}

// TestStoreWriteLocks: the active records a batch changes are locked
// from the start of its write (the plan is decided on which are active):
// a hand's clear of one waits for the batch (here: gives up after its
// lock_timeout) rather than slip in and fail the write.
func TestStoreWriteLocks(t *testing.T) {
	s := writerStore(t)
	ctx := context.Background()
	epoch, _ := s.Claim(ctx)
	if _, err := s.Write(ctx, epoch, []Transition{tr(KindRaised, "r1", "d1", "major", "v1", 1)}, nil); err != nil {
		t.Fatal(err)
	}
	var handErr error
	s.afterLock = func() {
		tx, err := s.db.Begin()
		if err != nil {
			t.Error(err)
			return
		}
		defer func() { _ = tx.Rollback() }()
		if _, err := tx.Exec("SET LOCAL lock_timeout = '200ms'"); err != nil {
			t.Error(err)
			return
		}
		_, handErr = tx.Exec("UPDATE alarm_records SET state = 'cleared', cleared_by = 'bob' WHERE rule_id = 'r1' AND device_id = 'd1' AND state = 'active'")
		if handErr == nil {
			handErr = tx.Commit()
		}
	}
	if _, err := s.Write(ctx, epoch, []Transition{tr(KindEscalated, "r1", "d1", "critical", "v2", 2)}, nil); err != nil {
		t.Fatalf("the batch's write: %v", err)
	}
	var pe *pq.Error
	if !errors.As(handErr, &pe) || pe.Code != "55P03" {
		t.Errorf("a clear by hand during the write: %v, want it to wait for the lock", handErr)
	}
	if recs := records(t, s, ctx); len(recs) != 1 || recs[0].State != StateActive || recs[0].Severity != "critical" {
		t.Errorf("records %+v", recs)
	}
}

func slicesSortBy[T any](s []T, key func(T) string) {
	slices.SortStableFunc(s, func(a, b T) int { return strings.Compare(key(a), key(b)) })
}

// stepwiseWrite is Write as it was before it wrote set-wise: statements
// one transition at a time, the epoch and the rules' locks each in a
// statement of its own (the state rows as Write writes them).
func stepwiseWrite(ctx context.Context, s *Store, epoch int64, trs []Transition, devs []DeviceRow) (WriteResult, error) {
	stx, err := s.db.BeginTxx(ctx, nil)
	if err != nil {
		return WriteResult{}, err
	}
	defer func() { _ = stx.Rollback() }()
	tx := writeTx{stx, s}
	var cur int64
	if err := tx.GetContext(ctx, &cur, "SELECT epoch FROM alarm_owner WHERE id = 1 FOR SHARE"); err != nil {
		return WriteResult{}, err
	}
	if cur != epoch {
		return WriteResult{}, ErrNotOwner
	}
	if trs, err = stepwiseLiveRules(ctx, tx, trs); err != nil {
		return WriteResult{}, err
	}
	res, err := stepwiseTransitions(ctx, tx, trs)
	if err != nil {
		return WriteResult{}, err
	}
	if err := writeState(ctx, tx, devs); err != nil {
		return WriteResult{}, err
	}
	return res, stx.Commit()
}

func stepwiseLiveRules(ctx context.Context, tx writeTx, trs []Transition) ([]Transition, error) {
	if len(trs) == 0 {
		return trs, nil
	}
	seen := map[string]bool{}
	var ids []string
	for _, t := range trs {
		if !seen[t.RuleID] {
			seen[t.RuleID] = true
			ids = append(ids, t.RuleID)
		}
	}
	slices.Sort(ids)
	var live []string
	if err := tx.SelectContext(ctx, &live, "SELECT id FROM alarm_rules WHERE id = ANY($1) AND enabled ORDER BY id FOR SHARE", pq.StringArray(ids)); err != nil {
		return nil, err
	}
	ok := make(map[string]bool, len(live))
	for _, id := range live {
		ok[id] = true
	}
	return slices.DeleteFunc(trs, func(t Transition) bool { return !ok[t.RuleID] }), nil
}

// BenchmarkStoreWrite: Write and stepwiseWrite, alternately, each on its
// own database, of the same batches: 2,000 devices' rows (a rule state
// in each), 2% of them raising (even batches) or clearing (odd ones)
// an alarm, 10% repeating another's; an outbox subscription hears every
// raise and clear. It reports each one's milliseconds and statements per
// batch; "alarms" writes the same batches without the state rows.
func BenchmarkStoreWrite(b *testing.B) {
	b.Run("batch", func(b *testing.B) { benchStoreWrite(b, true) })
	b.Run("alarms", func(b *testing.B) { benchStoreWrite(b, false) })
}

func benchStoreWrite(b *testing.B, withState bool) {
	const devices = 2000
	ctx := context.Background()
	set, step := writerStore(b), writerStore(b)
	for _, s := range []*Store{set, step} {
		if _, err := s.db.Exec(`INSERT INTO notify_subscriptions (id, name, products, kinds, channels) VALUES ('s1', 's1', '{p1}', '{raised,cleared}', '{c1}')`); err != nil {
			b.Fatal(err)
		}
	}
	eSet, _ := set.Claim(ctx)
	eStep, _ := step.Claim(ctx)
	batch := func(i int) ([]Transition, []DeviceRow) {
		var trs []Transition
		devs := make([]DeviceRow, devices)
		for d := range devices {
			dev := fmt.Sprintf("d%05d", d)
			switch {
			case d%50 == 0 && i%2 == 0:
				trs = append(trs, tr(KindRaised, "r1", dev, "major", "temp=85", float64(i)))
			case d%50 == 0:
				trs = append(trs, tr(KindCleared, "r1", dev, "major", "temp=20", float64(i)))
			case d%10 == 1:
				if i == 0 {
					trs = append(trs, tr(KindRaised, "r2", dev, "major", "limit=190", float64(i)))
				} else {
					trs = append(trs, tr(KindRepeated, "r2", dev, "major", "limit=190", float64(i)))
				}
			}
			devs[d] = DeviceRow{DeviceID: dev, ProductID: "p1", Data: []byte(fmt.Sprintf(`{"t":%d,"k":["h0123456789abcdef"],"p":{"temp":{"c":{"n":20.5},"t":%d}},"r":{"r3":{"d":%d,"l":%d}}}`, i, i, i+3600000, i))}
		}
		if !withState {
			return trs, nil
		}
		return trs, devs
	}
	var tSet, tStep time.Duration
	var nSet, nStep uint64
	i := 0
	for b.Loop() {
		trs, devs := batch(i)
		i++
		s0, t0 := step.statements.Load(), time.Now()
		if _, err := stepwiseWrite(ctx, step, eStep, slices.Clone(trs), devs); err != nil {
			b.Fatal(err)
		}
		tStep += time.Since(t0)
		nStep += step.statements.Load() - s0
		s0, t0 = set.statements.Load(), time.Now()
		if _, err := set.Write(ctx, eSet, slices.Clone(trs), devs); err != nil {
			b.Fatal(err)
		}
		tSet += time.Since(t0)
		nSet += set.statements.Load() - s0
	}
	b.ReportMetric(float64(tSet.Milliseconds())/float64(i), "setwise-ms/batch")
	b.ReportMetric(float64(tStep.Milliseconds())/float64(i), "stepwise-ms/batch")
	b.ReportMetric(float64(nSet)/float64(i), "setwise-stmts/batch")
	b.ReportMetric(float64(nStep)/float64(i), "stepwise-stmts/batch")
}

// stepwiseTransitions applies trs in order per (rule, device). Repeats are
// the bulk of a batch (every report meeting an active alarm's trigger):
// those of one alarm fold into one (count + n, the last value and time),
// and all of a batch's are written by one statement at the end, or before
// another transition of the same alarm.
func stepwiseTransitions(ctx context.Context, tx writeTx, trs []Transition) (WriteResult, error) {
	var res WriteResult
	lost := map[HandClear]bool{}
	pending := map[HandClear]*stepRepeats{}
	var order []HandClear
	flush := func(keys []HandClear) error {
		var batch []*stepRepeats
		for _, k := range keys {
			if r := pending[k]; r != nil {
				batch = append(batch, r)
				delete(pending, k)
			}
		}
		gone, err := stepwiseRepeatRecords(ctx, tx, batch)
		if err != nil {
			return err
		}
		for _, r := range gone {
			// A hand cleared it: the trigger met again is a new alarm.
			first := r.first
			first.Kind = KindRaised
			if err := stepwiseRaiseRecord(ctx, tx, first); err != nil {
				return err
			}
			if r.n > 1 {
				if _, err := stepwiseRepeatRecord(ctx, tx, r.last, r.n-1); err != nil {
					return err
				}
			}
			res.Reraised = append(res.Reraised, HandClear{RuleID: first.RuleID, DeviceID: first.DeviceID, RaisedAt: first.At})
		}
		return nil
	}
	for _, t := range trs {
		k := HandClear{RuleID: t.RuleID, DeviceID: t.DeviceID}
		if t.Kind == KindRepeated {
			if lost[k] {
				continue
			}
			if r := pending[k]; r != nil {
				r.n, r.last = r.n+1, t
			} else {
				pending[k] = &stepRepeats{first: t, last: t, n: 1}
				order = append(order, k)
			}
			continue
		}
		if err := flush([]HandClear{k}); err != nil {
			return res, err
		}
		switch t.Kind {
		case KindRaised:
			delete(lost, k)
			if err := stepwiseRaiseRecord(ctx, tx, t); err != nil {
				return res, err
			}
		case KindEscalated, KindDeescalated, KindCleared:
			if lost[k] {
				continue
			}
			q := `UPDATE alarm_records SET severity = $3, last_time = greatest(last_time, $4) WHERE rule_id = $1 AND device_id = $2 AND state = 'active' RETURNING id`
			args := []any{t.RuleID, t.DeviceID, t.Severity, t.At}
			if t.Kind == KindCleared {
				args = []any{t.RuleID, t.DeviceID, t.At, t.Value}
				q = `UPDATE alarm_records SET state = 'cleared', cleared_time = $3, clear_value = $4 WHERE rule_id = $1 AND device_id = $2 AND state = 'active' RETURNING id`
			}
			var id int64
			err := tx.GetContext(ctx, &id, q, args...)
			if errors.Is(err, sql.ErrNoRows) {
				lost[k] = true
				res.Gone = append(res.Gone, k)
				continue
			}
			if err != nil {
				return res, fmt.Errorf("alarm: %s: %w", t.Kind, err)
			}
			if err := stepwiseInsertTransition(ctx, tx, id, t); err != nil {
				return res, err
			}
		}
	}
	if err := flush(order); err != nil {
		return res, err
	}
	return res, nil
}

// stepRepeats are n repeats of one alarm in a batch.
type stepRepeats struct {
	first, last Transition
	n           int
}

// repeatRecords adds each batch entry's repeats to its active record in
// one statement, and returns those that found none (cleared by hand).
func stepwiseRepeatRecords(ctx context.Context, tx writeTx, batch []*stepRepeats) ([]*stepRepeats, error) {
	if len(batch) == 0 {
		return nil, nil
	}
	rules, devs, vals := make([]string, len(batch)), make([]string, len(batch)), make([]string, len(batch))
	ns, ats := make([]int64, len(batch)), make([]string, len(batch))
	for i, r := range batch {
		rules[i], devs[i], vals[i] = r.last.RuleID, r.last.DeviceID, r.last.Value
		ns[i], ats[i] = int64(r.n), r.last.At.UTC().Format(time.RFC3339Nano)
	}
	var done []struct {
		Rule   string `db:"rule_id"`
		Device string `db:"device_id"`
	}
	err := tx.SelectContext(ctx, &done, `UPDATE alarm_records a SET count = a.count + x.n, last_value = x.v, last_time = greatest(a.last_time, x.t)
		FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[], $5::timestamptz[]) AS x(r, d, n, v, t)
		WHERE a.rule_id = x.r AND a.device_id = x.d AND a.state = 'active'
		RETURNING a.rule_id, a.device_id`, pq.StringArray(rules), pq.StringArray(devs), pq.Int64Array(ns), pq.StringArray(vals), pq.StringArray(ats))
	if err != nil {
		return nil, fmt.Errorf("alarm: repeats: %w", err)
	}
	found := make(map[HandClear]bool, len(done))
	for _, d := range done {
		found[HandClear{RuleID: d.Rule, DeviceID: d.Device}] = true
	}
	var gone []*stepRepeats
	for _, r := range batch {
		if !found[HandClear{RuleID: r.last.RuleID, DeviceID: r.last.DeviceID}] {
			gone = append(gone, r)
		}
	}
	return gone, nil
}

// raiseRecord inserts a new active record, or (one is active already: the
// state was lost or rebuilt) counts a repeat of it: one alarm either way.
func stepwiseRaiseRecord(ctx context.Context, tx writeTx, t Transition) error {
	var id int64
	err := tx.GetContext(ctx, &id, `INSERT INTO alarm_records (rule_id, rule_name, product_id, device_id, severity, state,
		count, first_value, last_value, raised_time, last_time)
		VALUES ($1, $2, $3, $4, $5, 'active', 1, $6, $6, $7, $7)
		ON CONFLICT (rule_id, device_id) WHERE state = 'active' DO NOTHING RETURNING id`,
		t.RuleID, t.RuleName, t.ProductID, t.DeviceID, t.Severity, t.Value, t.At)
	if errors.Is(err, sql.ErrNoRows) {
		_, err := stepwiseRepeatRecord(ctx, tx, t, 1)
		return err
	}
	if err != nil {
		return fmt.Errorf("alarm: raise: %w", err)
	}
	t.Kind = KindRaised
	return stepwiseInsertTransition(ctx, tx, id, t)
}

func stepwiseRepeatRecord(ctx context.Context, tx writeTx, t Transition, n int) (bool, error) {
	res, err := tx.ExecContext(ctx, `UPDATE alarm_records SET count = count + $3, last_value = $4, last_time = greatest(last_time, $5)
		WHERE rule_id = $1 AND device_id = $2 AND state = 'active'`, t.RuleID, t.DeviceID, n, t.Value, t.At)
	if err != nil {
		return false, fmt.Errorf("alarm: repeat: %w", err)
	}
	k, _ := res.RowsAffected()
	return k == 1, nil
}

func stepwiseInsertTransition(ctx context.Context, tx writeTx, record int64, t Transition) error {
	_, err := tx.ExecContext(ctx, `INSERT INTO alarm_transitions (record_id, time, kind, severity, value) VALUES ($1, $2, $3, $4, $5)`,
		record, t.At, t.Kind, t.Severity, t.Value)
	if err != nil {
		return fmt.Errorf("alarm: transition: %w", err)
	}
	return nil
}
