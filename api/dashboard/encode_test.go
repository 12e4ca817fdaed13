package dashboard

import (
	"bytes"
	"crypto/md5"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"devicehub/schema"
	"devicehub/tsdb"
)

// appendItem appends item as encoding/json writes it, after a comma if b
// holds items already, and counts it into size: the reference the item
// writers (appendCountItem, appendPropAggItem, appendHistoryItem) are
// compared with.
func appendItem(b []byte, size *resultBytes, item any) ([]byte, error) {
	js, err := json.Marshal(item)
	if err != nil {
		return b, err
	}
	if err := size.add(len(js) + 1); err != nil {
		return b, err
	}
	if len(b) > 0 {
		b = append(b, ',')
	}
	return append(b, js...), nil
}

// TestAppendCountItem: a message-count item and a whole answer are the
// bytes encoding/json writes for them (aggItem; the envelope of the
// items as json.RawMessage), whatever the group and the timeString's
// layout hold (text to escape, non-ASCII, invalid UTF-8), and each item
// is counted into the result's size as appendItem counts it.
func TestAppendCountItem(t *testing.T) {
	t.Parallel()
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
					item := aggItem{Group: group, Data: aggData{Value: v, TimeString: layout.format(tm), Timestamp: i, Time: tm.UnixMilli(), TimeZone: tm.Location().String()}}
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
	t.Parallel()
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
	t.Parallel()
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
					Value: aggValue(agg, bk), TimeString: layout.format(bk.Start), Timestamp: i,
					Time: bk.Start.UnixMilli(), TimeZone: bk.Start.Location().String()}}
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
	t.Parallel()
	var size resultBytes
	size.n.Store(maxDashboardResult - 10)
	b := []byte(`{"x":1}`)
	got, _, err := appendPropAggItem(b, nil, &size, propAggItemPrefix("g", "p"), tsdb.AggAvg,
		tsdb.AggBucket{Start: time.Unix(0, 0), Values: 1, Value: 2.5}, defaultLayout, time.Unix(0, 0), 0)
	if err == nil || string(got) != `{"x":1}` {
		t.Fatalf("got %s, %v", got, err)
	}
}

// historyEntry shapes one stored value with its thing-model definition
// into the historyData encoding/json writes: appendHistoryItem's
// reference (its id the md5 hex of "device-property-ms").
func historyEntry(v tsdb.PropertyValue, model *schema.ThingModel, loc *time.Location) historyData {
	value := storedValue(&v)
	sum := md5.Sum([]byte(v.DeviceID + "-" + v.Property + "-" + strconv.FormatInt(v.Time.UnixMilli(), 10)))
	hv := historyValue{
		ID: hex.EncodeToString(sum[:]), Property: v.Property, PropertyName: v.Property,
		Type: v.ValueType, Value: value, CreateTime: v.Time.UnixMilli(), Timestamp: v.Time.UnixMilli(),
	}
	if def, ok := model.Property(v.Property); ok {
		hv.PropertyName = def.Name
		hv.Type = def.ValueType.Type
		hv.FormatValue = def.ValueType.FormatValue(value)
	} else {
		hv.FormatValue = plainText(value)
	}
	if reason := model.Outside(v.Property, value); reason != "" {
		hv.OutsideModel = &struct {
			Text  string `json:"text"`
			Value string `json:"value"`
		}{schema.OutsideText(reason), reason}
	}
	return historyData{Value: hv, TimeString: v.Time.In(loc).Format(time.DateTime), Timestamp: v.Time.UnixMilli(), TimeZone: loc.String()}
}

// historyTestModel defines a property of every value type the
// formatValue depends on, some of them with names and texts to escape.
const historyTestModel = `{"properties":[
{"id":"f","name":"F <&>","valueType":{"type":"float","scale":2}},
{"id":"d","name":"D","valueType":{"type":"double"}},
{"id":"i","name":"I","valueType":{"type":"int"}},
{"id":"l","name":"L\u2028","valueType":{"type":"long"}},
{"id":"b","name":"B","valueType":{"type":"boolean","trueText":"<on>","trueValue":"true","falseText":"off & out","falseValue":"false"}},
{"id":"e","name":"E","valueType":{"type":"enum","elements":[{"value":"1","text":"one <1>"},{"value":"a","text":"A"},{"value":"true","text":"yes"}]}},
{"id":"t","name":"T","valueType":{"type":"date","format":"yyyy-MM-dd HH:mm:ss"}},
{"id":"s","name":"S \"q\"","valueType":{"type":"string"}},
{"id":"o","name":"O","valueType":{"type":"object","properties":[{"id":"x","name":"X","valueType":{"type":"int"}}]}},
{"id":"pw","name":"PW","valueType":{"type":"password"}}]}`

