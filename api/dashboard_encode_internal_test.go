package api

import (
	"bytes"
	"encoding/json"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"devicehub/tsdb"
)

// TestAppendCountItem: a message-count item and a whole answer are the
// bytes encoding/json writes for them (aggItem; the envelope of the
// items as json.RawMessage), whatever the group and the timeString's
// layout hold (text to escape, non-ASCII, invalid UTF-8), and each item
// is counted into the result's size as appendItem counts it.
func TestAppendCountItem(t *testing.T) {
	loc, err := time.LoadLocation("Asia/Shanghai")
	if err != nil {
		t.Fatal(err)
	}
	groups := []string{"", "g", "a\"b\\c", "<script>&", "日本\u2028x", "bad\xffutf8", "tab\tnl\n\x01", strings.Repeat("x", 300)}
	patterns := []string{"yyyy-MM-dd", "d-M-H-h-m-s-S yy", "ddd-MMMMM-yyyyy SSSS", "yyyy-MM-dd HH:mm:ss.SSS", "MM月dd日 E a hh", "'<q>' yy MMM MMMM EEEE", "'\"'''yyyy", "y"}
	times := []time.Time{time.Date(2024, 2, 29, 23, 59, 59, 123e6, loc), time.Date(5, 1, 2, 3, 4, 5, 0, loc), time.Date(2025, 12, 31, 12, 0, 0, 0, loc)}
	values := []uint64{0, 1, 1<<64 - 1}
	for _, pattern := range patterns {
		layout, err := parseJavaPattern(pattern)
		if err != nil {
			t.Fatal(pattern, err)
		}
		for _, group := range groups {
			var got []byte
			var want []json.RawMessage
			var scratch []byte
			var gotSize, wantSize resultBytes
			var wantItems []byte
			i := 0
			for _, tm := range times {
				for _, v := range values {
					if got, scratch, err = appendCountItem(got, scratch, &gotSize, countItemPrefix(group), v, layout, tm, i); err != nil {
						t.Fatal(err)
					}
					item := aggItem{Group: group, Data: aggData{Value: v, TimeString: layout.format(tm), Timestamp: i}}
					js, err := json.Marshal(item)
					if err != nil {
						t.Fatal(err)
					}
					want = append(want, js)
					if wantItems, err = appendItem(wantItems, &wantSize, item); err != nil {
						t.Fatal(err)
					}
					i++
				}
			}
			wantJS, err := json.Marshal(want)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal([]byte("["+string(got)+"]"), wantJS) || !bytes.Equal(got, wantItems) {
				t.Errorf("pattern %q group %q:\n got %s\nwant %s", pattern, group, got, wantJS)
			}
			if gotSize.n.Load() != wantSize.n.Load() {
				t.Errorf("pattern %q group %q: size %d, want %d", pattern, group, gotSize.n.Load(), wantSize.n.Load())
			}
		}
	}
}

// TestEpochMillis: what epochMillis reads it reads as json.Unmarshal does.
func TestEpochMillis(t *testing.T) {
	for _, raw := range []string{"0", "-0", "1", "-1", "1732600000000", "-1732600000000", "999999999999999999", "-999999999999999999",
		"9999999999999999999", "1.5", "1e3", "01", "-", "", `"1"`, "1 ", " 1", "+1", "null", "--1", "1-"} {
		var want int64
		got, ok := epochMillis([]byte(raw))
		werr := json.Unmarshal([]byte(raw), &want)
		if ok && (werr != nil || got != want) {
			t.Errorf("%q: epochMillis %d, json %d (%v)", raw, got, want, werr)
		}
		if !ok && raw != "" && len(strings.Trim(raw, "-")) <= 18 && strings.Trim(raw, "-0123456789") == "" && werr == nil {
			t.Errorf("%q: json reads %d, epochMillis does not", raw, want)
		}
	}
}

