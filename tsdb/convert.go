package tsdb

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"
)

// The conversion of device_property to the layout of schema 00006 (the
// time stored once, as ts; sorted by device, then time), run by the
// "--@convert <from> <to>" line of that file at the first start of the
// version, before the statements after it (the new views).
//
// Resumable: the new table <to> is filled one monthly partition at a
// time (INSERT ... SELECT of that month of <from>); a month is recorded in
// <to>_copied, with its row count, only once <to> holds as many of its
// rows as <from>. A start interrupted in the middle of a month drops
// what <to> holds of that month and copies it again; the months recorded
// are not copied again. Before the swap every month's count is read once
// more, and a month that gained rows meanwhile (an old instance still
// writing) is copied again. Then the views that read <from>'s old
// columns are dropped, <from> and <to> swapped by one RENAME, and the old
// table and the record dropped. Nothing writes <to> until the swap, so
// the rollups (fed by the views on <from>'s name) count each value once.
//
// One converter at a time. The steps are exact for one converter only:
// two copying the same month at once insert it twice (the recount only
// refuses fewer rows), one drops the month the other has just copied
// and recorded, or recounts it between the other's drop and copy, and
// one can swap, its months all recorded, while the other has dropped a
// month of <to> to copy it again (lost) or is still copying into it
// (doubled). No statement of ClickHouse makes these steps atomic, and it
// has no locks, so Open takes Options.ConvertLock (devicehub: a
// PostgreSQL advisory lock that every instance sharing the database
// takes, on one server as on a cluster) before its first DDL statement
// when <from> is still in the old layout, and holds it until its last
// (convertLock). The converter holding it is the only one that writes
// <to> or its record or swaps; one that waited finds <from> in the new
// layout, skips the CREATEs of <to> (their --@if counts 0) and converts
// nothing, so no row is copied twice and none is dropped. A lock lost
// meanwhile (its PostgreSQL session gone) cancels the conversion, which
// the next holder resumes; rows a cancelled INSERT ... SELECT still
// wrote make a month's count in <to> differ from <from>'s, and
// convertMonths, which compares both with the record, has it copied
// again before the swap. (Rows written after that last comparison are
// not seen: the lock is only lost with its holder's PostgreSQL session,
// and the holder stops its statements at once.) Without a lock (nil,
// tests and the bench) the caller makes sure one instance converts.

// convertLock takes Options.ConvertLock when one of stmts is a conversion
// whose table is still in the old layout. The lock is held for the rest
// of the DDL, the conversion's tables made before it and the views after
// it included: an instance that waited finds the new layout, skips the
// CREATEs of the conversion's tables (their conditions count 0) and
// converts nothing. The returned ctx ends when the lock is lost.
func (db *DB) convertLock(ctx context.Context, stmts []ddl) (context.Context, func(), error) {
	if db.opt.ConvertLock == nil {
		return ctx, func() {}, nil
	}
	due := false
	for _, s := range stmts {
		if s.convert == "" {
			continue
		}
		f := strings.Fields(s.convert)
		if len(f) != 2 || !identRE.MatchString(f[0]) {
			return ctx, nil, fmt.Errorf("tsdb: bad %q line %q", convertPrefix, s.convert)
		}
		old, err := db.oldTable(ctx, f[0])
		if err != nil {
			return ctx, nil, err
		}
		due = due || old
	}
	if !due {
		return ctx, func() {}, nil
	}
	lost, release, err := db.opt.ConvertLock(ctx)
	if err != nil {
		return ctx, nil, fmt.Errorf("tsdb: convert: lock: %w", err)
	}
	lctx, cancel := context.WithCancel(ctx)
	stop := make(chan struct{})
	go func() {
		select {
		case <-lost:
			cancel()
		case <-stop:
		}
	}()
	return lctx, func() { close(stop); cancel(); release() }, nil
}

// convertOldViews are the views of the layout before 00006: they read the
// time column and are dropped before the swap (00006 creates their
// successors, *_mv6).
var convertOldViews = []string{"device_property_hourly_mv", "device_property_product_hourly_mv", "device_property_daily_mv"}

const (
	// convertColumns are the columns copied, as the new table names them.
	convertColumns = "ts, product_id, device_id, property, value_type, num_value, str_value"
	// convertOldMonth and convertNewMonth are the partition keys (toYYYYMM
	// in the server's zone) of the two layouts.
	convertOldMonth = "toYYYYMM(time)"
	convertNewMonth = "toYYYYMM(toDateTime(intDiv(ts, 1000)))"
)

// ConvertStats says what the last conversion did (the bench reads it).
type ConvertStats struct {
	Months   int           // partitions copied
	Rows     uint64        // rows copied
	Duration time.Duration // copying and swapping
}

