package firmware

import (
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestDownloadCodesStartAtZero: every status the download route answers
// with, refusals and failures included, has its series on /metrics
// before the first download.
func TestDownloadCodesStartAtZero(t *testing.T) {
	reg := prometheus.NewRegistry()
	newMetrics(reg)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var codes []string
	for _, mf := range mfs {
		if mf.GetName() != "devicehub_firmware_downloads_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if m.GetCounter().GetValue() != 0 {
				t.Errorf("%v: %v before any download", m.GetLabel(), m.GetCounter().GetValue())
			}
			for _, l := range m.GetLabel() {
				codes = append(codes, l.GetValue())
			}
		}
	}
	slices.Sort(codes)
	want := []string{"200", "206", "401", "403", "404", "416", "500", "503"}
	if !slices.Equal(codes, want) {
		t.Errorf("download codes at start: %v, want %v", codes, want)
	}
}
