package api_test

import (
	"strings"
	"testing"
)

// TestHTTPMetricsLabels: each request is counted, and its latency
// observed, under its route pattern, method and status label "code".
func TestHTTPMetricsLabels(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.ok("GET", "/api/authorize/me", nil, nil)
	e.fails("GET", "/api/device-product/missing-1", nil, 404, "not_found")
	e.fails("GET", "/api/device-product/missing-2", nil, 404, "not_found")
	e.do("GET", "/api/authorize/me", nil, "")

	text := e.metrics()
	f := func(series string) {
		t.Helper()
		if !strings.Contains(text, series) {
			t.Errorf("no %s in /metrics", series)
		}
	}
	f(`devicehub_http_requests_total{code="200",method="POST",route="/api/authorize/login"} 1`)
	f(`devicehub_http_requests_total{code="200",method="GET",route="/api/authorize/me"} 1`)
	// The token check runs before the route is matched: what it refuses
	// is counted under the group's prefix.
	f(`devicehub_http_requests_total{code="401",method="GET",route="/api"} 1`)
	f(`devicehub_http_requests_total{code="404",method="GET",route="/api/device-product/:id"} 2`)
	f(`devicehub_http_request_duration_seconds_count{code="404",method="GET",route="/api/device-product/:id"} 2`)
	f(`devicehub_http_request_duration_seconds_bucket{code="200",method="GET",route="/api/authorize/me",le="+Inf"} 1`)
	if strings.Contains(text, `status="`) {
		t.Errorf("a status label is left in /metrics: the status is label code")
	}
}