// LastConversion is what this DB's Open converted (zero: nothing).
func (db *DB) LastConversion() ConvertStats { return db.converted }

// convert runs a --@convert statement.
func (db *DB) convert(ctx context.Context, s ddl) error {
	f := strings.Fields(s.convert)
	if len(f) != 2 || !identRE.MatchString(f[0]) || !identRE.MatchString(f[1]) {
		return fmt.Errorf("tsdb: bad %q line %q", convertPrefix, s.convert)
	}
	from, to := f[0], f[1]
	old, err := db.oldTable(ctx, from)
	if err != nil || !old {
		return err // nil: converted (or created in the new layout)
	}
	if err := db.convertAll(ctx, from, to); err != nil {
		// Another instance converting at the same time swapped the
		// tables first (its RENAME queued before this one's): done.
		if old, cerr := db.oldTable(ctx, from); cerr == nil && !old {
			return nil
		}
		return err
	}
	return nil
}

// oldTable reports whether from (its replicated table in cluster mode)
// still has the time column of the layout before 00006.
func (db *DB) oldTable(ctx context.Context, from string) (bool, error) {
	ctx, cancel := db.ctx(ctx)
	defer cancel()
	var n uint64
	if err := db.conn.QueryRow(ctx, "SELECT count() FROM system.columns WHERE database = currentDatabase() AND table = ? AND name = 'time'",
		db.storageTable(from)).Scan(&n); err != nil {
		return false, fmt.Errorf("tsdb: convert %s: %w", from, err)
	}
	return n > 0, nil
}

// convertAll copies every month not yet copied, then swaps.
func (db *DB) convertAll(ctx context.Context, from, to string) error {
	start := time.Now()
	st := ConvertStats{}
	for pass := 0; ; pass++ {
		months, err := db.convertMonths(ctx, from, to)
		if err != nil {
			return err
		}
		if len(months) == 0 {
			break
		}
		if pass > 10 {
			return fmt.Errorf("tsdb: convert %s: months %v keep changing: stop the instances that still write it", from, months)
		}
		for _, m := range months {
			n, err := db.convertMonth(ctx, from, to, m)
			if err != nil {
				return err
			}
			st.Months++
			st.Rows += n
		}
	}
	if err := db.convertSwap(ctx, from, to); err != nil {
		return err
	}
	st.Duration = time.Since(start)
	db.converted = st
	return nil
}

