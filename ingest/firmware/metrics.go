package firmware

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	owner       prometheus.Gauge
	sent        *prometheus.CounterVec
	transitions *prometheus.CounterVec
	reports     *prometheus.CounterVec
	rollouts    *prometheus.CounterVec
	// Downloads is counted by the download route (Service.Downloaded).
	downloads *prometheus.CounterVec
	bytes     prometheus.Counter
	lookups   prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		owner: prometheus.NewGauge(prometheus.GaugeOpts{Name: "devicehub_firmware_engine_owner",
			Help: "1 while this instance runs the firmware engine (one instance at a time)."}),
		sent: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "devicehub_firmware_upgrades_total",
			Help: "Firmware upgrade messages by outcome (sent, error)."}, []string{"outcome"}),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "devicehub_firmware_device_transitions_total",
			Help: "Devices' firmware jobs entering a state (QUEUED, INITIATED, ..., UPDATED, FAILED, TIMED_OUT)."}, []string{"state"}),
		reports: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "devicehub_firmware_reports_total",
			Help: "Devices' firmware reports stored, by topic (progress, version)."}, []string{"topic"}),
		rollouts: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "devicehub_firmware_rollouts_ended_total",
			Help: "Rollouts the engine ended, by state (completed, aborted)."}, []string{"state"}),
		downloads: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "devicehub_firmware_downloads_total",
			Help: "Firmware download requests by HTTP status."}, []string{"code"}),
		bytes: prometheus.NewCounter(prometheus.CounterOpts{Name: "devicehub_firmware_download_bytes_total",
			Help: "Bytes of firmware downloads answered (the lengths sent)."}),
		lookups: prometheus.NewCounter(prometheus.CounterOpts{Name: "devicehub_firmware_download_lookups_total",
			Help: "Database reads made by downloads (a package's file once per 2 s; credentials only when they are not those the link was signed for)."}),
	}
	// Every known label value starts at 0, so that its series is on
	// /metrics (and a dashboard's rate starts) before the first event.
	for _, outcome := range []string{"sent", "error"} {
		m.sent.WithLabelValues(outcome)
	}
	for _, st := range DeviceStates {
		m.transitions.WithLabelValues(st)
	}
	for _, topic := range []string{"progress", "version"} {
		m.reports.WithLabelValues(topic)
	}
	for _, st := range []string{RolloutCompleted, RolloutAborted} {
		m.rollouts.WithLabelValues(st)
	}
	for _, code := range downloadCodes {
		m.downloads.WithLabelValues(itoa(code))
	}
	if reg != nil {
		reg.MustRegister(m.owner, m.sent, m.transitions, m.reports, m.rollouts, m.downloads, m.bytes, m.lookups)
	}
	return m
}

// downloadCodes are the statuses the download route answers with
// (api's downloadFirmware): the whole file, a range, a range past the end,
// bad credentials, another device's or an expired link, an unknown one,
// the database busy, a failure.
var downloadCodes = []int{200, 206, 416, 401, 403, 404, 503, 500}

// Downloaded counts a download answered with code and n bytes.
func (s *Service) Downloaded(code int, n int64) {
	s.m.downloads.WithLabelValues(strconv.Itoa(code)).Inc()
	if n > 0 {
		s.m.bytes.Add(float64(n))
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

func ftoa(f float64) string { return strconv.FormatFloat(f, 'f', 2, 64) }
