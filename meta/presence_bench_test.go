package meta_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io/fs"
	"net/url"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pressly/goose/v3"

	"devicehub/meta"
	"devicehub/meta/metatest"
	"devicehub/schema"
)

// BenchmarkPresenceWrite measures a presence write (ApplyStateChanges, as
// ingest's state writers batch it: 500 changes) on 100,000 devices, in two
// databases seeded alike: "before", left at the migration before
// *_presence_indexes.sql, and "after", migrated to the end. Batches
// alternate between the two (A then B, B then A), so that a loaded
// machine slows both alike:
//
//	go test -run '^$' -bench PresenceWrite -benchtime 1x -timeout 30m ./meta/
//
// Per change it reports:
//   - us/change: wall time (the one figure a loaded machine distorts);
//   - walB/change, walB-noFPI/change: WAL of the writes' own transactions
//     and of the pruning of their pages, read back with pg_walinspect
//     (records of this database only, whatever else the server writes;
//     it needs a superuser, as the tests' server has); noFPI leaves out
//     full-page images, whose number depends on when the server last
//     checkpointed;
//   - %hot, idxtup/change, idxWalB/change: HOT updates, index entries
//     written (each update that is not HOT writes one in every index of
//     devices) and their WAL (without full-page images);
//   - hit/change, dirtied/change: shared buffers of the lock and UPDATE
//     statements, from EXPLAIN (ANALYZE, BUFFERS) of the same statements
//     in a storm of their own;
//   - %hot-4writers: HOT updates in a storm of four writers at once
//     (ingest's StateWriters), each its own devices;
//   - packed-*: the same figures for births of devices whose rows are on
//     full pages, where the first change of a page is not HOT and the
//     indexes are paid.
func BenchmarkPresenceWrite(b *testing.B) {
	const devices, batch, storm = 100_000, 500, 10_000
	ctx := context.Background()
	variants := presenceDatabases(b, devices)
	wr := newWALReader(b, variants[0].store.DB().DB)
	for _, v := range variants {
		v.wr = wr
		if err := v.store.DB().QueryRow(`SELECT d.oid, pg_relation_filenode('devices') FROM pg_database d
			WHERE d.datname = current_database()`).Scan(&v.oid, &v.relfile); err != nil {
			b.Fatal(err)
		}
		if err := v.store.DB().QueryRow(`SELECT count(*) FROM pg_index WHERE indrelid = 'devices'::regclass`).Scan(&v.indexes); err != nil {
			b.Fatal(err)
		}
		// The copy's pages are not in shared buffers yet: both start warm.
		if _, err := v.store.DB().Exec(`CREATE EXTENSION IF NOT EXISTS pg_prewarm`); err != nil {
			b.Logf("%s: no pg_prewarm (%v): its first writes read pages", v.name, err)
		} else if _, err := v.store.DB().Exec(`SELECT pg_prewarm(c.oid) FROM pg_class c
			WHERE c.oid = 'devices'::regclass OR c.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = 'devices'::regclass)`); err != nil {
			b.Fatal(err)
		}
	}
	// The devices of the storms: deployed, spread over their half of the
	// table, in an order that is the same each run (devices reconnect in
	// no order). The first half's rows are on pages with no room.
	half := fmt.Sprintf("dev-%07d", devices/2)
	var packed, ids []string
	if err := variants[0].store.DB().Select(&packed, `SELECT id FROM devices WHERE state <> 'notActive' AND id <= $1
		ORDER BY md5(id) LIMIT $2`, half, storm/2); err != nil {
		b.Fatal(err)
	}
	if err := variants[0].store.DB().Select(&ids, `SELECT id FROM devices WHERE state <> 'notActive' AND id > $1
		ORDER BY md5(id) LIMIT $2`, half, 4*storm); err != nil {
		b.Fatal(err)
	}
	if len(packed) < storm/2 || len(ids) < 4*storm {
		b.Fatalf("%d and %d devices to change, want %d and %d", len(packed), len(ids), storm/2, 4*storm)
	}
	timed, explained, parallel := ids[:storm], ids[storm:2*storm], ids[2*storm:]
	at := time.Now()
	changes := func(ids []string, online bool, round int) []meta.StateChange {
		cs := make([]meta.StateChange, len(ids))
		for i, id := range ids {
			cs[i] = meta.StateChange{DeviceID: id, Online: online, At: at.Add(time.Duration(round) * time.Second), Address: "10.1.2.3:40000"}
		}
		return cs
	}
	b.ResetTimer()
	// Births of devices on full pages: a page's first is not HOT.
	for i := 0; i < len(packed); i += batch {
		cs := changes(packed[i:i+batch], true, 0)
		for _, v := range alternate(variants, i/batch) {
			v.write(b, ctx, cs, &v.packed)
		}
	}
	// Births, wills, births, wills of the same devices, batch by batch in
	// both databases.
	for round := range 4 {
		for i := 0; i < storm; i += batch {
			cs := changes(timed[i:i+batch], round%2 == 0, round)
			for _, v := range alternate(variants, i/batch) {
				v.write(b, ctx, cs, &v.roomy)
			}
		}
	}
	// The same through EXPLAIN, for the buffers.
	for round := range 2 {
		for i := 0; i < storm; i += batch {
			cs := changes(explained[i:i+batch], round == 0, round)
			for _, v := range variants {
				v.explain(b, ctx, cs)
			}
		}
	}
	// Four writers at once: A, B, then B, A on other devices.
	for k, part := range [][]string{parallel[:storm], parallel[storm:]} {
		for _, v := range alternate(variants, k) {
			v.parallel(b, ctx, part, batch, func(ids []string, online bool) []meta.StateChange { return changes(ids, online, 10) })
		}
	}
	b.StopTimer()
	for _, v := range variants {
		b.Run("schema="+v.name, func(b *testing.B) {
			for range b.N {
			}
			v.roomy.report(b, "", v)
			v.packed.report(b, "packed-", v)
			if p := v.parWAL; v.wr != nil && p.hot+p.cold > 0 {
				b.ReportMetric(100*float64(p.hot)/float64(p.hot+p.cold), "%hot-4writers")
			}
			e := float64(v.explained)
			b.ReportMetric(float64(v.buf.hit)/e, "hit/change")
			b.ReportMetric(float64(v.buf.read)/e, "read/change")
			b.ReportMetric(float64(v.buf.dirtied)/e, "dirtied/change")
			b.Logf("%s: %d indexes on devices; %d changes timed (%d HOT, %d not), %d on full pages (%d HOT, %d not), %d explained",
				v.name, v.indexes, v.roomy.changes, v.roomy.wal.hot, v.roomy.wal.cold, v.packed.changes, v.packed.wal.hot,
				v.packed.wal.cold, v.explained)
		})
	}
}

