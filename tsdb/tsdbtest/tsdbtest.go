// Package tsdbtest gives tests a ClickHouse database of their own on the
// real server ($DEVICEHUB_CLICKHOUSE_ADDR, default 127.0.0.1:9000), with the
// tables applied, dropped when the test ends.
package tsdbtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"testing"
	"time"

	"devicehub/bench/testkit"
	"devicehub/tsdb"
)

// NewDB opens database devicehub_test_<random> in the platform zone loc.
func NewDB(t testing.TB, loc *time.Location) *tsdb.DB {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	return OpenDB(t, "devicehub_test_"+hex.EncodeToString(b[:]), loc)
}

// OpenDB opens database name, creating it and its tables if need be, in
// the platform zone loc (nil: tsdb's default), and drops it when the test
// ends: also for a database a server under test created.
func OpenDB(t testing.TB, name string, loc *time.Location) *tsdb.DB {
	t.Helper()
	opt := tsdb.DefaultOptions()
	if a := os.Getenv("DEVICEHUB_CLICKHOUSE_ADDR"); a != "" {
		opt.Addr = a
	}
	opt.Database = name
	if loc != nil {
		opt.TimeZone = loc
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, err := tsdb.Open(ctx, opt)
	if err != nil {
		t.Fatalf("tsdbtest: open (is ClickHouse up? run `make services`): %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = db.DropDatabase(ctx)
		db.Close()
	})
	return db
}

// StoredCounts returns how many device_message rows each message id has,
// of messages in direction dir ("up", "down"; "" for both): the fault
// tests compare it with what was published and acknowledged.
func StoredCounts(ctx context.Context, db *tsdb.DB, dir string) (map[string]uint64, error) {
	return db.MessageIDCounts(ctx, dir)
}

// AwaitStored polls StoredCounts until every message id of ids is stored
// or timeout has passed, and returns the last counts and the ids still
// missing (all of them while the database does not answer).
func AwaitStored(db *tsdb.DB, dir string, ids []string, timeout time.Duration) (got map[string]uint64, missing []string) {
	testkit.Within(timeout, func() bool {
		var err error
		got, err = StoredCounts(context.Background(), db, dir)
		missing = missing[:0]
		for _, id := range ids {
			if err != nil || got[id] == 0 {
				missing = append(missing, id)
			}
		}
		return len(missing) == 0
	})
	return got, missing
}

// Duplicates sums counts (as StoredCounts returns them): rows stored, rows
// beyond the first of each id, and the ids stored more than once.
func Duplicates(counts map[string]uint64) (rows, dups uint64, ids []string) {
	for id, n := range counts {
		rows += n
		if n > 1 {
			dups += n - 1
			ids = append(ids, id)
		}
	}
	return rows, dups, ids
}
