package api

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"
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
