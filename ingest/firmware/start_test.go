package firmware

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestStartStaleStatistics: a rollout whose job rows arrived after the
// statistics were taken (the planner believes there are a handful) still
// starts 10,000 devices in one statement within the store's timeout, and
// the start's plan joins no row set by a nested loop over a CTE or a
// sequential scan (10,000 x 10,000 comparisons), whatever the estimates.
func TestStartStaleStatistics(t *testing.T) {
	const n = 10_000
	ms, svc, _, r := setup(t, 10, 60)
	db := ms.DB()
	ctx := context.Background()
	// The statistics are taken while the table holds another rollout's
	// rows: this rollout's id is unknown to them (estimated 1 row).
	if _, err := svc.store.SetState(ctx, r.ID, RolloutCanceled, "", RolloutRunning); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `ANALYZE devices; ANALYZE firmware_devices`); err != nil {
		t.Fatal(err)
	}
	old := r.ID
	r.ID = NewID()
	if _, err := db.ExecContext(ctx, `INSERT INTO firmware_rollouts (id, product_id, package_id, version, target, rate_per_minute,
		timeout_seconds, retries, state) SELECT $2, product_id, package_id, version, target, rate_per_minute, timeout_seconds,
		retries, 'running' FROM firmware_rollouts WHERE id = $1`, old, r.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO devices (id, name, product_id, state, secure_id)
		SELECT 'fs-' || i, 'fs', 'fp', 'online', 'fs-' || i FROM generate_series(1, $1) i`, n); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO firmware_devices (rollout_id, device_id)
		SELECT $1, 'fs-' || i FROM generate_series(1, $2) i`, r.ID, n); err != nil {
		t.Fatal(err)
	}

	var plan string
	if err := db.GetContext(ctx, &plan, `EXPLAIN (FORMAT JSON) `+startSQL, r.ID, false, n, 60); err != nil {
		t.Fatal(err)
	}
	var nodes []map[string]any
	if err := json.Unmarshal([]byte(plan), &nodes); err != nil {
		t.Fatal(err)
	}
	top := nodes[0]["Plan"].(map[string]any)
	if bad := quadratic(top); bad != "" {
		t.Fatalf("the start's plan %s:\n%s", bad, plan)
	}
	// The UPDATE fetches its rows by address, not by filtering a scan
	// with a list (n x n again).
	if bad := updateScan(top); bad != "Tid Scan" {
		bad = "reads the updated rows by a " + bad + ", not a Tid Scan"
		t.Fatalf("the start's plan %s:\n%s", bad, plan)
	}
	if testing.Verbose() {
		var lines []string
		tx, _ := db.BeginTxx(ctx, nil)
		_ = tx.SelectContext(ctx, &lines, `EXPLAIN ANALYZE `+startSQL, r.ID, false, n, 60)
		_ = tx.Rollback()
		t.Log(strings.Join(lines, "\n"))
	}

	svc.store.timeout = 30 * time.Second // the plan checks above are the rule; this bounds a loaded machine
	epoch, err := svc.store.Claim(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out, err := svc.store.start(ctx, epoch, r, false, n)
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != n {
		t.Fatalf("started %d of %d", len(out), n)
	}
}

// quadratic names a Nested Loop whose inner side scans a CTE or a whole
// table (each outer row compared with every inner one), "" when none.
func quadratic(p map[string]any) string {
	kids, _ := p["Plans"].([]any)
	if p["Node Type"] == "Nested Loop" && len(kids) == 2 {
		inner := kids[1].(map[string]any)
		for inner["Node Type"] == "Materialize" || inner["Node Type"] == "Hash" {
			k, _ := inner["Plans"].([]any)
			if len(k) == 0 {
				break
			}
			inner = k[0].(map[string]any)
		}
		if nt := inner["Node Type"]; nt == "CTE Scan" || nt == "Seq Scan" {
			return fmt.Sprintf("has a Nested Loop over a %s (%v)", nt, inner["Relation Name"])
		}
	}
	for _, k := range kids {
		if s := quadratic(k.(map[string]any)); s != "" {
			return s
		}
	}
	return ""
}

// updateScan is the node type under the ModifyTable node (the UPDATE's
// own scan).
func updateScan(p map[string]any) string {
	if p["Node Type"] == "ModifyTable" {
		for _, k := range p["Plans"].([]any) {
			m := k.(map[string]any)
			if m["Parent Relationship"] == "Outer" || m["Parent Relationship"] == "Member" {
				return fmt.Sprint(m["Node Type"])
			}
		}
	}
	return fmt.Sprint(p["Node Type"])
}
