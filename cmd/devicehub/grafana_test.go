package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"devicehub/bench/testkit"
	"devicehub/ingest/mqtttest"
)

// promqlRefs are the metric and label names a PromQL expression (or a
// Grafana label_values(metric, label) query) refers to.
type promqlRefs struct {
	metrics, labels []string
}

var (
	promqlString   = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	promqlRange    = regexp.MustCompile(`\[[^\]]*\]`)
	promqlMatchers = regexp.MustCompile(`\{([^}]*)\}`)
	promqlMatcher  = regexp.MustCompile(`([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)`)
	promqlGrouping = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)`)
	labelValues    = regexp.MustCompile(`label_values\(\s*([A-Za-z_:][A-Za-z0-9_:]*)\s*,\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)`)
	promqlIdent    = regexp.MustCompile(`[A-Za-z_:][A-Za-z0-9_:]*(\s*\()?`)
	legendLabel    = regexp.MustCompile(`\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}`)
)

// promqlKeywords are PromQL's words that are neither metrics nor
// functions followed by "(".
var promqlKeywords = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true,
	"group_right": true, "bool": true, "and": true, "or": true, "unless": true, "offset": true}

// parsePromQL finds the metrics and labels expr names: labels of matchers,
// of grouping clauses and of label_values; metrics are the other names
// that are not functions (a name before "(") or keywords.
func parsePromQL(expr string) promqlRefs {
	var r promqlRefs
	expr = promqlString.ReplaceAllString(expr, `""`)
	expr = promqlRange.ReplaceAllString(expr, "")
	for _, m := range labelValues.FindAllStringSubmatch(expr, -1) {
		r.metrics = append(r.metrics, m[1])
		r.labels = append(r.labels, m[2])
	}
	expr = labelValues.ReplaceAllString(expr, "")
	for _, m := range promqlMatchers.FindAllStringSubmatch(expr, -1) {
		for _, l := range promqlMatcher.FindAllStringSubmatch(m[1], -1) {
			r.labels = append(r.labels, l[1])
		}
	}
	expr = promqlMatchers.ReplaceAllString(expr, " ")
	for _, m := range promqlGrouping.FindAllStringSubmatch(expr, -1) {
		for _, l := range strings.Split(m[1], ",") {
			if l = strings.TrimSpace(l); l != "" {
				r.labels = append(r.labels, l)
			}
		}
	}
	expr = promqlGrouping.ReplaceAllString(expr, " ")
	for _, m := range promqlIdent.FindAllStringSubmatch(expr, -1) {
		name := strings.TrimRight(strings.TrimSuffix(strings.TrimSpace(m[0]), "("), " ")
		if m[1] != "" || promqlKeywords[name] || strings.HasPrefix(name, "$") {
			continue
		}
		r.metrics = append(r.metrics, name)
	}
	return r
}

func TestParsePromQL(t *testing.T) {
	f := func(expr string, metrics, labels []string) {
		t.Helper()
		r := parsePromQL(expr)
		sort.Strings(r.metrics)
		sort.Strings(r.labels)
		if !slices.Equal(r.metrics, metrics) || !slices.Equal(r.labels, labels) {
			t.Errorf("%s: metrics %v labels %v, want %v %v", expr, r.metrics, r.labels, metrics, labels)
		}
	}
	f(`sum by (code) (rate(a_total{instance=~"$instance"}[$__rate_interval]))`, []string{"a_total"}, []string{"code", "instance"})
	f(`histogram_quantile(0.99, sum by (le, kind) (rate(b_bucket{outcome=~"x|y",instance=~"$i"}[5m])))`,
		[]string{"b_bucket"}, []string{"instance", "kind", "le", "outcome"})
	f(`sum(c_total{i="a{b}"}) - sum(d_total)`, []string{"c_total", "d_total"}, []string{"i"})
	f(`topk(10, sum by (route, method) (rate(e[1m]))) / on(instance) group_left(version) f`, []string{"e", "f"},
		[]string{"instance", "method", "route", "version"})
	f(`label_values(devicehub_build_info, instance)`, []string{"devicehub_build_info"}, []string{"instance"})
	f(`go_gc_duration_seconds{quantile="1"}`, []string{"go_gc_duration_seconds"}, []string{"quantile"})
}

// exposition reads the Prometheus text format: each sample name with the
// label names its samples carry.
func exposition(text string) map[string]map[string]bool {
	out := map[string]map[string]bool{}
	label := regexp.MustCompile(`([A-Za-z_][A-Za-z0-9_]*)="`)
	for _, line := range strings.Split(text, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, rest, _ := strings.Cut(line, " ")
		if i := strings.IndexByte(line, '{'); i >= 0 && i < len(name) {
			name, rest = line[:i], line[i:]
		}
		if out[name] == nil {
			out[name] = map[string]bool{}
		}
		if strings.HasPrefix(rest, "{") {
			for _, m := range label.FindAllStringSubmatch(rest[:strings.LastIndexByte(rest, '}')], -1) {
				out[name][m[1]] = true
			}
		}
	}
	return out
}

