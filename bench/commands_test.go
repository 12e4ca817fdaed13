package bench

import (
	"context"
	"os"
	"runtime"
	"strconv"
	"testing"
	"time"

	"devicehub/bench/testkit"
	"devicehub/ingest/mqtttest"
)

// TestRunCommandsSmall runs the commands scenario at a toy size: the whole
// path works and every figure is filled in. Its devicehub feeds device
// logins to the broker's plugin (a full sync of its own database), so it
// runs on a private broker: the shared one's logins, those of a `make
// run` beside `make test` too, are not the test's.
func TestRunCommandsSmall(t *testing.T) {
	t.Parallel()
	bin := testkit.Devicehub(t)
	broker := mqtttest.StartBroker(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := RunCommands(ctx, CommandsParams{Devices: 3, Concurrency: 4, Requests: 60, Warmup: 8, ChildParams: ChildParams{ServerBinary: bin},
		BrokerURL: broker.URL()})
	if err != nil {
		t.Fatal(err)
	}
	t.Log(res)
	if res.Reads.Requests != 60 || res.Reads.Errors != 0 || res.Reads.Latency.P50Ms <= 0 {
		t.Fatalf("reads: %+v", res.Reads)
	}
	if res.Ceiling == nil || res.Ceiling.Requests != 60 || res.P50Ratio <= 0 {
		t.Fatalf("ceiling: %+v", res.Ceiling)
	}
	if res.DeviceReads < 60 {
		t.Fatalf("devices saw %d reads", res.DeviceReads)
	}
	if res.PeakRSS <= 0 || res.BenchRSS <= 0 || res.ServerPID <= 0 {
		t.Fatalf("RSS: %+v", res)
	}
	checkChildCPU(t, res.CPU, res.ServerPID, 60)
	checkChildGone(t, res.ServerPID)
}

// BenchmarkCommandsRead runs RunCommands once (b.N is 1: one run is a
// whole load test) and reports its percentiles. DEVICEHUB_BENCH_DEVICES
// (default 100), DEVICEHUB_BENCH_CONCURRENCY (1000) and
// DEVICEHUB_BENCH_REQUESTS (20000) set its size.
//
//	go test -run '^$' -bench BenchmarkCommandsRead -benchtime 1x ./bench/
func BenchmarkCommandsRead(b *testing.B) {
	p := CommandsParams{
		Devices:     envInt("DEVICEHUB_BENCH_DEVICES", 100),
		Concurrency: envInt("DEVICEHUB_BENCH_CONCURRENCY", 1000),
		Requests:    envInt("DEVICEHUB_BENCH_REQUESTS", 20000),
	}
	var res CommandsResult
	for b.Loop() {
		var err error
		if res, err = RunCommands(context.Background(), p); err != nil {
			b.Fatal(err)
		}
	}
	b.Log(res)
	b.ReportMetric(res.Reads.Latency.P50Ms, "p50-ms")
	b.ReportMetric(res.Reads.Latency.P99Ms, "p99-ms")
	b.ReportMetric(res.Reads.SustainedRPS, "reads/s")
	if res.Ceiling != nil {
		b.ReportMetric(res.Ceiling.Latency.P50Ms, "ceiling-p50-ms")
		b.ReportMetric(res.P50Ratio, "p50-ratio")
		b.ReportMetric(res.RPSRatio, "rps-ratio")
	}
}

func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

// TestPacedProcs: a paced run up to onePRate holds this process to one P
// until restored; faster paced runs and closed loop leave it alone.
// Serial: GOMAXPROCS is the whole process's.
func TestPacedProcs(t *testing.T) {
	before := runtime.GOMAXPROCS(0)
	for _, tc := range []struct {
		rate float64
		want int
	}{
		{0, before},
		{-1, before},
		{1000, 1},
		{onePRate, 1},
		{onePRate + 1, before},
	} {
		restore := pacedProcs(tc.rate)
		got := runtime.GOMAXPROCS(0)
		restore()
		if got != tc.want {
			t.Errorf("rate %v: GOMAXPROCS %d during the run, want %d", tc.rate, got, tc.want)
		}
		if after := runtime.GOMAXPROCS(0); after != before {
			t.Fatalf("rate %v: GOMAXPROCS %d after restore, want %d", tc.rate, after, before)
		}
	}
}
