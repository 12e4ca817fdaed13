package tsdb_test

import (
	"context"
	"testing"
	"time"

	"devicehub/tsdb"
	"devicehub/tsdb/tsdbtest"
)

// TestLatestValues: the latest value of each requested property of each
// device, whether it is from the last day or older; other products,
// devices and properties are left out.
func TestLatestValues(t *testing.T) {
	db := tsdbtest.NewDB(t, time.UTC)
	ctx := context.Background()
	now := time.Now().Truncate(time.Millisecond)
	v := func(product, device, prop string, at time.Time, num float64) tsdb.PropertyValue {
		return tsdb.PropertyValue{Time: at, ProductID: product, DeviceID: device, Property: prop, ValueType: "number", Num: num}
	}
	rows := []tsdb.PropertyValue{
		v("p", "d1", "a", now.Add(-time.Hour), 1), v("p", "d1", "a", now.Add(-time.Minute), 2), // latest 2
		v("p", "d1", "b", now.Add(-72*time.Hour), 3), v("p", "d1", "b", now.Add(-96*time.Hour), 4), // older than a day: 3
		v("p", "d2", "a", now.Add(-40*24*time.Hour), 5), // only old
		v("p", "d3", "a", now, 6),                       // not asked for
		v("q", "d1", "a", now, 7),                       // another product
		v("p", "d1", "c", now, 8),                       // another property
		{Time: now.Add(-2 * time.Minute), ProductID: "p", DeviceID: "d2", Property: "b", ValueType: "string", Str: "x"},
	}
	if err := db.Insert(ctx, nil, rows); err != nil {
		t.Fatal(err)
	}
	got, err := db.LatestValues(ctx, "p", []string{"d1", "d2", "d4"}, []string{"a", "b"})
	if err != nil {
		t.Fatal(err)
	}
	want := map[[2]string]string{{"d1", "a"}: "2", {"d1", "b"}: "3", {"d2", "a"}: "5", {"d2", "b"}: "x"}
	if len(got) != len(want) {
		t.Fatalf("got %d values, want %d: %+v", len(got), len(want), got)
	}
	for _, g := range got {
		text := g.Str
		if g.ValueType == "number" {
			text = map[float64]string{2: "2", 3: "3", 5: "5"}[g.Num]
		}
		if w, ok := want[[2]string{g.DeviceID, g.Property}]; !ok || w != text {
			t.Errorf("%s/%s = %+v, want %q", g.DeviceID, g.Property, g, w)
		}
	}
	if got, err := db.LatestValues(ctx, "p", nil, []string{"a"}); err != nil || len(got) != 0 {
		t.Fatalf("no devices: %v %v", got, err)
	}
}
