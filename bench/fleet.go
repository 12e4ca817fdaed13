package bench

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"devicehub/schema/backoff"
)

// FleetParams configure RunFleet. Zero fields take the defaults noted
// (the full-size run); the test and a smoke run scale them down.
type FleetParams struct {
	// Phase 1, provisioning: Devices created and deployed through the bulk
	// API (POST /api/device/instance/batch/_create?deploy=true), Batch per
	// call, Clients calls at a time. Default 100,000, 10,000, 4.
	Devices int `json:"devices"`
	Batch   int `json:"batch"`
	Clients int `json:"clients"`
	// Verify is how many devices each login check tries (spread over the
	// fleet). Default 100.
	Verify int `json:"verify"`
	// Phase 2: Logins is the fleet after the fill; the devices beyond
	// Devices are inserted straight into PostgreSQL, then the devicehub
	// child is restarted and its full sync timed. Default 1,000,000;
	// Devices or less skips the fill. SyncTimeout bounds the sync
	// (default 10 min).
	Logins      int           `json:"logins"`
	SyncTimeout time.Duration `json:"syncTimeout"`
	// Phases 3 and 4: a device publishes a QoS 1 report every
	// ProbeInterval (default 20 ms) and times each PUBACK, Baseline quiet
	// (default 10 s), then for Churn (default 30 s; negative skips phases
	// 3 and 4) while ChurnRate (default 100) single-device API calls a
	// second deploy, undeploy and rotate the key of ChurnPool devices
	// (default 1,000) by Workers clients (default 16); each deployed
	// device connects at once, once.
	ProbeInterval time.Duration `json:"probeInterval"`
	Baseline      time.Duration `json:"baseline"`
	Churn         time.Duration `json:"churn"`
	ChurnRate     int           `json:"churnRate"`
	ChurnPool     int           `json:"churnPool"`
	Workers       int           `json:"workers"`
	// Phase 5: IngestDevices (default 1,000; negative skips) each publish
	// QoS 1 reports on their own connection, closed loop with
	// IngestInflight unacknowledged each (default 4), for IngestDuration
	// (default 10 s) per round, through the broker with devicehub's plugin
	// and through a dynamic-security-only broker where the same devices
	// are that plugin's clients, for IngestRounds rounds (default 3; the
	// order alternates, medians are reported: a round disturbed by another
	// process on the machine does not decide).
	IngestDevices  int           `json:"ingestDevices"`
	IngestInflight int           `json:"ingestInflight"`
	IngestDuration time.Duration `json:"ingestDuration"`
	IngestRounds   int           `json:"ingestRounds"`
	// Phase 6: a dynamic-security-only broker whose file holds each of
	// DynsecSizes device logins (default 1,000 and 10,000; none skips),
	// DynsecChanges more devices created one command at a time (default
	// 20), within DynsecTime per size (default 2 min), after DynsecQuiet
	// of quiet probing (default 3 s).
	DynsecSizes   []int         `json:"dynsecSizes"`
	DynsecChanges int           `json:"dynsecChanges"`
	DynsecTime    time.Duration `json:"dynsecTime"`
	DynsecQuiet   time.Duration `json:"dynsecQuiet"`

	// ChildParams: the devicehub child (it runs with roles api and
	// -device-auth plugin).
	ChildParams
}

func (p FleetParams) withDefaults() FleetParams {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	defDur := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	def(&p.Devices, 100000)
	def(&p.Batch, 10000)
	def(&p.Clients, 4)
	def(&p.Verify, 100)
	def(&p.Logins, 1000000)
	defDur(&p.SyncTimeout, 10*time.Minute)
	defDur(&p.ProbeInterval, 20*time.Millisecond)
	defDur(&p.Baseline, 10*time.Second)
	defDur(&p.Churn, 30*time.Second)
	def(&p.ChurnRate, 100)
	def(&p.ChurnPool, 1000)
	def(&p.Workers, 16)
	def(&p.IngestDevices, 1000)
	def(&p.IngestInflight, 4)
	defDur(&p.IngestDuration, 10*time.Second)
	def(&p.IngestRounds, 3)
	if p.DynsecSizes == nil {
		p.DynsecSizes = []int{1000, 10000}
	}
	def(&p.DynsecChanges, 20)
	defDur(&p.DynsecTime, 2*time.Minute)
	defDur(&p.DynsecQuiet, 3*time.Second)
	p.childDefaults()
	p.Batch = min(max(p.Batch, 1), 10000) // the bulk API's limit per call
	p.Devices = max(p.Devices, 2)
	p.Clients, p.Workers, p.Verify = max(p.Clients, 1), max(p.Workers, 1), max(p.Verify, 1)
	p.IngestRounds, p.IngestInflight = max(p.IngestRounds, 1), max(p.IngestInflight, 1)
	p.ChurnRate = max(p.ChurnRate, 1)
	var sizes []int
	for _, n := range p.DynsecSizes {
		if n > 0 {
			sizes = append(sizes, n)
		}
	}
	p.DynsecSizes = sizes
	return p
}

