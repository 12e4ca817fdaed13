package bench

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"devicehub/meta/metatest"
)

// TestCommitProbe: the probe's transactions each take a transaction id
// (their commit is a WAL flush, not a no-op) and are timed.
func TestCommitProbe(t *testing.T) {
	t.Parallel()
	dsn := metatest.ServerDSN() + "/postgres?sslmode=disable"
	db, err := sql.Open("postgres", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var before int64
	if err := db.QueryRowContext(ctx, `SELECT txid_current()`).Scan(&before); err != nil {
		t.Fatal(err)
	}
	stop, err := startCommitProbe(ctx, dsn, 10*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	s := stop()
	var after int64
	if err := db.QueryRowContext(ctx, `SELECT txid_current()`).Scan(&after); err != nil {
		t.Fatal(err)
	}
	if s.N < 3 || s.P50Ms <= 0 || s.MaxMs < s.P50Ms {
		t.Fatalf("commit probe: %+v", s)
	}
	// Each timed commit took an id: at least N of them between ours.
	if after-before-1 < s.N {
		t.Fatalf("%d transaction ids taken between, %d commits timed", after-before-1, s.N)
	}
}
