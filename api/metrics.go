package api

import (
	"strconv"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the HTTP request metrics of /metrics.
type metrics struct {
	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "devicehub_http_requests_total",
			Help: "HTTP requests by route pattern, method and response status code.",
		}, []string{"route", "method", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "devicehub_http_request_duration_seconds",
			Help:    "HTTP request latency by route pattern, method and response status code.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 10},
		}, []string{"route", "method", "code"}),
	}
	if reg != nil {
		reg.MustRegister(m.requests, m.latency)
	}
	return m
}

// middleware records every request under its route pattern (not its path,
// which would grow the label set with every id) and its status as label
// "code", the name Prometheus' own HTTP instrumentation (promhttp) uses.
func (m *metrics) middleware(c *fiber.Ctx) error {
	start := time.Now()
	if err := c.Next(); err != nil {
		// Write the error's envelope now, so that its status is counted.
		if herr := c.App().ErrorHandler(c, err); herr != nil {
			return herr
		}
	}
	status := c.Response().StatusCode()
	method := labelMethod(c.Method())
	route := "unmatched"
	if r := c.Route(); r != nil && r.Path != "/" && r.Path != "" {
		route = r.Path
	}
	code := strconv.Itoa(status)
	if status >= 0 && status < len(statusCodes) {
		code = statusCodes[status]
	}
	m.requests.WithLabelValues(route, method, code).Inc()
	m.latency.WithLabelValues(route, method, code).Observe(time.Since(start).Seconds())
	return nil
}

// statusCodes are the texts of the HTTP status codes, made once.
var statusCodes = func() (t [600]string) {
	for i := range t {
		t[i] = strconv.Itoa(i)
	}
	return t
}()

// labelMethod is a request's method for a label: a copy, as fasthttp
// reuses the buffers behind c.Method() (Fiber's constants for its
// methods).
func labelMethod(m string) string {
	for _, known := range []string{fiber.MethodGet, fiber.MethodPost, fiber.MethodPut, fiber.MethodPatch,
		fiber.MethodDelete, fiber.MethodHead, fiber.MethodOptions} {
		if m == known {
			return known
		}
	}
	return strings.Clone(m)
}
