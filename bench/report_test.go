package bench

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestHistogram(t *testing.T) {
	var h Histogram
	for i := 1; i <= 1000; i++ {
		h.Record(time.Duration(i) * time.Millisecond)
	}
	f := func(q float64, want time.Duration) {
		t.Helper()
		got := h.Quantile(q)
		if d := float64(got-want) / float64(want); d < -0.02 || d > 0.02 {
			t.Errorf("q%.2f = %v, want %v", q, got, want)
		}
	}
	f(0.5, 500*time.Millisecond)
	f(0.9, 900*time.Millisecond)
	f(0.99, 990*time.Millisecond)
	f(1, time.Second)
	f(0.001, time.Millisecond)
	for v := int64(0); v < 1<<40; v = v*3/2 + 1 {
		if got := histValue(histIndex(v)); float64(got-v) > 0.016*float64(v)+1 || float64(v-got) > 0.016*float64(v)+1 {
			t.Fatalf("bucket of %d is valued %d", v, got)
		}
	}
}

func TestWriteReport(t *testing.T) {
	dir := t.TempDir()
	r := &Report{Scenario: "commands", Command: "go run ./cmd/bench commands", Started: time.Now(), Machine: CollectMachine(),
		Figures:   []Figure{{Scenario: "commands", Name: "p50", Value: 1.5, Unit: "ms", Against: "bare fiber", Baseline: 0.5, Ratio: 3}},
		Results:   map[string]any{"commands": map[string]int{"n": 1}},
		Timelines: map[string][]Second{"commands": {{T: 0, OK: 10, P50Ms: 1, P99Ms: 2}, {T: 1, OK: 12, P50Ms: 1.2, P99Ms: 3}}},
	}
	if err := WriteReport(dir, r); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"report.json", "summary.md", "timeline.svg"} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil || len(b) == 0 {
			t.Fatalf("%s: %v", name, err)
		}
	}
	md, _ := os.ReadFile(filepath.Join(dir, "summary.md"))
	if !strings.Contains(string(md), "| commands | p50 | 1.50 ms | bare fiber |") {
		t.Fatalf("summary:\n%s", md)
	}
	if r.Machine.CPUs < 1 || r.Machine.MemTotalB <= 0 {
		t.Fatalf("machine: %+v", r.Machine)
	}
}

// TestHistogramMerge: histograms exported by the generator's children and
// merged give the quantiles of one histogram of every value.
func TestHistogramMerge(t *testing.T) {
	var a, b, all, merged Histogram
	for i := range 1000 {
		d := time.Duration(i*i) * time.Microsecond
		if i%3 == 0 {
			a.Record(d)
		} else {
			b.Record(d)
		}
		all.Record(d)
	}
	for _, h := range []*Histogram{&a, &b} { // as a child sends it
		raw, err := json.Marshal(h.export())
		if err != nil {
			t.Fatal(err)
		}
		var d histData
		if err := json.Unmarshal(raw, &d); err != nil {
			t.Fatal(err)
		}
		merged.merge(&d)
	}
	merged.merge(nil)
	if merged.Summary() != all.Summary() {
		t.Fatalf("merged %+v, want %+v", merged.Summary(), all.Summary())
	}
}
