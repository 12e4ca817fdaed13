package bench

import (
	"math"
	"os"
	"runtime/metrics"
	"strings"
	"testing"
)

func TestParseStatCPU(t *testing.T) {
	f := func(stat string, want int64) {
		t.Helper()
		got, err := parseStatCPU([]byte(stat))
		if err != nil || got != want {
			t.Fatalf("parseStatCPU(%q) = %d, %v; want %d", stat, got, err, want)
		}
	}
	f("9114 (clickhouse-serv) S 9113 8658 4168 0 -1 4194304 9652 0 10 0 103 85 0 0 20 0 29 0 42192 485003264 19684", 188)
	// A command name with spaces and parentheses.
	f("42 (a) b (c)) R 1 42 42 0 -1 0 0 0 0 0 7 3 0 0 20 0 1 0 1 1 1", 10)
	if _, err := parseStatCPU([]byte("42 (x) S 1 2")); err == nil {
		t.Fatal("short line accepted")
	}
	if _, ok := procCPUTime(0); !ok {
		t.Fatal("no CPU time for this process")
	}
}

func TestParseVmRSS(t *testing.T) {
	if got := parseVmRSS([]byte("Name:\tx\nVmPeak:\t 999 kB\nVmRSS:\t   2048 kB\n")); got != 2048<<10 {
		t.Fatalf("got %d", got)
	}
	if got := parseVmRSS([]byte("Name:\tx\n")); got != 0 {
		t.Fatalf("got %d", got)
	}
	if pidRSS(os.Getpid()) <= 0 || processRSS() <= 0 {
		t.Fatal("no RSS for this process")
	}
	stop := pidRSSSampler(0)
	if a, b := stop(), stop(); a <= 0 || a != b {
		t.Fatalf("sampler peaks %d, %d", a, b)
	}
}

func TestParseListenInodes(t *testing.T) {
	tcp := `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:0754 00000000:0000 0A 00000000:00000000 00:00000000 00000000   113        0 81234 1 0000000000000000 100 0 0 10 0
   1: 0100007F:2328 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 70001 1 0000000000000000 100 0 0 10 0
   2: 0100007F:0754 0100007F:A1B2 01 00000000:00000000 00:00000000 00000000   113        0 99999 1 0000000000000000 20 4 30 10 -1
`
	f := func(port int, want string) {
		t.Helper()
		if got := strings.Join(parseListenInodes([]byte(tcp), port), ","); got != want {
			t.Fatalf("port %d: %q, want %q", port, got, want)
		}
	}
	f(1876, "81234") // 0x754; the established connection on it is not a listener
	f(9000, "70001")
	f(1884, "")
}

func TestAddrPort(t *testing.T) {
	f := func(addr string, want int) {
		t.Helper()
		if got := addrPort(addr); got != want {
			t.Fatalf("addrPort(%q) = %d, want %d", addr, got, want)
		}
	}
	f("tcp://127.0.0.1:1884", 1884)
	f("127.0.0.1:9000", 9000)
	f("mqtt://[::1]:1883/x", 1883)
	f("localhost", 0)
}

func TestParsePromText(t *testing.T) {
	m, err := parsePromText(strings.NewReader(`# HELP devicehub_ingest_received_total Uplink MQTT messages received.
# TYPE devicehub_ingest_received_total counter
devicehub_ingest_received_total 12345
devicehub_ingest_dropped_total{reason="malformed"} 0
devicehub_ingest_dropped_total{reason="unknown_device"} 7
devicehub_ingest_dropped_total{reason="a b"} 2 1700000000000
devicehub_ingest_flush_seconds_bucket{le="+Inf"} 4
devicehub_ingest_flush_seconds_sum 0.5
devicehub_ingest_flush_seconds_count 4
go_gc_duration_seconds{quantile="0.5"} 1.5e-05
`))
	if err != nil {
		t.Fatal(err)
	}
	f := func(name string, want float64) {
		t.Helper()
		if got := m.sum(name); got != want {
			t.Fatalf("%s = %v, want %v", name, got, want)
		}
	}
	f("devicehub_ingest_received_total", 12345)
	f("devicehub_ingest_dropped_total", 9)
	f("devicehub_ingest_flush_seconds_sum", 0.5)
	f("devicehub_ingest_flush_seconds_count", 4)
	f("devicehub_ingest_flush_seconds", 0)
	d := m.byLabel("devicehub_ingest_dropped_total", "reason")
	if len(d) != 2 || d["unknown_device"] != 7 || d["a b"] != 2 {
		t.Fatalf("dropped: %v", d)
	}
	if _, err := parsePromText(strings.NewReader("x_total\n")); err == nil {
		t.Fatal("line without value accepted")
	}
}

