package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"sync"
	"time"

	"devicehub/bench/sim"
	"devicehub/schema"
)

// CommandsParams configure RunCommands. Zero fields take the defaults noted.
type CommandsParams struct {
	Devices     int     `json:"devices"`     // simulated devices, default 100
	Concurrency int     `json:"concurrency"` // HTTP clients in flight, default 1000
	Requests    int     `json:"requests"`    // measured reads, default 20000
	Warmup      int     `json:"warmup"`      // reads before measuring, default 2 x Concurrency
	Rate        float64 `json:"rate"`        // req/s, open loop; 0: closed loop (as fast as answered)
	// SkipCeiling leaves out the bare-Fiber ceiling run.
	SkipCeiling bool   `json:"skipCeiling"`
	BrokerURL   string `json:"brokerUrl"` // default $DEVICEHUB_MQTT_URL or tcp://127.0.0.1:1884
	// Progress, if set, receives a live status line.
	Progress io.Writer `json:"-"`
	// ChildParams: the devicehub child (-roles=api,ingest in ServerArgs
	// records the downlinks too).
	ChildParams
}

func (p CommandsParams) withDefaults() CommandsParams {
	if p.Devices <= 0 {
		p.Devices = 100
	}
	if p.Concurrency <= 0 {
		p.Concurrency = 1000
	}
	if p.Requests <= 0 {
		p.Requests = 20000
	}
	if p.Warmup <= 0 {
		p.Warmup = 2 * p.Concurrency
	}
	if p.BrokerURL == "" {
		p.BrokerURL = os.Getenv("DEVICEHUB_MQTT_URL")
	}
	if p.BrokerURL == "" {
		p.BrokerURL = "tcp://127.0.0.1:1884"
	}
	p.childDefaults()
	return p
}

// CommandsResult is what RunCommands measured.
type CommandsResult struct {
	Params CommandsParams `json:"params"`
	// Reads: GET /api/device/standard/{d}/property/temp through the API,
	// the command path and the broker to a simulated device and back.
	Reads LoadResult `json:"reads"`
	// Ceiling: a bare Fiber handler, same machine, same client and load.
	Ceiling *LoadResult `json:"ceiling,omitempty"`
	// Ratios to the ceiling: latency (>= 1, lower is better) and
	// throughput (<= 1, higher is better).
	P50Ratio float64 `json:"p50Ratio,omitempty"`
	P99Ratio float64 `json:"p99Ratio,omitempty"`
	RPSRatio float64 `json:"rpsRatio,omitempty"`
	// DeviceReads is what the simulated devices received (>= requests).
	DeviceReads int64 `json:"deviceReads"`
	// The server is the devicehub binary, a child process with these
	// roles; PeakRSS is its peak VmRSS over the reads (warm-up included),
	// BenchRSS this process's (HTTP clients and simulated devices)
	// meanwhile, bytes.
	ServerPID   int    `json:"serverPid"`
	ServerRoles string `json:"serverRoles"`
	PeakRSS     int64  `json:"serverPeakRssBytes"`
	BenchRSS    int64  `json:"benchPeakRssBytes"`
	// CPU of each process over the measured reads (not the warm-up).
	CPU CPUBreakdown `json:"cpu"`
}

func (r CommandsResult) String() string {
	s := fmt.Sprintf("commands: %d devices, %d concurrent: %s", r.Params.Devices, r.Params.Concurrency, r.Reads)
	if r.Ceiling != nil {
		s += fmt.Sprintf("\n  bare fiber ceiling: %s\n  ratio to ceiling: p50 x%.1f, p99 x%.1f, throughput %.2f",
			r.Ceiling, r.P50Ratio, r.P99Ratio, r.RPSRatio)
	}
	s += fmt.Sprintf("\n  peak RSS: devicehub server process %d MiB (roles %s), bench process (clients and devices) %d MiB\n  %s",
		r.PeakRSS>>20, r.ServerRoles, r.BenchRSS>>20, r.CPU)
	if r.Ceiling != nil && r.Ceiling.CPU != nil {
		s += "\n  " + r.Ceiling.CPU.String()
	}
	return s
}

