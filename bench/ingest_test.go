package bench

import (
	"context"
	"math"
	"os"
	"strconv"
	"testing"
	"time"
)

// BenchmarkIngest runs RunIngest once per QoS (each run is long; b.N is
// 1). DEVICEHUB_BENCH_DURATION sets the ingest phase (default 15s),
// DEVICEHUB_BENCH_DEVICES the number of devices (default 1000),
// DEVICEHUB_BENCH_CONNECTIONS the server's subscriber connections. The
// server is the devicehub binary, built once and run as a child process.
//
//	go test -run '^$' -bench BenchmarkIngest -benchtime 1x ./bench/
func BenchmarkIngest(b *testing.B) {
	p := IngestParams{Duration: 15 * time.Second}
	if d, err := time.ParseDuration(os.Getenv("DEVICEHUB_BENCH_DURATION")); err == nil {
		p.Duration = d
	}
	if n, err := strconv.Atoi(os.Getenv("DEVICEHUB_BENCH_DEVICES")); err == nil {
		p.Devices = n
	}
	if n, err := strconv.Atoi(os.Getenv("DEVICEHUB_BENCH_CONNECTIONS")); err == nil {
		p.Connections = n
	}
	bin, err := BuildServer(context.Background(), b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	p.ServerBinary = bin
	for _, qos := range []byte{0, 1} {
		b.Run("QoS"+string('0'+qos), func(b *testing.B) {
			p := p
			p.QoS = qos
			var res IngestResult
			for b.Loop() {
				var err error
				res, err = RunIngest(context.Background(), p)
				if err != nil {
					b.Fatalf("%v (%s)", err, res)
				}
			}
			b.Log(res)
			b.ReportMetric(res.IngestRate, "msgs/s")
			b.ReportMetric(res.BrokerRate, "broker_msgs/s")
			b.ReportMetric(res.Ratio, "ratio")
			b.ReportMetric(res.BoundRatio, "cpu_bound_ratio")
			b.ReportMetric(res.ClickHouse.Rate, "clickhouse_msgs/s")
			b.ReportMetric(res.ClickHouseRatio, "clickhouse_ratio")
			b.ReportMetric(float64(res.PeakRSS>>20), "server_peakRSS_MiB")
		})
	}
}

func TestCPUBound(t *testing.T) {
	phase := func(machine, total float64) CPUBreakdown {
		c := CPUBreakdown{MachineCores: 2, Total: ProcCPU{MicrosPerMsg: total}}
		if machine > 0 {
			c.Machine = &ProcCPU{MicrosPerMsg: machine}
		}
		return c
	}
	for _, tc := range []struct {
		name        string
		insert      CPUBreakdown
		passThrough []CPUBreakdown
		want        float64
	}{
		// 2 cores / (mean(9, 11) + 10 µs) = 100,000 msg/s.
		{"machine figures", phase(10, 7), []CPUBreakdown{phase(9, 8), phase(11, 10)}, 100000},
		// Without the machine's busy time, the processes' sum.
		{"process sums", phase(0, 15), []CPUBreakdown{phase(0, 5)}, 100000},
		{"no pass-through", phase(10, 7), nil, 0},
		{"empty pass-through phase", phase(10, 7), []CPUBreakdown{phase(9, 8), {}}, 0},
		{"empty insert phase", CPUBreakdown{}, []CPUBreakdown{phase(9, 8)}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := cpuBound(tc.insert, tc.passThrough...); math.Abs(got-tc.want) > 1e-6 {
				t.Fatalf("cpuBound = %v, want %v", got, tc.want)
			}
		})
	}
}
