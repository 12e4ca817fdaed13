package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"html"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
)

// Report is one run of cmd/bench: what was measured, where, how, and the
// figures held against their ceilings.
type Report struct {
	Scenario string    `json:"scenario"`
	Command  string    `json:"command"`
	Started  time.Time `json:"started"`
	Seconds  float64   `json:"seconds"`
	Machine  Machine   `json:"machine"`
	Versions Versions  `json:"versions"`
	// Broker is what the MQTT broker held when the run started.
	Broker  *BrokerState `json:"brokerAtStart,omitempty"`
	Figures []Figure     `json:"figures"`
	// Results holds each scenario's full result (params included), by name.
	Results map[string]any `json:"results"`
	// Timelines are per-second samples of load phases, by name, for the plot.
	Timelines map[string][]Second `json:"timelines,omitempty"`
	Errors    []string            `json:"errors,omitempty"`
}

// Figure is one headline number and what it is held against.
type Figure struct {
	Scenario string  `json:"scenario"`
	Name     string  `json:"name"`
	Value    float64 `json:"value"`
	Unit     string  `json:"unit"`
	// Against names the ceiling or baseline measured in the same run.
	Against  string  `json:"against,omitempty"`
	Baseline float64 `json:"baseline,omitempty"`
	Ratio    float64 `json:"ratio,omitempty"`
	Target   string  `json:"target,omitempty"`
	// Note, where set, stands for the value: a wait whose bound passed
	// ("not reached (94,569 of 100,000 connected within 3m0s)").
	Note string `json:"note,omitempty"`
}

// Machine is the box the run measured.
type Machine struct {
	Hostname  string `json:"hostname"`
	CPUs      int    `json:"cpus"`
	CPUModel  string `json:"cpuModel"`
	MemTotalB int64  `json:"memTotalBytes"`
	Kernel    string `json:"kernel"`
	GoVersion string `json:"goVersion"`
	GOMAXPROC int    `json:"gomaxprocs"`
}

// Versions of the servers, as they answer.
type Versions struct {
	ClickHouse string `json:"clickhouse"`
	PostgreSQL string `json:"postgresql"`
	Mosquitto  string `json:"mosquitto"`
}

// CollectMachine reads the machine's cores and memory.
func CollectMachine() Machine {
	m := Machine{CPUs: runtime.NumCPU(), GoVersion: runtime.Version(), GOMAXPROC: runtime.GOMAXPROCS(0)}
	m.Hostname, _ = os.Hostname()
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "MemTotal:"); ok {
				kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
				m.MemTotalB = kb << 10
			}
		}
	}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	return m
}

// CollectVersions asks each server its version; a server that does not
// answer is recorded as such, not fatal.
func CollectVersions(ctx context.Context, clickhouseAddr, pgServer string) Versions {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var v Versions
	if conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{clickhouseAddr}}); err != nil {
		v.ClickHouse = "unknown: " + err.Error()
	} else {
		if err := conn.QueryRow(ctx, "SELECT version()").Scan(&v.ClickHouse); err != nil {
			v.ClickHouse = "unknown: " + err.Error()
		}
		conn.Close()
	}
	if db, err := openPGAdmin(pgServerDSN(pgServer), 1); err == nil {
		if err := db.QueryRowContext(ctx, "SHOW server_version").Scan(&v.PostgreSQL); err != nil {
			v.PostgreSQL = "unknown: " + err.Error()
		}
		db.Close()
	}
	// mosquitto -h prints its version first and exits non-zero.
	out, _ := exec.CommandContext(ctx, "mosquitto", "-h").CombinedOutput()
	if first, _, _ := strings.Cut(string(out), "\n"); strings.TrimSpace(first) != "" {
		v.Mosquitto = strings.TrimSpace(first)
	} else {
		v.Mosquitto = "unknown"
	}
	return v
}

// WriteReport writes report.json, summary.md and timeline.svg into dir.
func WriteReport(dir string, r *Report) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	js, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "report.json"), js, 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "summary.md"), []byte(Markdown(r)), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "timeline.svg"), []byte(TimelineSVG(r.Timelines)), 0o644)
}

func num(v float64) string {
	switch {
	case v == 0:
		return "0"
	case v >= 1000:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case v >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	default:
		return strconv.FormatFloat(v, 'f', 2, 64)
	}
}