// aggTestFloats are values of every kind encoding/json writes apart:
// zeros, integers, both sides of its switches to the exponent form
// (1e-6, 1e21), exponents of one and of several digits, the extremes,
// values of 17 significant digits, NaN and the infinities (null), and
// random ones, of random bits and of every magnitude.
func aggTestFloats() []float64 {
	fs := []float64{0, math.Copysign(0, -1), 1, -1, 0.5, 2.5, 19.25, 0.1 + 0.2, 1.0 / 3, -2.0 / 3, 100, 1e6, 123456789,
		1e-6, math.Nextafter(1e-6, 0), math.Nextafter(1e-6, 1), -1e-6, 1e-7, 1e-9, 1e-10, 1.5e-300, 5e-324, -5e-324,
		1e20, 1e21, math.Nextafter(1e21, 0), math.Nextafter(1e21, math.Inf(1)), -1e21, 1e22, 1e100, 1.7976931348623157e308,
		-math.MaxFloat64, math.SmallestNonzeroFloat64, 1 << 53, 1<<53 + 1, -(1 << 62), 9007199254740993, 0.30000000000000004,
		123456789012345680000, 1.2345678901234567e-5, math.Pi, -math.E, math.NaN(), math.Inf(1), math.Inf(-1)}
	r := rand.New(rand.NewPCG(3, 4))
	for range 3000 {
		fs = append(fs, math.Float64frombits(r.Uint64()))
	}
	for e := -330; e <= 310; e++ {
		fs = append(fs, r.NormFloat64()*math.Pow(10, float64(e)), float64(r.Int64N(1<<53))*math.Pow(10, float64(e%25)))
	}
	for range 2000 {
		fs = append(fs, float64(r.Int64()-r.Int64()), math.Round(r.NormFloat64()*1e4)/100)
	}
	return fs
}

// TestAppendPropAggItem: a property aggregate item is the bytes
// encoding/json writes for it (propAggItem with aggValue), for every
// aggregate, empty buckets and full ones, values of every kind
// (aggTestFloats), whatever the group, the property and the timeString
// hold, and each item is counted into the result's size as appendItem
// counts it.
func TestAppendPropAggItem(t *testing.T) {
	loc, err := time.LoadLocation("Asia/Shanghai")
	if err != nil {
		t.Fatal(err)
	}
	texts := []string{"", "p0", "a\"b\\c", "<script>&", "日本\u2028x\u2029", "bad\xffutf8", "tab\tnl\n\x01\x7f", strings.Repeat("x", 300)}
	layouts := []javaLayout{defaultLayout}
	for _, pattern := range []string{"yyyy-MM-dd HH:mm", "'<q>&' MMM EEEE a", "MM月dd日 HH"} {
		l, err := parseJavaPattern(pattern)
		if err != nil {
			t.Fatal(pattern, err)
		}
		layouts = append(layouts, l)
	}
	aggs := []string{tsdb.AggAvg, tsdb.AggMin, tsdb.AggMax, tsdb.AggSum, tsdb.AggCount, tsdb.AggFirst, tsdb.AggLast}
	counts := []uint64{0, 1, 7, 1<<64 - 1}
	start := time.Date(2024, 2, 29, 23, 0, 0, 0, loc)
	floats := aggTestFloats()
	n := 0
	for ti, group := range texts {
		for _, property := range texts {
			var got, want, scratch []byte
			var gotSize, wantSize resultBytes
			prefix := propAggItemPrefix(group, property)
			for i, f := range floats {
				bk := tsdb.AggBucket{Start: start.Add(time.Duration(i) * time.Hour), Values: counts[i%len(counts)], Value: f}
				agg, layout := aggs[(i+ti)%len(aggs)], layouts[i%len(layouts)]
				if got, scratch, err = appendPropAggItem(got, scratch, &gotSize, prefix, agg, bk, layout, bk.Start, i); err != nil {
					t.Fatal(err)
				}
				item := propAggItem{Group: group, Property: property, Data: propAggData{
					Value: aggValue(agg, bk), TimeString: layout.format(bk.Start), Timestamp: i}}
				if want, err = appendItem(want, &wantSize, item); err != nil {
					t.Fatal(err)
				}
				n++
			}
			if !bytes.Equal(got, want) {
				g, w := got, want
				for len(g) > 0 && len(w) > 0 && g[0] == w[0] {
					g, w = g[1:], w[1:]
				}
				t.Fatalf("group %q property %q: differ from byte %d:\n got %.200s\nwant %.200s", group, property, len(got)-len(g), g, w)
			}
			if gotSize.n.Load() != wantSize.n.Load() {
				t.Fatalf("group %q property %q: size %d, want %d", group, property, gotSize.n.Load(), wantSize.n.Load())
			}
		}
	}
	t.Logf("%d items", n)
}

// TestAppendPropAggItemRefused: an item the result's size refuses is
// taken back out of the items, as appendItem leaves them.
func TestAppendPropAggItemRefused(t *testing.T) {
	var size resultBytes
	size.n.Store(maxDashboardResult - 10)
	b := []byte(`{"x":1}`)
	got, _, err := appendPropAggItem(b, nil, &size, propAggItemPrefix("g", "p"), tsdb.AggAvg,
		tsdb.AggBucket{Start: time.Unix(0, 0), Values: 1, Value: 2.5}, defaultLayout, time.Unix(0, 0), 0)
	if err == nil || string(got) != `{"x":1}` {
		t.Fatalf("got %s, %v", got, err)
	}
}
