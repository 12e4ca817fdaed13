package bench

import (
	"context"
	"devicehub/ingest/wire"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
)

// FleetIngest is phase 5: the same devices, each on its own login and
// connection, publishing QoS 1 reports closed loop through the broker with
// devicehub's plugin (holding the whole fleet) and through a broker where
// they are dynamic-security clients (holding only them), alternating in
// one run. What is measured is what a subscriber with the service login
// receives: the broker's pass-through with each plugin checking every
// CONNECT, PUBLISH and delivery, not devicehub's storage (a ClickHouse
// insert per message would be the same on both sides and only dilute the
// difference).
type FleetIngest struct {
	Devices  int     `json:"devices"`
	Inflight int     `json:"inflight"` // unacknowledged publishes per device
	Seconds  float64 `json:"seconds"`  // measured per round (after a warm-up)
	// PluginLogins: the logins the plugin's broker held meanwhile.
	PluginLogins int `json:"pluginLogins"`
	// DynsecCreateSeconds: creating the devices' clients and roles through
	// the dynamic-security plugin's control topic (50 devices a message).
	DynsecCreateSeconds float64 `json:"dynsecCreateSeconds"`
	// Connect: every device connecting to each broker (32 at a time).
	PluginConnectSeconds float64       `json:"pluginConnectSeconds"`
	DynsecConnectSeconds float64       `json:"dynsecConnectSeconds"`
	Rounds               []IngestRound `json:"rounds"`
	PluginRate           float64       `json:"pluginRate"` // median msg/s received
	DynsecRate           float64       `json:"dynsecRate"`
	Ratio                float64       `json:"ratio"` // PluginRate / DynsecRate
	// The broker's CPU per message received, medians: less sensitive to
	// what else runs on the machine than the rates.
	PluginBrokerMicros float64    `json:"pluginBrokerMicrosPerMsg"`
	DynsecBrokerMicros float64    `json:"dynsecBrokerMicrosPerMsg"`
	Setup              FleetPhase `json:"setup"`
}

// IngestRound is one side's measured window.
type IngestRound struct {
	Broker string  `json:"broker"`
	Rate   float64 `json:"rate"` // received msg/s
	// BrokerMicros: the broker's CPU per message received.
	BrokerMicros float64      `json:"brokerMicrosPerMsg"`
	Received     int64        `json:"received"`
	Published    int64        `json:"published"` // acknowledged, whole round
	CPU          CPUBreakdown `json:"cpu"`
}

func (f FleetIngest) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d devices, %d in flight each: devicehub plugin (%d logins) %.0f msg/s, dynamic security (%d logins) %.0f msg/s, ratio %.3f; broker CPU %.2f vs %.2f µs/msg (medians of %d rounds of %.0fs)",
		f.Devices, f.Inflight, f.PluginLogins, f.PluginRate, f.Devices, f.DynsecRate, f.Ratio, f.PluginBrokerMicros, f.DynsecBrokerMicros, len(f.Rounds)/2, f.Seconds)
	fmt.Fprintf(&b, "\n    dynamic security: devices created in %.1fs; connect all: plugin %.1fs, dynamic security %.1fs",
		f.DynsecCreateSeconds, f.PluginConnectSeconds, f.DynsecConnectSeconds)
	for _, r := range f.Rounds {
		fmt.Fprintf(&b, "\n    %-22s %8.0f msg/s (%d received, %d acknowledged)\n    %s", r.Broker, r.Rate, r.Received, r.Published, r.CPU)
	}
	return b.String()
}

// ingestSide is one broker of phase 5 with the devices connected to it
// and a service-login subscriber counting their reports.
type ingestSide struct {
	name     string
	procName string // the broker's, in a phase's processes
	url      string
	devices  []mqtt.Client
	sub      mqtt.Client
	received atomic.Int64
}

func (s *ingestSide) close() {
	for _, c := range s.devices {
		if c != nil {
			c.Disconnect(0)
		}
	}
	if s.sub != nil {
		s.sub.Disconnect(100)
	}
}

// connectSide connects the subscriber and every device (conc at a time).
func connectSide(ctx context.Context, name, url, product string, logins []fleetLogin) (*ingestSide, time.Duration, error) {
	s := &ingestSide{name: name, url: url, devices: make([]mqtt.Client, len(logins))}
	s.sub = mqtt.NewClient(pahoOptions(serviceLogin(), url, "bench-fleet-sub-"+randHex(4)).SetCleanSession(true).SetAutoReconnect(false))
	if t := s.sub.Connect(); !t.WaitTimeout(10*time.Second) || t.Error() != nil {
		return s, 0, fmt.Errorf("bench: subscriber connect: %v", t.Error())
	}
	if t := s.sub.Subscribe(wire.DeviceTopic(product, "+", wire.LevelReport), 1, func(mqtt.Client, mqtt.Message) { s.received.Add(1) }); !t.WaitTimeout(10*time.Second) || t.Error() != nil {
		return s, 0, fmt.Errorf("bench: subscribe: %v", t.Error())
	}
	start := time.Now()
	err := forEach(ctx, len(logins), 32, func(_ context.Context, i int) error {
		c, err := connectDevice(url, logins[i])
		s.devices[i] = c
		return err
	})
	return s, time.Since(start), err
}