// historyTestStrings are texts of every kind appendJSONString writes
// apart: HTML characters, U+2028 and U+2029, invalid UTF-8, quotes,
// backslashes, control characters, non-ASCII.
var historyTestStrings = []string{"", "x", "1", "a", "true", "a\"b\\c", "<script>&amp;</script>", "日本\u2028x\u2029",
	"bad\xffutf8\xc3", "\xed\xa0\x80", "tab\tnl\n\r\x01\x1f\x7f\b\f", "\u00e9\U0001F600", strings.Repeat("x<", 200)}

// historyTestJSON are json values: valid ones with spaces to compact and
// <, >, &, U+2028 and U+2029 to escape inside strings, and ones that are
// not JSON (encoding/json refuses them).
var historyTestJSON = []string{`{}`, `[]`, `null`, `true`, `0`, `-1.5e3`, `"s"`, ` { "a" : [ 1 , 2 , { "b" : null } ] , "c" : "x y" } `,
	"{\"h\":\"<b>&amp;</b>\",\"l\":\"\u2028\u2029\",\"q\":\"\\\"\\\\ \\u003c\"}", "\t[\n1,\r\n\"\xff\"]\n", `"日本"`,
	``, ` `, `{`, `{"a":}`, `[1,]`, `nope`, `1 2`, `{"a":1}}`, "\"\x01\"", `'s'`, `NaN`}

// TestAppendHistoryItem: a history item is the bytes encoding/json
// writes for it (historyItem with historyEntry), for every value kind
// storedValue returns (numbers of every kind: aggTestFloats; bools;
// strings; json values, valid or not), with and without the value's
// thing-model definition (the formatValue from its ValueType, or
// plainText), whatever the group, device, property and zone, and random
// ones; a value encoding/json refuses (NaN, infinities, invalid json) is
// refused with encoding/json's error and leaves b as it was; each item
// is counted into the result's size as appendItem counts it.
func TestAppendHistoryItem(t *testing.T) {
	t.Parallel()
	model, err := schema.ParseThingModelString(historyTestModel)
	if err != nil {
		t.Fatal(err)
	}
	shanghai, err := time.LoadLocation("Asia/Shanghai")
	if err != nil {
		t.Fatal(err)
	}
	locs := []*time.Location{shanghai, time.UTC}
	times := []time.Time{time.UnixMilli(1732600000123), time.UnixMilli(0), time.UnixMilli(-1), time.UnixMilli(-62135596800000),
		time.Date(2024, 2, 29, 23, 59, 59, 999e6, shanghai), time.UnixMilli(253402300799999)}
	properties := []string{"f", "d", "i", "l", "b", "e", "t", "s", "o", "pw", "unknown", "<&>", "bad\xff", ""}
	groups := []string{"", "g", "a\"b\\c", "<script>&", "日本\u2028x", "bad\xffutf8", "tab\tnl\n\x01"}
	devices := []string{"d1", "dev<&>", strings.Repeat("long-device-id-", 10)}

	var values []tsdb.PropertyValue
	for _, f := range aggTestFloats() {
		values = append(values, tsdb.PropertyValue{ValueType: "number", Num: f})
	}
	for _, f := range []float64{0, 1, -1, 2, 0.5, math.NaN()} {
		values = append(values, tsdb.PropertyValue{ValueType: "bool", Num: f})
	}
	for _, s := range historyTestStrings {
		values = append(values, tsdb.PropertyValue{ValueType: "string", Str: s}, tsdb.PropertyValue{ValueType: "password", Str: s})
	}
	for _, s := range historyTestJSON {
		values = append(values, tsdb.PropertyValue{ValueType: "json", Str: s})
	}
	r := rand.New(rand.NewPCG(5, 6))
	for range 3000 {
		v := tsdb.PropertyValue{Num: math.Float64frombits(r.Uint64())}
		switch r.IntN(4) {
		case 0:
			v.ValueType = "number"
		case 1:
			v.ValueType, v.Num = "bool", float64(r.IntN(2))
		case 2:
			v.ValueType, v.Str = "string", randomText(r)
		default:
			v.ValueType, v.Str = "json", randomJSON(r, 3)
			if r.IntN(10) == 0 { // broken
				v.Str = v.Str[:r.IntN(len(v.Str)+1)] + randomText(r)
			}
		}
		values = append(values, v)
	}

	n, refused := 0, 0
	for gi, group := range groups {
		prefix := historyItemPrefix(group)
		for _, m := range []*schema.ThingModel{model, nil} {
			var got, want, scratch []byte
			var gotSize, wantSize resultBytes
			for i, v := range values {
				k := i + gi
				v.Time = times[k%len(times)]
				v.DeviceID = devices[k%len(devices)]
				v.Property = properties[k%len(properties)]
				loc := locs[k%len(locs)]
				before, wantBefore := len(got), len(want)
				var gerr, werr error
				got, scratch, gerr = appendHistoryItem(got, scratch, &gotSize, prefix, &v, m, loc)
				want, werr = appendItem(want, &wantSize, historyItem{Group: group, Data: historyEntry(v, m, loc)})
				n++
				if werr != nil {
					refused++
					if gerr == nil || gerr.Error() != werr.Error() || fmt.Sprintf("%T", gerr) != fmt.Sprintf("%T", werr) {
						t.Fatalf("%s %q %v: error %v (%T), want %v (%T)", v.ValueType, v.Str, v.Num, gerr, gerr, werr, werr)
					}
					if len(got) != before {
						t.Fatalf("%s %q %v: refused, b changed", v.ValueType, v.Str, v.Num)
					}
					continue
				}
				if gerr != nil {
					t.Fatalf("%s %q %v: %v", v.ValueType, v.Str, v.Num, gerr)
				}
				if !bytes.Equal(got[before:], want[wantBefore:]) {
					g, w := got[before:], want[wantBefore:]
					for len(g) > 0 && len(w) > 0 && g[0] == w[0] {
						g, w = g[1:], w[1:]
					}
					t.Fatalf("group %q property %q %s %q %v: differ from the item's byte %d:\n got %.300s\nwant %.300s",
						group, v.Property, v.ValueType, v.Str, v.Num, len(got)-before-len(g), g, w)
				}
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("group %q: the items differ", group)
			}
			if gotSize.n.Load() != wantSize.n.Load() {
				t.Fatalf("group %q: size %d, want %d", group, gotSize.n.Load(), wantSize.n.Load())
			}
			if !json.Valid([]byte("[" + string(got) + "]")) {
				t.Fatalf("group %q: the items are not a JSON array's", group)
			}
		}
	}
	t.Logf("%d items, %d refused", n, refused)
}

