package bench

import (
	"context"
	"sync"
	"time"

	"devicehub/schema/backoff"
)

// startCommitProbe times PostgreSQL's commit of a transaction of its own
// every interval, on a connection of its own, until the returned stop: a
// `SELECT txid_current()` in autocommit takes a transaction id, so its
// commit writes a commit record and waits for its WAL to be flushed, as
// every durable write's commit does. Its latency, measured beside a
// scenario on the same server at the same time, is the floor under any
// of the scenario's latencies that wait for a commit (an alarm is on
// /api/live only after the write that raised it committed).
func startCommitProbe(ctx context.Context, dsn string, every time.Duration) (stop func() LatencySummary, err error) {
	db, err := openPG(dsn, 1)
	if err != nil {
		return nil, err
	}
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, err
	}
	var h Histogram
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		backoff.Every(ctx.Done(), every, func(time.Time) bool {
			t0 := time.Now()
			var xid int64
			if db.QueryRowContext(ctx, `SELECT txid_current()`).Scan(&xid) == nil {
				h.Record(time.Since(t0))
			}
			return true
		})
	}()
	return func() LatencySummary {
		cancel()
		wg.Wait()
		db.Close()
		return h.Summary()
	}, nil
}
