package bench

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	_ "github.com/lib/pq" // PostgreSQL driver

	"devicehub/tsdb"
)

// openPGBench opens PostgreSQL database <Prefix> (created if missing),
// which holds the baseline tables device_message_<size>.
func openPGBench(ctx context.Context, p DashboardParams) (*sql.DB, error) {
	admin, err := openPGAdmin(p.PostgresDSN, 1)
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	var exists bool
	if err := admin.QueryRowContext(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", p.Prefix).Scan(&exists); err != nil {
		return nil, fmt.Errorf("bench: postgres: %w", err)
	}
	if !exists {
		if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+p.Prefix); err != nil {
			return nil, fmt.Errorf("bench: postgres: create database: %w", err)
		}
	}
	db, err := openPG(p.PostgresDSN+"/"+p.Prefix+"?sslmode=disable", 2)
	if err != nil {
		return nil, err
	}
	if _, err := db.ExecContext(ctx, "CREATE TABLE IF NOT EXISTS bench_info (size bigint PRIMARY KEY, start_ms bigint NOT NULL, span_ms bigint NOT NULL, rows bigint NOT NULL)"); err != nil {
		db.Close()
		return nil, fmt.Errorf("bench: postgres: %w", err)
	}
	return db, nil
}

// dropPGBench drops database <Prefix> if it holds no table but bench_info.
func dropPGBench(ctx context.Context, p DashboardParams) {
	db, err := openPG(p.PostgresDSN+"/"+p.Prefix+"?sslmode=disable", 1)
	if err != nil {
		return
	}
	var n int
	err = db.QueryRowContext(ctx, "SELECT count(*) FROM pg_tables WHERE schemaname = 'public' AND tablename <> 'bench_info'").Scan(&n)
	db.Close()
	if err != nil || n > 0 {
		return
	}
	if admin, err := openPGAdmin(p.PostgresDSN, 1); err == nil {
		_, _ = admin.ExecContext(ctx, "DROP DATABASE IF EXISTS "+p.Prefix+" WITH (FORCE)")
		admin.Close()
	}
}

// runPGBaseline loads (or reuses) the plain table of size n with the same
// messages as ClickHouse and times the aggregates as a PostgreSQL-only
// platform computes them.
func runPGBaseline(ctx context.Context, p DashboardParams, db *sql.DB, g genInfo, n int, queries []dashQuery, loc *time.Location) (*PGBaseline, error) {
	b := &PGBaseline{}
	table := fmt.Sprintf("device_message_%d", n)
	var startMs, rows int64
	err := db.QueryRowContext(ctx, "SELECT start_ms, rows FROM bench_info WHERE size = $1", n).Scan(&startMs, &rows)
	if err == nil && startMs == g.startMs && rows == int64(n) {
		b.Reused = true
		p.Logf("size %d: reusing PostgreSQL table %s", n, table)
	} else {
		if err := loadPG(ctx, p, db, g, n, table, b); err != nil {
			return b, err
		}
	}
	if !p.KeepData {
		defer func() {
			dctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			_, _ = db.ExecContext(dctx, "DROP TABLE IF EXISTS "+table)
			_, _ = db.ExecContext(dctx, "DELETE FROM bench_info WHERE size = $1", n)
			dropPGBench(dctx, p)
		}()
	}

	trunc := map[string]string{tsdb.Day: "day", tsdb.Month: "month"}
	lats := []*Latency{&b.Day30, &b.Month12}
	totals := []*uint64{&b.Day30Total, &b.Month12Total}
	for i, q := range queries[:2] {
		buckets, err := tsdb.Buckets(q.interval, q.from, time.UnixMilli(g.startMs+g.spanMs), loc, q.limit)
		if err != nil {
			return b, err
		}
		lo, hi := buckets[len(buckets)-1], bucketAfter(q.interval, buckets[0])
		sqlText := fmt.Sprintf("SELECT date_trunc('%s', time AT TIME ZONE '%s') AS b, count(*) FROM %s"+
			" WHERE time >= $1 AND time < $2 GROUP BY 1 ORDER BY 1 DESC", trunc[q.interval], dashZone, table)
		run := func() (uint64, error) {
			rs, err := db.QueryContext(ctx, sqlText, lo, hi)
			if err != nil {
				return 0, err
			}
			defer rs.Close()
			var total uint64
			for rs.Next() {
				var bt time.Time
				var c uint64
				if err := rs.Scan(&bt, &c); err != nil {
					return 0, err
				}
				total += c
			}
			return total, rs.Err()
		}
		if *totals[i], err = run(); err != nil { // warm-up
			return b, err
		}
		var ds []time.Duration
		start := time.Now()
		for range p.PGIterations {
			t0 := time.Now()
			if _, err := run(); err != nil {
				return b, err
			}
			ds = append(ds, time.Since(t0))
		}
		*lats[i] = summarize(ds, time.Since(start))
		p.Logf("size %d: postgres %s p50 %.1fms max %.1fms", n, q.name, lats[i].P50, lats[i].Max)
	}
	return b, nil
}

func loadPG(ctx context.Context, p DashboardParams, db *sql.DB, g genInfo, n int, table string, b *PGBaseline) error {
	start := time.Now()
	stmts := []string{
		"DELETE FROM bench_info WHERE size = " + fmt.Sprint(n),
		"DROP TABLE IF EXISTS " + table,
		"CREATE TABLE " + table + ` (
			time timestamptz NOT NULL, ts bigint NOT NULL, product_id text NOT NULL, device_id text NOT NULL,
			direction text NOT NULL, message_type text NOT NULL, message_id text NOT NULL, topic text NOT NULL, payload text NOT NULL)`,
	}
	for off := 0; off < n; off += dashChunk {
		cnt := min(dashChunk, n-off)
		stmts = append(stmts, fmt.Sprintf(`INSERT INTO %[1]s
SELECT to_timestamp((s.ts / 1000)::double precision), s.ts,
  'p' || (s.i %% %[5]d %% %[6]d), 'd' || (s.i %% %[5]d),
  CASE WHEN s.i %% 20 = 0 THEN 'down' ELSE 'up' END, CASE WHEN s.i %% 20 = 0 THEN 'WRITE_PROPERTY' ELSE 'REPORT_PROPERTY' END,
  s.i::text, '/p' || (s.i %% %[5]d %% %[6]d) || '/d' || (s.i %% %[5]d) || '/properties/report',
  '{"temperature":' || ((s.i %% 400) / 10.0) || ',"humidity":' || (s.i %% 97) || '}'
FROM (SELECT i, %[2]d + (i * %[3]d) / %[4]d AS ts FROM generate_series(%[7]d::bigint, %[8]d::bigint) AS i) s`,
			table, g.startMs, g.spanMs, n, dashDevices, dashProducts, off, off+cnt-1))
	}
	stmts = append(stmts,
		"CREATE INDEX ON "+table+" (time)",
		"VACUUM ANALYZE "+table,
		fmt.Sprintf("INSERT INTO bench_info (size, start_ms, span_ms, rows) VALUES (%d, %d, %d, %d)", n, g.startMs, g.spanMs, n),
	)
	for _, st := range stmts {
		if _, err := db.ExecContext(ctx, st); err != nil {
			return fmt.Errorf("%.80s: %w", st, err)
		}
	}
	b.LoadSeconds = time.Since(start).Seconds()
	p.Logf("size %d: loaded PostgreSQL table %s in %.1fs", n, table, b.LoadSeconds)
	return nil
}
