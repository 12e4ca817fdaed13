package jsonw

import (
	"bytes"
	"encoding/json"
	"math"
	"math/rand/v2"
	"testing"
)

// pieces are texts whose JSON encoding has escapes or replacements.
var pieces = []string{
	"", "plain", `quote " and \ backslash`, "<script>&amp;</script>", "\x00\x01\x1f\x7f", "\b\f\n\r\t",
	"\xff\xfe invalid", "cut \xe2\x82", "\u2028\u2029", "Żółw 电表 🚀", "{\"properties\":[]}", "%_like_%",
}

func texts() []string {
	out := append([]string(nil), pieces...)
	r := rand.New(rand.NewPCG(4, 7))
	for range 2000 {
		var b []byte
		for range r.IntN(6) {
			t := pieces[r.IntN(len(pieces))]
			if len(t) > 0 {
				i := r.IntN(len(t))
				b = append(b, t[i:min(len(t), i+r.IntN(8)+1)]...)
			}
		}
		out = append(out, string(b))
	}
	return out
}

func noHTML(t *testing.T, v any) string {
	t.Helper()
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		t.Fatal(err)
	}
	return string(bytes.TrimSuffix(buf.Bytes(), []byte("\n")))
}

// TestStrings: String and Bytes write what json.Marshal writes, and
// StringNoHTML what an Encoder without HTML escaping writes, after what
// the buffer held.
func TestStrings(t *testing.T) {
	for _, s := range texts() {
		want, _ := json.Marshal(s)
		if got := String([]byte("x"), s); string(got) != "x"+string(want) {
			t.Fatalf("String(%q) = %s, want %s", s, got[1:], want)
		}
		if got := Bytes([]byte("x"), []byte(s)); string(got) != "x"+string(want) {
			t.Fatalf("Bytes(%q) = %s, want %s", s, got[1:], want)
		}
		if got, want := StringNoHTML([]byte("x"), s), noHTML(t, s); string(got) != "x"+want {
			t.Fatalf("StringNoHTML(%q) = %s, want %s", s, got[1:], want)
		}
	}
}

// TestRaw: Raw writes what json.Marshal writes for a json.RawMessage,
// RawNoHTML what json.Compact does, and both write null for what is not
// JSON.
func TestRaw(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	var raws []string
	for _, s := range texts()[:500] {
		v := map[string]any{s: []any{s, 1.5, nil, true, map[string]any{"k": s}}}
		b, _ := json.MarshalIndent(v, " ", "\t") // spaces to remove
		if r.IntN(2) == 0 {
			b = []byte(noHTML(t, v)) // unescaped <, >, &, U+2028 to escape
		}
		raws = append(raws, string(b))
	}
	raws = append(raws, `"<\u2028>"`, ` [ 1 , "a b" ] `, `"\"<"`, "\"\u2028\"")
	for _, raw := range raws {
		want, err := json.Marshal(json.RawMessage(raw))
		if err != nil {
			t.Fatalf("%q: %v", raw, err)
		}
		if got := Raw([]byte("x"), []byte(raw)); string(got) != "x"+string(want) {
			t.Fatalf("Raw(%q) = %s, want %s", raw, got[1:], want)
		}
		var compact bytes.Buffer
		if err := json.Compact(&compact, []byte(raw)); err != nil {
			t.Fatal(err)
		}
		if got := RawNoHTML([]byte("x"), []byte(raw)); string(got) != "x"+compact.String() {
			t.Fatalf("RawNoHTML(%q) = %s, want %s", raw, got[1:], compact.String())
		}
	}
	for _, bad := range []string{"", " ", "{", `{"a": 1}}`, `{"a": 1} x`, "'x'"} {
		if _, err := json.Marshal(json.RawMessage(bad)); err == nil {
			t.Fatalf("encoding/json takes %q", bad)
		}
		if got := Raw(nil, []byte(bad)); string(got) != "null" {
			t.Errorf("Raw(%q) = %q; want null", bad, got)
		}
		if got := RawNoHTML(nil, []byte(bad)); string(got) != "null" {
			t.Errorf("RawNoHTML(%q) = %q; want null", bad, got)
		}
	}
	if Raw(nil, nil) == nil || string(Raw(nil, nil)) != "null" || string(RawNoHTML(nil, nil)) != "null" {
		t.Error("nil is not null")
	}
}

// TestLists: List writes a nil slice as null, Array as [].
func TestLists(t *testing.T) {
	str := func(s *string, b []byte) []byte { return String(b, *s) }
	for _, s := range [][]string{nil, {}, {"a"}, {"a", "<b>"}} {
		want, _ := json.Marshal(s)
		if got := List([]byte("x"), s, str); string(got) != "x"+string(want) {
			t.Errorf("List(%q) = %s, want %s", s, got[1:], want)
		}
		want, _ = json.Marshal(append([]string{}, s...))
		if got := Array([]byte("x"), s, str); string(got) != "x"+string(want) {
			t.Errorf("Array(%q) = %s, want %s", s, got[1:], want)
		}
	}
}

// TestFloat: Float writes what json.Marshal writes for a float64, and
// null for what it refuses.
func TestFloat(t *testing.T) {
	fs := []float64{0, math.Copysign(0, -1), 1, -1, 0.1, 20.5, 1e-6, 9.99e-7, 1e-7, -1e-7, 1.5e-10, 1e20, 1e21, -1e21, 1.2345e300,
		math.MaxFloat64, math.SmallestNonzeroFloat64, 1764445283123, 123456789012345678, 1.0 / 3,
		1e15 - 1, -1e15 + 1, 1e15, -1e15, 1e15 + 2, 999999999999999.9, 1<<53 + 2, -(1 << 62), 1 << 63}
	r := rand.New(rand.NewPCG(3, 5))
	for range 5000 {
		fs = append(fs, math.Float64frombits(r.Uint64()), r.NormFloat64()*math.Pow(10, float64(r.IntN(60)-30)),
			float64(r.Int64N(1<<53)-1<<52)/float64(int64(1)<<r.IntN(40)), math.Round(r.NormFloat64()*math.Pow(10, float64(r.IntN(25)))))
	}
	for _, f := range fs {
		want, err := json.Marshal(f)
		if err != nil {
			if got := Float([]byte("x"), f); string(got) != "xnull" {
				t.Fatalf("Float(%v) = %s, want null", f, got[1:])
			}
			continue
		}
		if got := Float([]byte("x"), f); string(got) != "x"+string(want) {
			t.Fatalf("Float(%v) = %s, want %s", f, got[1:], want)
		}
	}
	for _, f := range []float64{math.NaN(), math.Inf(1), math.Inf(-1)} {
		if got := Float(nil, f); string(got) != "null" {
			t.Errorf("Float(%v) = %s, want null", f, got)
		}
	}
}
