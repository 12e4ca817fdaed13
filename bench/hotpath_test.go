package bench

// In-process benchmarks of the hot paths, no services needed:
//
//	go test -run '^$' -bench 'Decode|Batch|QueryBody|Envelope' -benchmem ./bench/

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"devicehub/ingest/wire"
	"devicehub/meta"
	"devicehub/tsdb"
)

// BenchmarkDecodeReport: topic parsing and decoding of a property report
// with 8 properties (RunIngest's payload shape).
func BenchmarkDecodeReport(b *testing.B) {
	topic := "/meter/meter-000007/properties/report"
	payload := reportPayload(nil, "meter-000007", 6, 42)
	var rows wire.Rows
	now := time.Now()
	b.SetBytes(int64(len(payload)))
	b.ReportAllocs()
	for b.Loop() {
		rows.Reset()
		t, ok := wire.ParseTopic(topic)
		if !ok {
			b.Fatal("topic")
		}
		if err := wire.DecodeReport(&rows, t, payload, now); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
	b.ReportMetric(float64(len(rows.Props)), "props/msg")
}

type countInserter struct{ rows atomic.Int64 }

func (c *countInserter) InsertBatch(_ context.Context, b *tsdb.Batch) error {
	c.rows.Add(int64(b.Len()))
	return nil
}

// BenchmarkBatchBuilding: decoded rows of one message added to the
// ClickHouse batch writer (flush at 20000 rows into an inserter that only
// counts): the cost of batching, without the network.
func BenchmarkBatchBuilding(b *testing.B) {
	var rows wire.Rows
	t, _ := wire.ParseTopic("/meter/meter-000007/properties/report")
	if err := wire.DecodeReport(&rows, t, reportPayload(nil, "meter-000007", 6, 42), time.Now()); err != nil {
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

// BenchmarkQueryBody: decoding and compiling a typical device list body
// (a like and an eq term in a group, a sort, a page) to SQL.
func BenchmarkQueryBody(b *testing.B) {
	body := []byte(`{"pageIndex":2,"pageSize":25,"sorts":[{"name":"createTime","order":"desc"}],
		"terms":[{"terms":[{"column":"name","value":"%kitchen%","termType":"like"},
		{"column":"productId","value":"product-3","termType":"eq","type":"and"},
		{"column":"state","value":"online,offline","termType":"in","type":"and"}]}]}`)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		q, err := meta.DecodeQuery(body)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := meta.DeviceResource.Compile(q); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "bodies/s")
}

// BenchmarkEnvelope: encoding a page of 25 devices in the response
// envelope. Fiber's c.JSON is encoding/json's Marshal plus a copy into
// the response, so this is the encoding cost of a list answer.
func BenchmarkEnvelope(b *testing.B) {
	type device struct {
		ID          string            `json:"id"`
		Name        string            `json:"name"`
		ProductID   string            `json:"productId"`
		ProductName string            `json:"productName"`
		State       map[string]string `json:"state"`
		CreateTime  int64             `json:"createTime"`
		Describe    string            `json:"describe,omitempty"`
	}
	type page struct {
		PageIndex, PageSize, Total int
		Data                       []device `json:"data"`
	}
	type envelope struct {
		Message   string `json:"message"`
		Result    any    `json:"result,omitempty"`
		Status    int    `json:"status"`
		Code      string `json:"code,omitempty"`
		Timestamp int64  `json:"timestamp"`
	}
	p := page{PageSize: 25, Total: 12500}
	for i := range 25 {
		p.Data = append(p.Data, device{ID: "dev-00000" + string(rune('0'+i%10)), Name: "Kitchen meter 1234",
			ProductID: "product-3", ProductName: "Product 3", State: map[string]string{"text": "Online", "value": "online"},
			CreateTime: 1795432565768})
	}
	var n int
	b.ReportAllocs()
	for b.Loop() {
		js, err := json.Marshal(envelope{Message: "success", Result: p, Status: 200, Timestamp: time.Now().UnixMilli()})
		if err != nil {
			b.Fatal(err)
		}
		n = len(js)
	}
	b.SetBytes(int64(n))
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "envelopes/s")
}