// round publishes from every device for d, closed loop with inflight
// unacknowledged each, and measures what the subscriber received after
// warm (the connections' ramp) until the end of publishing; then it waits
// for the subscriber to receive the rest, so that the next round starts
// on an idle broker.
func (s *ingestSide) round(ctx context.Context, product string, logins []fleetLogin, inflight int, d, warm time.Duration, procs []fleetProc) (IngestRound, error) {
	r := IngestRound{Broker: s.name}
	before := s.received.Load()
	start := time.Now()
	deadline := start.Add(d)
	var published atomic.Int64
	var wg sync.WaitGroup
	errc := make(chan error, len(s.devices))
	for i, c := range s.devices {
		wg.Add(1)
		go func() {
			defer wg.Done()
			topic := wire.DeviceTopic(product, logins[i].ID, wire.LevelReport)
			ring := make([]mqtt.Token, inflight)
			buf := make([]byte, 0, 256)
			var k int64
			wait := func(t mqtt.Token) bool {
				if t == nil {
					return true
				}
				if !t.WaitTimeout(30*time.Second) || t.Error() != nil {
					errc <- fmt.Errorf("bench: %s publish: %v", logins[i].ID, t.Error())
					return false
				}
				published.Add(1)
				return true
			}
			for ; time.Now().Before(deadline) && ctx.Err() == nil; k++ {
				slot := k % int64(inflight)
				if !wait(ring[slot]) {
					return
				}
				buf = reportPayload(buf, logins[i].ID, i, k)
				ring[slot] = c.Publish(topic, 1, false, append([]byte(nil), buf...))
			}
			for _, t := range ring {
				if !wait(t) {
					return
				}
			}
		}()
	}
	if err := sleepCtx(ctx, warm); err != nil {
		wg.Wait()
		return r, err
	}
	meter := startFleetPhase("ingest, "+s.name, procs)
	c0, t0 := s.received.Load(), time.Now()
	if err := sleepCtx(ctx, time.Until(deadline)); err != nil {
		wg.Wait()
		return r, err
	}
	c1, t1 := s.received.Load(), time.Now()
	r.Received = c1 - c0
	r.Rate = float64(r.Received) / t1.Sub(t0).Seconds()
	r.CPU = meter.end(r.Received, "msg").CPU
	for _, pc := range r.CPU.Procs {
		if pc.Name == s.procName {
			r.BrokerMicros = pc.MicrosPerMsg
		}
	}
	wg.Wait()
	close(errc)
	if err := <-errc; err != nil {
		return r, err
	}
	r.Published = published.Load()
	// The rest of the round's messages reach the subscriber (or stop
	// coming for 5 s) before the next round starts.
	prev, last := int64(-1), time.Now()
	for s.received.Load()-before < r.Published && time.Since(last) < 5*time.Second {
		if n := s.received.Load(); n != prev {
			prev, last = n, time.Now()
		}
		time.Sleep(10 * time.Millisecond)
	}
	return r, nil
}

func (e *fleetEnv) ingest(ctx context.Context) (*FleetIngest, error) {
	p := e.p
	logins := e.logins[:min(p.IngestDevices, len(e.logins))]
	res := &FleetIngest{Devices: len(logins), Inflight: p.IngestInflight, PluginLogins: max(p.Logins, len(e.logins))}
	dyn, err := startFleetBroker(ctx, brokerDynsec, nil)
	if err != nil {
		return nil, err
	}
	defer dyn.stop()
	procs := e.procs(fleetProc{name: "mosquitto (dynamic security only)", pid: dyn.pid})
	// e.procs names the plugin's broker "mosquitto (devicehub plugin)".
	meter := startFleetPhase("ingest setup: dynamic-security clients, connections", procs)
	t0 := time.Now()
	if err := createDynsecDevices(ctx, dyn.url(), e.product, logins, 50); err != nil {
		return nil, err
	}
	res.DynsecCreateSeconds = time.Since(t0).Seconds()
	sides := make([]*ingestSide, 2)
	defer func() {
		for _, s := range sides {
			if s != nil {
				s.close()
			}
		}
	}()
	var took time.Duration
	if sides[0], took, err = connectSide(ctx, brokerPlugin, e.broker.url(), e.product, logins); err != nil {
		return nil, err
	}
	res.PluginConnectSeconds = took.Seconds()
	if sides[1], took, err = connectSide(ctx, brokerDynsec, dyn.url(), e.product, logins); err != nil {
		return nil, fmt.Errorf("%w\n%s", err, dyn.logTail())
	}
	res.DynsecConnectSeconds = took.Seconds()
	res.Setup = meter.end(int64(len(logins)), "device")

	warm := min(time.Second, p.IngestDuration/5)
	res.Seconds = (p.IngestDuration - warm).Seconds()
	sides[0].procName, sides[1].procName = "mosquitto (devicehub plugin)", "mosquitto (dynamic security only)"
	var plugin, dynsec, pluginCPU, dynsecCPU []float64
	for k := range p.IngestRounds {
		order := sides
		if k%2 == 1 { // ABBA: drift on the machine falls on both sides alike
			order = []*ingestSide{sides[1], sides[0]}
		}
		for _, s := range order {
			r, err := s.round(ctx, e.product, logins, p.IngestInflight, p.IngestDuration, warm, procs)
			if err != nil {
				return nil, err
			}
			p.Logf("fleet: ingest round %d, %s: %.0f msg/s", k+1, s.name, r.Rate)
			res.Rounds = append(res.Rounds, r)
			if s == sides[0] {
				plugin, pluginCPU = append(plugin, r.Rate), append(pluginCPU, r.BrokerMicros)
			} else {
				dynsec, dynsecCPU = append(dynsec, r.Rate), append(dynsecCPU, r.BrokerMicros)
			}
		}
	}
	res.PluginRate, res.DynsecRate = median(plugin), median(dynsec)
	res.Ratio = Ratio(res.PluginRate, res.DynsecRate)
	res.PluginBrokerMicros, res.DynsecBrokerMicros = median(pluginCPU), median(dynsecCPU)
	return res, nil
}
