package wire

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"devicehub/tsdb"
)

var testNow = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

func TestParseTopic(t *testing.T) {
	f := func(topic string, want Topic, wantOK bool) {
		t.Helper()
		got, ok := ParseTopic(topic)
		if ok != wantOK {
			t.Fatalf("ParseTopic(%q) ok = %v, want %v", topic, ok, wantOK)
		}
		if !ok {
			return
		}
		want.Name = topic
		if got != want {
			t.Fatalf("ParseTopic(%q) = %+v, want %+v", topic, got, want)
		}
	}
	f("/p1/d1/properties/report", Topic{Kind: KindReport, ProductID: "p1", DeviceID: "d1"}, true)
	f("/p1/d1/event/fire", Topic{Kind: KindEvent, ProductID: "p1", DeviceID: "d1", EventID: "fire"}, true)
	f("/p1/d1/online", Topic{Kind: KindOnline, ProductID: "p1", DeviceID: "d1"}, true)
	f("/p1/d1/offline", Topic{Kind: KindOffline, ProductID: "p1", DeviceID: "d1"}, true)
	f("/p1/d1/properties/read/reply", Topic{Kind: KindReadReply, ProductID: "p1", DeviceID: "d1"}, true)
	f("/p1/d1/function/invoke/reply", Topic{Kind: KindInvokeReply, ProductID: "p1", DeviceID: "d1"}, true)
	f("/p1/d1/properties/read", Topic{}, false) // downlink
	f("/p1/d1/function/invoke", Topic{}, false)
	f("/p1/d1/event/", Topic{}, false)
	f("/p1/d1/event/a/b", Topic{}, false)
	f("p1/d1/online", Topic{}, false)
	f("//d1/online", Topic{}, false)
	f("/p1//online", Topic{}, false)
	f("/p1/d1", Topic{}, false)
	f("", Topic{}, false)
	f("/", Topic{}, false)
	f("/p1/d1/online/x", Topic{}, false)
}

func topic(t *testing.T, s string) Topic {
	t.Helper()
	tp, ok := ParseTopic(s)
	if !ok {
		t.Fatalf("bad topic %q", s)
	}
	return tp
}

