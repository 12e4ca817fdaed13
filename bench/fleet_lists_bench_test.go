package bench

// Presence and lists at fleet scale (issue 32, item 3): a storm of state
// changes written as ingest writes them, and endpoint 7 on 1,000,000
// devices through HTTP.
//
// Seeding 1,000,000 devices takes minutes; set DEVICEHUB_BENCH_FLEET_DB to
// a database name to keep them between runs (created and seeded on first
// use, migrated by meta.Open on every run; drop it by hand when done).
//
//	DEVICEHUB_BENCH_FLEET_DB=devicehub_bench_fleet1m \
//	  go test -run '^$' -bench 'BenchmarkFleet(StateStorm|DeviceList)' -benchtime 1x -timeout 60m ./bench/

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"testing"
	"time"

	"github.com/lib/pq"

	"devicehub/meta"
	"devicehub/meta/metatest"
)

const (
	fleetListDevices  = 1_000_000
	fleetListProducts = 10
)

// fleetListStore opens the bench database of 1,000,000 devices (seeding it
// if it has none) with the page cache and total estimates off, so that
// every request reaches PostgreSQL.
func fleetListStore(b *testing.B) *meta.Store {
	b.Helper()
	opts := meta.DefaultOptions()
	opts.PageCacheTTL, opts.TotalEstimateTTL, opts.MaxOpenConns = 0, 0, 8
	if name := os.Getenv("DEVICEHUB_BENCH_FLEET_DB"); name != "" {
		admin, err := sql.Open("postgres", metatest.ServerDSN()+"/postgres?sslmode=disable")
		if err != nil {
			b.Fatal(err)
		}
		var exists bool
		if err := admin.QueryRow(`SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, name).Scan(&exists); err != nil {
			b.Fatal(err)
		}
		if !exists {
			if _, err := admin.Exec("CREATE DATABASE " + pq.QuoteIdentifier(name)); err != nil {
				b.Fatal(err)
			}
		}
		admin.Close()
		opts.DSN = metatest.ServerDSN() + "/" + name + "?sslmode=disable"
	} else {
		opts.DSN = metatest.NewDatabase(b)
	}
	start := time.Now()
	store, err := meta.Open(context.Background(), opts)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { store.Close() })
	if d := time.Since(start); d > time.Second {
		b.Logf("opened (migrated) in %s", d.Round(time.Millisecond))
	}
	if err := store.EnsureAdmin(context.Background(), "admin123"); err != nil {
		b.Fatal(err)
	}
	var n int
	if err := store.DB().QueryRow(`SELECT count(*) FROM devices`).Scan(&n); err != nil {
		b.Fatal(err)
	}
	if n == 0 {
		start := time.Now()
		seedFleetDevices(b, store.DB().DB, fleetListDevices)
		b.Logf("seeded %d devices in %s", fleetListDevices, time.Since(start).Round(time.Second))
	} else if n != fleetListDevices {
		b.Fatalf("the bench database has %d devices, want %d (drop it)", n, fleetListDevices)
	}
	return store
}

// seedFleetDevices inserts n devices over fleetListProducts products: 5%
// notActive, 10% online, the rest offline (i%20 == 0 notActive, i%10 == 1
// online: all in product-1, as product = i%10). Names are "<Room> meter <i>", ids dev-<7 digits>, one device
// created per second back from now. The indexes are built after the rows
// and triggers are off while inserting (no 950,000 login notifications);
// the product counts are taken after.
func seedFleetDevices(b *testing.B, db *sql.DB, n int) {
	b.Helper()
	ctx := context.Background()
	conn, err := db.Conn(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	var defs []string
	rows, err := conn.QueryContext(ctx, `SELECT indexdef FROM pg_indexes
		WHERE tablename = 'devices' AND indexname <> 'devices_pkey' ORDER BY indexname`)
	if err != nil {
		b.Fatal(err)
	}
	for rows.Next() {
		var d string
		if err := rows.Scan(&d); err != nil {
			b.Fatal(err)
		}
		defs = append(defs, d)
	}
	rows.Close()
	stmts := []string{
		`SET session_replication_role = replica`,
		fmt.Sprintf(`INSERT INTO products (id, name, device_type, state, classified_id)
			SELECT 'product-' || i, 'Product ' || i, (ARRAY['device','gateway'])[i %% 2 + 1], 1, 'class-' || (i %% 3)
			FROM generate_series(0, %d) AS i`, fleetListProducts-1),
		`DO $$ DECLARE r record; BEGIN
			FOR r IN SELECT indexname FROM pg_indexes WHERE tablename = 'devices' AND indexname <> 'devices_pkey' LOOP
				EXECUTE 'DROP INDEX ' || quote_ident(r.indexname);
			END LOOP; END $$`,
		fmt.Sprintf(`INSERT INTO devices (id, name, product_id, state, secure_id, secure_key, creator_id, create_time, online_time, offline_time)
			SELECT 'dev-' || lpad(i::text, 7, '0'),
				(ARRAY['Kitchen','Garage','Attic','Office','Lab','Basement','Roof','Hall'])[i %% 8 + 1] || ' meter ' || i,
				'product-' || (i %% %d),
				CASE WHEN i %% 20 = 0 THEN 'notActive' WHEN i %% 10 = 1 THEN 'online' ELSE 'offline' END,
				'dev-' || i, md5(i::text), 'admin',
				now() - make_interval(secs => i),
				CASE WHEN i %% 20 <> 0 THEN now() - make_interval(secs => i %% 86400) END,
				CASE WHEN i %% 20 <> 0 AND i %% 10 <> 1 THEN now() - make_interval(secs => i %% 3600) END
			FROM generate_series(1, %d) AS i`, fleetListProducts, n),
		`DELETE FROM product_device_counts`,
		`INSERT INTO product_device_counts (product_id, devices) SELECT product_id, count(*) FROM devices GROUP BY product_id`,
	}
	stmts = append(stmts, defs...)
	stmts = append(stmts, `SET session_replication_role = DEFAULT`, `VACUUM ANALYZE devices`, `VACUUM ANALYZE products`)
	for _, s := range stmts {
		t0 := time.Now()
		if _, err := conn.ExecContext(ctx, s); err != nil {
			b.Fatalf("seed: %.80s: %v", s, err)
		}
		b.Logf("seed: %.70s... %s", s, time.Since(t0).Round(time.Millisecond))
	}
}

// tableStats are pg_stat_user_tables' update counters of devices, the WAL
// position and the size of the devices table with its indexes.
type tableStats struct {
	upd, hot  int64
	wal       string
	tableSize int64
}

func readTableStats(b *testing.B, db *sql.DB, table string) tableStats {
	b.Helper()
	var s tableStats
	if err := db.QueryRow(`SELECT n_tup_upd, n_tup_hot_upd, pg_current_wal_lsn()::text, pg_total_relation_size(relid)
		FROM pg_stat_user_tables WHERE relname = $1`, table).Scan(&s.upd, &s.hot, &s.wal, &s.tableSize); err != nil {
		b.Fatal(err)
	}
	return s
}

func walBytes(b *testing.B, db *sql.DB, from, to string) int64 {
	var n int64
	if err := db.QueryRow(`SELECT pg_wal_lsn_diff($2::pg_lsn, $1::pg_lsn)::bigint`, from, to).Scan(&n); err != nil {
		b.Fatal(err)
	}
	return n
}

// BenchmarkFleetStateStorm writes a storm of births of 50,000 offline
// devices (of 1,000,000), then their wills, as ingest writes them: ApplyStateChanges in
// batches of 500 (ingest's StateBatch), one after the other. It reports
// the time per state change, batches (commits) per second, the share of
// HOT updates of the devices row and the WAL written per change. The
// devices end in the state they had.
func BenchmarkFleetStateStorm(b *testing.B) {
	store := fleetListStore(b)
	const storm, batch = 50_000, 500
	var ids []string
	// Devices reconnect in no order (jittered backoff): a sample spread
	// over the whole table, in a random order that is the same each run.
	if err := store.DB().Select(&ids, `SELECT id FROM devices WHERE state = 'offline' ORDER BY md5(id) LIMIT $1`, storm); err != nil {
		b.Fatal(err)
	}
	if len(ids) < storm {
		b.Fatalf("%d offline devices, want %d", len(ids), storm)
	}
	// A fresh pool for the storm: its connections' statistics reach
	// pg_stat_user_tables when they close.
	opts := meta.DefaultOptions()
	opts.DSN, opts.MaxOpenConns, opts.PageCacheTTL = storeDSN(b, store), 2, 0
	ctx := context.Background()
	for _, online := range []bool{true, false} {
		name := "births"
		if !online {
			name = "wills"
		}
		b.Run(name, func(b *testing.B) {
			w, err := meta.Open(ctx, opts)
			if err != nil {
				b.Fatal(err)
			}
			before := readTableStats(b, store.DB().DB, "devices")
			lat := make([]time.Duration, 0, storm/batch)
			at := time.Now()
			b.ResetTimer()
			start := time.Now()
			changed := 0
			for i := 0; i < storm; i += batch {
				cs := make([]meta.StateChange, 0, batch)
				for _, id := range ids[i:min(i+batch, storm)] {
					cs = append(cs, meta.StateChange{DeviceID: id, Online: online, At: at, Address: "127.0.0.2:40000"})
				}
				t0 := time.Now()
				n, err := w.ApplyStateChanges(ctx, cs)
				if err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(t0))
				changed += n
			}
			took := time.Since(start)
			b.StopTimer()
			w.Close() // its backends flush their statistics as they exit
			if changed != storm {
				b.Fatalf("%d devices changed, want %d", changed, storm)
			}
			var after tableStats
			for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(200 * time.Millisecond) {
				after = readTableStats(b, store.DB().DB, "devices")
				if after.upd-before.upd >= storm || time.Now().After(deadline) {
					break
				}
			}
			sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
			b.ReportMetric(float64(took.Microseconds())/storm, "us/change")
			b.ReportMetric(float64(len(lat))/took.Seconds(), "commits/s")
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms/batch")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms/batch")
			upd := after.upd - before.upd
			if upd > 0 {
				b.ReportMetric(100*float64(after.hot-before.hot)/float64(upd), "%hot")
			}
			b.ReportMetric(float64(walBytes(b, store.DB().DB, before.wal, after.wal))/storm, "walB/change")
			b.Logf("%s: %d changes in %s; devices: %d updates, %d HOT; table+indexes %d MB -> %d MB", name, storm,
				took.Round(time.Millisecond), upd, after.hot-before.hot, before.tableSize>>20, after.tableSize>>20)
		})
	}
}

// storeDSN is the DSN of the database store is connected to.
func storeDSN(b *testing.B, store *meta.Store) string {
	var name string
	if err := store.DB().QueryRow(`SELECT current_database()`).Scan(&name); err != nil {
		b.Fatal(err)
	}
	return metatest.ServerDSN() + "/" + name + "?sslmode=disable"
}

// BenchmarkFleetDeviceList measures endpoint 7 (and the overview's counts)
// on 1,000,000 devices through HTTP, every request answered by PostgreSQL
// (no page cache, no kept estimates): p50 and p99 over 60 requests per
// query, values varied where a query has one.
func BenchmarkFleetDeviceList(b *testing.B) {
	store := fleetListStore(b)
	if _, err := store.DB().Exec(`ANALYZE devices`); err != nil {
		b.Fatal(err)
	}
	c := startAPI(b, store)
	type page struct {
		Total      int               `json:"total"`
		TotalExact bool              `json:"totalExact"`
		Data       []json.RawMessage `json:"data"`
	}
	queries := []struct {
		name, path string
		body       func(i int) string
	}{
		{"state-online", "/api/device-instance/_query", func(int) string {
			return `{"pageSize":25,"terms":[{"column":"state","value":"online"}]}`
		}},
		{"state-offline-name-like", "/api/device-instance/_query", func(i int) string {
			return fmt.Sprintf(`{"pageSize":25,"terms":[{"column":"state","value":"offline"},{"column":"name","termType":"like","value":"%%meter %d%%"}]}`, 1000+i*37)
		}},
		{"id-like", "/api/device-instance/_query", func(i int) string {
			return fmt.Sprintf(`{"pageSize":25,"terms":[{"column":"id","termType":"like","value":"%%%04d%%"}]}`, 1000+i*37)
		}},
		// The seed puts every online device in product-1 (100,000): the
		// other products have none.
		{"product-1-online", "/api/device-instance/_query", func(int) string {
			return `{"pageSize":25,"terms":[{"column":"productId","value":"product-1"},{"column":"state","value":"online"}]}`
		}},
		{"product-none-online", "/api/device-instance/_query", func(i int) string {
			return fmt.Sprintf(`{"pageSize":25,"terms":[{"column":"productId","value":"product-%d"},{"column":"state","value":"online"}]}`, 2+i%8)
		}},
		{"sort-createTime", "/api/device-instance/_query", func(i int) string {
			return fmt.Sprintf(`{"pageIndex":%d,"pageSize":25,"sorts":[{"name":"createTime","order":"desc"}]}`, i%4)
		}},
		{"sort-name", "/api/device-instance/_query", func(i int) string {
			return fmt.Sprintf(`{"pageIndex":%d,"pageSize":25,"sorts":[{"name":"name","order":"asc"}]}`, i%4)
		}},
		// The console's devices page: sorted by id, filtered by state (the
		// overview's "devices online" link), searched by id or name.
		{"console-devices-online", "/api/device-instance/_query", func(i int) string {
			return fmt.Sprintf(`{"pageIndex":%d,"pageSize":25,"sorts":[{"name":"id","order":"asc"}],"terms":[{"column":"state","value":"online"}]}`, i%4)
		}},
		{"console-search", "/api/device-instance/_query", func(i int) string {
			q := fmt.Sprintf("%%meter %d%%", 4000+i*37)
			return fmt.Sprintf(`{"pageSize":25,"sorts":[{"name":"id","order":"asc"}],"terms":[{"terms":[{"column":"name$like","value":%q},{"column":"id$like","value":%q,"type":"or"}]}]}`, q, q)
		}},
		// The console's overview: products, devices, devices online.
		{"overview-products", "/api/device-product/_count", func(int) string { return `{}` }},
		{"overview-devices", "/api/device-instance/_query", func(int) string { return `{"pageSize":1}` }},
		{"overview-online", "/api/device-instance/_query", func(int) string {
			return `{"pageSize":1,"terms":[{"column":"state","value":"online"}]}`
		}},
	}
	const runs = 60
	for _, q := range queries {
		b.Run(q.name, func(b *testing.B) {
			lat := make([]time.Duration, 0, runs)
			var last page
			count := q.path == "/api/device-product/_count"
			for i := 0; i < runs; i++ {
				var p page
				var out any = &p
				if count {
					out, p.TotalExact = &p.Total, true // a count is always exact
				}
				t0 := time.Now()
				c.post(q.path, q.body(i), out)
				lat = append(lat, time.Since(t0))
				last = p
			}
			sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
			ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
			b.ReportMetric(ms(lat[runs/2]), "p50-ms")
			b.ReportMetric(ms(lat[runs*99/100]), "p99-ms")
			b.Logf("%s: last total %d (exact %v), %d items", q.name, last.Total, last.TotalExact, len(last.Data))
		})
	}
}
