package bench

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
)

// ShadowParams configure RunShadow. Zero fields take the defaults noted.
type ShadowParams struct {
	// Devices reconnecting at once in each storm; default 10,000.
	Devices int `json:"devices"`
	// Timeout bounds each wait (a storm drained, every delta delivered);
	// default 5 minutes.
	Timeout time.Duration `json:"timeout"`
	ChildParams
}

// ShadowStorm is one storm of births: every device's birth published at
// once (QoS 1, one gateway connection playing the devices), until ingest
// has acknowledged them all and, with pending deltas, every delta arrived.
type ShadowStorm struct {
	Births    int     `json:"births"`
	Deltas    int     `json:"deltas"`    // devices that got their delta
	Repeats   int     `json:"repeats"`   // deltas a device got again (same version)
	P99Ms     float64 `json:"p99Ms"`     // from the storm's start until 99% of the deltas arrived
	AllMs     float64 `json:"allMs"`     // ... until all of them arrived
	DrainedMs float64 `json:"drainedMs"` // ... until ingest acknowledged every birth
	// CPUSeconds is the devicehub child's CPU from the storm's start
	// until drained (and, with deltas, all delivered).
	CPUSeconds float64 `json:"cpuSeconds"`
}

// ShadowResult is what RunShadow measured: the same storm without and
// with a pending delta per device, on one devicehub.
type ShadowResult struct {
	Params   ShadowParams `json:"params"`
	Plain    ShadowStorm  `json:"plain"`
	Deltas   ShadowStorm  `json:"deltas"`
	ExtraCPU float64      `json:"extraCpuSeconds"` // Deltas.CPUSeconds - Plain.CPUSeconds
}

func (r ShadowResult) String() string {
	return fmt.Sprintf("shadow: %d devices reconnecting; without deltas drained in %.0f ms (devicehub %.2f CPU s); "+
		"with a pending delta each: %d of %d deltas delivered, 99%% in %.0f ms, all in %.0f ms, drained in %.0f ms (devicehub %.2f CPU s, +%.2f s)",
		r.Params.Devices, r.Plain.DrainedMs, r.Plain.CPUSeconds, r.Deltas.Deltas, r.Deltas.Births, r.Deltas.P99Ms, r.Deltas.AllMs,
		r.Deltas.DrainedMs, r.Deltas.CPUSeconds, r.ExtraCPU)
}

// Figures are the result's report lines.
func (r ShadowResult) Figures() []Figure {
	n := fmt.Sprintf(" (%d devices reconnecting at once)", r.Params.Devices)
	return []Figure{
		{Name: "devices that got their delta" + n, Value: float64(r.Deltas.Deltas), Unit: "deltas", Target: "all " + strconv.Itoa(r.Deltas.Births)},
		{Name: "deltas delivered again (a device's second, same version)" + n, Value: float64(r.Deltas.Repeats), Unit: "deltas"},
		{Name: "time until 99% of the deltas delivered" + n, Value: r.Deltas.P99Ms, Unit: "ms"},
		{Name: "time until every delta delivered" + n, Value: r.Deltas.AllMs, Unit: "ms"},
		{Name: "storm drained, with deltas" + n, Value: r.Deltas.DrainedMs, Unit: "ms", Against: "the same storm without deltas", Baseline: r.Plain.DrainedMs, Ratio: Ratio(r.Deltas.DrainedMs, r.Plain.DrainedMs)},
		{Name: "devicehub CPU for the storm, with deltas" + n, Value: r.Deltas.CPUSeconds, Unit: "CPU s", Against: "the same storm without deltas", Baseline: r.Plain.CPUSeconds, Ratio: Ratio(r.Deltas.CPUSeconds, r.Plain.CPUSeconds)},
		{Name: "extra devicehub CPU for the deltas" + n, Value: r.ExtraCPU, Unit: "CPU s"},
	}
}