func TestDecodeReport(t *testing.T) {
	tp := topic(t, "/p/d/properties/report")
	payload := []byte(`{"messageId":"m1","timestamp":1717243200000,"properties":{"temp":21.5,"on":true,"off":false,"name":"pump \"A\"","cfg":{"a":[1,2]},"arr":[1],"gone":null,"neg":-1e3}}`)
	var r Rows
	if err := DecodeReport(&r, tp, payload, testNow); err != nil {
		t.Fatal(err)
	}
	ts := time.UnixMilli(1717243200000)
	wantMsg := tsdb.Message{Time: ts, ProductID: "p", DeviceID: "d", Direction: "up", MessageType: "REPORT_PROPERTY",
		MessageID: "m1", Topic: "/p/d/properties/report", Payload: payload}
	if len(r.Msgs) != 1 || fmt.Sprint(r.Msgs[0]) != fmt.Sprint(wantMsg) {
		t.Fatalf("msgs = %+v", r.Msgs)
	}
	p := func(id, vt string, num float64, str string) tsdb.PropertyValue {
		return tsdb.PropertyValue{Time: ts, ProductID: "p", DeviceID: "d", Property: id, ValueType: vt, Num: num, Str: str}
	}
	want := []tsdb.PropertyValue{
		p("temp", "number", 21.5, ""),
		p("on", "bool", 1, "true"),
		p("off", "bool", 0, "false"),
		p("name", "string", 0, `pump "A"`),
		p("cfg", "json", 0, `{"a":[1,2]}`),
		p("arr", "json", 0, `[1]`),
		p("neg", "number", -1000, ""),
	}
	if fmt.Sprint(r.Props) != fmt.Sprint(want) {
		t.Fatalf("props\n got %+v\nwant %+v", r.Props, want)
	}
	for i := range r.Props {
		if err := r.Props[i].Validate(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestDecodeInvalidUTF8: bytes that are not UTF-8 inside a property id, a
// string or a JSON value become U+FFFD, so the API never writes them into
// its JSON.
func TestDecodeInvalidUTF8(t *testing.T) {
	tp := topic(t, "/p/d/properties/report")
	var r Rows
	if err := DecodeReport(&r, tp, []byte("{\"properties\":{\"s\":\"a\xffb\",\"j\":{\"k\":\"\xfe\"}}}"), testNow); err != nil {
		t.Fatal(err)
	}
	if len(r.Props) != 2 || r.Props[0].Str != "a\uFFFDb" || r.Props[1].Str != "{\"k\":\"\uFFFD\"}" {
		t.Fatalf("props %+v", r.Props)
	}
	r.Reset()
	if err := DecodeReport(&r, tp, []byte("{\"properties\":{\"\xff\":1}}"), testNow); err != nil || r.Props[0].Property != "\uFFFD" {
		t.Fatalf("a non-UTF-8 property id: %v %+v", err, r.Props)
	}
}

func TestDecodeErrors(t *testing.T) {
	f := func(topicName, payload string, want error) {
		t.Helper()
		var r Rows
		r.Props = append(r.Props, tsdb.PropertyValue{Property: "keep"})
		err := Decode(&r, topic(t, topicName), []byte(payload), testNow, nil)
		if !errors.Is(err, want) {
			t.Fatalf("Decode(%q, %.60q) = %v, want %v", topicName, payload, err, want)
		}
		if len(r.Msgs) != 0 || len(r.Props) != 1 {
			t.Fatalf("Decode(%q, %.60q) appended rows on error: %+v", topicName, payload, r)
		}
	}
	rep := "/p/d/properties/report"
	f(rep, ``, ErrMalformed)
	f(rep, `{}`, ErrMalformed) // no properties
	f(rep, `{"properties":null}`, ErrMalformed)
	f(rep, `{"properties":[1]}`, ErrMalformed)
	f(rep, `{"properties":{"a":1}`, ErrMalformed)
	f(rep, `{"properties":{"a":1}} x`, ErrMalformed)
	f(rep, `{"properties":{"a":01}}`, ErrMalformed)
	f(rep, `{"properties":{"a":1e999}}`, ErrMalformed)
	f(rep, `{"properties":{"":1}}`, ErrMalformed)
	f(rep, `{"properties":{"`+strings.Repeat("x", 65)+`":1}}`, ErrMalformed)
	f(rep, `{"properties":{"a":"\x"}}`, ErrMalformed)
	f(rep, `{"properties":{"a":tru}}`, ErrMalformed)
	f(rep, `[]`, ErrMalformed)
	f(rep, `{"properties":{"a":1,"b":`+strings.Repeat("[", 100)+strings.Repeat("]", 100)+`}}`, ErrMalformed)
	f(rep, `{"pad":"`+strings.Repeat("x", MaxPayload)+`","properties":{}}`, ErrTooLarge)
	var many strings.Builder
	many.WriteString(`{"properties":{`)
	for i := range MaxProperties + 1 {
		if i > 0 {
			many.WriteByte(',')
		}
		fmt.Fprintf(&many, `"p%d":%d`, i, i)
	}
	many.WriteString(`}}`)
	f(rep, many.String(), ErrTooLarge)
	f("/p/d/event/e", `"data"`, ErrMalformed)
	f("/p/d/event/e", `{"data":}`, ErrMalformed)
	f("/p/d/properties/read/reply", `{"success":true}`, ErrMalformed) // no messageId
	f("/p/d/function/invoke/reply", `{"messageId":"x","properties":3}`, ErrMalformed)
	f("/p/d/online", strings.Repeat(" ", MaxPayload+1), ErrTooLarge)
}

func TestDecodeTimestamps(t *testing.T) {
	f := func(ts string, want time.Time) {
		t.Helper()
		var r Rows
		payload := `{"properties":{}}`
		if ts != "" {
			payload = `{"timestamp":` + ts + `,"properties":{"a":1}}`
		}
		if err := DecodeReport(&r, topic(t, "/p/d/properties/report"), []byte(payload), testNow); err != nil {
			t.Fatal(err)
		}
		if got := r.Msgs[0].Time; !got.Equal(want) {
			t.Fatalf("timestamp %s: time %s, want %s", ts, got, want)
		}
		for _, p := range r.Props {
			if !p.Time.Equal(want) {
				t.Fatalf("timestamp %s: property time %s, want %s", ts, p.Time, want)
			}
		}
	}
	f("", testNow)
	f("1717243200000", time.UnixMilli(1717243200000))
	f("1717243200", time.Unix(1717243200, 0))           // seconds
	f("1717243200.5", time.UnixMilli(1717243200500))    // fractional seconds
	f(`"1717243200000"`, time.UnixMilli(1717243200000)) // numeric string
	f("946684799000", testNow)                          // before 2000
	f(fmt.Sprint(testNow.Add(11*time.Minute).UnixMilli()), testNow)
	f(fmt.Sprint(testNow.Add(9*time.Minute).UnixMilli()), testNow.Add(9*time.Minute))
	f("-5", testNow)
	f(`"soon"`, testNow)
	f(`{"a":1}`, testNow)
}

func TestDecodeOthers(t *testing.T) {
	var r Rows
	if err := DecodeEvent(&r, topic(t, "/p/d/event/alarm"), []byte(`{"data":{"level":3},"messageId":"e1"}`), testNow); err != nil {
		t.Fatal(err)
	}
	if m := r.Msgs[0]; m.MessageType != "EVENT" || m.MessageID != "e1" || len(r.Props) != 0 || !m.Time.Equal(testNow) {
		t.Fatalf("event: %+v", r)
	}
	for _, payload := range []string{"", "bye", `{"timestamp":1717243200000}`, `{broken`, `[1,2]`} {
		r.Reset()
		at, err := DecodePresence(&r, topic(t, "/p/d/offline"), []byte(payload), testNow)
		if err != nil {
			t.Fatalf("offline %q: %v", payload, err)
		}
		want := testNow
		if strings.Contains(payload, "timestamp") {
			want = time.UnixMilli(1717243200000)
		}
		if !at.Equal(want) || r.Msgs[0].MessageType != "OFFLINE" || r.Msgs[0].MessageID == "" {
			t.Fatalf("offline %q: at %s, %+v", payload, at, r.Msgs)
		}
	}
	r.Reset()
	var rep Reply
	payload := `{"messageId":"r1","deviceId":"d","success":true,"code":"ok","message":"fine","properties":{"t":1.5,"s":"x"},"output":[1]}`
	if err := DecodeReply(&r, topic(t, "/p/d/properties/read/reply"), []byte(payload), testNow, &rep); err != nil {
		t.Fatal(err)
	}
	if rep.MessageID != "r1" || rep.DeviceID != "d" || !rep.Success || rep.Code != "ok" || rep.Message != "fine" ||
		string(rep.Properties) != `{"t":1.5,"s":"x"}` || string(rep.Output) != "[1]" {
		t.Fatalf("reply %+v", rep)
	}
	if len(r.Props) != 2 || r.Msgs[0].MessageType != "READ_PROPERTY_REPLY" || r.Msgs[0].MessageID != "r1" {
		t.Fatalf("reply rows %+v", r)
	}
	// A generated id is used when the device sends none, and is unique.
	r.Reset()
	for range 2 {
		if err := DecodeReport(&r, topic(t, "/p/d/properties/report"), []byte(`{"properties":{"a":1,"a":2}}`), testNow); err != nil {
			t.Fatal(err)
		}
	}
	if r.Msgs[0].MessageID == "" || r.Msgs[0].MessageID == r.Msgs[1].MessageID {
		t.Fatalf("generated ids: %+v", r.Msgs)
	}
	if len(r.Props) != 2 || r.Props[0].Num != 2 {
		t.Fatalf("duplicate keys: last must win once: %+v", r.Props)
	}
}

// reference decodes a report with encoding/json, for differential fuzzing.
func referenceProps(payload []byte) (int, bool) {
	var v struct {
		Properties map[string]any `json:"properties"`
	}
	if err := json.Unmarshal(payload, &v); err != nil || v.Properties == nil {
		return 0, false
	}
	n := 0
	for _, x := range v.Properties {
		if x != nil {
			n++
		}
	}
	return n, true
}

func fuzzSeeds(f *testing.F) {
	for _, s := range []string{
		`{"messageId":"m1","timestamp":1717243200000,"properties":{"temp":21.5,"on":true,"name":"x","o":{"a":[1,{"b":null}]},"n":null}}`,
		`{"properties":{}}`, `{"properties":{"a":"\u00e9\n"}}`, `{"data":{"x":1},"timestamp":"17"}`,
		`{"messageId":"r","deviceId":"d","success":false,"code":"e","message":"m","output":null}`,
		``, `null`, `{`, `{"properties":{"a":-0.5e-3}}`, "{\"properties\":{\"\xff\":1}}",
	} {
		f.Add([]byte(s))
	}
}

func FuzzDecodeReport(f *testing.F) {
	fuzzSeeds(f)
	tp, _ := ParseTopic("/p/d/properties/report")
	f.Fuzz(func(t *testing.T, payload []byte) {
		var r Rows
		err := DecodeReport(&r, tp, payload, testNow)
		if err != nil {
			if len(r.Msgs)+len(r.Props) != 0 {
				t.Fatalf("rows appended on error")
			}
			return
		}
		want, ok := referenceProps(payload)
		if !ok {
			t.Fatalf("accepted %q, encoding/json rejects it", payload)
		}
		if len(r.Props) != want || len(r.Msgs) != 1 {
			t.Fatalf("%q: %d properties, encoding/json has %d", payload, len(r.Props), want)
		}
		for i := range r.Props {
			if err := r.Props[i].Validate(); err != nil {
				t.Fatal(err)
			}
		}
		if err := r.Msgs[0].Validate(); err != nil {
			t.Fatal(err)
		}
	})
}

func FuzzDecodeEvent(f *testing.F) {
	fuzzSeeds(f)
	tp, _ := ParseTopic("/p/d/event/e")
	f.Fuzz(func(t *testing.T, payload []byte) {
		var r Rows
		if err := DecodeEvent(&r, tp, payload, testNow); err == nil {
			var v map[string]any
			if json.Unmarshal(payload, &v) != nil || v == nil {
				t.Fatalf("accepted %q, encoding/json rejects it", payload)
			}
			if len(r.Msgs) != 1 || r.Msgs[0].Validate() != nil {
				t.Fatalf("rows %+v", r)
			}
		}
	})
}

func FuzzDecodePresence(f *testing.F) {
	fuzzSeeds(f)
	tp, _ := ParseTopic("/p/d/online")
	f.Fuzz(func(t *testing.T, payload []byte) {
		var r Rows
		if _, err := DecodePresence(&r, tp, payload, testNow); err != nil {
			t.Fatalf("presence must accept %q: %v", payload, err)
		}
		if len(r.Msgs) != 1 || r.Msgs[0].Validate() != nil {
			t.Fatalf("rows %+v", r)
		}
	})
}

func FuzzDecodeReply(f *testing.F) {
	fuzzSeeds(f)
	tp, _ := ParseTopic("/p/d/function/invoke/reply")
	f.Fuzz(func(t *testing.T, payload []byte) {
		var r Rows
		var rep Reply
		if err := DecodeReply(&r, tp, payload, testNow, &rep); err == nil {
			var v map[string]any
			if json.Unmarshal(payload, &v) != nil || v == nil {
				t.Fatalf("accepted %q, encoding/json rejects it", payload)
			}
			if rep.MessageID == "" || len(r.Msgs) != 1 {
				t.Fatalf("reply %+v rows %+v", rep, r)
			}
		}
	})
}

func FuzzParseTopic(f *testing.F) {
	for _, s := range []string{"/p/d/properties/report", "/p/d/event/x", "/p/d/online", "//", "/+/#/online"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tp, ok := ParseTopic(s)
		if !ok {
			return
		}
		if tp.Kind == KindUnknown || tp.ProductID == "" || tp.DeviceID == "" || tp.Name != s ||
			strings.Contains(tp.ProductID, "/") || strings.Contains(tp.DeviceID, "/") {
			t.Fatalf("ParseTopic(%q) = %+v", s, tp)
		}
	})
}

func BenchmarkDecodeReport(b *testing.B) {
	tp, _ := ParseTopic("/product-1/device-000042/properties/report")
	payload := []byte(`{"messageId":"1717243200000-42","timestamp":1717243200000,"properties":{"temperature":21.53,"humidity":48.2,"pressure":1013.25,"voltage":3.31,"on":true,"mode":"auto","rssi":-67,"fw":"1.4.2"}}`)
	var r Rows
	now := time.Now()
	b.SetBytes(int64(len(payload)))
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		r.Reset()
		if err := DecodeReport(&r, tp, payload, now); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}

// parseNumber gives exactly strconv.ParseFloat's value, sign of zero
// included, on its fast path and off it.
func TestParseNumber(t *testing.T) {
	check := func(txt string) {
		t.Helper()
		got, err := parseNumber([]byte(txt))
		want, werr := strconv.ParseFloat(txt, 64)
		if (err != nil) != (werr != nil) || math.Float64bits(got) != math.Float64bits(want) {
			t.Fatalf("parseNumber(%q) = %v, %v; strconv: %v, %v", txt, got, err, want, werr)
		}
	}
	for _, txt := range []string{
		"0", "-0", "0.0", "-0.0", "1", "-1", "21.5", "-3.25", "0.1", "0.3", "1013.25", "0.000001",
		"123456789012345", "999999999999999", "0.99999999999999", "1234567890.12345", // 15 digits
		"1234567890123456", "9007199254740993", "0.1234567890123456", // 16+: strconv
		"1e5", "1E-7", "-2.5e+3", "1e400", "-1e400", "4.9e-325", // exponents: strconv
		"3.14159265358979", "2.718281828459045", "100", "0.5",
	} {
		check(txt)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 200000 {
		var b []byte
		if rng.IntN(2) == 0 {
			b = append(b, '-')
		}
		intDigits, fracDigits := 1+rng.IntN(12), rng.IntN(10)
		b = strconv.AppendUint(b, rng.Uint64N(uint64(math.Pow10(intDigits))), 10)
		if fracDigits > 0 {
			b = append(b, '.')
			for range fracDigits {
				b = append(b, byte('0'+rng.IntN(10)))
			}
		}
		check(string(b))
	}
}

func FuzzParseNumber(f *testing.F) {
	for _, s := range []string{"0", "-0.5", "21.5", "123456789012345", "1e5", "0.000001"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, txt string) {
		s := scanner{b: []byte(txt)}
		num, err := s.number()
		if err != nil || s.i != len(txt) {
			return // not a JSON number: never reaches parseNumber
		}
		got, err := parseNumber(num)
		want, werr := strconv.ParseFloat(txt, 64)
		if (err != nil) != (werr != nil) || math.Float64bits(got) != math.Float64bits(want) {
			t.Fatalf("parseNumber(%q) = %v, %v; strconv: %v, %v", txt, got, err, want, werr)
		}
	})
}

// Duplicate ids keep their last value in first-seen order; nulls remove
// the id, whichever way the two combine.
func TestDecodeDuplicatesAndNulls(t *testing.T) {
	tp, _ := ParseTopic("/p/d/properties/report")
	many := `"k0":0,"k1":1,"k2":2,"k3":3,"k4":4,"k5":5,"k6":6,"k7":7,"k8":8,"k9":9,"k10":10,"k11":11,"k12":12,"k13":13,"k14":14,"k15":15`
	for _, c := range []struct{ props, want string }{
		{`"a":1,"b":2`, "a=1 b=2"},
		{`"a":1,"a":2`, "a=2"},
		{`"ab":1,"cb":2,"ab":3`, "ab=3 cb=2"},
		{`"a1b":1,"a2b":2`, "a1b=1 a2b=2"}, // same length, first and last byte
		{`"a":1,"b":null,"c":3`, "a=1 c=3"},
		{`"a":null,"b":1,"a":2`, "a=2 b=1"},
		{`"a":1,"b":2,"a":null`, "b=2"},
		{`"a":null,"b":null`, ""},
		{many + `,"k3":33`, "k0=0 k1=1 k2=2 k3=33 k4=4 k5=5 k6=6 k7=7 k8=8 k9=9 k10=10 k11=11 k12=12 k13=13 k14=14 k15=15"},
		{many + `,"k3":null,"k16":16`, "k0=0 k1=1 k2=2 k4=4 k5=5 k6=6 k7=7 k8=8 k9=9 k10=10 k11=11 k12=12 k13=13 k14=14 k15=15 k16=16"},
	} {
		var r Rows
		r.Props = append(r.Props, tsdb.PropertyValue{Property: "earlier"}) // rows of a previous message stay
		if err := DecodeReport(&r, tp, []byte(`{"properties":{`+c.props+`}}`), testNow); err != nil {
			t.Fatalf("%s: %v", c.props, err)
		}
		var got []string
		for _, p := range r.Props[1:] {
			got = append(got, fmt.Sprintf("%s=%g", p.Property, p.Num))
		}
		if strings.Join(got, " ") != c.want || r.Props[0].Property != "earlier" {
			t.Errorf("%s: got %v, want %s", c.props, got, c.want)
		}
	}
}
