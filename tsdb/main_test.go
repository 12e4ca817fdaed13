package tsdb

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// Integration tests use a ClickHouse at $DEVICEHUB_CLICKHOUSE_ADDR
// (default 127.0.0.1:9000, start it with .ci/services), each run in its
// own databases, dropped at the end.

var (
	shanghai = mustLoad("Asia/Shanghai")
	berlin   = mustLoad("Europe/Berlin")

	sharedMu   sync.Mutex // toDrop
	toDrop     []*DB
	sharedOpen sync.Mutex // sharedDB
	sharedDB   *DB
	runSuffix  = fmt.Sprintf("%d_%d", time.Now().Unix(), rand.IntN(1e6))
)

func mustLoad(name string) *time.Location {
	l, err := time.LoadLocation(name)
	if err != nil {
		panic(err)
	}
	return l
}

func TestMain(m *testing.M) {
	code := m.Run()
	for _, db := range toDrop {
		// Each its own bound: one slow drop does not leave the rest.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if err := db.DropDatabase(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "drop test database:", err)
		}
		cancel()
		db.Close()
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

func testOptions(name string, loc *time.Location) Options {
	opt := DefaultOptions()
	if a := os.Getenv("DEVICEHUB_CLICKHOUSE_ADDR"); a != "" {
		opt.Addr = a
	}
	opt.Database = "devicehub_test_" + name + "_" + runSuffix
	opt.TimeZone = loc
	return opt
}

// openDB opens (and registers for dropping) a database of this run.
func openDB(t testing.TB, name string, loc *time.Location) *DB {
	t.Helper()
	return openDBWith(t, testOptions(name, loc))
}

// openDBWith is openDB with options of the test's own (testOptions, then
// changed).
func openDBWith(t testing.TB, opt Options) *DB {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, err := Open(ctx, opt)
	if err != nil {
		t.Fatalf("open ClickHouse (run .ci/services if it is down): %v", err)
	}
	sharedMu.Lock()
	toDrop = append(toDrop, db)
	sharedMu.Unlock()
	return db
}

// shared returns the run's main test database (platform zone Asia/Shanghai);
// tests keep apart by product id. The first call opens it, under
// sharedOpen so that parallel tests open it once.
func shared(t testing.TB) *DB {
	t.Helper()
	sharedOpen.Lock()
	defer sharedOpen.Unlock()
	if sharedDB == nil {
		sharedDB = openDB(t, "main", shanghai)
	}
	return sharedDB
}

// ctxT bounds a test against a hang, not its speed: on a 2-core machine
// about half as fast as the usual, under make test, TestPropertyAggregates
// and TestExportHistory ran past one minute.
func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	return ctx
}
