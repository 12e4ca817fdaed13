package bench

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// FleetConnectParams configure RunFleetConnect. Zero fields take the
// defaults noted (the full-size run); the test scales them down.
type FleetConnectParams struct {
	// Devices provisioned through the bulk API (Batch per call, Clients
	// calls at a time) and connected at once, each with its own login,
	// client id and last will. Default 100,000, 10,000, 4.
	Devices int `json:"devices"`
	Batch   int `json:"batch"`
	Clients int `json:"clients"`
	// Interval between a device's QoS 1 reports. Default 10s (10,000
	// reports/s at 100,000 devices).
	Interval time.Duration `json:"interval"`
	// Steady is the measured window with every device connected. Default 60s.
	Steady time.Duration `json:"steady"`
	// ConnectConcurrency bounds the dials in flight. Default 256.
	ConnectConcurrency int `json:"connectConcurrency"`
	// PerAddress: connections per loopback source address (127.0.0.2,
	// 127.0.0.3, ...; one address has about 28,000 ephemeral ports).
	// Default 20,000.
	PerAddress int `json:"perAddress"`
	// Probes: devices whose reports are timed publish to stored. Default 1,000.
	Probes int `json:"probes"`
	// BackoffMin and BackoffMax of the devices' reconnection (full
	// jitter: uniform in [0, min(max, min*2^attempt)]). Default 1s, 30s.
	BackoffMin time.Duration `json:"backoffMin"`
	BackoffMax time.Duration `json:"backoffMax"`
	// Timeout bounds each wait of a phase (all connected, state correct,
	// backlog stored). Default 3 min.
	Timeout time.Duration `json:"timeout"`
	// SkipBrokerRestart, SkipDevicehubRestart leave a storm out.
	SkipBrokerRestart    bool `json:"skipBrokerRestart,omitempty"`
	SkipDevicehubRestart bool `json:"skipDevicehubRestart,omitempty"`

	PostgresServer string                           `json:"postgresServer"`
	ClickHouseAddr string                           `json:"clickhouseAddr"`
	ServerBinary   string                           `json:"-"`
	ServerArgs     []string                         `json:"serverArgs,omitempty"`
	Logf           func(format string, args ...any) `json:"-"`
}

func (p FleetConnectParams) withDefaults() FleetConnectParams {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	defDur := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&p.Devices, 100000)
	def(&p.Batch, 10000)
	def(&p.Clients, 4)
	defDur(&p.Interval, 10*time.Second)
	defDur(&p.Steady, 60*time.Second)
	def(&p.ConnectConcurrency, 256)
	def(&p.PerAddress, 20000)
	def(&p.Probes, 1000)
	defDur(&p.BackoffMin, time.Second)
	defDur(&p.BackoffMax, 30*time.Second)
	defDur(&p.Timeout, 3*time.Minute)
	p.PerAddress = min(p.PerAddress, 25000)
	p.Probes = min(p.Probes, p.Devices)
	if p.Logf == nil {
		p.Logf = func(string, ...any) {}
	}
	return p
}

// FleetConnectResult is what RunFleetConnect measured.
type FleetConnectResult struct {
	Params           FleetConnectParams `json:"params"`
	FileLimit        uint64             `json:"fileLimit"` // RLIMIT_NOFILE of the bench and its children
	SourceAddresses  int                `json:"sourceAddresses"`
	Provision        *FleetProvision    `json:"provision,omitempty"`
	Connect          *ConnectStorm      `json:"connect,omitempty"`
	Steady           *FleetSteady       `json:"steady,omitempty"`
	BrokerRestart    *ConnectStorm      `json:"brokerRestart,omitempty"`
	DevicehubRestart *DevicehubRestart  `json:"devicehubRestart,omitempty"`
	Final            *FleetFinal        `json:"final,omitempty"`
	Timeline         []FleetSecond      `json:"timeline,omitempty"`
}

