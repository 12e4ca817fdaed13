package tsdb

import (
	"fmt"
	"slices"
	"sort"
	"testing"
	"time"
)

// TestExportHistory checks what an export sends against what was stored:
// every value of the range, property by property, in time then value
// order, whatever the window size; Newest with its ties; empty ranges.
func TestExportHistory(t *testing.T) {
	db := shared(t)
	ctx := ctxT(t)
	base := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	var stored []PropertyValue
	for i := range 5000 {
		// Uneven spacing: bursts and gaps, several values per millisecond.
		ms := int64(i/3)*7 + int64(i%97)*1000*int64(i%2)
		stored = append(stored, PropertyValue{Time: base.Add(time.Duration(ms) * time.Millisecond), ProductID: "exp", DeviceID: "e1",
			Property: []string{"a", "b", "c"}[i%3], ValueType: "number", Num: float64(i % 11)})
	}
	stored = append(stored,
		PropertyValue{Time: base, ProductID: "exp", DeviceID: "e1", Property: "s", ValueType: "string", Str: "x,\"y\"\nz"},
		PropertyValue{Time: base, ProductID: "exp", DeviceID: "e2", Property: "a", ValueType: "number", Num: -1},  // another device
		PropertyValue{Time: base, ProductID: "exp2", DeviceID: "e1", Property: "a", ValueType: "number", Num: -2}, // another product
	)
	if err := db.Insert(ctx, nil, stored); err != nil {
		t.Fatal(err)
	}
	want := func(q ExportQuery) []string {
		var out []string
		var props []string
		for _, p := range q.Properties {
			if !slices.Contains(props, p) {
				props = append(props, p)
			}
		}
		for _, p := range stored {
			if p.ProductID != q.ProductID || p.DeviceID != q.DeviceID {
				continue
			}
			if len(q.Properties) == 0 && !slices.Contains(props, p.Property) {
				props = append(props, p.Property)
			}
		}
		if len(q.Properties) == 0 {
			sort.Strings(props)
		}
		for _, name := range props {
			var vs []PropertyValue
			for _, p := range stored {
				ms := p.Time.UnixMilli()
				if p.ProductID == q.ProductID && p.DeviceID == q.DeviceID && p.Property == name &&
					(q.From.IsZero() || ms >= q.From.UnixMilli()) && (q.To.IsZero() || ms < q.To.UnixMilli()) {
					vs = append(vs, p)
				}
			}
			sort.SliceStable(vs, func(i, j int) bool { return valueBefore(vs[i], vs[j]) })
			if q.Newest > 0 && len(vs) > q.Newest {
				cut := vs[len(vs)-q.Newest].Time.UnixMilli()
				for len(vs) > 0 && vs[0].Time.UnixMilli() < cut {
					vs = vs[1:]
				}
			}
			for _, v := range vs {
				out = append(out, fmt.Sprintf("%s %d %s %g %q", v.Property, v.Time.UnixMilli(), v.ValueType, v.Num, v.Str))
			}
		}
		return out
	}
	f := func(q ExportQuery, windowRows uint64) {
		t.Helper()
		e, err := db.PrepareExport(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		if windowRows > 0 {
			e.windowRows = windowRows
		}
		var got []string
		if err := e.Each(ctx, func(v *PropertyValue) error {
			got = append(got, fmt.Sprintf("%s %d %s %g %q", v.Property, v.Time.UnixMilli(), v.ValueType, v.Num, v.Str))
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		w := want(q)
		if !slices.Equal(got, w) {
			i := 0
			for i < min(len(got), len(w)) && got[i] == w[i] {
				i++
			}
			t.Fatalf("%+v windows %d: %d values, want %d; first difference at %d: got %q, want %q",
				q, windowRows, len(got), len(w), i, got[i:min(i+3, len(got))], w[i:min(i+3, len(w))])
		}
		if q.Newest == 0 && e.Rows() != uint64(len(w)) {
			t.Fatalf("%+v: Rows %d, want %d", q, e.Rows(), len(w))
		}
	}
	all := ExportQuery{ProductID: "exp", DeviceID: "e1"}
	f(all, 0)
	f(all, 100)
	// A window a value: each window is a query, so over half a second
	// (118 values, 2 pairs of one property at one millisecond), not all
	// 5,000: under a loaded make test 5,000 queries ran past ctxT's minute.
	f(ExportQuery{ProductID: "exp", DeviceID: "e1", From: base.Add(7 * time.Second), To: base.Add(7500 * time.Millisecond)}, 1)
	f(ExportQuery{ProductID: "exp", DeviceID: "e1", Properties: []string{"c", "a", "nope", "c"}}, 37)
	f(ExportQuery{ProductID: "exp", DeviceID: "e1", From: base.Add(time.Second), To: base.Add(40 * time.Second)}, 50)
	f(ExportQuery{ProductID: "exp", DeviceID: "e1", To: base.Add(9 * time.Second), Newest: 10}, 0)
	f(ExportQuery{ProductID: "exp", DeviceID: "e1", Newest: 1}, 3)
	f(ExportQuery{ProductID: "exp", DeviceID: "e1", From: base.Add(time.Second), To: base.Add(time.Second)}, 0)
	f(ExportQuery{ProductID: "exp", DeviceID: "none"}, 0)
}
