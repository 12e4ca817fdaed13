package bench

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"devicehub/bench/testkit"
)

// TestRunAPISmall runs the api scenario at a toy size.
func TestRunAPISmall(t *testing.T) {
	t.Parallel()
	bin := testkit.Devicehub(t)
	// A bound against a hang, not a timing: beside the api package's
	// tests make test saw it take over a minute (12 devicehub children).
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	res, err := RunAPI(ctx, APIParams{Devices: 200, Products: 20, Concurrency: 2, Requests: 20, CachedRequests: 20, Warmup: 2, ChildParams: ChildParams{ServerBinary: bin}})
	if err != nil {
		t.Fatal(err)
	}
	t.Log(res)
	if len(res.Queries) != 12 || res.Ceiling == nil || res.PeakRSS <= 0 || res.BenchRSS <= 0 {
		t.Fatalf("%+v", res)
	}
	modes := map[string]int{}
	for _, q := range res.Queries {
		if q.Load.Requests != 20 || q.Load.Latency.P50Ms <= 0 || q.P50Ratio <= 0 || q.ServerPID <= 0 {
			t.Fatalf("%s: %+v", q.Name, q)
		}
		if q.Limited != (q.ScopeP50Ratio > 0 && q.ScopeRPSRatio > 0) {
			t.Fatalf("%s: limited %v, scope ratios %v %v", q.Name, q.Limited, q.ScopeP50Ratio, q.ScopeRPSRatio)
		}
		checkChildCPU(t, q.CPU, q.ServerPID, 20)
		checkChildGone(t, q.ServerPID)
		modes[q.PageCache]++
	}
	if modes["off"] != 6 || modes["warm"] != 6 || res.Queries[0].ServerPID == res.Queries[11].ServerPID {
		t.Fatalf("page cache modes %v, children %d and %d: want 6 kinds in each mode, a child each", modes, res.Queries[0].ServerPID, res.Queries[11].ServerPID)
	}
}

// checkChildCPU checks a measured phase's CPU breakdown names this process
// and the devicehub child (the other processes may be unreadable).
func checkChildCPU(t *testing.T, c CPUBreakdown, server int, requests int64) {
	t.Helper()
	seen := map[int]bool{}
	for _, p := range c.Procs {
		seen[p.PID] = p.Seconds >= 0
	}
	if c.Messages != requests || c.Unit != "req" || !seen[os.Getpid()] || !seen[server] {
		t.Fatalf("CPU: %+v", c)
	}
}

// checkChildGone checks the devicehub child has exited (and been reaped).
func checkChildGone(t *testing.T, pid int) {
	t.Helper()
	if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err == nil {
		t.Fatalf("devicehub child %d still running", pid)
	}
}

func TestChildFlag(t *testing.T) {
	args := []string{"-pprof-addr=127.0.0.1:6060", "--roles", "api,ingest", "-ingest-connections=4", "-roles=api"}
	if v, ok := childFlag(args, "ingest-connections"); !ok || v != "4" {
		t.Fatalf("ingest-connections: %q %v", v, ok)
	}
	if got := childRoles("x", args); got != "api" { // the last one wins, as with flag
		t.Fatalf("roles: %q", got)
	}
	if got := childRoles("api", args[:1]); got != "api" {
		t.Fatalf("default roles: %q", got)
	}
	if got := childRoles("api", args[:3]); got != "api,ingest" {
		t.Fatalf("roles: %q", got)
	}
}