// Markdown is the summary of r.
func Markdown(r *Report) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# devicehub bench: %s\n\n", r.Scenario)
	fmt.Fprintf(&b, "- command: `%s`\n- started: %s, took %.0f s\n", r.Command, r.Started.Format(time.RFC3339), r.Seconds)
	m := r.Machine
	fmt.Fprintf(&b, "- machine: %d CPUs (%s), %.1f GiB RAM, Linux %s, %s\n", m.CPUs, m.CPUModel, float64(m.MemTotalB)/(1<<30), m.Kernel, m.GoVersion)
	fmt.Fprintf(&b, "- servers: ClickHouse %s, PostgreSQL %s, %s\n", r.Versions.ClickHouse, r.Versions.PostgreSQL, r.Versions.Mosquitto)
	if r.Broker != nil {
		fmt.Fprintf(&b, "- broker at start: %s\n", r.Broker)
	}
	b.WriteString("\n")
	b.WriteString("| scenario | figure | value | against (same run) | baseline | ratio | target |\n|---|---|---:|---|---:|---:|---|\n")
	for _, f := range r.Figures {
		ratio := ""
		if f.Ratio != 0 {
			ratio = num(f.Ratio)
		}
		base := ""
		if f.Against != "" {
			base = num(f.Baseline) + " " + f.Unit
		}
		value := num(f.Value) + " " + f.Unit
		if f.Note != "" {
			value = f.Note
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s |\n", f.Scenario, f.Name, value, f.Against, base, ratio, f.Target)
	}
	for _, e := range r.Errors {
		fmt.Fprintf(&b, "\n**error:** %s\n", e)
	}
	b.WriteString("\nLatency percentiles come from a log-linear histogram (within 1.6%); warm-up requests are not counted; throughput is the median of per-second rates. `report.json` has every parameter and result; `timeline.svg` plots each load phase per second.\n")
	return b.String()
}

// TimelineSVG plots requests/s (top) and p50/p99 latency (bottom) per
// second of each series.
func TimelineSVG(series map[string][]Second) string {
	const w, h, left, top, ph, gap = 900, 560, 70, 30, 220, 50
	pw := w - left - 200
	names := make([]string, 0, len(series))
	maxT, maxRate, maxLat := 1, 1.0, 1.0
	for n, s := range series {
		names = append(names, n)
		for _, p := range s {
			maxT = max(maxT, p.T+1)
			maxRate = max(maxRate, float64(p.OK+p.Errors))
			maxLat = max(maxLat, p.P99Ms)
		}
	}
	sort.Strings(names)
	colors := []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">`+"\n", w, h)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", w, h)
	panel := func(y0 int, title string, maxV float64) {
		fmt.Fprintf(&b, `<text x="%d" y="%d" font-size="13">%s</text>`+"\n", left, y0-8, html.EscapeString(title))
		fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#999"/>`+"\n", left, y0, pw, ph)
		for i := 0; i <= 4; i++ {
			y := y0 + ph - ph*i/4
			fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#eee"/><text x="%d" y="%d" text-anchor="end">%s</text>`+"\n",
				left, y, left+pw, y, left-4, y+4, num(maxV*float64(i)/4))
		}
		for i := 0; i <= 5; i++ {
			x := left + pw*i/5
			fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle">%ds</text>`+"\n", x, y0+ph+14, maxT*i/5)
		}
	}
	line := func(y0 int, maxV float64, s []Second, val func(Second) float64, color, dash string) {
		var pts []string
		for _, p := range s {
			x := float64(left) + float64(pw)*(float64(p.T)+0.5)/float64(maxT)
			y := float64(y0+ph) - float64(ph)*val(p)/maxV
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x, y))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="1.5" stroke-dasharray="%s" points="%s"/>`+"\n", color, dash, strings.Join(pts, " "))
	}
	y1, y2 := top, top+ph+gap
	panel(y1, "throughput (requests/s, per second)", maxRate)
	panel(y2, "latency (ms): p50 solid, p99 dashed", maxLat)
	for i, n := range names {
		c := colors[i%len(colors)]
		line(y1, maxRate, series[n], func(p Second) float64 { return float64(p.OK + p.Errors) }, c, "")
		line(y2, maxLat, series[n], func(p Second) float64 { return p.P50Ms }, c, "")
		line(y2, maxLat, series[n], func(p Second) float64 { return p.P99Ms }, c, "4 3")
		fmt.Fprintf(&b, `<rect x="%d" y="%d" width="12" height="3" fill="%s"/><text x="%d" y="%d">%s</text>`+"\n",
			left+pw+12, top+14*i+8, c, left+pw+30, top+14*i+12, html.EscapeString(n))
	}
	b.WriteString("</svg>\n")
	return b.String()
}
