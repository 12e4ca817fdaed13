package wire

import (
	"errors"
	"testing"
	"time"
)

func TestDecodeFirmwareProgress(t *testing.T) {
	tp, ok := ParseTopic("/p1/d1/firmware/progress")
	if !ok || tp.Kind != KindFirmwareProgress {
		t.Fatalf("topic: %+v %v", tp, ok)
	}
	now := time.Now()
	for _, c := range []struct {
		in   string
		want FirmwareProgress
		bad  bool
	}{
		{in: `{"rolloutId":"r","version":"1.2.0","state":"DOWNLOADING","progress":42.5}`, want: FirmwareProgress{RolloutID: "r", Version: "1.2.0", State: "DOWNLOADING", Progress: 42}},
		{in: `{"rolloutId":"r","version":"1.2.0","state":"FAILED","reason":"sha256 mismatch","messageId":"m","timestamp":1}`, want: FirmwareProgress{RolloutID: "r", Version: "1.2.0", State: "FAILED", Reason: "sha256 mismatch"}},
		{in: `{"rolloutId":"r","version":"1.2.0","state":"DOWNLOADING","progress":700}`, want: FirmwareProgress{RolloutID: "r", Version: "1.2.0", State: "DOWNLOADING", Progress: 100}},
		{in: `{"rolloutId":"r","version":"1.2.0","state":"DONE"}`, bad: true},
		{in: `{"version":"1.2.0","state":"UPDATED"}`, bad: true},
		{in: `{"rolloutId":"r","state":"UPDATED"}`, bad: true},
		{in: `{"rolloutId":"r","version":"1","state":"UPDATED","progress":"x"}`, bad: true},
		{in: `[]`, bad: true},
	} {
		var rows Rows
		var got FirmwareProgress
		err := DecodeFirmwareProgress(&rows, tp, []byte(c.in), now, &got)
		if c.bad {
			if !errors.Is(err, ErrMalformed) || len(rows.Msgs) != 0 {
				t.Errorf("%s: err %v, rows %d: want malformed, nothing", c.in, err, len(rows.Msgs))
			}
			continue
		}
		if err != nil || got != c.want || len(rows.Msgs) != 1 || rows.Msgs[0].MessageType != "FIRMWARE_PROGRESS" {
			t.Errorf("%s: %+v %v %d", c.in, got, err, len(rows.Msgs))
		}
	}
}

func TestDecodeFirmwareVersion(t *testing.T) {
	tp, ok := ParseTopic("/p1/d1/firmware/version")
	if !ok || tp.Kind != KindFirmwareVersion {
		t.Fatalf("topic: %+v %v", tp, ok)
	}
	var rows Rows
	var v string
	if err := DecodeFirmwareVersion(&rows, tp, []byte(`{"version":"1.2.0","timestamp":1700000000000}`), time.Now(), &v); err != nil || v != "1.2.0" {
		t.Fatalf("%q %v", v, err)
	}
	for _, in := range []string{`{}`, `{"version":""}`, `{"version":{}}`, `nope`} {
		if err := DecodeFirmwareVersion(&rows, tp, []byte(in), time.Now(), &v); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v", in, err)
		}
	}
}

func FuzzDecodeFirmwareProgress(f *testing.F) {
	f.Add([]byte(`{"rolloutId":"r","version":"1.2.0","state":"DOWNLOADING","progress":42}`))
	f.Add([]byte(`{"rolloutId":"r","version":"1.2.0","state":"FAILED","reason":"x\u00e9"}`))
	tp, _ := ParseTopic("/p/d/firmware/progress")
	f.Fuzz(func(t *testing.T, b []byte) {
		var rows Rows
		var p FirmwareProgress
		if err := DecodeFirmwareProgress(&rows, tp, b, time.Now(), &p); err == nil {
			if !progressStates[p.State] || p.Progress < 0 || p.Progress > 100 || p.RolloutID == "" || p.Version == "" {
				t.Fatalf("accepted %q as %+v", b, p)
			}
		}
	})
}

func FuzzDecodeFirmwareVersion(f *testing.F) {
	f.Add([]byte(`{"version":"1.2.0","timestamp":1700000000000}`))
	tp, _ := ParseTopic("/p/d/firmware/version")
	f.Fuzz(func(t *testing.T, b []byte) {
		var rows Rows
		var v string
		if err := DecodeFirmwareVersion(&rows, tp, b, time.Now(), &v); err == nil && (v == "" || len(v) > MaxFirmwareVersionLen) {
			t.Fatalf("accepted %q as %q", b, v)
		}
	})
}