// alternate is variants in their order for even k, reversed for odd.
func alternate(variants []*presenceDB, k int) []*presenceDB {
	if k%2 == 0 || len(variants) < 2 {
		return variants
	}
	return []*presenceDB{variants[1], variants[0]}
}

// stormFigures is what the timed writes of one kind cost a database.
type stormFigures struct {
	changes int
	elapsed time.Duration
	times   []time.Duration
	wal     walFigures
}

// report reports s's figures per change, their units prefixed.
func (s *stormFigures) report(b *testing.B, prefix string, v *presenceDB) {
	if s.changes == 0 {
		return
	}
	n := float64(s.changes)
	slices.Sort(s.times)
	b.ReportMetric(float64(s.elapsed.Microseconds())/n, prefix+"us/change")
	b.ReportMetric(float64(s.times[len(s.times)/2].Microseconds())/1000, prefix+"p50-ms/batch")
	if v.wr == nil {
		return
	}
	b.ReportMetric(float64(s.wal.bytes)/n, prefix+"walB/change")
	b.ReportMetric(float64(s.wal.bytes-s.wal.fpi)/n, prefix+"walB-noFPI/change")
	b.ReportMetric(100*float64(s.wal.hot)/float64(max(s.wal.hot+s.wal.cold, 1)), prefix+"%hot")
	b.ReportMetric(float64(s.wal.cold*int64(v.indexes))/n, prefix+"idxtup/change")
	b.ReportMetric(float64(s.wal.indexBytes)/n, prefix+"idxWalB/change")
}

// presenceDB is one database of BenchmarkPresenceWrite and its figures.
type presenceDB struct {
	name    string
	store   *meta.Store
	oid     int64 // of the database
	relfile int64 // of devices
	indexes int
	wr      *walReader // nil: no WAL figures

	roomy     stormFigures // rows on pages with room (fillfactor 85)
	packed    stormFigures // rows on full pages
	parWAL    walFigures
	explained int
	buf       struct{ hit, read, dirtied int64 }
}

// walFigures sums WAL records of a database's writes.
type walFigures struct {
	bytes, fpi, indexBytes int64
	hot, cold              int64 // heap updates, HOT and not
}