// ConnectStorm is every device (re)connecting at once: after the start,
// or after a broker restart.
type ConnectStorm struct {
	// Seconds from the start of the storm (the broker back, for a
	// restart) until 99% and 100% of the devices are connected; until
	// PostgreSQL shows every device online (since the storm began) and
	// the presence view agrees.
	To99, ToAll, StateSeconds, PresenceSeconds float64
	// Dial failures (refused at CONNACK among them) on the way.
	DialFailures, Refused int64
	Connack               LatencySummary // dial to CONNACK
	// DownSeconds: the broker stopped to listening again (restart only).
	DownSeconds float64 `json:"downSeconds,omitempty"`
	Phase       FleetPhase
}

func (s ConnectStorm) String() string {
	d := ""
	if s.DownSeconds > 0 {
		d = fmt.Sprintf("broker down %.1fs; ", s.DownSeconds)
	}
	return fmt.Sprintf("%s99%% connected %.1fs, all %.1fs; PostgreSQL all online %.1fs, presence view agrees %.1fs; %d dial failures (%d refused); CONNACK %s\n    %s",
		d, s.To99, s.ToAll, s.StateSeconds, s.PresenceSeconds, s.DialFailures, s.Refused, s.Connack, s.Phase)
}

// FleetSteady is the measured window with every device connected.
type FleetSteady struct {
	Seconds float64 `json:"seconds"`
	// Rates over the window: reports the broker acknowledged, messages
	// devicehub stored.
	AckedRate  float64        `json:"ackedRate"`
	StoredRate float64        `json:"storedRate"`
	EndToEnd   LatencySummary `json:"endToEnd"` // probes, publish to visible in ClickHouse
	// Memory per connected device: each process's RSS after the connect
	// storm minus before it, over the devices (generator: this process).
	BytesPerDevice map[string]float64 `json:"bytesPerDevice"`
	RSSMiB         map[string]int64   `json:"rssMiB"`
	Phase          FleetPhase         `json:"phase"`
}

func (s FleetSteady) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%.0fs: %.0f reports/s acknowledged, %.0f msgs/s stored; end to end %s\n    memory per device:", s.Seconds, s.AckedRate, s.StoredRate, s.EndToEnd)
	for _, n := range []string{"devicehub", "mosquitto", "generator", "generator (live heap and stacks)"} {
		fmt.Fprintf(&b, " %s %.0f B (%d MiB)", n, s.BytesPerDevice[n], s.RSSMiB[n])
	}
	fmt.Fprintf(&b, "\n    %s", s.Phase)
	return b.String()
}

// DevicehubRestart is devicehub stopped and started again under the
// connected fleet.
type DevicehubRestart struct {
	// DownSeconds: SIGTERM to healthy again. PresenceSeconds: from the
	// start until its presence view counts every device. DrainSeconds:
	// from the start until end-to-end latency is back under 2 s.
	DownSeconds, PresenceSeconds, DrainSeconds float64
	// PGCommits: transactions committed on the run's database from the
	// stop until DrainSeconds (the bench's own few polls included);
	// StateChanges written by the new child meanwhile.
	PGCommits    int64   `json:"pgCommits"`
	StateChanges float64 `json:"stateChanges"`
	DevicesLost  int64   `json:"devicesLost"` // device connections lost meanwhile (want 0)
	Phase        FleetPhase
}

func (r DevicehubRestart) String() string {
	return fmt.Sprintf("down %.1fs; presence view full %.1fs after the start; latency back under 2 s %.1fs after it; %d PostgreSQL commits, %.0f state changes written; %d device connections lost\n    %s",
		r.DownSeconds, r.PresenceSeconds, r.DrainSeconds, r.PGCommits, r.StateChanges, r.DevicesLost, r.Phase)
}

// FleetFinal is the reckoning at the end: what the broker acknowledged
// against what ClickHouse holds, and the last-will storm.
type FleetFinal struct {
	Sent            int64   `json:"sent"`
	Acked           int64   `json:"acked"`
	ReportsLost     int64   `json:"reportsLost"` // acknowledged, not stored (want 0)
	ReportsDup      int64   `json:"reportsDup"`  // stored more than once
	BirthsAcked     int64   `json:"birthsAcked"`
	BirthsLost      int64   `json:"birthsLost"`
	BirthsDup       int64   `json:"birthsDup"`
	WillsStored     int64   `json:"willsStored"` // every will stored
	WillsLost       int64   `json:"willsLost"`   // of the final abrupt close, not stored
	WillsDup        int64   `json:"willsDup"`
	StaleWills      int64   `json:"staleWills"`     // wills of connections before the last one (broker restart)
	OfflineSeconds  float64 `json:"offlineSeconds"` // abrupt close of all to PostgreSQL all offline
	PresenceSeconds float64 `json:"presenceSeconds"`
	NotOffline      int64   `json:"notOffline"` // devices not offline in PostgreSQL at the end
}

