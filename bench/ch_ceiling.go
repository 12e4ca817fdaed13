package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"devicehub/ingest"
	"devicehub/ingest/wire"
	"devicehub/tsdb"
)

// chCeilingPool is how many distinct messages the ClickHouse ceiling
// decodes up front and then inserts over and over: enough to cover every
// device several times, small enough to build in well under a second.
const chCeilingPool = 8192

// ClickHouseCeilingResult is the raw insert ceiling of ClickHouse for
// RunIngest's messages.
type ClickHouseCeilingResult struct {
	Messages  int64         // messages stored (each one device_message row plus its properties)
	Rows      int64         // rows of both tables
	Elapsed   time.Duration // first Add to the last batch stored
	Rate      float64       // messages/s
	RowRate   float64       // rows/s
	Writers   int           // concurrent batch writers, as the server's default
	CPU       CPUBreakdown
	PoolBuild time.Duration // decoding the message pool, not timed
}

// clickHouseCeiling inserts, for d, the very rows the ingester writes for
// RunIngest's reports (decoded by wire.Decode: one device_message row
// and 2 + i%13 device_property rows for device i) straight into a
// throwaway ClickHouse database through tsdb.Writer, with the server's
// default writer count and batch size, one Add per message as the
// ingester's workers do. There is no MQTT and no device lookup: it is what
// ClickHouse (and the tsdb client) can take on this machine. The rows are
// decoded before the clock starts, so generating them costs nothing.
func clickHouseCeiling(ctx context.Context, p IngestParams, product string, ids []string, procs []namedProc) (ClickHouseCeilingResult, error) {
	var res ClickHouseCeilingResult
	topt := tsdb.DefaultOptions()
	topt.Addr, topt.Database, topt.TimeZone = p.ClickHouseAddr, "devicehub_bench_chceil_"+randHex(4), time.UTC
	topt.Cluster = p.ClickHouseCluster
	db, err := tsdb.Open(ctx, topt)
	if err != nil {
		return res, err
	}
	defer db.Close()
	defer func() {
		dctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = db.DropDatabase(dctx)
	}()

	// The message pool, decoded as the ingester decodes.
	t0 := time.Now()
	pool := make([]wire.Rows, chCeilingPool)
	now := time.Now()
	for k := range pool {
		i := k % len(ids)
		topic := wire.DeviceTopic(product, ids[i], wire.LevelReport)
		t, ok := wire.ParseTopic(topic)
		if !ok {
			return res, fmt.Errorf("bench: topic %q", topic)
		}
		if err := wire.Decode(&pool[k], t, reportPayload(nil, ids[i], i, int64(k)), now, nil); err != nil {
			return res, fmt.Errorf("bench: decode: %w", err)
		}
	}
	res.PoolBuild = time.Since(t0)

	// The server's defaults: ingest's writer count, tsdb's writer options.
	res.Writers = ingest.DefaultOptions().Writers
	wopt := tsdb.WriterOptions{} // zero: tsdb's defaults, which the server keeps
	var stored, rows, lastDone atomic.Int64
	writers := make([]*tsdb.Writer, res.Writers)
	for n := range writers {
		writers[n] = tsdb.NewWriter(db, wopt)
	}
	span := startCPUSpan("raw ClickHouse insert", procs)
	start := time.Now()
	deadline := start.Add(p.ClickHouseDuration)
	var wg sync.WaitGroup
	errc := make(chan error, len(writers))
	for n, w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := n; time.Now().Before(deadline); k += len(writers) {
				r := &pool[k%len(pool)]
				nrows := int64(len(r.Msgs) + len(r.Props))
				if err := w.Add(ctx, r.Msgs, r.Props, func() {
					stored.Add(1)
					rows.Add(nrows)
					lastDone.Store(time.Now().UnixNano())
				}); err != nil {
					errc <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	// Flush what is buffered; Close waits for it.
	cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	var errs []error
	for _, w := range writers {
		errs = append(errs, w.Close(cctx))
	}
	end := span.snapshot()
	errs = append(errs, <-errc)
	if err := errors.Join(errs...); err != nil {
		return res, fmt.Errorf("bench: ClickHouse ceiling: %w", err)
	}
	res.Messages, res.Rows = stored.Load(), rows.Load()
	if res.Messages == 0 {
		return res, errors.New("bench: ClickHouse ceiling: nothing stored")
	}
	res.Elapsed = time.Duration(lastDone.Load() - start.UnixNano())
	res.Rate = float64(res.Messages) / res.Elapsed.Seconds()
	res.RowRate = float64(res.Rows) / res.Elapsed.Seconds()
	res.CPU = span.breakdown(end, res.Messages)

	// Cross-check: ClickHouse holds what the writers reported stored.
	var n uint64
	if err := db.Conn().QueryRow(ctx, "SELECT count() FROM device_message").Scan(&n); err != nil {
		return res, err
	}
	if int64(n) != res.Messages {
		return res, fmt.Errorf("bench: ClickHouse ceiling: %d messages stored, %d counted", res.Messages, n)
	}
	return res, nil
}
