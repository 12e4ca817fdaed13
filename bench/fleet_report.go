package bench

import (
	"fmt"
	"strings"
)

func (r FleetResult) String() string {
	var b strings.Builder
	b.WriteString("fleet:")
	if r.Unavailable != "" {
		fmt.Fprintf(&b, "\n  phases 1-5 not run: %s", r.Unavailable)
	}
	if r.Provision != nil {
		fmt.Fprintf(&b, "\n  1 %s", r.Provision)
	}
	if r.Fill != nil {
		fmt.Fprintf(&b, "\n  2 %s", r.Fill)
	}
	if r.Churn != nil {
		fmt.Fprintf(&b, "\n  3-4 %s", r.Churn)
	}
	if r.Ingest != nil {
		fmt.Fprintf(&b, "\n  5 %s", r.Ingest)
	}
	for _, s := range r.Dynsec {
		fmt.Fprintf(&b, "\n  6 %s", s)
	}
	if c := r.comparison(); c != "" {
		b.WriteString("\n  " + c)
	}
	return b.String()
}

// comparison is the one line that sets dynamic security at its largest
// size beside devicehub's plugin at fleet size.
func (r FleetResult) comparison() string {
	if len(r.Dynsec) == 0 {
		return ""
	}
	d := r.Dynsec[len(r.Dynsec)-1]
	s := fmt.Sprintf("dynamic security at %d logins: one change %.1f ms, PUBACK p99 %.1f ms during changes, broker RSS %d MiB",
		d.Logins, d.Command.P50Ms, d.During.Puback.P99Ms, d.RSSBytes>>20)
	if r.Fill != nil {
		s += fmt.Sprintf(" | devicehub plugin at %d logins: one change %.2f ms, broker RSS %d MiB", r.Fill.Logins, r.Fill.ControlChange.P50Ms, r.Fill.RSSBytes>>20)
	}
	if r.Churn != nil {
		s += fmt.Sprintf(", PUBACK p99 %.1f ms during %.0f changes/s", r.Churn.During.Puback.P99Ms, r.Churn.Ops.SustainedRPS)
	}
	return s
}

// Phases are every phase's CPU and RSS figures, in order.
func (r FleetResult) Phases() []FleetPhase {
	var out []FleetPhase
	if r.Provision != nil {
		out = append(out, r.Provision.Phase)
	}
	if r.Fill != nil {
		out = append(out, r.Fill.FillPhase, r.Fill.SyncPhase)
	}
	if r.Churn != nil {
		out = append(out, r.Churn.QuietPhase, r.Churn.Phase)
	}
	if r.Ingest != nil {
		out = append(out, r.Ingest.Setup)
		for _, x := range r.Ingest.Rounds {
			out = append(out, FleetPhase{Name: x.CPU.Phase, Seconds: x.CPU.WallSeconds, CPU: x.CPU})
		}
	}
	for _, s := range r.Dynsec {
		out = append(out, s.Phase)
	}
	return out
}