func (f FleetFinal) String() string {
	return fmt.Sprintf("reports: %d sent, %d acknowledged, %d lost, %d stored twice; births: %d acknowledged, %d lost, %d twice; wills after closing all abruptly: %d stored (%d lost, %d twice, %d of earlier connections), PostgreSQL all offline %.1fs, presence view 0 %.1fs, %d not offline",
		f.Sent, f.Acked, f.ReportsLost, f.ReportsDup, f.BirthsAcked, f.BirthsLost, f.BirthsDup, f.WillsStored, f.WillsLost, f.WillsDup, f.StaleWills, f.OfflineSeconds, f.PresenceSeconds, f.NotOffline)
}

func (r FleetConnectResult) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "fleet-connect: %d devices over %d source addresses, a report every %s; file limit %d", r.Params.Devices, r.SourceAddresses, r.Params.Interval, r.FileLimit)
	if r.Provision != nil {
		fmt.Fprintf(&b, "\n  provision: %.1fs, %.0f devices/s", r.Provision.Seconds, r.Provision.Rate)
	}
	if r.Connect != nil {
		fmt.Fprintf(&b, "\n  connect all: %s", r.Connect)
	}
	if r.Steady != nil {
		fmt.Fprintf(&b, "\n  steady: %s", r.Steady)
	}
	if r.BrokerRestart != nil {
		fmt.Fprintf(&b, "\n  broker restart: %s", r.BrokerRestart)
	}
	if r.DevicehubRestart != nil {
		fmt.Fprintf(&b, "\n  devicehub restart: %s", r.DevicehubRestart)
	}
	if r.Final != nil {
		fmt.Fprintf(&b, "\n  final: %s", r.Final)
	}
	return b.String()
}

// raiseFileLimit raises this process's RLIMIT_NOFILE to at least want
// (as root past the hard limit, up to fs.nr_open). Set with setrlimit, it
// is what the processes this one starts inherit (Go gives children the
// original limit only while the process never set its own).
func raiseFileLimit(want uint64) (uint64, error) {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		return 0, err
	}
	if b, err := os.ReadFile("/proc/sys/fs/nr_open"); err == nil {
		if n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64); err == nil {
			want = min(want, n)
		}
	}
	if r.Cur >= want {
		return r.Cur, syscall.Setrlimit(syscall.RLIMIT_NOFILE, &r)
	}
	n := syscall.Rlimit{Cur: want, Max: max(r.Max, want)}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &n); err != nil {
		// Not root: as far as the hard limit goes.
		n = syscall.Rlimit{Cur: r.Max, Max: r.Max}
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &n); err != nil {
			return r.Cur, err
		}
	}
	return n.Cur, nil
}

