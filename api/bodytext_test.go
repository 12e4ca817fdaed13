package api

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzCheckJSONText: the body scanner never panics, and it refuses a body
// that decodes as JSON exactly when one of its strings holds NUL or bytes
// that are not UTF-8.
func FuzzCheckJSONText(f *testing.F) {
	for _, s := range []string{`{}`, `{"a":"b"}`, `[1,"x",{"k":[null,true]}]`, `{"a":"\u0000"}`, "{\"a\":\"\xff\"}",
		`{"terms":[{"terms":[{"column":"name","value":"x\u0000"}]}]}`, `"\\u0000"`, `{"a\u0000":1}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		err := checkJSONText(body)
		var v any
		if json.Unmarshal(body, &v) != nil {
			return // malformed JSON: left to the decoder, whatever the scanner said
		}
		if good := utf8.Valid(body) && !hasNUL(v); good == (err != nil) {
			t.Fatalf("checkJSONText(%q) = %v", body, err)
		}
	})
}

// hasNUL reports a NUL in any string or key of a decoded JSON value.
func hasNUL(v any) bool {
	switch x := v.(type) {
	case string:
		return strings.ContainsRune(x, 0)
	case []any:
		for _, e := range x {
			if hasNUL(e) {
				return true
			}
		}
	case map[string]any:
		for k, e := range x {
			if strings.ContainsRune(k, 0) || hasNUL(e) {
				return true
			}
		}
	}
	return false
}