// Figures are the headline numbers, each beside its same-run baseline
// where there is one, and each phase's peak RSS per process (the CPU per
// process is in Phases).
func (r FleetResult) Figures() []Figure {
	var out []Figure
	add := func(f Figure) { out = append(out, f) }
	mib := func(b int64) float64 { return float64(b) / (1 << 20) }
	if p := r.Provision; p != nil {
		m := fmt.Sprintf(" (%d devices, calls of %d, %d at a time)", p.Devices, r.Params.Batch, p.Clients)
		add(Figure{Name: "1 provisioning: devices/s, bulk create+deploy, end to end" + m, Value: p.Rate, Unit: "devices/s", Target: ">= 2000 (100,000 in < 60 s)"})
		add(Figure{Name: "1 provisioning: seconds" + m, Value: p.Seconds, Unit: "s"})
		add(Figure{Name: "1 provisioning: call p50" + m, Value: p.Call.P50Ms, Unit: "ms"})
		add(Figure{Name: "1 provisioning: call p99" + m, Value: p.Call.P99Ms, Unit: "ms"})
		add(Figure{Name: "1 provisioning: logins not accepted at once after their call returned", Value: float64(p.AtOnce.Tried - p.AtOnce.Accepted), Unit: "logins", Target: "0"})
		add(Figure{Name: fmt.Sprintf("1 provisioning: sample logins not accepted (of %d)", p.Sample.Tried), Value: float64(p.Sample.Tried - p.Sample.Accepted), Unit: "logins", Target: "0"})
		add(Figure{Name: fmt.Sprintf("1 provisioning: broker RSS at %d logins", p.Devices), Value: mib(p.RSSBytes), Unit: "MiB"})
	}
	if f := r.Fill; f != nil {
		m := fmt.Sprintf(" (%d logins)", f.Logins)
		add(Figure{Name: fmt.Sprintf("2 fill: %d devices inserted into PostgreSQL (and VACUUM ANALYZE)", f.Inserted), Value: f.InsertSeconds, Unit: "s"})
		add(Figure{Name: "2 full sync of a restarted devicehub, exec to done" + m, Value: f.SyncSeconds, Unit: "s"})
		add(Figure{Name: "2 full sync: logins/s" + m, Value: Ratio(float64(f.Logins), f.SyncSeconds), Unit: "logins/s"})
		add(Figure{Name: "2 broker RSS" + m, Value: mib(f.RSSBytes), Unit: "MiB", Target: "<= 400 MB (381.5 MiB)",
			Against: "broker RSS with phase 1's devices", Baseline: mib(f.RSSBeforeBytes), Ratio: Ratio(float64(f.RSSBytes), float64(f.RSSBeforeBytes))})
		add(Figure{Name: "2 the plugin's own memory (getStats memoryBytes)" + m, Value: mib(f.PluginMemoryBytes), Unit: "MiB"})
		add(Figure{Name: fmt.Sprintf("2 sample logins not accepted after the sync (of %d)", f.Sample.Tried), Value: float64(f.Sample.Tried - f.Sample.Accepted), Unit: "logins", Target: "0"})
		add(Figure{Name: "2 login, dial to CONNACK p99 (sample)" + m, Value: f.Sample.Connack.P99Ms, Unit: "ms"})
		add(Figure{Name: "2 one plugin control change (setDevice/deleteDevice), round trip p50" + m, Value: f.ControlChange.P50Ms, Unit: "ms"})
		add(Figure{Name: "2 one plugin control change, round trip max" + m, Value: f.ControlChange.MaxMs, Unit: "ms"})
	}
	if c := r.Churn; c != nil {
		m := fmt.Sprintf(" (%d logins, %d calls/s paced)", c.Logins, r.Params.ChurnRate)
		q := c.Quiet.Puback
		fig := func(name string, v, base float64, target string) {
			add(Figure{Name: name + m, Value: v, Unit: "ms", Against: "same device, quiet (same run)", Baseline: base, Ratio: Ratio(v, base), Target: target})
		}
		fig("3 PUBACK p50 during churn", c.During.Puback.P50Ms, q.P50Ms, "")
		fig("3 PUBACK p99 during churn", c.During.Puback.P99Ms, q.P99Ms, "<= 5 ms")
		fig("3 PUBACK max during churn", c.During.Puback.MaxMs, q.MaxMs, "")
		add(Figure{Name: "3 PUBACKs missing (no PUBACK within 10 s)" + m, Value: float64(c.Quiet.Failed + c.During.Failed), Unit: "publishes", Target: "0"})
		add(Figure{Name: "3 churn calls/s (sustained median)" + m, Value: c.Ops.SustainedRPS, Unit: "calls/s"})
		add(Figure{Name: "3 churn calls failed" + m, Value: float64(c.Ops.Errors), Unit: "calls", Target: "0"})
		for _, k := range c.Kinds {
			add(Figure{Name: "3 " + k.Kind + " call p50" + m, Value: k.Latency.P50Ms, Unit: "ms"})
			add(Figure{Name: "3 " + k.Kind + " call p99" + m, Value: k.Latency.P99Ms, Unit: "ms"})
		}
		base := 0.0
		against := ""
		if r.Fill != nil {
			base, against = r.Fill.Sample.Connack.P99Ms, "login of a device deployed long before, dial to CONNACK (phase 2 sample)"
		}
		add(Figure{Name: fmt.Sprintf("4 deploy returned -> CONNACK p50 (%d deploys)", c.DeployConnect.Tried) + m, Value: c.DeployConnect.Connack.P50Ms, Unit: "ms"})
		add(Figure{Name: "4 deploy returned -> CONNACK p99" + m, Value: c.DeployConnect.Connack.P99Ms, Unit: "ms", Target: "<= 50 ms",
			Against: against, Baseline: base, Ratio: Ratio(c.DeployConnect.Connack.P99Ms, base)})
		add(Figure{Name: "4 deploy returned -> CONNACK max" + m, Value: c.DeployConnect.Connack.MaxMs, Unit: "ms"})
		add(Figure{Name: "4 logins refused or failed right after deploy returned (one try each)" + m, Value: float64(c.DeployConnect.Refused + c.DeployConnect.Failed), Unit: "logins", Target: "0"})
		add(Figure{Name: fmt.Sprintf("4 old logins let in right after undeploy/rotate returned (of %d)", c.Revoked.Tried) + m, Value: float64(c.Revoked.LetIn), Unit: "logins", Target: "0"})
	}
	if g := r.Ingest; g != nil {
		m := fmt.Sprintf(" (%d devices, own logins, QoS 1, %d in flight each; medians of %d rounds)", g.Devices, g.Inflight, r.Params.IngestRounds)
		add(Figure{Name: fmt.Sprintf("5 msg/s to a service-login subscriber, devicehub plugin at %d logins", g.PluginLogins) + m, Value: g.PluginRate, Unit: "msg/s",
			Against: fmt.Sprintf("dynamic security, same devices (%d logins), same run", g.Devices), Baseline: g.DynsecRate, Ratio: g.Ratio, Target: ">= 0.95"})
		add(Figure{Name: fmt.Sprintf("5 dynamic security: %d devices' clients and roles created through its control topic", g.Devices), Value: g.DynsecCreateSeconds, Unit: "s"})
		add(Figure{Name: "5 broker CPU per message, devicehub plugin" + m, Value: g.PluginBrokerMicros, Unit: "µs/msg",
			Against: "dynamic security, same run", Baseline: g.DynsecBrokerMicros, Ratio: Ratio(g.PluginBrokerMicros, g.DynsecBrokerMicros)})
	}
	var pluginP99, pluginChange, pluginRSS float64
	pluginAt := ""
	if r.Fill != nil {
		pluginChange, pluginRSS, pluginAt = r.Fill.ControlChange.P50Ms, mib(r.Fill.RSSBytes), fmt.Sprintf("devicehub plugin at %d logins (same run)", r.Fill.Logins)
	}
	if r.Churn != nil {
		pluginP99 = r.Churn.During.Puback.P99Ms
	}
	for _, s := range r.Dynsec {
		m := fmt.Sprintf(" (dynamic security only, %d logins)", s.Logins)
		fig := func(name string, v float64, unit string, base float64) {
			f := Figure{Name: name + m, Value: v, Unit: unit}
			if pluginAt != "" && base > 0 {
				f.Against, f.Baseline, f.Ratio = pluginAt, base, Ratio(v, base)
			}
			add(f)
		}
		fig("6 one change (createRole/createClient), round trip p50", s.Command.P50Ms, "ms", pluginChange)
		fig("6 one change, round trip max", s.Command.MaxMs, "ms", 0)
		if s.During.Puback.N > 0 { // changes shorter than a probe interval have none
			fig(fmt.Sprintf("6 PUBACK p99 during changes (%d probes)", s.During.Puback.N), s.During.Puback.P99Ms, "ms", pluginP99)
			fig("6 PUBACK max during changes", s.During.Puback.MaxMs, "ms", 0)
		}
		fig("6 PUBACK p99 quiet", s.Quiet.Puback.P99Ms, "ms", 0)
		fig("6 broker RSS", mib(s.RSSBytes), "MiB", pluginRSS)
		fig("6 file size", float64(s.FileBytes)/1e6, "MB", 0)
		fig("6 broker start (loads the file)", s.LoadSeconds, "s", 0)
		if s.Device.P50Ms > 0 {
			f := Figure{Name: "6 devices/s one at a time (1 / one device's two changes)" + m, Value: 1000 / s.Device.P50Ms, Unit: "devices/s"}
			if r.Provision != nil {
				f.Against, f.Baseline, f.Ratio = "devicehub plugin, bulk API (phase 1)", r.Provision.Rate, Ratio(f.Value, r.Provision.Rate)
			}
			add(f)
		}
	}
	for _, ph := range r.Phases() {
		for _, rs := range ph.PeakRSS {
			add(Figure{Name: fmt.Sprintf("peak RSS, %s: %s", ph.Name, rs.Name), Value: mib(rs.Bytes), Unit: "MiB"})
		}
	}
	return out
}
