package meta_test

import (
	"context"
	"database/sql"
	"fmt"
	"io/fs"
	"testing"
	"time"

	"github.com/pressly/goose/v3"

	"devicehub/meta"
	"devicehub/meta/metatest"
	"devicehub/schema"
)

// checkDeviceTotals compares the device list's total, for every
// combination of a state and a product term (or none), with a count of
// the devices: exact (totalExact) although ExactTotalLimit is 1, and the
// page the one the total implies.
func checkDeviceTotals(t *testing.T, s *meta.Store, step string, products ...string) {
	t.Helper()
	ctx := context.Background()
	if err := s.SyncLists(ctx); err != nil {
		t.Fatal(err)
	}
	for _, state := range []string{"", meta.StateOnline, meta.StateOffline, meta.StateNotActive} {
		for _, product := range append([]string{""}, products...) {
			var terms []meta.Term
			where, args := "true", []any{}
			if product != "" {
				terms = append(terms, meta.Term{Column: "productId", Value: []byte(fmt.Sprintf("%q", product))})
				args = append(args, product)
				where += fmt.Sprintf(" AND product_id = $%d", len(args))
			}
			if state != "" {
				terms = append(terms, meta.Term{Column: "state", Value: []byte(fmt.Sprintf("%q", state))})
				args = append(args, state)
				where += fmt.Sprintf(" AND state = $%d", len(args))
			}
			var want int
			if err := s.DB().QueryRow("SELECT count(*) FROM devices WHERE "+where, args...).Scan(&want); err != nil {
				t.Fatal(err)
			}
			// A page past the end: the last page.
			page, err := s.QueryDevices(ctx, &meta.Query{PageSize: 2, PageIndex: 100_000, Terms: terms})
			if err != nil {
				t.Fatalf("%s: state %q product %q: %v", step, state, product, err)
			}
			wantItems, wantIndex := 0, 0
			if want > 0 {
				wantIndex = (want - 1) / 2
				wantItems = want - wantIndex*2
			}
			if page.Total != want || !page.TotalExact || len(page.Data) != wantItems || page.PageIndex != wantIndex {
				t.Errorf("%s: state %q product %q: total %d (exact %v), page %d with %d items; want %d devices, page %d with %d",
					step, state, product, page.Total, page.TotalExact, page.PageIndex, len(page.Data), want, wantIndex, wantItems)
			}
			for _, d := range page.Data {
				if state != "" && string(d.State) != state || product != "" && d.ProductID != product {
					t.Errorf("%s: state %q product %q: listed %s (%s, %s)", step, state, product, d.ID, d.State, d.ProductID)
				}
			}
		}
	}
}

// The device list's totals by state and product are read from the
// product counts (schema 00015), kept by every kind of write: creation,
// deploy, births and wills, undeploy, delete, a move to another product
// and SQL written past the store.
func TestDeviceTotalsByState(t *testing.T) {
	t.Parallel()
	s := openListStore(t, 1, 0)
	ctx := context.Background()
	createTestProduct(t, s, "p1", true)
	createTestProduct(t, s, "p2", true)
	for i := range 8 {
		createTestDevice(t, s, fmt.Sprintf("d%d", i), []string{"p1", "p2"}[i%2])
	}
	checkDeviceTotals(t, s, "created", "p1", "p2", "p3")
	for i := range 7 {
		deployTestDevice(t, s, fmt.Sprintf("d%d", i))
	}
	checkDeviceTotals(t, s, "deployed", "p1", "p2")

	at := time.Now()
	changes := []meta.StateChange{
		{DeviceID: "d0", Online: true, At: at}, {DeviceID: "d1", Online: true, At: at},
		{DeviceID: "d2", Online: true, At: at}, {DeviceID: "d4", Online: true, At: at},
		{DeviceID: "d7", Online: true, At: at},                    // notActive: left alone
		{DeviceID: "d4", Online: false, At: at.Add(-time.Second)}, // older: d4 stays online
	}
	if _, err := s.ApplyStateChanges(ctx, changes); err != nil {
		t.Fatal(err)
	}
	checkDeviceTotals(t, s, "births", "p1", "p2")
	if _, err := s.ApplyStateChanges(ctx, []meta.StateChange{{DeviceID: "d0", At: at.Add(time.Second)},
		{DeviceID: "d2", Online: true, At: at.Add(time.Second)}}); err != nil {
		t.Fatal(err)
	}
	checkDeviceTotals(t, s, "a will and a repeated birth", "p1", "p2")

	if _, err := s.UndeployDevice(ctx, "d2", lcAdmin); err != nil {
		t.Fatal(err)
	}
	if _, err := s.DeleteDevice(ctx, "d2"); err != nil {
		t.Fatal(err)
	}
	checkDeviceTotals(t, s, "undeployed and deleted", "p1", "p2")

	listExec(t, s, `UPDATE devices SET product_id = 'p2' WHERE id IN ('d4', 'd5')`)
	checkDeviceTotals(t, s, "moved", "p1", "p2")
	listExec(t, s, `INSERT INTO products (id, name, device_type) VALUES ('p3', 'P3', 'device')`)
	listExec(t, s, `INSERT INTO devices (id, name, product_id, state, secure_id)
		SELECT 'bulk' || i, 'Bulk ' || i, (ARRAY['p1', 'p3'])[i % 2 + 1], (ARRAY['online', 'offline', 'notActive'])[i % 3 + 1], 'bulk' || i
		FROM generate_series(1, 30) AS i`)
	checkDeviceTotals(t, s, "inserted in bulk", "p1", "p2", "p3")
	listExec(t, s, `UPDATE devices SET state = 'offline' WHERE state = 'online' AND product_id = 'p3'`)
	checkDeviceTotals(t, s, "updated in bulk", "p1", "p2", "p3")
	listExec(t, s, `DELETE FROM devices WHERE product_id = 'p1'`)
	checkDeviceTotals(t, s, "deleted in bulk", "p1", "p2", "p3")
	listExec(t, s, `TRUNCATE devices CASCADE`)
	checkDeviceTotals(t, s, "truncated", "p1", "p2", "p3")

	// A state no device is given is looked for in the devices, not the
	// counts: one written by hand is found.
	listExec(t, s, `INSERT INTO devices (id, name, product_id, state, secure_id) VALUES ('odd', 'Odd', 'p2', 'broken', 'odd')`)
	page, err := s.QueryDevices(ctx, &meta.Query{Terms: []meta.Term{{Column: "state", Value: []byte(`"broken"`)}}})
	if err != nil {
		t.Fatal(err)
	}
	if page.Total != 1 || !page.TotalExact || len(page.Data) != 1 {
		t.Errorf("state broken: total %d (exact %v), %d items; want the one device", page.Total, page.TotalExact, len(page.Data))
	}
}