const cmdModel = `{"properties":[{"id":"temp","name":"Temperature","valueType":{"type":"float","scale":1}},{"id":"mode","name":"Mode","valueType":{"type":"string"}}]}`

// RunCommands measures property reads through HTTP against simulated
// devices: the devicehub binary as a child process (role api: the command
// path rides on its presence client; fresh PostgreSQL and ClickHouse
// databases, the real broker), a product and p.Devices devices created
// through HTTP and answered by a sim fleet in this process, then
// p.Concurrency keep-alive clients reading, with the peak RSS of the
// child and the CPU of each process. The bare-Fiber ceiling runs after,
// in this process, with the same load.
func RunCommands(ctx context.Context, p CommandsParams) (CommandsResult, error) {
	p = p.withDefaults()
	res := CommandsResult{Params: p, ServerRoles: childRoles("api", p.ServerArgs)}
	product := "benchcmd" + randHex(4) // unique: other runs' devices stay apart
	tmp, bin, db, cleanup, err := p.prepare(ctx, "cmd")
	if err != nil {
		return res, err
	}
	defer cleanup()
	p.Logf("commands: starting devicehub (roles %s) on %s", res.ServerRoles, p.BrokerURL)
	srv, err := startChildAPI(ctx, childAPIConfig{Binary: bin, LogDir: tmp, DB: db, ClickHouseAddr: p.ClickHouseAddr,
		BrokerURL: p.BrokerURL, Roles: "api", Args: p.ServerArgs, Conns: p.Concurrency, DeviceLogins: true})
	if err != nil {
		return res, err
	}
	defer srv.stop()
	res.ServerPID = srv.pid()

	if err := srv.deployProduct(ctx, product, "Bench commands", cmdModel); err != nil {
		return res, err
	}
	// Each device connects with its own login, shown by its create call.
	ids := make([]string, p.Devices)
	logins := make(map[string]sim.Credential, len(ids))
	for i := range ids {
		ids[i] = product + "-" + strconv.Itoa(i)
		var d struct {
			Configuration struct {
				SecureID  string `json:"secureId"`
				SecureKey string `json:"secureKey"`
			} `json:"configuration"`
		}
		if err := srv.call(ctx, "POST", "/api/device/instance", map[string]any{"id": ids[i], "name": "Bench device " + strconv.Itoa(i), "productId": product}, &d); err != nil {
			return res, err
		}
		if err := srv.call(ctx, "POST", "/api/device/instance/"+ids[i]+"/deploy", nil, nil); err != nil {
			return res, err
		}
		logins[ids[i]] = sim.Credential{SecureID: d.Configuration.SecureID, SecureKey: d.Configuration.SecureKey}
	}

	p.Logf("commands: connecting %d simulated devices", p.Devices)
	model, err := schema.ParseThingModelString(cmdModel)
	if err != nil {
		return res, err
	}
	fleet, err := startFleet(ctx, sim.Options{BrokerURL: p.BrokerURL, ProductID: product, DeviceIDs: ids, Model: model,
		QoS: 1, Login: sim.OwnLogins(logins)})
	if err != nil {
		return res, err
	}
	closeFleet := sync.OnceFunc(fleet.Close)
	defer closeFleet()
	// Every device must answer (be online in the server's view: until it
	// has their birth messages reads fail with client_offline) before the
	// load starts.
	paths := make([]string, len(ids))
	for i, id := range ids {
		paths[i] = "/api/device/standard/" + id + "/property/temp"
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, path := range paths {
		for {
			_, err := srv.do(ctx, "GET", path, nil)
			if err == nil {
				break
			}
			if time.Now().After(deadline) || ctx.Err() != nil {
				return res, fmt.Errorf("bench: device never answered: %w", err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	read := func(ctx context.Context, i int) error {
		raw, err := srv.do(ctx, "GET", paths[i%len(paths)], nil)
		if err != nil {
			return err
		}
		if !bytes.Contains(raw, []byte(`"temp":`)) {
			return fmt.Errorf("bench: read without the property: %.200s", raw)
		}
		return nil
	}
	p.Logf("commands: %d warm-up and %d measured reads, %d concurrent", p.Warmup, p.Requests, p.Concurrency)
	backends, closeBackends := db.backends()
	defer closeBackends()
	procs := childProcs("HTTP clients and devices", srv.pid(), backends, p.BrokerURL, p.ClickHouseAddr)
	stopRSS, stopBenchRSS := pidRSSSampler(srv.pid()), rssSampler()
	var span *cpuSpan
	var end cpuSnapshot
	restoreProcs := pacedProcs(p.Rate)
	res.Reads, err = runLoad(ctx, loadSpec{Name: "commands", Concurrency: p.Concurrency, Requests: p.Requests,
		Warmup: p.Warmup, Rate: p.Rate, Do: read, Progress: p.Progress, Measured: func() func() {
			span = startCPUSpan("commands read property", procs)
			return func() { end = span.snapshot() }
		}})
	restoreProcs()
	res.PeakRSS, res.BenchRSS = stopRSS(), stopBenchRSS()
	if span != nil {
		res.CPU = span.breakdown(end, res.Reads.Requests)
		res.CPU.Unit = "req"
	}
	res.DeviceReads = fleet.Reads.Load()
	if err != nil {
		return res, err
	}
	if res.Reads.Errors > 0 {
		return res, fmt.Errorf("bench: %d of %d reads failed, first: %s", res.Reads.Errors, p.Requests, res.Reads.FirstError)
	}
	// The ceiling gets the machine to itself: no server, no devices.
	serr := srv.stop()
	closeFleet()

	if !p.SkipCeiling {
		p.Logf("commands: bare Fiber ceiling")
		c, err := FiberCeiling(ctx, CeilingParams{Concurrency: p.Concurrency, Requests: p.Requests, Warmup: p.Warmup,
			Rate: p.Rate, Progress: p.Progress})
		if err != nil {
			return res, err
		}
		res.Ceiling = &c
		res.P50Ratio = Ratio(res.Reads.Latency.P50Ms, c.Latency.P50Ms)
		res.P99Ratio = Ratio(res.Reads.Latency.P99Ms, c.Latency.P99Ms)
		res.RPSRatio = Ratio(res.Reads.SustainedRPS, c.SustainedRPS)
	}
	return res, serr
}

// pacedProcs runs this process (HTTP clients and simulated devices) on
// one P for a paced run of at most onePRate reads/s, until the function it
// returns is called. At such a rate the generator needs a third of a core
// or less, and its goroutines hand work to one another at every step of a
// read (paho's reader, router and writer, the HTTP client's wait); with a
// second P idle, each hand-off also wakes a thread to look for work, about
// a sixth of the generator's CPU. Faster paced runs and closed loop keep
// every P: there the generator must not be what limits the rate or adds
// to the latency.
func pacedProcs(rate float64) (restore func()) {
	if rate <= 0 || rate > onePRate {
		return func() {}
	}
	prev := runtime.GOMAXPROCS(1)
	return func() { runtime.GOMAXPROCS(prev) }
}

// onePRate is the fastest paced run pacedProcs holds to one P: at 1,000
// reads/s the generator takes 0.3 of a core, so there is room to spare.
const onePRate = 2000

// startFleet connects the devices; a device refused because the server has
// not yet given the broker its login (the server does within moments of
// the deploy) is tried again, for up to 10 s.
func startFleet(ctx context.Context, o sim.Options) (*sim.Fleet, error) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		f, err := sim.Start(ctx, o)
		if err == nil || time.Now().After(deadline) {
			return f, err
		}
		time.Sleep(200 * time.Millisecond)
	}
}