// RunShadow runs the devicehub binary (api and ingest) on a private
// broker, provisions Devices devices, and measures a storm of their
// births twice: without desired state, then after bulk calls gave each a
// desired value, so that every birth must be answered with a delta.
func RunShadow(ctx context.Context, p ShadowParams) (res ShadowResult, err error) {
	if p.Devices <= 0 {
		p.Devices = 10_000
	}
	if p.Timeout <= 0 {
		p.Timeout = 5 * time.Minute
	}
	run, err := p.withBroker(ctx, "shadow")
	res.Params = p
	if err != nil {
		return res, err
	}
	defer run.cleanup()
	p.Logf("shadow: starting devicehub (api, ingest) on a private broker")
	srv, err := startChildAPI(ctx, childAPIConfig{Binary: run.bin, LogDir: run.tmp, DB: run.db, ClickHouseAddr: p.ClickHouseAddr,
		BrokerURL: run.broker.url(), Roles: "api,ingest", Args: p.ServerArgs, Conns: 8})
	if err != nil {
		return res, err
	}
	defer srv.stop()

	product := "benchshadow" + randHex(4)
	if err := srv.deployProduct(ctx, product, "Bench shadow", `{"properties":[{"id":"target","name":"Target","valueType":{"type":"float"},"expands":{"type":["read","write"]}}]}`); err != nil {
		return res, err
	}
	ids := make([]string, p.Devices)
	for i := range ids {
		ids[i] = product + "-" + strconv.Itoa(i)
	}
	p.Logf("shadow: provisioning %d devices", p.Devices)
	for lo := 0; lo < len(ids); lo += 10_000 {
		batch := make([]map[string]any, 0, 10_000)
		for _, id := range ids[lo:min(lo+10_000, len(ids))] {
			batch = append(batch, map[string]any{"id": id, "name": id, "productId": product})
		}
		if err := srv.call(ctx, "POST", "/api/device/instance/batch/_create?deploy=true", batch, nil); err != nil {
			return res, err
		}
	}

	// One gateway connection plays every device: it publishes their
	// births and wills and receives their deltas.
	// The private broker goes with its logins: no removal.
	gateway, _, err := newGateway(ctx, run.broker.url())
	if err != nil {
		return res, err
	}
	var (
		mu       sync.Mutex
		arrivals []time.Duration     // first delta of each device
		seen     = map[string]bool{} // devices whose delta arrived
		repeats  int                 // deltas of a device that had one
		start    time.Time
		counting atomic.Bool
	)
	o := mqtt.NewClientOptions().AddBroker(run.broker.url()).SetClientID("bench-gw-" + randHex(4)).
		SetUsername(gateway.Username).SetPassword(gateway.Password).SetCleanSession(true).SetMaxResumePubInFlight(1000)
	gw := mqtt.NewClient(o)
	if err := waitToken(gw.Connect(), 30*time.Second); err != nil {
		return res, fmt.Errorf("bench: gateway connect: %w", err)
	}
	defer gw.Disconnect(0)
	if err := waitToken(gw.Subscribe("/"+product+"/+/shadow/delta", 1, func(_ mqtt.Client, m mqtt.Message) {
		if !counting.Load() {
			return
		}
		mu.Lock()
		if id := m.Topic(); seen[id] {
			repeats++
		} else {
			seen[id] = true
			arrivals = append(arrivals, time.Since(start))
		}
		mu.Unlock()
	}), 30*time.Second); err != nil {
		return res, fmt.Errorf("bench: gateway subscribe: %w", err)
	}
	acked := func() (float64, error) {
		m, err := srv.proc.scrapeMetrics(ctx)
		if err != nil {
			return 0, err
		}
		return m["devicehub_ingest_acked_total"], nil
	}
	// publishAll publishes level for every device and waits until ingest
	// acknowledged as many more messages.
	publishAll := func(level string) (time.Duration, error) {
		before, err := acked()
		if err != nil {
			return 0, err
		}
		t0 := time.Now()
		// At most publishWindow unacknowledged (an MQTT connection has
		// 65,535 packet ids).
		toks := make([]mqtt.Token, 0, len(ids))
		for i, id := range ids {
			if i >= publishWindow {
				if err := waitToken(toks[i-publishWindow], p.Timeout); err != nil {
					return 0, fmt.Errorf("bench: publish %s: %w", level, err)
				}
			}
			toks = append(toks, gw.Publish("/"+product+"/"+id+"/"+level, 1, false, `{}`))
		}
		for _, t := range toks {
			if err := waitToken(t, p.Timeout); err != nil {
				return 0, fmt.Errorf("bench: publish %s: %w", level, err)
			}
		}
		deadline := t0.Add(p.Timeout)
		for {
			n, err := acked()
			if err != nil {
				return 0, err
			}
			if n-before >= float64(len(ids)) {
				return time.Since(t0), nil
			}
			if time.Now().After(deadline) || ctx.Err() != nil {
				return 0, fmt.Errorf("bench: %s storm: %.0f of %d acknowledged within %s", level, n-before, len(ids), p.Timeout)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	storm := func(withDeltas bool) (ShadowStorm, error) {
		s := ShadowStorm{Births: len(ids)}
		mu.Lock()
		arrivals, seen, repeats = arrivals[:0], map[string]bool{}, 0
		start = time.Now()
		mu.Unlock()
		counting.Store(withDeltas)
		cpu0, _ := procCPUTime(srv.pid())
		drained, err := publishAll("online")
		if err != nil {
			return s, err
		}
		s.DrainedMs = float64(drained.Milliseconds())
		if withDeltas {
			deadline := time.Now().Add(p.Timeout)
			for {
				mu.Lock()
				n := len(arrivals)
				mu.Unlock()
				if n >= len(ids) || time.Now().After(deadline) || ctx.Err() != nil {
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
		}
		cpu1, _ := procCPUTime(srv.pid())
		s.CPUSeconds = (cpu1 - cpu0).Seconds()
		counting.Store(false)
		mu.Lock()
		got := slices.Clone(arrivals)
		s.Repeats = repeats
		mu.Unlock()
		slices.Sort(got)
		s.Deltas = len(got)
		if len(got) > 0 {
			s.AllMs = float64(got[len(got)-1].Milliseconds())
			if k := (len(ids)*99 + 99) / 100; k <= len(got) {
				s.P99Ms = float64(got[k-1].Milliseconds())
			}
		}
		// Every device offline again, for the next storm.
		if _, err := publishAll("offline"); err != nil {
			return s, err
		}
		return s, nil
	}

	p.Logf("shadow: storm of %d births without desired state", len(ids))
	if res.Plain, err = storm(false); err != nil {
		return res, err
	}
	p.Logf("shadow: a desired value for each device (bulk calls of 10,000)")
	for lo := 0; lo < len(ids); lo += 10_000 {
		if err := srv.call(ctx, "POST", "/api/device/instance/batch/_shadow", map[string]any{"deviceIds": ids[lo:min(lo+10_000, len(ids))],
			"desired": map[string]any{"target": 21.5}}, nil); err != nil {
			return res, err
		}
	}
	p.Logf("shadow: storm of %d births, each with a pending delta", len(ids))
	if res.Deltas, err = storm(true); err != nil {
		return res, err
	}
	res.ExtraCPU = res.Deltas.CPUSeconds - res.Plain.CPUSeconds
	if res.Deltas.Deltas < len(ids) {
		return res, fmt.Errorf("bench: %d of %d deltas delivered", res.Deltas.Deltas, len(ids))
	}
	return res, nil
}

// publishWindow bounds the gateway's publishes in flight.
const publishWindow = 20_000

func waitToken(t mqtt.Token, d time.Duration) error {
	if !t.WaitTimeout(d) {
		return fmt.Errorf("timed out after %s", d)
	}
	return t.Error()
}