func (f *walFigures) add(g walFigures) {
	f.bytes += g.bytes
	f.fpi += g.fpi
	f.indexBytes += g.indexBytes
	f.hot += g.hot
	f.cold += g.cold
}

// walReader reads back the WAL of the benchmark's writes through one
// connection that holds a temporary physical replication slot: the server
// may checkpoint (and recycle segments) between a write and its reading,
// often on a machine whose other tests write much WAL. The slot is moved
// on after each reading, so it holds back little.
type walReader struct {
	conn *sql.Conn
	slot string
}

func newWALReader(b *testing.B, db *sql.DB) *walReader {
	ctx := context.Background()
	if _, err := db.Exec(`CREATE EXTENSION IF NOT EXISTS pg_walinspect`); err != nil {
		b.Logf("no pg_walinspect (%v): no WAL figures", err)
		return nil
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		b.Fatal(err)
	}
	w := &walReader{conn: conn, slot: fmt.Sprintf("devicehub_bench_%d", time.Now().UnixNano())}
	if _, err := conn.ExecContext(ctx, `SELECT pg_create_physical_replication_slot($1, true, true)`, w.slot); err != nil {
		conn.Close()
		b.Logf("no replication slot (%v): no WAL figures", err)
		return nil
	}
	b.Cleanup(func() { conn.Close() }) // the slot is the session's
	return w
}

func (w *walReader) lsn(b *testing.B, flushed bool) string {
	f := "pg_current_wal_insert_lsn()"
	if flushed {
		f = "pg_current_wal_flush_lsn()"
	}
	var l string
	if err := w.conn.QueryRowContext(context.Background(), `SELECT `+f+`::text`).Scan(&l); err != nil {
		b.Fatal(err)
	}
	return l
}

// between reads the WAL records between from and to of database oid:
// those of transactions that wrote one of its blocks, and those with no
// transaction (pruning) on its blocks. Updates are counted in the table
// devices (relfilenode devices) only, those that begin a page (+INIT)
// included. The slot then moves on to to.
func (w *walReader) between(b *testing.B, oid, devices int64, from, to string) walFigures {
	ctx := context.Background()
	var f walFigures
	err := w.conn.QueryRowContext(ctx, `WITH r AS (SELECT * FROM pg_get_wal_records_info($1::pg_lsn, $2::pg_lsn)),
		mine AS (SELECT * FROM r WHERE block_ref ~ ('rel \d+/' || $3 || '/')),
		x AS (SELECT DISTINCT xid FROM mine WHERE xid <> '0'),
		w AS (SELECT * FROM r WHERE xid IN (SELECT xid FROM x) UNION ALL SELECT * FROM mine WHERE xid = '0')
		SELECT COALESCE(sum(record_length), 0), COALESCE(sum(fpi_length), 0),
			COALESCE(sum(record_length - fpi_length) FILTER (WHERE resource_manager IN ('Btree', 'Gin', 'Gist')), 0),
			count(*) FILTER (WHERE resource_manager = 'Heap' AND record_type LIKE 'HOT_UPDATE%' AND block_ref ~ $4),
			count(*) FILTER (WHERE resource_manager = 'Heap' AND record_type LIKE 'UPDATE%' AND block_ref ~ $4)
		FROM w`, from, to, strconv.FormatInt(oid, 10), fmt.Sprintf(`rel \d+/%d/%d `, oid, devices)).Scan(&f.bytes, &f.fpi, &f.indexBytes, &f.hot, &f.cold)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := w.conn.ExecContext(ctx, `SELECT pg_replication_slot_advance($1, $2::pg_lsn)`, w.slot, to); err != nil {
		b.Fatal(err)
	}
	return f
}

func (v *presenceDB) write(b *testing.B, ctx context.Context, cs []meta.StateChange, s *stormFigures) {
	var from string
	if v.wr != nil {
		from = v.wr.lsn(b, false)
	}
	t0 := time.Now()
	n, err := v.store.ApplyStateChanges(ctx, cs)
	d := time.Since(t0)
	if err != nil {
		b.Fatal(err)
	}
	if n != len(cs) {
		b.Fatalf("%s: %d of %d changed", v.name, n, len(cs))
	}
	s.changes += n
	s.elapsed += d
	s.times = append(s.times, d)
	if v.wr != nil {
		s.wal.add(v.wr.between(b, v.oid, v.relfile, from, v.wr.lsn(b, true)))
	}
}