// FleetResult is what RunFleet measured; a phase that did not run is nil.
type FleetResult struct {
	Params    FleetParams     `json:"params"`
	Provision *FleetProvision `json:"provision,omitempty"`
	Fill      *FleetFill      `json:"fill,omitempty"`
	Churn     *FleetChurn     `json:"churn,omitempty"`
	Ingest    *FleetIngest    `json:"ingest,omitempty"`
	Dynsec    []DynsecStep    `json:"dynsec,omitempty"`
	// Unavailable says why phases 1-5 did not run (devicehub's plugin or
	// the bulk API missing in this tree).
	Unavailable string `json:"unavailable,omitempty"`
}

// FleetPhase is one phase's wall time and the CPU and peak RSS of each
// process it involved.
type FleetPhase struct {
	Name    string       `json:"name"`
	Seconds float64      `json:"seconds"`
	CPU     CPUBreakdown `json:"cpu"`
	PeakRSS []ProcRSS    `json:"peakRss"`
}

// ProcRSS is one process's peak resident set over a phase.
type ProcRSS struct {
	Name  string `json:"name"`
	PID   int    `json:"pid"`
	Bytes int64  `json:"bytes"`
}

func (f FleetPhase) String() string {
	var b strings.Builder
	b.WriteString(f.CPU.String())
	b.WriteString("\n    peak RSS:")
	for i, r := range f.PeakRSS {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, " %s %d MiB", r.Name, r.Bytes>>20)
	}
	return b.String()
}

// fleetProc is a process a phase accounts for: one process whose pid may
// change between phases (the devicehub child is restarted), or a group
// (PostgreSQL's backends of the run's database), whose RSS is not summed
// (their shared buffers would count once per backend).
type fleetProc struct {
	name  string
	pid   func() int // 0: not running
	group func() []int
}

// phaseMeter takes a phase's CPU (each process from the phase's start, or
// from its own start if it began meanwhile) and samples each single
// process's RSS every 250 ms.
type phaseMeter struct {
	name  string
	procs []fleetProc
	span  *cpuSpan
	stop  chan struct{}
	wg    sync.WaitGroup
	mu    sync.Mutex
	peak  map[string]ProcRSS
}

func startPhase(name string, procs []namedProc) *phaseMeter {
	fp := make([]fleetProc, 0, len(procs))
	for _, p := range procs {
		if p.Members != nil {
			fp = append(fp, fleetProc{name: p.Name, group: p.Members})
			continue
		}
		pid := p.PID
		if pid == 0 {
			pid = os.Getpid()
		}
		fp = append(fp, fleetProc{name: p.Name, pid: func() int { return pid }})
	}
	return startFleetPhase(name, fp)
}

func startFleetPhase(name string, procs []fleetProc) *phaseMeter {
	named := make([]namedProc, len(procs))
	for i, p := range procs {
		if p.group != nil {
			named[i] = namedProc{Name: p.name, Members: p.group}
			continue
		}
		pid := p.pid
		named[i] = namedProc{Name: p.name, Members: func() []int {
			if n := pid(); n > 0 {
				return []int{n}
			}
			return nil
		}}
	}
	m := &phaseMeter{name: name, procs: procs, span: startCPUSpan(name, named), stop: make(chan struct{}), peak: map[string]ProcRSS{}}
	m.sample()
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		backoff.Every(m.stop, 250*time.Millisecond, func(time.Time) bool {
			m.sample()
			return true
		})
	}()
	return m
}