// restart stops the broker with SIGTERM (it saves its sessions and the
// plugin's snapshot) and starts it again on the same port and data
// directory; it returns once the broker listens, and how long it was
// away.
func (b *fleetBroker) restart(ctx context.Context) (time.Duration, error) {
	bin, err := mosquittoBinary()
	if err != nil {
		return 0, err
	}
	old := b.cmd
	_ = syscall.Kill(-old.Process.Pid, syscall.SIGTERM)
	select {
	case <-b.exited:
	case <-time.After(30 * time.Second):
		_ = syscall.Kill(-old.Process.Pid, syscall.SIGKILL)
		<-b.exited
	}
	down := time.Now()
	b.cmd = exec.Command(bin, "-c", filepath.Join(b.dir, "mosquitto.conf"))
	b.cmd.Dir = b.dir
	b.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := b.cmd.Start(); err != nil {
		b.cmd = nil
		return 0, fmt.Errorf("bench: restart mosquitto: %w", err)
	}
	b.exited = make(chan struct{})
	b.watch(b.cmd, b.exited)
	for {
		c, err := net.DialTimeout("tcp", b.addr(), time.Second)
		if err == nil {
			c.Close()
			return time.Since(down), nil
		}
		select {
		case <-b.exited:
			return 0, fmt.Errorf("bench: restarted mosquitto exited:\n%s", b.logTail())
		default:
		}
		if time.Since(down) > time.Minute || ctx.Err() != nil {
			return 0, fmt.Errorf("bench: restarted mosquitto not up: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// RunFleetConnect runs the fleet-connect scenario: p.Devices devices
// provisioned in bulk and connected at once to a private broker with
// devicehub's plugin, each reporting every p.Interval at QoS 1 to a
// devicehub child (api and ingest) on databases of its own; then the
// broker restarted under them, then devicehub restarted under them; at
// the end every acknowledged report, birth and will is looked up in
// ClickHouse, and every device closed abruptly (a storm of wills).
func RunFleetConnect(ctx context.Context, p FleetConnectParams) (res FleetConnectResult, err error) {
	p = p.withDefaults()
	res.Params = p
	// Sockets: one per device here and at the broker, plus the children's.
	if res.FileLimit, err = raiseFileLimit(uint64(2*p.Devices + 65536)); err != nil {
		return res, fmt.Errorf("bench: file limit: %w", err)
	}
	// The broker holds a socket per device in one process, as does this
	// one: both are bound by the limit (a process without
	// CAP_SYS_RESOURCE cannot raise its hard limit).
	if res.FileLimit < uint64(p.Devices+512) {
		return res, fmt.Errorf("bench: fleet-connect: %d devices need %d open files in the broker's one process and in this one; the limit here is %d "+
			"(RLIMIT_NOFILE hard limit, raised only with CAP_SYS_RESOURCE): at most %d devices on this machine", p.Devices, p.Devices+512, res.FileLimit, res.FileLimit-512)
	}
	broker, err := startFleetBroker(ctx, brokerPlugin, nil)
	if err != nil {
		return res, err
	}
	defer broker.stop()
	fp := FleetParams{Devices: p.Devices, Batch: p.Batch, Clients: p.Clients, Verify: 10, PostgresServer: p.PostgresServer,
		ClickHouseAddr: p.ClickHouseAddr, ServerBinary: p.ServerBinary, Logf: p.Logf,
		// Ingest too, on one plain persistent subscription (the default:
		// kept across broker restarts), whatever the bench's children use.
		ServerArgs: append([]string{"-roles=api,ingest", "-mqtt-share-group=none"}, p.ServerArgs...)}.withDefaults()
	e := &fleetEnv{p: fp, broker: broker, adminPassword: "bench-" + randHex(8), seed: randHex(8), chPID: clickhousePID(fp.ClickHouseAddr)}
	tmp, bin, db, cleanup, err := prepareChildRun(ctx, "fleetconnect", fp.ServerBinary, fp.PostgresServer, p.Logf)
	if err != nil {
		return res, err
	}
	defer cleanup()
	e.tmp, e.bin, e.db = tmp, bin, db
	backends, closeBackends := db.backends()
	defer closeBackends()
	e.backends = backends
	p.Logf("fleet-connect: private broker on %s, file limit %d; starting devicehub (api, ingest)", broker.url(), res.FileLimit)
	if err := e.startChild(ctx); err != nil {
		return res, err
	}
	defer e.stopChild()
	p.Logf("fleet-connect: provisioning %d devices through the bulk API", p.Devices)
	if res.Provision, err = e.provision(ctx); err != nil {
		return res, err
	}
	p.Logf("fleet-connect: %s", res.Provision)

	f := newConnectFleet(broker.addr(), e.product, e.logins, p.Interval, p.PerAddress, p.Probes, p.BackoffMin, p.BackoffMax)
	res.SourceAddresses = len(f.sources)
	w, err := newFleetWatch(e, f)
	if err != nil {
		return res, err
	}
	defer func() {
		f.closeAll(false)
		w.close()
		res.Timeline = w.timeline()
	}()
	r := &fleetConnectRun{p: p, e: e, f: f, w: w}
	rssBefore := r.rss()
	w.run()

	// 1. Everyone connects at once.
	w.setPhase("connect")
	p.Logf("fleet-connect: %d devices connecting, %d dials at a time, from %d source addresses", p.Devices, p.ConnectConcurrency, len(f.sources))
	if res.Connect, err = r.storm(ctx, "connect", time.Time{}, func() error { f.start(p.ConnectConcurrency); return nil }); err != nil {
		return res, err
	}
	p.Logf("fleet-connect: connect: %s", res.Connect)

	// 2. Steady.
	w.setPhase("steady")
	if res.Steady, err = r.steady(ctx, rssBefore); err != nil {
		return res, err
	}
	p.Logf("fleet-connect: steady: %s", res.Steady)

	// 3. Broker restart.
	if !p.SkipBrokerRestart {
		w.setPhase("broker restart")
		var down time.Duration
		t0 := time.Now()
		res.BrokerRestart, err = r.storm(ctx, "broker restart", t0, func() (err error) {
			down, err = broker.restart(ctx)
			return err
		})
		if res.BrokerRestart != nil {
			res.BrokerRestart.DownSeconds = down.Seconds()
		}
		if err != nil {
			return res, err
		}
		p.Logf("fleet-connect: broker restart: %s", res.BrokerRestart)
		w.setPhase("after broker restart")
		if err := sleepCtx(ctx, 2*p.Interval); err != nil {
			return res, err
		}
	}

	// 4. devicehub restart.
	if !p.SkipDevicehubRestart {
		w.setPhase("devicehub restart")
		if res.DevicehubRestart, err = r.devicehubRestart(ctx); err != nil {
			return res, err
		}
		p.Logf("fleet-connect: devicehub restart: %s", res.DevicehubRestart)
		w.setPhase("after devicehub restart")
		if err := sleepCtx(ctx, 2*p.Interval); err != nil {
			return res, err
		}
	}

	// 5. The reckoning, and a storm of wills.
	w.setPhase("final")
	if res.Final, err = r.final(ctx); err != nil {
		return res, err
	}
	p.Logf("fleet-connect: final: %s", res.Final)
	return res, nil
}

// fleetConnectRun is one run's state shared by its phases.
type fleetConnectRun struct {
	p FleetConnectParams
	e *fleetEnv
	f *connectFleet
	w *fleetWatch
}

func (r *fleetConnectRun) rss() map[string]int64 {
	return map[string]int64{"devicehub": pidRSS(int(r.e.childPID.Load())), "mosquitto": pidRSS(r.e.broker.pid()), "generator": pidRSS(0),
		"generator (live heap and stacks)": liveGoMemory()}
}

// liveGoMemory is this process's live heap and goroutine stacks after a
// collection: what the simulated devices hold, without the slack of the
// bench's GC target (GOGC 400) that its RSS includes.
func liveGoMemory() int64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc + ms.StackInuse)
}

// waitFor polls cond every 100 ms until it holds, returning the seconds
// since t0; an error if it does not within the run's timeout.
func (r *fleetConnectRun) waitFor(ctx context.Context, what string, t0 time.Time, cond func() bool) (float64, error) {
	deadline := time.Now().Add(r.p.Timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("bench: fleet-connect: %s not within %s (%d of %d devices connected)", what, r.p.Timeout, r.f.connected.Load(), r.p.Devices)
		}
		if err := sleepCtx(ctx, 100*time.Millisecond); err != nil {
			return 0, err
		}
	}
	return time.Since(t0).Seconds(), nil
}

// storm runs act (which starts the devices, or restarts the broker) and
// times the reconnection from the moment act returns, then the state.
// since: the devices' state must be newer (zero: any online state).
func (r *fleetConnectRun) storm(ctx context.Context, name string, since time.Time, act func() error) (*ConnectStorm, error) {
	meter := startFleetPhase(name, r.e.procs())
	fails0, refused0 := r.f.dialFailures.Load(), r.f.refused.Load()
	r.f.connack.Store(&Histogram{})
	s := &ConnectStorm{}
	if err := act(); err != nil {
		return s, err
	}
	t0 := time.Now()
	n := int64(r.p.Devices)
	var err error
	if s.To99, err = r.waitFor(ctx, name+": 99% connected", t0, func() bool { return r.f.connected.Load()*100 >= n*99 }); err != nil {
		return s, err
	}
	if s.ToAll, err = r.waitFor(ctx, name+": all connected", t0, func() bool { return r.f.connected.Load() >= n }); err != nil {
		return s, err
	}
	if s.StateSeconds, err = r.waitFor(ctx, name+": PostgreSQL all online", t0, func() bool {
		_, fresh, err := r.w.pgOnline(ctx, since)
		return err == nil && fresh >= n
	}); err != nil {
		return s, err
	}
	if s.PresenceSeconds, err = r.waitFor(ctx, name+": presence view", t0, func() bool {
		pr, _ := r.w.childMetrics(ctx)
		return int64(pr) == n
	}); err != nil {
		return s, err
	}
	s.DialFailures, s.Refused = r.f.dialFailures.Load()-fails0, r.f.refused.Load()-refused0
	s.Connack = r.f.connack.Load().Summary()
	s.Phase = meter.end(n, "device")
	return s, nil
}

func (r *fleetConnectRun) steady(ctx context.Context, rssBefore map[string]int64) (*FleetSteady, error) {
	// A full interval first: every device has reported once, the ramp is over.
	if err := sleepCtx(ctx, r.p.Interval); err != nil {
		return nil, err
	}
	r.w.setPhase("steady (measured)")
	meter := startFleetPhase("steady", r.e.procs())
	a0, t0 := r.f.acked.Load(), time.Now()
	stored0 := r.storedNow(ctx)
	if err := sleepCtx(ctx, r.p.Steady); err != nil {
		return nil, err
	}
	a1, el := r.f.acked.Load(), time.Since(t0).Seconds()
	stored1 := r.storedNow(ctx)
	s := &FleetSteady{Seconds: el, AckedRate: float64(a1-a0) / el, StoredRate: float64(stored1-stored0) / el,
		EndToEnd: r.w.phaseLatency("steady (measured)"), BytesPerDevice: map[string]float64{}, RSSMiB: map[string]int64{}}
	for k, v := range r.rss() {
		s.RSSMiB[k] = v >> 20
		s.BytesPerDevice[k] = float64(v-rssBefore[k]) / float64(r.p.Devices)
	}
	s.Phase = meter.end(a1-a0, "report")
	return s, nil
}

func (r *fleetConnectRun) storedNow(ctx context.Context) float64 {
	_, st := r.w.childMetrics(ctx)
	return st
}

func (r *fleetConnectRun) devicehubRestart(ctx context.Context) (*DevicehubRestart, error) {
	e := r.e
	res := &DevicehubRestart{}
	meter := startFleetPhase("devicehub restart", e.procs())
	commits0, _ := r.w.pgCommits(ctx)
	lost0 := r.f.lost.Load()
	t0 := time.Now()
	// Stopped as an operator would (SIGTERM), its broker session and
	// ClickHouse database kept: not childAPI.stop, which ends both.
	old := e.child
	old.http.close()
	if err := old.proc.stop(20 * time.Second); err != nil {
		return nil, fmt.Errorf("bench: devicehub stop: %w", err)
	}
	e.setChild(nil)
	if err := e.startChild(ctx); err != nil {
		return nil, err
	}
	start := time.Now()
	res.DownSeconds = start.Sub(t0).Seconds()
	n := int64(r.p.Devices)
	var err error
	if res.PresenceSeconds, err = r.waitFor(ctx, "devicehub restart: presence view", start, func() bool {
		pr, _ := r.w.childMetrics(ctx)
		return int64(pr) == n
	}); err != nil {
		return res, err
	}
	// Drained: a second whose end-to-end p99 is under 2 s, after a second
	// with the restart's backlog behind it.
	if res.DrainSeconds, err = r.waitFor(ctx, "devicehub restart: latency back under 2 s", start, func() bool {
		l := r.w.latest()
		return time.Since(start) > 2*time.Second && l.P99Ms > 0 && l.P99Ms < 2000 && l.Stored > 0
	}); err != nil {
		return res, err
	}
	commits1, _ := r.w.pgCommits(ctx)
	res.PGCommits = commits1 - commits0
	if m, err := e.child.proc.scrapeMetrics(ctx); err == nil {
		res.StateChanges = m["devicehub_ingest_state_changes_total"]
	}
	res.DevicesLost = r.f.lost.Load() - lost0
	res.Phase = meter.end(n, "device")
	return res, nil
}

func (r *fleetConnectRun) final(ctx context.Context) (*FleetFinal, error) {
	f := r.f
	f.pauseReports(15 * time.Second)
	res := &FleetFinal{Sent: f.sent.Load(), Acked: f.acked.Load(), BirthsAcked: f.birthsAcked.Load()}
	// Every acknowledged report stored, or no progress for 15 s.
	prev, last := int64(-1), time.Now()
	for time.Since(last) < 15*time.Second {
		n, err := r.w.storedTotal(ctx)
		if err == nil && n >= res.Acked {
			break
		}
		if n != prev {
			prev, last = n, time.Now()
		}
		if err := sleepCtx(ctx, 500*time.Millisecond); err != nil {
			return res, err
		}
	}
	// The storm of wills: every device gone at once, without DISCONNECT.
	lastConn := make([]uint32, len(f.devs))
	for i, d := range f.devs {
		d.mu.Lock()
		lastConn[i] = d.connNo
		d.mu.Unlock()
	}
	t0 := time.Now()
	f.closeAll(true)
	var err error
	if res.OfflineSeconds, err = r.waitFor(ctx, "final: PostgreSQL all offline", t0, func() bool {
		on, _, err := r.w.pgOnline(ctx, time.Time{})
		return err == nil && on == 0
	}); err != nil {
		r.p.Logf("fleet-connect: %v", err)
	}
	if res.PresenceSeconds, err = r.waitFor(ctx, "final: presence view empty", t0, func() bool {
		pr, _ := r.w.childMetrics(ctx)
		return pr == 0
	}); err != nil {
		r.p.Logf("fleet-connect: %v", err)
	}
	if err := r.w.pg.QueryRowContext(ctx, `SELECT count(*) FROM devices WHERE product_id = $1 AND state <> 'offline'`, r.e.product).Scan(&res.NotOffline); err != nil {
		return res, err
	}
	// Wills are stored with the state change: give the last batch a second.
	if err := sleepCtx(ctx, 2*time.Second); err != nil {
		return res, err
	}
	stored, err := r.w.storedByDevice(ctx)
	if err != nil {
		return res, fmt.Errorf("bench: stored messages: %w", err)
	}
	for i, d := range f.devs {
		s := stored[f.logins[i].ID]
		if s == nil {
			s = &storedCounts{}
		}
		d.mu.Lock()
		for _, seq := range d.acked {
			if s.reports[strconv.FormatUint(uint64(seq), 10)] == 0 {
				res.ReportsLost++
			}
		}
		for _, b := range d.births {
			if s.births["b"+strconv.FormatUint(uint64(b), 10)] == 0 {
				res.BirthsLost++
			}
		}
		d.mu.Unlock()
		for _, n := range s.reports {
			res.ReportsDup += int64(max(n-1, 0))
		}
		for _, n := range s.births {
			res.BirthsDup += int64(max(n-1, 0))
		}
		lastWill := "w" + strconv.FormatUint(uint64(lastConn[i]), 10)
		for id, n := range s.wills {
			res.WillsStored += int64(n)
			res.WillsDup += int64(max(n-1, 0))
			if id != lastWill {
				res.StaleWills++
			}
		}
		if lastConn[i] > 0 && s.wills[lastWill] == 0 {
			res.WillsLost++
		}
	}
	if res.ReportsLost > 0 {
		return res, fmt.Errorf("bench: fleet-connect: %d acknowledged reports not stored", res.ReportsLost)
	}
	return res, nil
}

// Figures are the run's headline numbers, each beside its target.
func (r FleetConnectResult) Figures() []Figure {
	var out []Figure
	add := func(f Figure) { out = append(out, f) }
	m := fmt.Sprintf(" (%d devices, a report every %s)", r.Params.Devices, r.Params.Interval)
	if c := r.Connect; c != nil {
		add(Figure{Name: "connect all at once: 99% connected" + m, Value: c.To99, Unit: "s"})
		add(Figure{Name: "connect all at once: all connected" + m, Value: c.ToAll, Unit: "s", Target: "all connected"})
		add(Figure{Name: "connect all at once: PostgreSQL shows all online" + m, Value: c.StateSeconds, Unit: "s"})
	}
	if s := r.Steady; s != nil {
		add(Figure{Name: "steady: reports acknowledged/s" + m, Value: s.AckedRate, Unit: "reports/s"})
		add(Figure{Name: "steady: messages stored/s" + m, Value: s.StoredRate, Unit: "msgs/s", Target: ">= 10,000 at 100,000 devices"})
		add(Figure{Name: "steady: end to end p50, publish to stored" + m, Value: s.EndToEnd.P50Ms, Unit: "ms"})
		add(Figure{Name: "steady: end to end p99, publish to stored" + m, Value: s.EndToEnd.P99Ms, Unit: "ms", Target: "<= 2000"})
		for _, n := range []string{"devicehub", "mosquitto", "generator", "generator (live heap and stacks)"} {
			add(Figure{Name: "steady: memory per connected device, " + n + m, Value: s.BytesPerDevice[n], Unit: "bytes"})
			t := ""
			if n == "devicehub" {
				t = "<= 1 GB (953 MiB)"
			}
			add(Figure{Name: "steady: RSS, " + n + m, Value: float64(s.RSSMiB[n]), Unit: "MiB", Target: t})
		}
	}
	if b := r.BrokerRestart; b != nil {
		add(Figure{Name: "broker restart: 99% reconnected after the broker is back" + m, Value: b.To99, Unit: "s", Target: "<= 60"})
		add(Figure{Name: "broker restart: all reconnected" + m, Value: b.ToAll, Unit: "s"})
		add(Figure{Name: "broker restart: every device online in PostgreSQL (newer than the restart)" + m, Value: b.StateSeconds, Unit: "s", Target: "<= 90"})
		add(Figure{Name: "broker restart: presence view agrees" + m, Value: b.PresenceSeconds, Unit: "s"})
	}
	if d := r.DevicehubRestart; d != nil {
		add(Figure{Name: "devicehub restart: down (SIGTERM to healthy)" + m, Value: d.DownSeconds, Unit: "s"})
		add(Figure{Name: "devicehub restart: presence view rebuilt after the start" + m, Value: d.PresenceSeconds, Unit: "s"})
		add(Figure{Name: "devicehub restart: end to end back under 2 s after the start" + m, Value: d.DrainSeconds, Unit: "s"})
		add(Figure{Name: "devicehub restart: PostgreSQL commits until drained" + m, Value: float64(d.PGCommits), Unit: "commits"})
		add(Figure{Name: "devicehub restart: device connections lost" + m, Value: float64(d.DevicesLost), Unit: "devices", Target: "0"})
	}
	if f := r.Final; f != nil {
		add(Figure{Name: "acknowledged reports lost" + m, Value: float64(f.ReportsLost), Unit: "reports", Target: "0"})
		add(Figure{Name: "reports stored twice" + m, Value: float64(f.ReportsDup), Unit: "reports"})
		add(Figure{Name: "acknowledged births lost" + m, Value: float64(f.BirthsLost), Unit: "births", Target: "0"})
		add(Figure{Name: "births stored twice" + m, Value: float64(f.BirthsDup), Unit: "births"})
		add(Figure{Name: "wills lost, all devices closed abruptly" + m, Value: float64(f.WillsLost), Unit: "wills", Target: "0"})
		add(Figure{Name: "wills stored twice" + m, Value: float64(f.WillsDup), Unit: "wills"})
		add(Figure{Name: "wills of earlier connections (broker restart)" + m, Value: float64(f.StaleWills), Unit: "wills"})
		add(Figure{Name: "all closed abruptly: PostgreSQL all offline" + m, Value: f.OfflineSeconds, Unit: "s"})
		add(Figure{Name: "devices not offline in PostgreSQL at the end" + m, Value: float64(f.NotOffline), Unit: "devices", Target: "0"})
	}
	return out
}

// StoredTimeline is the run's messages stored per second, as Seconds of
// the report's timeline chart (OK: stored; P50/P99: end to end).
func (r FleetConnectResult) StoredTimeline() []Second {
	out := make([]Second, len(r.Timeline))
	for i, s := range r.Timeline {
		out[i] = Second{T: s.T, OK: s.Stored, P50Ms: s.P50Ms, P99Ms: s.P99Ms}
	}
	return out
}
