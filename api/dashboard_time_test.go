package api

import (
	"encoding/json"
	"testing"
	"time"
)

func TestJavaPattern(t *testing.T) {
	at := time.Date(2024, 2, 9, 7, 5, 3, 42e6, time.UTC)
	f := func(pattern, want string) {
		t.Helper()
		l, err := parseJavaPattern(pattern)
		if err != nil {
			t.Fatalf("%q: %v", pattern, err)
		}
		if got := l.format(at); got != want {
			t.Fatalf("%q: got %q, want %q", pattern, got, want)
		}
	}
	f("yyyy-MM-dd", "2024-02-09")
	f("yyyy-MM", "2024-02")
	f("MM月dd日", "02月09日")
	f("yyyy-MM-dd HH:mm:ss", "2024-02-09 07:05:03")
	f("yy/M/d H:m:s.SSS", "24/2/9 7:5:3.042")
	f("'week of' yyyy-MM-dd", "week of 2024-02-09")
	f("dd MMM yyyy, EEE", "09 Feb 2024, Fri")
	f("hh a", "07 AM")
	f("''yyyy''", "'2024'")
	bad := func(pattern string) {
		t.Helper()
		if _, err := parseJavaPattern(pattern); err == nil {
			t.Fatalf("%q: want an error", pattern)
		}
	}
	bad("yyyy-QQ")
	bad("'unterminated")
	bad("yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy")
}

func TestTimeParam(t *testing.T) {
	now := time.Date(2024, 3, 15, 10, 30, 0, 0, time.UTC)
	def := time.Unix(0, 0)
	f := func(raw string, want time.Time) {
		t.Helper()
		got, err := parseTimeParam("from", json.RawMessage(raw), now, def)
		if err != nil {
			t.Fatalf("%s: %v", raw, err)
		}
		if !got.Equal(want) {
			t.Fatalf("%s: got %v, want %v", raw, got, want)
		}
	}
	f(``, def)
	f(`1700000000000`, time.UnixMilli(1700000000000))
	f(`"1700000000000"`, time.UnixMilli(1700000000000))
	f(`"now"`, now)
	f(`"now-7d"`, now.AddDate(0, 0, -7))
	f(`"now-1M"`, time.Date(2024, 2, 15, 10, 30, 0, 0, time.UTC))
	f(`"now-1y+2h"`, time.Date(2023, 3, 15, 12, 30, 0, 0, time.UTC))
	f(`"now/d"`, time.Date(2024, 3, 15, 0, 0, 0, 0, time.UTC))
	f(`"now-1M/M"`, time.Date(2024, 2, 1, 0, 0, 0, 0, time.UTC))
	f(`"now/w"`, time.Date(2024, 3, 11, 0, 0, 0, 0, time.UTC))
	for _, raw := range []string{`"yesterday"`, `"now-7q"`, `true`, `{}`, `"now-"`, `-99999999999999`, `99999999999999`} {
		if _, err := parseTimeParam("from", json.RawMessage(raw), now, def); err == nil {
			t.Fatalf("%s: want an error", raw)
		}
	}
}