// grafanaQuery is one query of the dashboard and where it is.
type grafanaQuery struct {
	where, expr, legend string
}

// grafanaQueries reads every query of the dashboard: the panels'
// targets (rows' nested panels included) and the template variables'.
func grafanaQueries(t *testing.T, path string) []grafanaQuery {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	type panel struct {
		Title   string  `json:"title"`
		Panels  []panel `json:"panels"`
		Targets []struct {
			Expr         string `json:"expr"`
			LegendFormat string `json:"legendFormat"`
		} `json:"targets"`
	}
	var d struct {
		Panels     []panel `json:"panels"`
		Templating struct {
			List []struct {
				Name  string          `json:"name"`
				Type  string          `json:"type"`
				Query json.RawMessage `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	var qs []grafanaQuery
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			for _, tg := range p.Targets {
				qs = append(qs, grafanaQuery{where: "panel " + p.Title, expr: tg.Expr, legend: tg.LegendFormat})
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct {
			Query string `json:"query"`
		}
		if json.Unmarshal(v.Query, &q) != nil {
			_ = json.Unmarshal(v.Query, &q.Query) // the older form: a plain string
		}
		qs = append(qs, grafanaQuery{where: "variable " + v.Name, expr: q.Query})
	}
	return qs
}

// scrapeLabels are added by Prometheus at scrape time, not by devicehub.
var scrapeLabels = map[string]bool{"instance": true, "job": true}

// TestGrafanaDashboardMetrics runs the binary, with JSON logs and the
// access log, on its own broker, gives it some traffic (API calls, a
// device's reports, one with a bad timestamp, a message of an unknown
// device, a command that times out, a notification channel and a
// forwarding rule) and checks that every metric the
// Grafana dashboard queries is on /metrics with every label the dashboard
// groups, filters or names legends by: the dashboard cannot drift from
// the server. The log is JSON lines with an access line per request and no
// token.
func TestGrafanaDashboardMetrics(t *testing.T) {
	t.Parallel()
	queries := grafanaQueries(t, "grafana-dashboard.json")
	own := startOwn(t, "grafana", "DEVICEHUB_LOG_FORMAT=json", "DEVICEHUB_ACCESS_LOG=true", "DEVICEHUB_LOG_LEVEL=info")
	srv, broker, suffix, token := own.server, own.broker, own.suffix, own.token
	product, device := "gp"+suffix, "gd"+suffix
	srv.deployDevice(t, token, product, device)

	gw := mqtttest.Gateway(t, broker.URL())
	dev := mqtttest.ConnectDevice(t, broker.URL(), device, func(o *mqtt.ClientOptions) { gw(o) })
	prefix := "/" + product + "/" + device
	dev.MustPublish(t, prefix+"/online", 1, "")
	dev.MustPublish(t, prefix+"/properties/report", 1, `{"properties":{"temperature":21.5}}`)
	dev.MustPublish(t, prefix+"/properties/report", 1, `{"timestamp":"soon","properties":{"temperature":22}}`)
	dev.MustPublish(t, "/"+product+"/ghost-"+suffix+"/properties/report", 1, `{"properties":{"temperature":1}}`)
	testkit.Eventually(t, 20*time.Second, "two reports stored and the bad timestamp counted", func() bool {
		m := metricsText(t, srv.base)
		return strings.Contains(m, "\ndevicehub_ingest_bad_timestamps_total 1\n") && !strings.Contains(m, "\ndevicehub_ingest_stored_total 0\n")
	})

	// The device does not answer: a read that times out.
	req, _ := http.NewRequest("GET", srv.base+"/api/device/standard/"+device+"/property/temperature?timeout=200", nil)
	req.Header.Set("X-Access-Token", token)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusInternalServerError {
		t.Errorf("read from a silent device: %d, want 500 time_out", res.StatusCode)
	}
	srv.call(t, token, "POST", "/api/device-instance/_query/", map[string]any{"pageSize": 5})

	// A notification channel and a forwarding rule: their series are
	// labelled by their ids, on /metrics from the channel's first queue
	// reading (every 5 s) and from the forwarder's loading the rule.
	sink := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer sink.Close()
	srv.call(t, token, "POST", "/api/notify/channel", map[string]any{"id": "gh" + suffix, "name": "Hook", "webhook": map[string]any{"url": sink.URL}})
	srv.call(t, token, "POST", "/api/notify/forward", map[string]any{"id": "gf" + suffix, "name": "Out", "productId": product,
		"webhook": map[string]any{"url": sink.URL}})
	testkit.Eventually(t, 20*time.Second, "the channel's and the rule's series", func() bool {
		m := metricsText(t, srv.base)
		return strings.Contains(m, `devicehub_notify_sent_total{channel="gh`+suffix+`"}`) &&
			strings.Contains(m, `devicehub_forward_pending_messages{rule="gf`+suffix+`"}`)
	})

	have := exposition(metricsText(t, srv.base))
	seen := map[string]bool{}
	for _, q := range queries {
		r := parsePromQL(q.expr)
		if len(r.metrics) == 0 {
			t.Errorf("%s: no metric in %q", q.where, q.expr)
		}
		for _, m := range legendLabel.FindAllStringSubmatch(q.legend, -1) {
			r.labels = append(r.labels, m[1])
		}
		for _, m := range r.metrics {
			seen[m] = true
			if have[m] == nil {
				t.Errorf("%s: metric %s is not on /metrics (%s)", q.where, m, q.expr)
			}
		}
		for _, l := range r.labels {
			if scrapeLabels[l] {
				continue
			}
			if !slices.ContainsFunc(r.metrics, func(m string) bool { return have[m][l] }) {
				t.Errorf("%s: no metric of %q has label %s", q.where, q.expr, l)
			}
		}
	}
	// The dashboard covers what the issue asks for.
	for _, m := range []string{"devicehub_build_info", "devicehub_http_requests_total", "devicehub_http_request_duration_seconds_bucket",
		"devicehub_ingest_stored_total", "devicehub_ingest_acked_total", "devicehub_ingest_parked", "devicehub_ingest_bad_timestamps_total",
		"devicehub_commands_total", "devicehub_command_duration_seconds_bucket", "devicehub_devices_online",
		"go_goroutines", "go_memstats_heap_alloc_bytes", "process_resident_memory_bytes",
		"devicehub_alarm_evaluations_total", "devicehub_alarm_evaluation_lag_seconds_bucket", "devicehub_alarms_active", "devicehub_alarm_owner",
		"devicehub_notify_sent_total", "devicehub_notify_failed_total", "devicehub_notify_send_seconds_bucket",
		"devicehub_notify_queue_depth", "devicehub_notify_retried_total", "devicehub_notify_dead_total",
		"devicehub_forward_sent_total", "devicehub_forward_lag_seconds", "devicehub_forward_pending_messages",
		"devicehub_forward_dropped_total", "devicehub_forward_failed_total", "devicehub_forward_spool_bytes", "devicehub_forward_owner", "devicehub_forward_redelivered_total",
		"devicehub_firmware_device_transitions_total", "devicehub_firmware_upgrades_total", "devicehub_firmware_reports_total",
		"devicehub_firmware_rollouts_ended_total", "devicehub_firmware_downloads_total", "devicehub_firmware_download_bytes_total",
		"devicehub_firmware_engine_owner"} {
		if !seen[m] {
			t.Errorf("the dashboard has no panel on %s", m)
		}
	}

	// JSON logs, an access line per request, no token.
	logText, err := os.ReadFile(srv.logf)
	if err != nil {
		t.Fatal(err)
	}
	access := 0
	for _, line := range strings.Split(strings.TrimSpace(string(logText)), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Errorf("log line is not JSON: %q", line)
			continue
		}
		if rec["msg"] == "http request" {
			access++
		}
	}
	if access < 8 {
		t.Errorf("%d access log lines, want one per request:\n%s", access, logText)
	}
	if strings.Contains(string(logText), token) || strings.Contains(string(logText), "admin123") {
		t.Errorf("the log holds the token or the admin password:\n%s", logText)
	}
}

// TestGrafanaPanelUnits: a series is drawn in the unit of what it
// measures: in a panel of seconds every series is a duration (a
// *_seconds histogram quantile, sum or rate of one), unless an override
// gives that series a unit of its own (rows per insert once showed as
// "5 min"); a panel of errors plots errors only.
func TestGrafanaPanelUnits(t *testing.T) {
	raw, err := os.ReadFile("grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title       string `json:"title"`
			FieldConfig struct {
				Defaults struct {
					Unit string `json:"unit"`
				} `json:"defaults"`
				Overrides []struct {
					Matcher struct {
						ID      string `json:"id"`
						Options string `json:"options"`
					} `json:"matcher"`
					Properties []struct {
						ID    string `json:"id"`
						Value any    `json:"value"`
					} `json:"properties"`
				} `json:"overrides"`
			} `json:"fieldConfig"`
			Targets []struct {
				Expr   string `json:"expr"`
				Legend string `json:"legendFormat"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, p := range d.Panels {
		unitOf := func(legend string) string {
			for _, o := range p.FieldConfig.Overrides {
				if o.Matcher.ID == "byName" && o.Matcher.Options == legend {
					for _, pr := range o.Properties {
						if pr.ID == "unit" {
							return fmt.Sprint(pr.Value)
						}
					}
				}
			}
			return p.FieldConfig.Defaults.Unit
		}
		for _, tg := range p.Targets {
			if unitOf(tg.Legend) == "s" {
				checked++
				if !strings.Contains(tg.Expr, "_seconds") {
					t.Errorf("panel %q: series %q (%s) is drawn in seconds but measures no duration", p.Title, tg.Legend, tg.Expr)
				}
			}
			if strings.Contains(strings.ToLower(p.Title), "retried") && !strings.Contains(tg.Expr, "error") {
				t.Errorf("panel %q plots %q, which is no error", p.Title, tg.Legend)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no series in seconds: the check checked nothing")
	}
}
