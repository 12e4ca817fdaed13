package tsdb_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"devicehub/ingest/wire"
	"devicehub/tsdb"
)

type countInserter struct{ rows atomic.Int64 }

func (c *countInserter) InsertBatch(_ context.Context, b *tsdb.Batch) error {
	c.rows.Add(int64(b.Len()))
	return nil
}

// BenchmarkBatchBuilding: decoded rows of one message (a property report
// with 8 properties: 9 rows) added to the ClickHouse batch writer (flush
// at 20000 rows into an inserter that only counts): the cost of batching,
// without the network. No services needed:
//
//	go test -run '^$' -bench BatchBuilding -benchmem ./tsdb/
func BenchmarkBatchBuilding(b *testing.B) {
	var rows wire.Rows
	t, _ := wire.ParseTopic("/meter/meter-000007/properties/report")
	payload := []byte(`{"messageId":"1717243200000-42","timestamp":1717243200000,"properties":{"temperature":21.53,"humidity":48.2,"pressure":1013.25,"voltage":3.31,"on":true,"mode":"auto","rssi":-67,"fw":"1.4.2"}}`)
	if err := wire.DecodeReport(&rows, t, payload, time.Now()); err != nil {
		b.Fatal(err)
	}
	ins := &countInserter{}
	w := tsdb.NewWriter(ins, tsdb.WriterOptions{MaxRows: 20000, FlushInterval: time.Second})
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if err := w.Add(ctx, rows.Msgs, rows.Props, nil); err != nil {
			b.Fatal(err)
		}
	}
	el := b.Elapsed()
	if err := w.Close(ctx); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/el.Seconds(), "msgs/s")
	b.ReportMetric(float64(b.N*(len(rows.Msgs)+len(rows.Props)))/el.Seconds(), "rows/s")
}