// explain writes cs with ApplyStateChanges' statements under EXPLAIN
// (ANALYZE, BUFFERS) and adds their buffers (the statements' own; the
// triggers' are not in a plan).
func (v *presenceDB) explain(b *testing.B, ctx context.Context, cs []meta.StateChange) {
	setup, lock, update, args := meta.StateChangeSQL(cs)
	tx, err := v.store.DB().BeginTx(ctx, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.Exec(setup); err != nil {
		b.Fatal(err)
	}
	for _, st := range []struct {
		sql  string
		args []any
	}{{lock, args[:1]}, {update, args}} {
		var out []byte
		if err := tx.QueryRow(`EXPLAIN (ANALYZE, BUFFERS, TIMING OFF, FORMAT JSON) `+st.sql, st.args...).Scan(&out); err != nil {
			b.Fatal(err)
		}
		var plan []struct {
			Plan struct {
				Hit     int64 `json:"Shared Hit Blocks"`
				Read    int64 `json:"Shared Read Blocks"`
				Dirtied int64 `json:"Shared Dirtied Blocks"`
			} `json:"Plan"`
		}
		if err := json.Unmarshal(out, &plan); err != nil || len(plan) != 1 {
			b.Fatalf("EXPLAIN: %v %.200s", err, out)
		}
		p := plan[0].Plan
		v.buf.hit += p.Hit
		v.buf.read += p.Read
		v.buf.dirtied += p.Dirtied
	}
	if err := tx.Commit(); err != nil {
		b.Fatal(err)
	}
	v.explained += len(cs)
}

// parallel writes births then wills of ids from four writers at once,
// each its own quarter, and keeps the WAL figures of the whole.
func (v *presenceDB) parallel(b *testing.B, ctx context.Context, ids []string, batch int, changes func([]string, bool) []meta.StateChange) {
	const writers = 4
	var from string
	if v.wr != nil {
		from = v.wr.lsn(b, false)
	}
	for _, online := range []bool{true, false} {
		var wg sync.WaitGroup
		errs := make(chan error, writers)
		for w := range writers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := w * batch; i < len(ids); i += writers * batch {
					if _, err := v.store.ApplyStateChanges(ctx, changes(ids[i:min(i+batch, len(ids))], online)); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			b.Fatal(err)
		}
	}
	if v.wr != nil {
		v.parWAL.add(v.wr.between(b, v.oid, v.relfile, from, v.wr.lsn(b, true)))
	}
}

// presenceDatabases seeds a database with devices and returns it as
// "before" (left at the migration before *_presence_indexes.sql) and a
// copy migrated to the end as "after"; without that migration, the one
// database migrated to the end as "now".
func presenceDatabases(b *testing.B, devices int) []*presenceDB {
	ctx := context.Background()
	files, err := fs.Glob(schema.Postgres, "postgres/*.sql")
	if err != nil {
		b.Fatal(err)
	}
	var before int64
	for i, f := range files {
		if strings.HasSuffix(f, "_presence_indexes.sql") && i > 0 {
			v, _, _ := strings.Cut(path.Base(files[i-1]), "_")
			before, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	dsn := metatest.NewDatabase(b)
	db, err := sql.Open("postgres", dsn)
	if err != nil {
		b.Fatal(err)
	}
	sub, _ := fs.Sub(schema.Postgres, "postgres")
	p, err := goose.NewProvider(goose.DialectPostgres, db, sub)
	if err != nil {
		b.Fatal(err)
	}
	if before > 0 {
		_, err = p.UpTo(ctx, before)
	} else {
		_, err = p.Up(ctx)
	}
	if err != nil {
		b.Fatal(err)
	}
	t0 := time.Now()
	seedPresence(b, db, devices)
	b.Logf("seeded %d devices in %s", devices, time.Since(t0).Round(time.Millisecond))
	db.Close()
	open := func(name, dsn string) *presenceDB {
		s, err := meta.OpenUnmigrated(dsn, 8)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { s.Close() })
		return &presenceDB{name: name, store: s}
	}
	if before == 0 {
		return []*presenceDB{open("now", dsn)}
	}
	// The copy: the same pages, then the rest of the migrations.
	u, _ := url.Parse(dsn)
	src := strings.TrimPrefix(u.Path, "/")
	dst := src + "_after"
	admin, err := sql.Open("postgres", metatest.ServerDSN()+"/postgres?sslmode=disable")
	if err != nil {
		b.Fatal(err)
	}
	defer admin.Close()
	if _, err := admin.Exec(fmt.Sprintf("CREATE DATABASE %s TEMPLATE %s", dst, src)); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if a, err := sql.Open("postgres", metatest.ServerDSN()+"/postgres?sslmode=disable"); err == nil {
			_, _ = a.Exec("DROP DATABASE IF EXISTS " + dst + " WITH (FORCE)")
			a.Close()
		}
	})
	u.Path = "/" + dst
	opts := meta.DefaultOptions()
	opts.DSN = u.String()
	migrated, err := meta.Open(ctx, opts)
	if err != nil {
		b.Fatal(err)
	}
	migrated.Close()
	return []*presenceDB{open("before", dsn), open("after", u.String())}
}