// convertMonths lists the months of from that are not recorded as copied
// with their current row count or that to does not hold with that count,
// and the months to holds that from has not.
func (db *DB) convertMonths(ctx context.Context, from, to string) ([]string, error) {
	ctx, cancel := db.ctx(ctx)
	defer cancel()
	have := map[string]uint64{}
	rows, err := db.conn.Query(ctx, "SELECT toString("+convertOldMonth+") AS m, count() FROM "+from+" GROUP BY m")
	if err != nil {
		return nil, fmt.Errorf("tsdb: convert %s: count months: %w", from, err)
	}
	for rows.Next() {
		var m string
		var n uint64
		if err := rows.Scan(&m, &n); err != nil {
			rows.Close()
			return nil, fmt.Errorf("tsdb: convert %s: count months: %w", from, err)
		}
		have[m] = n
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("tsdb: convert %s: count months: %w", from, err)
	}
	done := map[string]uint64{}
	rows, err = db.conn.Query(ctx, "SELECT partition, max(copied) FROM "+to+"_copied GROUP BY partition")
	if err != nil {
		return nil, fmt.Errorf("tsdb: convert %s: read record: %w", from, err)
	}
	for rows.Next() {
		var m string
		var n uint64
		if err := rows.Scan(&m, &n); err != nil {
			rows.Close()
			return nil, fmt.Errorf("tsdb: convert %s: read record: %w", from, err)
		}
		done[m] = n
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("tsdb: convert %s: read record: %w", from, err)
	}
	// What <to> holds of each month: a month whose copy differs from its
	// record (rows a converter whose lock was lost still wrote) is copied
	// again, a month <to> holds and <from> no longer has is emptied.
	held := map[string]uint64{}
	rows, err = db.conn.Query(ctx, "SELECT toString("+convertNewMonth+") AS m, count() FROM "+to+" GROUP BY m")
	if err != nil {
		return nil, fmt.Errorf("tsdb: convert %s: count copied months: %w", from, err)
	}
	for rows.Next() {
		var m string
		var n uint64
		if err := rows.Scan(&m, &n); err != nil {
			rows.Close()
			return nil, fmt.Errorf("tsdb: convert %s: count copied months: %w", from, err)
		}
		held[m] = n
		if _, ok := have[m]; !ok {
			have[m] = 0
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("tsdb: convert %s: count copied months: %w", from, err)
	}
	var out []string
	for m, n := range have {
		if c, ok := done[m]; !ok || c != n || held[m] != n {
			out = append(out, m)
		}
	}
	sort.Strings(out)
	return out, nil
}

// convertMonth copies month m (YYYYMM) of from into to, replacing what to
// held of it, and records it; it returns the rows copied.
func (db *DB) convertMonth(ctx context.Context, from, to, m string) (uint64, error) {
	if _, err := fmt.Sscanf(m, "%d", new(int)); err != nil || len(m) != 6 {
		return 0, fmt.Errorf("tsdb: convert %s: month %q", from, m)
	}
	qctx, cancel := db.ctx(ctx)
	defer cancel()
	var n uint64
	if err := db.conn.QueryRow(qctx, "SELECT count() FROM "+from+" WHERE "+convertOldMonth+" = "+m).Scan(&n); err != nil {
		return 0, fmt.Errorf("tsdb: convert %s: count %s: %w", from, m, err)
	}
	if err := db.conn.Exec(qctx, "ALTER TABLE "+db.alterTarget(db.storageTable(to))+" DROP PARTITION ID "+quoteString(m)); err != nil {
		return 0, fmt.Errorf("tsdb: convert %s: empty %s of %s: %w", from, m, to, err)
	}
	// The copy itself as long as it takes (the caller's ctx bounds it).
	if err := db.conn.Exec(ctx, "INSERT INTO "+to+" ("+convertColumns+") SELECT "+convertColumns+" FROM "+from+
		" WHERE "+convertOldMonth+" = "+m); err != nil {
		return 0, fmt.Errorf("tsdb: convert %s: copy %s: %w", from, m, err)
	}
	var got uint64
	if err := db.conn.QueryRow(qctx, "SELECT count() FROM "+to+" WHERE "+convertNewMonth+" = "+m).Scan(&got); err != nil {
		return 0, fmt.Errorf("tsdb: convert %s: count copy of %s: %w", from, m, err)
	}
	if got < n {
		return 0, fmt.Errorf("tsdb: convert %s: month %s: %d rows copied of %d", from, m, got, n)
	}
	// INSERT ... SELECT of literals (m is six digits): an INSERT with
	// VALUES and bound arguments is sent as a data block the driver
	// waits for.
	if err := db.conn.Exec(qctx, fmt.Sprintf("INSERT INTO %s_copied (partition, copied) SELECT %s, toUInt64(%d)", to, quoteString(m), got)); err != nil {
		return 0, fmt.Errorf("tsdb: convert %s: record %s: %w", from, m, err)
	}
	return got, nil
}

// convertSwap drops the old views, swaps the tables and drops the old
// one and the record.
func (db *DB) convertSwap(ctx context.Context, from, to string) error {
	ctx, cancel := db.ctx(ctx)
	defer cancel()
	q := func(t string) string { return "`" + db.opt.Database + "`.`" + t + "`" }
	var steps []string
	for _, v := range convertOldViews {
		steps = append(steps, "DROP TABLE IF EXISTS "+q(v)+db.onCluster())
	}
	old := from + "_v5"
	if !db.clustered() {
		steps = append(steps,
			"RENAME TABLE "+q(from)+" TO "+q(old)+", "+q(to)+" TO "+q(from),
			"DROP TABLE IF EXISTS "+q(old),
			"DROP TABLE IF EXISTS "+q(to+"_copied"))
	} else {
		// The replicated tables swap; the Distributed ones are made
		// again over them (their columns are the old layout's).
		l := localSuffix
		steps = append(steps,
			"RENAME TABLE "+q(from+l)+" TO "+q(old+l)+", "+q(to+l)+" TO "+q(from+l)+db.onCluster(),
			"DROP TABLE IF EXISTS "+q(from)+db.onCluster(),
			"DROP TABLE IF EXISTS "+q(to)+db.onCluster(),
			"CREATE TABLE IF NOT EXISTS "+q(from)+db.onCluster()+" AS "+q(from+l)+
				" ENGINE = Distributed("+quoteString(db.opt.Cluster)+", "+quoteString(db.opt.Database)+", "+quoteString(from+l)+", cityHash64(device_id))",
			"DROP TABLE IF EXISTS "+q(old+l)+db.onCluster(),
			"DROP TABLE IF EXISTS "+q(to+"_copied")+db.onCluster(),
			"DROP TABLE IF EXISTS "+q(to+"_copied"+l)+db.onCluster())
	}
	for _, s := range steps {
		if err := db.conn.Exec(ctx, s); err != nil {
			return fmt.Errorf("tsdb: convert %s: %q: %w", from, s, err)
		}
	}
	return nil
}
