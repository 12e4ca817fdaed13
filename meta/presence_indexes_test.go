package meta_test

import (
	"context"
	"testing"

	"devicehub/meta"
	"devicehub/meta/metatest"
)

// TestMigratePresenceIndexes: the presence-indexes migration drops
// devices_name, which no list reads (the name sort has its natural index,
// eq on name the trigram one), keeps the device rows, and its Down puts
// the index back. Name equality still finds its devices through the
// indexes left.
func TestMigratePresenceIndexes(t *testing.T) {
	ctx := context.Background()
	m := metatest.Migrations(t, "_presence_indexes.sql")
	db, p, dsn, before := m.DB, m.Provider, m.DSN, m.Before
	if _, err := p.UpTo(ctx, before); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`INSERT INTO products (id, name, device_type) VALUES ('p1', 'P1', 'device')`,
		`INSERT INTO devices (id, name, product_id, state, secure_id)
			SELECT 'd' || i, 'Device ' || (i % 50), 'p1', (ARRAY['online', 'offline', 'notActive'])[i % 3 + 1], 'd' || i
			FROM generate_series(1, 300) AS i`,
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("%.60s: %v", q, err)
		}
	}
	hasIndex := func() bool {
		var n int
		if err := db.QueryRowContext(ctx, `SELECT count(*) FROM pg_indexes WHERE tablename = 'devices' AND indexname = 'devices_name'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 1
	}
	if !hasIndex() {
		t.Fatal("before the migration: no devices_name")
	}
	const rowsDigest = `SELECT md5(string_agg(d::text, '|' ORDER BY id)) FROM devices d`
	var digest, after string
	if err := db.QueryRowContext(ctx, rowsDigest).Scan(&digest); err != nil {
		t.Fatal(err)
	}
	opts := meta.DefaultOptions()
	opts.DSN = dsn
	s, err := meta.Open(ctx, opts) // the migration, and whatever follows
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if hasIndex() {
		t.Error("after the migration: devices_name is still there")
	}
	if err := db.QueryRowContext(ctx, rowsDigest).Scan(&after); err != nil {
		t.Fatal(err)
	}
	if after != digest {
		t.Error("the device rows changed in the migration")
	}
	page, err := s.QueryDevices(ctx, &meta.Query{Terms: []meta.Term{{Column: "name", Value: []byte(`"Device 7"`)}}, PageSize: 100})
	if err != nil {
		t.Fatal(err)
	}
	if page.Total != 6 || len(page.Data) != 6 {
		t.Errorf("name eq: total %d, %d items; want 6", page.Total, len(page.Data))
	}
	if _, err := p.DownTo(ctx, before); err != nil {
		t.Fatal(err)
	}
	if !hasIndex() {
		t.Error("down: devices_name not back")
	}
}