// seedPresence inserts devices over 10 products, as a fleet provisioned
// and deployed: 5% notActive, 10% online, the rest offline, with the
// columns a device that has connected holds. The first half is packed
// into full pages (as rows written before 00015, or after a mass
// change), the second leaves 15% of each page free (fillfactor 85). The
// indexes are built after the rows, and the triggers are off while
// inserting; the counts are taken after.
func seedPresence(b *testing.B, db *sql.DB, n int) {
	ctx := context.Background()
	conn, err := db.Conn(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	insert := func(from, to int) string {
		return fmt.Sprintf(`INSERT INTO devices (id, name, product_id, state, secure_id, secure_key, creator_id, creator_name,
				create_time, registry_time, online_time, offline_time, address)
			SELECT 'dev-' || lpad(i::text, 7, '0'),
				(ARRAY['Kitchen','Garage','Attic','Office','Lab','Basement','Roof','Hall'])[i %% 8 + 1] || ' meter ' || i,
				'product-' || (i %% 10),
				CASE WHEN i %% 20 = 0 THEN 'notActive' WHEN i %% 10 = 1 THEN 'online' ELSE 'offline' END,
				'dev-' || i, md5(i::text), 'admin', 'Administrator',
				now() - make_interval(secs => i),
				CASE WHEN i %% 20 <> 0 THEN now() - make_interval(secs => i) END,
				CASE WHEN i %% 20 <> 0 THEN now() - make_interval(secs => 7200 + i %% 86400) END,
				CASE WHEN i %% 20 <> 0 AND i %% 10 <> 1 THEN now() - make_interval(secs => 3600 + i %% 3600) END,
				CASE WHEN i %% 20 <> 0 THEN '10.0.' || (i %% 250) || '.' || (i %% 200) || ':' || (30000 + i %% 30000) ELSE '' END
			FROM generate_series(%d, %d) AS i`, from, to)
	}
	for _, s := range []string{
		`SET session_replication_role = replica`,
		`INSERT INTO products (id, name, device_type, state, classified_id)
			SELECT 'product-' || i, 'Product ' || i, (ARRAY['device','gateway'])[i % 2 + 1], 1, 'class-' || (i % 3)
			FROM generate_series(0, 9) AS i`,
		`CREATE TEMP TABLE defs AS SELECT indexname, indexdef FROM pg_indexes
			WHERE tablename = 'devices' AND indexname <> 'devices_pkey'`,
		`DO $$ DECLARE r record; BEGIN
			FOR r IN SELECT indexname FROM defs LOOP EXECUTE 'DROP INDEX ' || quote_ident(r.indexname); END LOOP; END $$`,
		`ALTER TABLE devices SET (fillfactor = 100)`,
		insert(1, n/2),
		`ALTER TABLE devices SET (fillfactor = 85)`,
		insert(n/2+1, n),
		`DELETE FROM product_device_counts`,
		`INSERT INTO product_device_counts (product_id, devices, online, offline, not_active)
			SELECT product_id, count(*), count(*) FILTER (WHERE state = 'online'), count(*) FILTER (WHERE state = 'offline'),
				count(*) FILTER (WHERE state = 'notActive')
			FROM devices GROUP BY product_id`,
		`DO $$ DECLARE r record; BEGIN FOR r IN SELECT indexdef FROM defs LOOP EXECUTE r.indexdef; END LOOP; END $$`,
		`SET session_replication_role = DEFAULT`,
		`VACUUM ANALYZE devices`, `VACUUM ANALYZE products`, `VACUUM ANALYZE product_device_counts`,
	} {
		if _, err := conn.ExecContext(ctx, s); err != nil {
			b.Fatalf("seed: %.80s: %v", s, err)
		}
	}
}
