package tsdb

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestHistoryRange: the newest N values of a range, oldest first; paging
// with To set to a page's oldest millisecond walks back through every
// value exactly once, also where values share that millisecond; bounds
// are exact to the millisecond.
func TestHistoryRange(t *testing.T) {
	db := shared(t)
	ctx := ctxT(t)
	base := sh(t, "2024-05-01 08:00:00")
	var ps []PropertyValue
	add := func(prop string, at time.Duration, v float64) {
		ps = append(ps, PropertyValue{Time: base.Add(at), ProductID: "hr_p", DeviceID: "d1", Property: prop, ValueType: "number", Num: v})
	}
	for i := range 20 {
		add("temp", time.Duration(i)*1500*time.Millisecond, float64(i)) // 1.5 s apart: two values in some seconds
	}
	// Three values at the millisecond of value 10, and one 1 ms before it.
	add("temp", 15*time.Second, 10.5)
	add("temp", 15*time.Second, 9.75)
	add("temp", 15*time.Second-time.Millisecond, 9.9)
	for i := range 5 {
		add("hum", time.Duration(i)*time.Hour, float64(50+i))
	}
	ps = append(ps, PropertyValue{Time: base, ProductID: "hr_p", DeviceID: "d2", Property: "temp", ValueType: "number", Num: 99})
	if err := db.Insert(ctx, nil, ps); err != nil {
		t.Fatal(err)
	}
	f := func(q HistoryQuery, want string) []PropertyValue {
		t.Helper()
		q.ProductID, q.DeviceID = "hr_p", "d1"
		got, err := db.HistoryRange(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		if numbersText(got) != want {
			t.Fatalf("%+v:\n got %s\nwant %s", q, numbersText(got), want)
		}
		return got
	}
	at := func(d time.Duration) time.Time { return base.Add(d) }
	temp := []string{"temp"}
	// [from, to) to the millisecond: 1.5 s is value 1, 6 s value 4.
	f(HistoryQuery{Properties: temp, From: at(1500 * time.Millisecond), To: at(6 * time.Second), N: 10}, "temp=1 temp=2 temp=3")
	f(HistoryQuery{Properties: temp, From: at(1501 * time.Millisecond), To: at(6001 * time.Millisecond), N: 10}, "temp=2 temp=3 temp=4")
	// Newest N of the range.
	f(HistoryQuery{Properties: temp, To: at(6 * time.Second), N: 2}, "temp=2 temp=3")
	f(HistoryQuery{Properties: temp, From: at(27 * time.Second), N: 5}, "temp=18 temp=19")
	// A page whose oldest millisecond holds three values returns them all.
	page := f(HistoryQuery{Properties: temp, From: at(0), N: 10}, "temp=9.75 temp=10 temp=10.5 temp=11 temp=12 temp=13 temp=14 temp=15 temp=16 temp=17 temp=18 temp=19")
	if !page[0].Time.Equal(at(15 * time.Second)) {
		t.Fatalf("page starts at %v", page[0].Time)
	}
	// Paging back from the newest value with any page size: nothing
	// repeated, nothing skipped, ties at page edges included.
	for _, n := range []int{1, 2, 3, 4, 10} {
		var seen []string
		var to time.Time
		for pages := 0; ; pages++ {
			got, err := db.HistoryRange(ctx, HistoryQuery{ProductID: "hr_p", DeviceID: "d1", Properties: temp, To: to, N: n})
			if err != nil {
				t.Fatal(err)
			}
			if len(got) == 0 || pages > 30 {
				break
			}
			var s []string
			for _, v := range got {
				s = append(s, fmt.Sprint(v.Num))
			}
			seen = append(s, seen...)
			to = got[0].Time
		}
		if got := strings.Join(seen, " "); got != "0 1 2 3 4 5 6 7 8 9 9.9 9.75 10 10.5 11 12 13 14 15 16 17 18 19" {
			t.Fatalf("paged back %d at a time: %s", n, got)
		}
	}
	// Several properties, each its own newest N; none named: all of them.
	f(HistoryQuery{Properties: []string{"hum", "temp", "missing"}, From: at(0), To: at(3 * time.Hour), N: 2}, "hum=51 hum=52 temp=18 temp=19")
	f(HistoryQuery{To: at(time.Hour), N: 1}, "hum=50 temp=19")
	// Without From the windows widen from To: hum 4 h back is found.
	f(HistoryQuery{Properties: []string{"hum"}, To: at(30 * 24 * time.Hour), N: 5}, "hum=50 hum=51 hum=52 hum=53 hum=54")
	// An empty range.
	f(HistoryQuery{Properties: temp, From: at(time.Second), To: at(time.Second), N: 3}, "")
	f(HistoryQuery{Properties: temp, From: at(-time.Hour), To: at(-time.Minute), N: 3}, "")
}

// numbersText is values as "property=number ...", in order.
func numbersText(vs []PropertyValue) string {
	var s []string
	for _, v := range vs {
		s = append(s, fmt.Sprintf("%s=%g", v.Property, v.Num))
	}
	return strings.Join(s, " ")
}