// Migration 00015 keeps every device row as it was, counts the states of
// the devices already there, and makes state changes HOT-eligible (no
// index on state); its Down puts the index back.
func TestMigrateDevicePresence(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := metatest.NewDatabase(t)
	opts := meta.DefaultOptions()
	opts.DSN = dsn
	sub, err := fs.Sub(schema.Postgres, "postgres")
	if err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("postgres", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	p, err := goose.NewProvider(goose.DialectPostgres, db, sub)
	if err != nil {
		t.Fatal(err)
	}
	const before = 11 // the last migration before 00015 on this branch
	if _, err := p.UpTo(ctx, before); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`INSERT INTO products (id, name, device_type) VALUES ('p1', 'P1', 'device'), ('p2', 'P2', 'device'), ('p3', 'P3', 'device')`,
		`INSERT INTO devices (id, name, product_id, state, secure_id, online_time)
			SELECT 'd' || i, 'Device ' || i, (ARRAY['p1', 'p2'])[i % 2 + 1],
				(ARRAY['online', 'offline', 'notActive', 'online'])[i % 4 + 1], 'd' || i, now() - make_interval(secs => i)
			FROM generate_series(1, 200) AS i`,
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("%.60s: %v", q, err)
		}
	}
	const rowsDigest = `SELECT md5(string_agg(d::text, '|' ORDER BY id)) FROM devices d`
	var digest, after string
	if err := db.QueryRowContext(ctx, rowsDigest).Scan(&digest); err != nil {
		t.Fatal(err)
	}

	s, err := meta.Open(ctx, opts) // applies 00015 (and whatever follows)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := db.QueryRowContext(ctx, rowsDigest).Scan(&after); err != nil {
		t.Fatal(err)
	}
	if after != digest {
		t.Errorf("the device rows changed in the migration")
	}
	var stateIndexes int
	var reloptions string
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM pg_indexes WHERE tablename = 'devices' AND indexdef LIKE '%(state)%'`).Scan(&stateIndexes); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRowContext(ctx, `SELECT array_to_string(reloptions, ',') FROM pg_class WHERE relname = 'devices'`).Scan(&reloptions); err != nil {
		t.Fatal(err)
	}
	if stateIndexes != 0 || reloptions != "fillfactor=85" {
		t.Errorf("devices: %d indexes on state, options %q; want none, fillfactor=85", stateIndexes, reloptions)
	}
	checkDeviceTotals(t, s, "migrated", "p1", "p2", "p3")

	// What ingest changes on a birth or a will (state, online_time,
	// offline_time, address) is in no index: updating it is a HOT update
	// where the page has room, as on the pages written since (fillfactor).
	if _, err := db.ExecContext(ctx, `INSERT INTO devices (id, name, product_id, state, secure_id) VALUES ('new', 'New', 'p1', 'offline', 'new')`); err != nil {
		t.Fatal(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, `UPDATE devices SET state = 'online', online_time = now(), offline_time = now(), address = '127.0.0.1:1' WHERE id = 'new'`); err != nil {
		t.Fatal(err)
	}
	var upd, hot int
	if err := tx.QueryRowContext(ctx, `SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables WHERE relname = 'devices'`).Scan(&upd, &hot); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if upd != 1 || hot != 1 {
		t.Errorf("a state change: %d updates, %d of them HOT; want 1 HOT", upd, hot)
	}
	if _, err := s.ApplyStateChanges(ctx, []meta.StateChange{{DeviceID: "d2", Online: true, At: time.Now()}}); err != nil {
		t.Fatal(err)
	}
	checkDeviceTotals(t, s, "a birth after the migration", "p1", "p2")

	if _, err := p.DownTo(ctx, before); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM pg_indexes WHERE tablename = 'devices' AND indexname = 'devices_state'`).Scan(&stateIndexes); err != nil {
		t.Fatal(err)
	}
	if stateIndexes != 1 {
		t.Errorf("down: %d devices_state indexes, want 1", stateIndexes)
	}
}
