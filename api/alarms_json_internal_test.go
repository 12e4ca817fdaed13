package api

import (
	"encoding/json"
	"math/rand/v2"
	"testing"
	"time"

	"devicehub/ingest/alarm"
)

// TestAppendRecord: appendRecord writes the bytes encoding/json writes
// for recordView, for records of texts that need escapes, with and
// without the optional fields and times.
func TestAppendRecord(t *testing.T) {
	r := rand.New(rand.NewPCG(47, 3))
	tm := func() *time.Time {
		if r.IntN(2) == 0 {
			return nil
		}
		x := time.UnixMilli(r.Int64N(2e12))
		return &x
	}
	opt := func() string {
		if r.IntN(2) == 0 {
			return ""
		}
		return randomText(r)
	}
	sev := append(alarm.Severities(), "other")
	for range 2000 {
		rec := alarm.Record{ID: r.Int64N(1e12) - 1e6, RuleID: randomText(r), RuleName: randomText(r), ProductID: randomText(r),
			DeviceID: randomText(r), Severity: sev[r.IntN(len(sev))], State: randomText(r), Count: r.Int64N(1e9),
			FirstValue: randomText(r), LastValue: randomText(r), RaisedTime: time.UnixMilli(r.Int64N(2e12)),
			LastTime: time.UnixMilli(r.Int64N(2e12)), ClearedTime: tm(), ClearedBy: opt(), ClearValue: opt(),
			Acked: r.IntN(2) == 0, AckedTime: tm(), AckedBy: opt(), AckComment: opt()}
		want, err := json.Marshal(recordView(&rec))
		if err != nil {
			t.Fatal(err)
		}
		if got := appendRecord(&rec, []byte("prefix")); string(got) != "prefix"+string(want) {
			t.Fatalf("appendRecord\n got %s\nwant %s", got[len("prefix"):], want)
		}
	}
}