// randomJSON is a random JSON value nested at most depth deep, with
// random spaces around its tokens and randomText in its strings (as
// valid JSON strings, invalid UTF-8 kept).
func randomJSON(r *rand.Rand, depth int) string {
	sp := func() string { return []string{"", "", " ", "\n\t", "\r\n  "}[r.IntN(5)] }
	str := func() string {
		s := randomText(r)
		var b []byte
		b = append(b, '"')
		for i := 0; i < len(s); i++ {
			switch c := s[i]; {
			case c == '"' || c == '\\':
				b = append(b, '\\', c)
			case c < 0x20:
				b = fmt.Appendf(b, `\u%04x`, c)
			default:
				b = append(b, c)
			}
		}
		return string(append(b, '"'))
	}
	k := r.IntN(7)
	if depth == 0 {
		k %= 5
	}
	var s string
	switch k {
	case 0:
		s = "null"
	case 1:
		s = strconv.FormatBool(r.IntN(2) == 0)
	case 2:
		s = strconv.FormatFloat(r.NormFloat64()*math.Pow(10, float64(r.IntN(40)-20)), 'g', -1, 64)
	case 3, 4:
		s = str()
	case 5:
		var items []string
		for range r.IntN(4) {
			items = append(items, randomJSON(r, depth-1))
		}
		s = "[" + strings.Join(items, ",") + sp() + "]"
	default:
		var items []string
		for range r.IntN(4) {
			items = append(items, sp()+str()+sp()+":"+randomJSON(r, depth-1))
		}
		s = "{" + strings.Join(items, ",") + sp() + "}"
	}
	return sp() + s + sp()
}

// TestAppendHistoryItemRefused: an item the result's size refuses is
// taken back out of the items, as appendItem leaves them.
func TestAppendHistoryItemRefused(t *testing.T) {
	t.Parallel()
	var size resultBytes
	size.n.Store(maxDashboardResult - 10)
	b := []byte(`{"x":1}`)
	v := tsdb.PropertyValue{Time: time.UnixMilli(1732600000123), DeviceID: "d", Property: "p", ValueType: "number", Num: 2.5}
	got, _, err := appendHistoryItem(b, nil, &size, historyItemPrefix("g"), &v, nil, time.UTC)
	if err == nil || string(got) != `{"x":1}` {
		t.Fatalf("got %s, %v", got, err)
	}
}

