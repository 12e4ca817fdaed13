package link

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Command kinds, the kind label of the command metrics.
const (
	kindRead     = 0 // property reads, "read"
	kindInvoke   = 1 // function invokes, "invoke"
	kindWrite    = 2 // property writes, "write"
	kindShadow   = 3 // shadow messages (delta, get reply), "shadow": sent only
	kindFirmware = 4 // firmware upgrades (ingest/firmware), "firmware": sent only
)

var kindNames = [...]string{kindRead: "read", kindInvoke: "invoke", kindWrite: "write", kindShadow: "shadow", kindFirmware: "firmware"}

// Command outcomes, the outcome label of the command metrics.
const (
	outcomeAnswered = iota // a read answered by the device with success
	outcomeFailed          // a read answered with success=false (DeviceError)
	outcomeSent            // an invoke published (and, at QoS 1, acknowledged by the broker)
	outcomeTimeout         // ErrTimeout
	outcomeOffline         // ErrOffline
	outcomeBusy            // ErrTooBusy
	outcomeError           // anything else: encoding or publishing failed
	outcomeCount
)

var outcomeNames = [outcomeCount]string{"answered", "failed", "sent", "timeout", "offline", "busy", "error"}

// kindOutcomes are the outcomes each kind can have; their series are
// created at start, so that rates exist before the first event.
var kindOutcomes = [...][]int{
	kindRead:     {outcomeAnswered, outcomeFailed, outcomeTimeout, outcomeOffline, outcomeBusy, outcomeError},
	kindInvoke:   {outcomeSent, outcomeTimeout, outcomeOffline, outcomeError},
	kindWrite:    {outcomeAnswered, outcomeFailed, outcomeTimeout, outcomeOffline, outcomeBusy, outcomeError},
	kindShadow:   {},
	kindFirmware: {},
}

// commandMetrics are the command path's metrics. The series are looked up
// once here, so that a command costs a few atomic additions.
type commandMetrics struct {
	total    *prometheus.CounterVec   // devicehub_commands_total{kind,outcome}
	duration *prometheus.HistogramVec // devicehub_command_duration_seconds{kind,outcome}
	sentVec  *prometheus.CounterVec   // devicehub_commands_sent_total{kind}
	pending  prometheus.GaugeFunc     // devicehub_commands_pending

	counts  [len(kindNames)][outcomeCount]prometheus.Counter
	seconds [len(kindNames)][outcomeCount]prometheus.Observer
	sends   [len(kindNames)]prometheus.Counter
}

func newCommandMetrics(c *Commands) *commandMetrics {
	m := &commandMetrics{
		total: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "devicehub_commands_total",
			Help: "Commands by kind (read, invoke, write) and outcome (answered, failed, sent, timeout, offline, busy, error)."},
			[]string{"kind", "outcome"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "devicehub_command_duration_seconds",
			Help:    "Time from a command's call to its outcome, by kind and outcome; a read's is its round trip to the device.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}},
			[]string{"kind", "outcome"}),
		sentVec: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "devicehub_commands_sent_total",
			Help: "Downlinks published to the broker, by kind."}, []string{"kind"}),
		pending: prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "devicehub_commands_pending",
			Help: "Property reads and writes waiting for their reply."}, func() float64 { return float64(c.Pending()) }),
	}
	for k, outcomes := range kindOutcomes {
		for _, o := range outcomes {
			m.counts[k][o] = m.total.WithLabelValues(kindNames[k], outcomeNames[o])
			m.seconds[k][o] = m.duration.WithLabelValues(kindNames[k], outcomeNames[o])
		}
		m.sends[k] = m.sentVec.WithLabelValues(kindNames[k])
	}
	return m
}

func (m *commandMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.total, m.duration, m.sentVec, m.pending}
}

// register registers every collector or, failing that, none.
func (m *commandMetrics) register(r prometheus.Registerer) error {
	for i, col := range m.collectors() {
		if err := r.Register(col); err != nil {
			for _, done := range m.collectors()[:i] {
				r.Unregister(done)
			}
			return err
		}
	}
	return nil
}

func (m *commandMetrics) unregister(r prometheus.Registerer) {
	for _, col := range m.collectors() {
		r.Unregister(col)
	}
}

// observe counts a command of kind that ended with err, started at start.
func (m *commandMetrics) observe(kind int, start time.Time, err error) {
	o := outcomeOf(kind, err)
	m.counts[kind][o].Inc()
	m.seconds[kind][o].Observe(time.Since(start).Seconds())
}

func (m *commandMetrics) sent(kind int) { m.sends[kind].Inc() }

func outcomeOf(kind int, err error) int {
	var de *DeviceError
	switch {
	case err == nil && kind == kindInvoke:
		return outcomeSent
	case err == nil:
		return outcomeAnswered
	case errors.As(err, &de) && (kind == kindRead || kind == kindWrite):
		return outcomeFailed
	case errors.Is(err, ErrTimeout):
		return outcomeTimeout
	case errors.Is(err, ErrOffline):
		return outcomeOffline
	case errors.Is(err, ErrTooBusy) && (kind == kindRead || kind == kindWrite):
		return outcomeBusy
	}
	return outcomeError
}
