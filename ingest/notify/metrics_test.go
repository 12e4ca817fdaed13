package notify_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"devicehub/bench/testkit"
)

// TestMetricsChannelSeries: a channel that has delivered nothing has its
// series on /metrics, at 0, from the dispatcher's first queue reading (a
// dashboard shows 0 and its rates start then, not "no data"). Fails when
// the depth reads only channels with pending notifications.
func TestMetricsChannelSeries(t *testing.T) {
	g := newRig(t)
	ch := g.webhook(t, newReceiver(t).URL("/quiet"), "")
	reg := prometheus.NewRegistry()
	o := fast()
	o.Registerer = reg
	g.run(t, o)
	names := []string{"devicehub_notify_sent_total", "devicehub_notify_failed_total", "devicehub_notify_retried_total",
		"devicehub_notify_dead_total", "devicehub_notify_send_seconds", "devicehub_notify_queue_depth"}
	testkit.Eventually(t, 10*time.Second, "every series of the channel", func() bool {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		found := map[string]bool{}
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "channel" && l.GetValue() == ch.ID {
						found[mf.GetName()] = true
					}
				}
			}
		}
		for _, n := range names {
			if !found[n] {
				return false
			}
		}
		return true
	})
	for _, n := range names {
		if v := metric(t, reg, n, ch.ID); v != 0 {
			t.Errorf("%s %v, want 0", n, v)
		}
	}
}
