package bench

import (
	"context"
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
			b.ReportMetric(res.ClickHouse.Rate, "clickhouse_msgs/s")
			b.ReportMetric(res.ClickHouseRatio, "clickhouse_ratio")
			b.ReportMetric(float64(res.PeakRSS>>20), "server_peakRSS_MiB")
		})
	}
}
