package notify

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	sent, failed, retried, dead *prometheus.CounterVec
	latency                     *prometheus.HistogramVec
	depth                       *prometheus.GaugeVec
}

// newMetrics registers the per-channel metrics with reg (nil: kept
// unregistered, for tests).
func newMetrics(reg prometheus.Registerer) *metrics {
	counter := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, []string{"channel"})
	}
	m := &metrics{
		sent:    counter("devicehub_notify_sent_total", "Notifications a channel's receiver accepted."),
		failed:  counter("devicehub_notify_failed_total", "Delivery attempts that failed (an error or a refusal such as a non-2xx)."),
		retried: counter("devicehub_notify_retried_total", "Failed notifications scheduled for another attempt."),
		dead:    counter("devicehub_notify_dead_total", "Notifications given up on after the retry limit (dead letters)."),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "devicehub_notify_send_seconds",
			Help: "How long one delivery attempt took.", Buckets: prometheus.ExponentialBuckets(0.005, 2, 12)}, []string{"channel"}),
		depth: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "devicehub_notify_queue_depth",
			Help: "Notifications pending delivery (including those waiting for a retry), per channel."}, []string{"channel"}),
	}
	if reg != nil {
		reg.MustRegister(m.sent, m.failed, m.retried, m.dead, m.latency, m.depth)
	}
	return m
}

// channel starts a channel's series at 0 (a no-op once they exist), so
// that they are on /metrics, and a dashboard's rates start, before its
// first delivery.
func (m *metrics) channel(id string) {
	for _, c := range []*prometheus.CounterVec{m.sent, m.failed, m.retried, m.dead} {
		c.WithLabelValues(id)
	}
	m.latency.WithLabelValues(id)
}
