package bench

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"

	"devicehub/tsdb"
)

// TestRunStorageSmall runs the storage scenario on 200,000 values: every
// generated report stored with its 10 values, every table and column
// sized from system.columns (the columns adding up to the table), one
// property of each kind sized, the queries answered in full, the values
// stored again through tsdb.InsertBatch, and both databases dropped.
// Correctness only, not sizes or timing.
func TestRunStorageSmall(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	name := "devicehub_bench_storage_test_" + randHex(4)
	r, err := RunStorage(ctx, StorageParams{Values: 200_000, Queries: 20, InsertValues: 20_000, Database: name, Layouts: true, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	if r.Messages == 0 || r.Values != r.Messages*uint64(len(storageProps)) || r.Values > 200_000 || r.Values < 190_000 {
		t.Fatalf("%d values, %d messages", r.Values, r.Messages)
	}
	if r.Devices != 20 {
		t.Errorf("%d devices, want the minimum 20", r.Devices)
	}
	sizes := map[string]StorageTable{}
	for _, tb := range r.Tables {
		sizes[tb.Table] = tb
		var sum uint64
		for _, c := range tb.Columns {
			sum += c.Compressed
		}
		if sum != tb.Compressed || tb.Compressed == 0 || tb.Uncompressed == 0 {
			t.Errorf("%s: %d compressed bytes, columns add up to %d; %d uncompressed", tb.Table, tb.Compressed, sum, tb.Uncompressed)
		}
	}
	if p := sizes["device_property"]; p.Rows != r.Values || len(p.Columns) < 5 || p.Uncompressed <= p.Compressed {
		t.Errorf("device_property: %+v", p)
	}
	if m := sizes["device_message"]; m.Rows != r.Messages {
		t.Errorf("device_message: %d rows, want %d", m.Rows, r.Messages)
	}
	if r.PropertyBytes <= 0 || r.MessageBytes <= r.PropertyBytes || r.AllBytes <= r.PropertyBytes {
		t.Errorf("bytes: property %.2f, message %.2f, all %.2f", r.PropertyBytes, r.MessageBytes, r.AllBytes)
	}
	var kinds []string
	for _, k := range r.Kinds {
		kinds = append(kinds, k.Kind)
		if k.BytesPerRow <= 0 {
			t.Errorf("kind %s: %.2f B", k.Kind, k.BytesPerRow)
		}
	}
	if got := strings.Join(kinds, ","); got != "float,counter,int,enum,bool,string,json" {
		t.Errorf("kinds %s", got)
	}
	if len(r.Layouts) != len(storageLayouts18) || r.Layouts[0].Rows != r.Values || r.Layouts[2].Rows != r.Values || r.Layouts[1].BytesPerRow <= 0 {
		t.Errorf("layouts: %+v", r.Layouts)
	}
	if o := r.Before; o == nil || o.Values != r.Values || o.PropertyBytes <= r.PropertyBytes || o.HistoryPerSec <= 0 || o.InsertValues != r.InsertValues {
		t.Errorf("before the conversion: %+v", o)
	}
	if r.ConvertRows != r.Values || r.ConvertMonths < 1 || r.ConvertSeconds <= 0 {
		t.Errorf("conversion: %d values, %d months, %.1fs", r.ConvertRows, r.ConvertMonths, r.ConvertSeconds)
	}
	if r.HistoryPerSec <= 0 || r.AggPerSec <= 0 || r.AggRollupPerSec <= 0 || r.Queries != 20 {
		t.Errorf("queries: %d, %.1f/s, %.1f/s", r.Queries, r.HistoryPerSec, r.AggPerSec)
	}
	if r.InsertValues != 20_000 || r.InsertPerSec <= 0 {
		t.Errorf("insert: %d values, %.0f/s", r.InsertValues, r.InsertPerSec)
	}
	if md := r.Markdown(); !strings.Contains(md, "| **device_property** |") || !strings.Contains(md, "| json | config |") || !strings.Contains(md, "| device_property B/value | ") {
		t.Errorf("markdown:\n%s", md)
	}
	conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{tsdb.DefaultOptions().Addr}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var left uint64
	if err := conn.QueryRow(ctx, "SELECT count() FROM system.databases WHERE name IN (?, ?)", name, name+"_insert").Scan(&left); err != nil || left != 0 {
		t.Errorf("%d databases left (%v)", left, err)
	}
}
