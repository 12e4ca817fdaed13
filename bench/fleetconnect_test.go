package bench

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"devicehub/bench/testkit"
)

// TestFleetConnectSmall runs fleet-connect at 2,000 devices over a pool
// of two brokers (a generator child each), each device on its own lean
// MQTT connection and login, through a restart of both brokers and a
// devicehub restart: every device reconnects, PostgreSQL and the
// presence view show each device's true state after each storm, no
// acknowledged report, birth or will is lost, and everything the run
// started is gone after it. The storm path of 100,000 devices, small.
func TestFleetConnectSmall(t *testing.T) {
	if _, err := mosquittoBinary(); err != nil {
		t.Skip(err)
	}
	bin := testkit.Devicehub(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	start := time.Now()
	const n = 2000
	res, err := RunFleetConnect(ctx, FleetConnectParams{Devices: n, Brokers: 2, Batch: 1000, Clients: 2, Interval: 2 * time.Second,
		Steady: 3 * time.Second, Probes: 50, PerAddress: 800, Timeout: 60 * time.Second, ServerBinary: bin, Logf: t.Logf})
	t.Logf("took %s\n%s", time.Since(start).Round(time.Millisecond), res)
	if err != nil {
		t.Fatal(err)
	}
	if res.SourceAddresses != 4 {
		t.Errorf("%d source addresses, want 4 (1,000 devices a broker, 800 connections each)", res.SourceAddresses)
	}
	for name, s := range map[string]*ConnectStorm{"connect": res.Connect, "broker restart": res.BrokerRestart} {
		if s == nil || s.ToAll <= 0 || s.StateSeconds <= 0 || s.PresenceSeconds <= 0 || s.Connack.N < n {
			t.Errorf("%s: %+v", name, s)
		}
	}
	if s := res.Steady; s == nil || s.AckedRate < n/2/2 || s.StoredRate <= 0 || s.EndToEnd.N == 0 || s.RSSMiB["mosquitto"] <= 0 {
		t.Errorf("steady: %+v", res.Steady)
	}
	if d := res.DevicehubRestart; d == nil || d.DevicesLost != 0 || d.DownSeconds <= 0 {
		t.Errorf("devicehub restart: %+v", res.DevicehubRestart)
	}
	f := res.Final
	if f == nil {
		t.Fatal("no final check")
	}
	if f.ReportsLost != 0 || f.BirthsLost != 0 || f.WillsLost != 0 || f.NotOffline != 0 || f.Acked == 0 || f.BirthsAcked < 2*n {
		t.Errorf("final: %+v", f)
	}
	if len(res.Timeline) == 0 {
		t.Error("no timeline")
	}
	// Everything it started is gone: the broker (its port closed), the
	// child, and the connections (this process's sockets back to a few).
	for _, ph := range []FleetPhase{res.Connect.Phase, res.Steady.Phase} {
		for _, r := range ph.PeakRSS {
			if r.PID > 0 && (strings.HasPrefix(r.Name, "mosquitto") || strings.HasPrefix(r.Name, "devicehub")) { // 0: a pool's sum
				if _, err := os.Stat(procPath(r.PID, "stat")); err == nil {
					t.Errorf("%s (pid %d) still running", r.Name, r.PID)
				}
			}
		}
	}
	if fds, err := os.ReadDir("/proc/self/fd"); err == nil && len(fds) > 200 {
		t.Errorf("%d file descriptors open after the run", len(fds))
	}
}