func (m *phaseMeter) sample() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, p := range m.procs {
		var pids []int
		if p.pid != nil {
			pids = []int{p.pid()}
		} else {
			pids = p.group()
		}
		var r int64
		for _, pid := range pids {
			if pid > 0 {
				r += pidRSS(pid)
			}
		}
		if r > m.peak[p.name].Bytes {
			pid := 0 // a group's RSS is its members' sum
			if len(pids) == 1 {
				pid = pids[0]
			}
			m.peak[p.name] = ProcRSS{Name: p.name, PID: pid, Bytes: r}
		}
	}
}

// end closes the phase: the CPU per unit of msgs (e.g. "device",
// "msg"), and each process's peak RSS.
func (m *phaseMeter) end(msgs int64, unit string) FleetPhase {
	close(m.stop)
	m.wg.Wait()
	m.sample()
	end := m.span.snapshot()
	c := m.span.breakdown(end, msgs)
	c.Unit = unit
	// A single process, or a group of one (a pool of one broker), reads
	// as itself.
	single := map[string]bool{}
	for _, p := range m.procs {
		single[p.name] = p.pid != nil
	}
	for i := range c.Procs {
		pr := &c.Procs[i]
		if pid := m.peak[pr.Name].PID; single[pr.Name] || pr.Members == 1 && pid > 0 {
			pr.Members, pr.PID = 0, pid
		}
	}
	f := FleetPhase{Name: m.name, Seconds: c.WallSeconds, CPU: c}
	for _, p := range m.procs {
		if r, ok := m.peak[p.name]; ok {
			f.PeakRSS = append(f.PeakRSS, r)
		}
	}
	return f
}

// fleetKey is a device's secureKey in this run: 32 hex digits, the md5 of
// seed and id, so that PostgreSQL computes the same for the devices it
// inserts itself (md5(seed || id)).
func fleetKey(seed, id string) string {
	h := md5.Sum([]byte(seed + id))
	return hex.EncodeToString(h[:])
}

// fleetID is device i of product, in series tag.
func fleetID(product, tag string, i int) string {
	return product + "-" + tag + strconv.Itoa(i)
}

// fleetLogins are n devices of product in series tag, secureId = id.
func fleetLogins(product, tag string, n int, seed string) []fleetLogin {
	out := make([]fleetLogin, n)
	for i := range out {
		id := fleetID(product, tag, i)
		out[i] = fleetLogin{ID: id, SecureID: id, Key: fleetKey(seed, id)}
	}
	return out
}

// spread picks up to n of logins, evenly spaced.
func spread(logins []fleetLogin, n int) []fleetLogin {
	if n >= len(logins) {
		return logins
	}
	out := make([]fleetLogin, n)
	for i := range out {
		out[i] = logins[i*len(logins)/n]
	}
	return out
}

// RunFleet runs the fleet scenario: devicehub's device-login plugin at
// fleet size (phases 1-5, a private broker with the plugin, the devicehub
// binary as a child on databases of its own) and Mosquitto's
// dynamic-security plugin at fleet size beside it (phase 6, private
// brokers without devicehub's plugin). Phases 1-5 are skipped, with the
// reason in Unavailable and an error wrapping errFleetUnavailable, when
// this tree has no plugin or bulk API; phase 6 runs anyway.
func RunFleet(ctx context.Context, p FleetParams) (FleetResult, error) {
	p = p.withDefaults()
	res := FleetResult{Params: p}
	var errs []error
	if err := runFleetPlugin(ctx, p, &res); err != nil {
		if errors.Is(err, errFleetUnavailable) {
			res.Unavailable = err.Error()
			p.Logf("fleet: phases 1-5 skipped: %v", err)
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			return res, errors.Join(errs...)
		}
	}
	for _, n := range p.DynsecSizes {
		p.Logf("fleet: phase 6, dynamic security at %d device logins: %d more devices, one command at a time (at most %s)", n, p.DynsecChanges, p.DynsecTime)
		st, err := runDynsecStep(ctx, p, n)
		if err != nil {
			errs = append(errs, fmt.Errorf("dynamic security at %d logins: %w", n, err))
			break
		}
		p.Logf("fleet: %s", st)
		res.Dynsec = append(res.Dynsec, st)
	}
	return res, errors.Join(errs...)
}

// median of xs (0 if none).
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
