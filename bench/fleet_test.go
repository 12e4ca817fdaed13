package bench

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"devicehub/bench/testkit"
)

// TestRunFleetSmall runs the fleet scenario at a toy size (200 devices
// provisioned, 1,000 logins, 2 s of churn, 20 devices publishing for 2 s
// a broker, a dynamic-security file of 50): every phase runs and fills
// its figures, and every process, database and broker it started is gone
// after it. (Ingest rounds of 1 s, 0.8 s measured, got no message at one
// broker twice under the suite's load, the race detector on.)
func TestRunFleetSmall(t *testing.T) {
	t.Parallel()
	if _, err := mosquittoBinary(); err != nil {
		t.Fatal(err) // .ci/services installs it (make test runs it)
	}
	bin := testkit.Devicehub(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	start := time.Now()
	res, err := RunFleet(ctx, FleetParams{Devices: 200, Batch: 100, Clients: 2, Verify: 10, Logins: 1000,
		Baseline: time.Second, Churn: 2 * time.Second, ChurnRate: 30, ChurnPool: 20, Workers: 4,
		IngestDevices: 20, IngestDuration: 2 * time.Second, IngestRounds: 1,
		DynsecSizes: []int{50}, DynsecChanges: 3, DynsecQuiet: 500 * time.Millisecond, ChildParams: ChildParams{ServerBinary: bin, Logf: t.Logf}})
	t.Logf("took %s\n%s", time.Since(start).Round(time.Millisecond), res)
	// Every broker and child it started is gone.
	for _, ph := range res.Phases() {
		for _, r := range ph.PeakRSS {
			if strings.HasPrefix(r.Name, "mosquitto") || strings.HasPrefix(r.Name, "devicehub") {
				if _, err := os.Stat(procPath(r.PID, "stat")); err == nil {
					t.Errorf("%s (pid %d) of phase %q still running", r.Name, r.PID, ph.Name)
				}
			}
		}
	}
	// Phase 6 runs whatever phases 1-5 need.
	if len(res.Dynsec) != 1 {
		t.Fatalf("dynamic security steps: %+v (err %v)", res.Dynsec, err)
	}
	if d := res.Dynsec[0]; d.Logins != 50 || d.Added < 3 || d.Added > 5 || d.Commands != 2*d.Added || d.Command.P50Ms <= 0 ||
		d.Quiet.Sent == 0 || d.Quiet.Failed+d.During.Failed != 0 || d.FileBytes == 0 || d.RSSBytes == 0 {
		t.Errorf("dynamic security step: %+v", d)
	}
	if err != nil { // errFleetUnavailable too: this tree has the plugin and the bulk API
		t.Fatal(err)
	}
	if p := res.Provision; p == nil || p.Devices != 200 || p.Calls != 2 || p.Rate <= 0 || p.Call.N != 2 ||
		p.AtOnce.Accepted != 2 || p.Sample.Accepted != 10 || p.RSSBytes == 0 {
		t.Errorf("provisioning: %+v", res.Provision)
	} else {
		checkPhase(t, p.Phase, "devicehub (child)", "mosquitto (devicehub plugin)")
	}
	if f := res.Fill; f == nil || f.Inserted != 800 || f.PluginDevices != 1000 || f.SyncSeconds <= 0 ||
		f.Sample.Tried != 20 || f.Sample.Accepted != 20 || f.ControlChange.N != 40 || f.RSSBytes == 0 {
		t.Errorf("fill: %+v", res.Fill)
	} else {
		checkPhase(t, f.SyncPhase, "devicehub (child)", "mosquitto (devicehub plugin)")
	}
	if c := res.Churn; c == nil || c.Quiet.Sent == 0 || c.During.Sent == 0 || c.Quiet.Failed+c.During.Failed != 0 ||
		c.Ops.Requests != 60 || c.Ops.Errors != 0 || len(c.Kinds) != 3 ||
		c.DeployConnect.Tried == 0 || c.DeployConnect.Accepted != c.DeployConnect.Tried ||
		c.Revoked.Tried == 0 || c.Revoked.Refused != c.Revoked.Tried {
		t.Errorf("churn: %+v", res.Churn)
	}
	if g := res.Ingest; g == nil || g.Devices != 20 || len(g.Rounds) != 2 || g.PluginRate <= 0 || g.DynsecRate <= 0 || g.Ratio <= 0 {
		t.Errorf("ingest: %+v", res.Ingest)
	}
	figs := map[string]bool{}
	for _, f := range res.Figures() {
		figs[f.Name[:strings.IndexByte(f.Name, ' ')]] = true
	}
	for _, n := range []string{"1", "2", "3", "4", "5", "6", "peak"} {
		if !figs[n] {
			t.Errorf("no figure of phase %s", n)
		}
	}
}

// checkPhase checks a phase has CPU and RSS figures of the processes named.
func checkPhase(t *testing.T, ph FleetPhase, names ...string) {
	t.Helper()
	for _, n := range names {
		cpu, rss := false, false
		for _, p := range ph.CPU.Procs {
			cpu = cpu || p.Name == n && p.PID > 0 && p.Members == 0
		}
		for _, r := range ph.PeakRSS {
			rss = rss || r.Name == n && r.Bytes > 0
		}
		if !cpu || !rss {
			t.Errorf("phase %q: %s: CPU %v, RSS %v: %+v %+v", ph.Name, n, cpu, rss, ph.CPU.Procs, ph.PeakRSS)
		}
	}
}

func TestWithoutOtherPlugins(t *testing.T) {
	conf := `per_listener_settings false
allow_anonymous false
plugin /work/.data/plugin/devicehub_auth.so
plugin_opt_service_users devicehub
plugin_opt_snapshot_file /d/devicehub-auth.snapshot
plugin /usr/lib/x86_64-linux-gnu/mosquitto_dynamic_security.so
plugin_opt_config_file /d/dynsec.json
listener 1884 127.0.0.1
`
	got, removed := withoutOtherPlugins(conf)
	want := `per_listener_settings false
allow_anonymous false
plugin /usr/lib/x86_64-linux-gnu/mosquitto_dynamic_security.so
plugin_opt_config_file /d/dynsec.json
listener 1884 127.0.0.1
`
	if !removed || got != want {
		t.Fatalf("removed %v:\n%s", removed, got)
	}
	if again, removed := withoutOtherPlugins(got); removed || again != got || hasOtherPlugin(got) {
		t.Fatalf("dynsec-only config changed: %v\n%s", removed, again)
	}
}

func TestWithoutPlugins(t *testing.T) {
	conf := `per_listener_settings false
allow_anonymous false
plugin /work/.data/plugin/devicehub_auth.so
plugin_opt_service_users devicehub
plugin /usr/lib/x86_64-linux-gnu/mosquitto_dynamic_security.so
plugin_opt_config_file /d/dynsec.json
max_packet_size 266240
listener 1884 127.0.0.1
`
	want := `per_listener_settings false
max_packet_size 266240
listener 1884 127.0.0.1
allow_anonymous true
`
	if got := withoutPlugins(conf); got != want {
		t.Fatalf("got:\n%s", got)
	}
}

func TestConnectPacket(t *testing.T) {
	for _, l := range []fleetLogin{{"d", "u", "k"}, {strings.Repeat("i", 64), strings.Repeat("u", 64), strings.Repeat("k", 200)}} {
		pkt := connectPacket(l)
		// Remaining length: one or two bytes (7 bits each), then the body.
		n, i := 0, 1
		for shift := 0; ; shift += 7 {
			n |= int(pkt[i]&0x7f) << shift
			if pkt[i]&0x80 == 0 {
				break
			}
			i++
		}
		body := pkt[i+1:]
		if pkt[0] != 0x10 || n != len(body) || string(body[:7]) != "\x00\x04MQTT\x04" || body[7] != 0xc2 {
			t.Fatalf("%q: % x", l.ID, pkt[:min(len(pkt), 16)])
		}
		if want := 10 + 6 + len(l.ID) + len(l.SecureID) + len(l.Key); len(body) != want {
			t.Fatalf("%q: body %d bytes, want %d", l.ID, len(body), want)
		}
	}
}