func TestCPUSpan(t *testing.T) {
	// A pid that cannot exist is left out, not an error.
	span := startCPUSpan("test", []namedProc{{Name: "self", PID: 0}, {Name: "gone", PID: 1 << 30}})
	s := 0
	for i := range 1_000_000 {
		s += i
	}
	c := span.breakdown(span.snapshot(), 1000)
	if len(c.Procs) != 1 || c.Procs[0].Name != "self" || c.Procs[0].PID != os.Getpid() || c.Procs[0].Seconds < 0 {
		t.Fatalf("%+v (%d)", c, s)
	}
	if c.Total.Seconds != c.Procs[0].Seconds || c.Messages != 1000 || c.MachineCores < 1 {
		t.Fatalf("%+v", c)
	}
	if !strings.Contains(c.String(), "self") || !strings.Contains(c.String(), "µs/msg") {
		t.Fatal(c.String())
	}

	// A group counts the members listed at the end: one there from the
	// start by difference, one that appeared meanwhile from its start; a
	// group with no member readable is left out.
	members := []int{1 << 30}
	span = startCPUSpan("group", []namedProc{
		{Name: "group", Members: func() []int { return members }},
		{Name: "empty", Members: func() []int { return nil }},
	})
	members = []int{1 << 30, os.Getpid()}
	c = span.breakdown(span.snapshot(), 10)
	c.Unit = "req"
	if len(c.Procs) != 1 || c.Procs[0].Name != "group" || c.Procs[0].Members != 1 || c.Procs[0].PID != 0 ||
		c.Procs[0].Seconds < 0 || c.Total.Seconds != c.Procs[0].Seconds {
		t.Fatalf("%+v", c)
	}
	if !strings.Contains(c.String(), "µs/req") {
		t.Fatal(c.String())
	}
}

func TestSchedWaitBetween(t *testing.T) {
	inf := math.Inf(1)
	h := func(counts ...uint64) *metrics.Float64Histogram {
		return &metrics.Float64Histogram{Counts: counts, Buckets: []float64{0, 0.001, 0.002, 0.010, inf}}
	}
	for _, c := range []struct {
		name     string
		from, to *metrics.Float64Histogram
		want     *SchedWait
	}{
		{"nothing new", h(5, 0, 0, 0), h(5, 0, 0, 0), nil},
		{"only the span's wake-ups count", h(100, 0, 0, 0), h(198, 1, 0, 1),
			&SchedWait{Count: 100, P50Ms: 1, P99Ms: 2}},
		{"the tail in the last bucket", h(0, 0, 0, 0), h(90, 0, 5, 5),
			&SchedWait{Count: 100, P50Ms: 1, P99Ms: 10}},
		{"histograms of different shapes", h(1, 0, 0, 0), &metrics.Float64Histogram{Counts: []uint64{1}, Buckets: []float64{0, inf}}, nil},
		{"no start", nil, h(1, 0, 0, 0), nil},
	} {
		got := schedWaitBetween(c.from, c.to)
		if (got == nil) != (c.want == nil) || got != nil && *got != *c.want {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
	if w := schedLatencies(); w == nil || len(w.Counts) == 0 {
		t.Errorf("this process's scheduling latencies: %+v", w)
	}
}
