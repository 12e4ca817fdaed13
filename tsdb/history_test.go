package tsdb

import (
	"fmt"
	"testing"
	"time"
)

// TestPropertyHistoryWindows: values found in the recent window are enough
// when there are n of them; otherwise older data is read too, and a
// property reported only long ago is still found.
func TestPropertyHistoryWindows(t *testing.T) {
	db := shared(t)
	ctx := ctxT(t)
	now := time.Now()
	var ps []PropertyValue
	add := func(prop string, age time.Duration, v float64) {
		ps = append(ps, PropertyValue{Time: now.Add(-age), ProductID: "win_p", DeviceID: "w1", Property: prop, ValueType: "number", Num: v})
	}
	for i := range 3 {
		add("temp", time.Duration(i+1)*time.Hour, float64(10+i)) // recent: 10, 11, 12
	}
	for i := range 3 {
		add("temp", time.Duration(i+3)*24*time.Hour, float64(20+i)) // last month: 20, 21, 22
	}
	add("temp", 400*24*time.Hour, 99) // last year
	add("old", 200*24*time.Hour, 7)   // only long ago
	if err := db.Insert(ctx, nil, ps); err != nil {
		t.Fatal(err)
	}
	f := func(n int, props []string, want string) {
		t.Helper()
		got, err := db.PropertyHistory(ctx, "win_p", "w1", props, n)
		if err != nil {
			t.Fatal(err)
		}
		var s []string
		for _, v := range got {
			s = append(s, fmt.Sprintf("%s=%g", v.Property, v.Num))
		}
		if fmt.Sprint(s) != want {
			t.Fatalf("n=%d %v: got %v, want %s", n, props, s, want)
		}
	}
	f(2, []string{"temp"}, "[temp=11 temp=10]")                                         // the last day suffices
	f(4, []string{"temp"}, "[temp=20 temp=12 temp=11 temp=10]")                         // widened to 30 days
	f(7, []string{"temp"}, "[temp=99 temp=22 temp=21 temp=20 temp=12 temp=11 temp=10]") // whole history
	f(1, []string{"temp", "old"}, "[temp=10 old=7]")                                    // one property only in old data
	f(1, nil, "[old=7 temp=10]")                                                        // none named: whole history

	// The last named query needed the whole history, so the next one starts
	// there, and still answers exactly.
	key := "win_p\x00w1"
	if got := db.hints.get(key, time.Now()); got != len(historyWindows)-1 {
		t.Fatalf("hint after a whole-history answer: %d", got)
	}
	f(2, []string{"temp"}, "[temp=11 temp=10]")
	if got := db.hints.get(key, time.Now()); got != len(historyWindows)-1 {
		t.Fatalf("hint kept: %d", got)
	}
	if got := db.hints.get(key, time.Now().Add(historyHintTTL)); got != 0 {
		t.Fatalf("hint after its TTL: %d", got)
	}
}

func TestHistoryHintsBounded(t *testing.T) {
	var h historyHints
	now := time.Now()
	for i := range maxHistoryHints + 10 {
		h.put(fmt.Sprint(i), 1, now)
	}
	if len(h.m) > maxHistoryHints {
		t.Fatalf("%d hints kept", len(h.m))
	}
	h.put("x", 0, now)
	if h.get("x", now) != 0 {
		t.Fatal("window 0 is not kept")
	}
}
