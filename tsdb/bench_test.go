package tsdb

import (
	"context"
	"fmt"
	"testing"
	"time"
)

func benchRows(n int) ([]Message, []PropertyValue) {
	base := time.Date(2024, 2, 29, 12, 0, 0, 0, time.UTC)
	ms := make([]Message, n)
	ps := make([]PropertyValue, n)
	for i := range ms {
		tm := base.Add(time.Duration(i) * time.Millisecond)
		dev := fmt.Sprintf("dev-%04d", i%1000)
		ms[i] = Message{Time: tm, ProductID: "bench", DeviceID: dev, Direction: "up", MessageType: "REPORT_PROPERTY",
			MessageID: fmt.Sprint(i), Topic: "/bench/" + dev + "/properties/report", Payload: []byte(`{"temperature":21.5,"humidity":40}`)}
		ps[i] = PropertyValue{Time: tm, ProductID: "bench", DeviceID: dev, Property: "temperature", ValueType: "number", Num: 21.5}
	}
	return ms, ps
}

// BenchmarkInsert stores batches of 10000 messages plus 10000 property
// values; "columns" is DB.Insert (whole-column appends), "rows" the
// row-by-row batch.Append it replaced, kept here for comparison.
func BenchmarkInsert(b *testing.B) {
	db := openDB(b, "bench", time.UTC)
	ms, ps := benchRows(10000)
	ctx := context.Background()
	run := func(b *testing.B, insert func() error) {
		b.ResetTimer()
		for b.Loop() {
			if err := insert(); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N*(len(ms)+len(ps)))/b.Elapsed().Seconds(), "rows/s")
	}
	b.Run("columns", func(b *testing.B) {
		run(b, func() error { return db.Insert(ctx, ms, ps) })
	})
	b.Run("rows", func(b *testing.B) {
		run(b, func() error { return insertRowByRow(ctx, db, ms, ps) })
	})
}

func insertRowByRow(ctx context.Context, db *DB, ms []Message, ps []PropertyValue) error {
	batch, err := db.Conn().PrepareBatch(ctx, insertMessages)
	if err != nil {
		return err
	}
	for i := range ms {
		m := &ms[i]
		if err := batch.Append(m.Time, m.Time.UnixMilli(), m.ProductID, m.DeviceID, m.Direction, m.MessageType, m.MessageID, m.Topic, string(m.Payload)); err != nil {
			batch.Close()
			return err
		}
	}
	if err := batch.Send(); err != nil {
		return err
	}
	batch, err = db.Conn().PrepareBatch(ctx, insertProps)
	if err != nil {
		return err
	}
	for i := range ps {
		p := &ps[i]
		if err := batch.Append(p.Time, p.Time.UnixMilli(), p.ProductID, p.DeviceID, p.Property, p.ValueType, p.Num, p.Str); err != nil {
			batch.Close()
			return err
		}
	}
	return batch.Send()
}