// BenchmarkAppendHistoryItem: one history item, a float with its
// definition (scale 2) and a string without one, written by
// appendHistoryItem and, as the reference, by encoding/json (appendItem
// of historyItem with historyEntry):
//
//	go test -run '^$' -bench AppendHistoryItem -benchmem ./api/
func BenchmarkAppendHistoryItem(b *testing.B) {
	model, err := schema.ParseThingModelString(historyTestModel)
	if err != nil {
		b.Fatal(err)
	}
	values := []tsdb.PropertyValue{
		{Time: time.UnixMilli(1732600000123), DeviceID: "device-0001", Property: "f", ValueType: "number", Num: 21.375},
		{Time: time.UnixMilli(1732600000456), DeviceID: "device-0001", Property: "state", ValueType: "string", Str: "running <ok> & idle"},
	}
	b.Run("append", func(b *testing.B) {
		var size resultBytes
		var out, scratch []byte
		prefix := historyItemPrefix("g")
		b.ReportAllocs()
		for i := range b.N {
			size.n.Store(0)
			if out, scratch, err = appendHistoryItem(out[:0], scratch, &size, prefix, &values[i%2], model, time.UTC); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		var size resultBytes
		var out []byte
		b.ReportAllocs()
		for i := range b.N {
			size.n.Store(0)
			if out, err = appendItem(out[:0], &size, historyItem{Group: "g", Data: historyEntry(values[i%2], model, time.UTC)}); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// The spec's result items as Go values: encoding/json writes them here
// as the reference of appendCountItem (aggItem), appendPropAggItem
// (propAggItem) and appendHistoryItem (historyItem).
type aggItem struct {
	Group string  `json:"group"`
	Data  aggData `json:"data"`
}

type aggData struct {
	Value      uint64 `json:"value"`
	TimeString string `json:"timeString"`
	Timestamp  int    `json:"timestamp"` // position 0, 1, 2...
	Time       int64  `json:"time"`      // the bucket's start, epoch ms
	TimeZone   string `json:"timeZone"`  // of timeString and the buckets' boundaries
}

type historyItem struct {
	Group string      `json:"group"`
	Data  historyData `json:"data"`
}

type historyData struct {
	Value      historyValue `json:"value"`
	TimeString string       `json:"timeString"`
	Timestamp  int64        `json:"timestamp"`
	TimeZone   string       `json:"timeZone"` // of timeString
}

type historyValue struct {
	ID           string `json:"id"`
	Property     string `json:"property"`
	PropertyName string `json:"propertyName"`
	Type         string `json:"type"`
	Value        any    `json:"value"`
	FormatValue  string `json:"formatValue"`
	CreateTime   int64  `json:"createTime"`
	Timestamp    int64  `json:"timestamp"`
	// OutsideModel marks a value outside the thing model: {text, value}.
	OutsideModel *struct {
		Text  string `json:"text"`
		Value string `json:"value"`
	} `json:"outsideModel,omitempty"`
}

// propAggItem is one bucket of one property.
type propAggItem struct {
	Group    string      `json:"group"`
	Property string      `json:"property"`
	Data     propAggData `json:"data"`
}

type propAggData struct {
	// Value is the aggregate: a number, or null for an empty bucket of
	// avg, min, max, first and last (count and sum of nothing are 0).
	Value      any    `json:"value"`
	TimeString string `json:"timeString"`
	Timestamp  int    `json:"timestamp"` // position 0, 1, 2... within the property
	Time       int64  `json:"time"`      // the bucket's start, epoch ms
	TimeZone   string `json:"timeZone"`  // of timeString and the buckets' boundaries
}

// trickyTexts are strings whose JSON encoding has escapes or
// replacements (as api's json_internal_test.go).
var trickyTexts = []string{
	"", "plain", `quote " and \ backslash`, "<script>&amp;</script>", "\x00\x01\x1f\x7f", "\b\f\n\r\t",
	"\xff\xfe invalid", "cut \xe2\x82", "\u2028\u2029", "Żółw 电表 🚀", "{\"properties\":[]}", "%_like_%",
}

// randomText mixes the pieces of trickyTexts.
func randomText(r *rand.Rand) string {
	var b []byte
	for range r.IntN(6) {
		t := trickyTexts[r.IntN(len(trickyTexts))]
		if len(t) > 0 {
			i := r.IntN(len(t))
			b = append(b, t[i:min(len(t), i+r.IntN(8)+1)]...)
		}
	}
	return string(b)
}
