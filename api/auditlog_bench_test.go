package api

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"devicehub/meta/metatest"
)

// BenchmarkAuditRecord is what auditing costs a write request: record,
// from every core at once, while the writer stores the entries in
// PostgreSQL in batches of the default size. ns/op is the request path's
// share; stored/s is the writer's rate, from the first record to the last
// entry stored (the buffer holds every entry: none is dropped).
//
//	go test -run '^$' -bench AuditRecord -benchtime 200000x ./api/
func BenchmarkAuditRecord(b *testing.B) {
	store := metatest.NewStore(b)
	opts := DefaultOptions()
	opts.AuditQueue = max(b.N, opts.AuditBatch)
	a := newAuditLog(store, opts, slog.New(slog.NewTextHandler(io.Discard, nil)), prometheus.NewRegistry())
	e := entryN(1)
	start := time.Now()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			a.record(e)
		}
	})
	b.StopTimer()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a.close(ctx)
	written, dropped := counterValue(a.written), counterValue(a.dropped)
	b.ReportMetric(written/time.Since(start).Seconds(), "stored/s")
	if written != float64(b.N) || dropped != 0 {
		b.Fatalf("%v stored, %v dropped of %d recorded", written, dropped, b.N)
	}
}
