// Command bench runs devicehub's end-to-end benchmarks against the real
// services and writes, per run, report.json, summary.md and timeline.svg
// under bench/results/<timestamp>/ (git-ignored):
//
//	go run ./cmd/bench <ingest|dashboard|dashboard-mixed|api|commands|live|soak|fleet|fleet-connect|shadow|firmware|alarms|storage|forward|all> [flags]
//
// Every figure is printed as a ratio to a ceiling or baseline measured in
// the same run: broker pass-through and raw ClickHouse inserts (ingest), a
// bare Fiber handler in this process (api, commands), the PostgreSQL raw
// table (dashboard aggregates). The ingest, api and commands scenarios run
// the real devicehub binary as a child process (built once per run) and
// report its peak RSS and the CPU of each process. fleet (not part of all)
// runs private brokers of its own: devicehub's device-login plugin filled
// to a million logins, beside Mosquitto's dynamic-security plugin
// (bench/fleet.go); -fleet-* flags scale it down for a smoke run.
// fleet-connect (not part of all) connects 100,000 devices at once, each
// on its own login, over a pool of brokers (a generator child process of
// this binary per broker): first the ceilings (the same connect and
// broker-restart storms against brokers with no plugin, and against the
// pool with devicehub detached), then with devicehub attached; it
// restarts every broker and then devicehub under them and counts what was
// lost (bench/fleetconnect.go). A bound not reached is reported as such
// and the later phases still run; it exits 1 naming the missed targets.
// -fc-* flags size it.
// forward (not part of all) offers 10,000 reports/s to a devicehub with a
// forwarding rule to a webhook in this process: the webhook's lag, ingest's
// rate with the webhook down (-forward-outage, 5 min) against up, the
// backlog's catch-up, and alarm raised -> notification received
// (bench/forward.go).
// shadow (not part of all) measures a storm of devices reconnecting,
// each with a pending delta, against the same storm without
// (bench/shadow.go); -shadow-devices sizes it.
// alarms (not part of all) runs devicehub with 100,000 devices of a product
// with 10 alarm rules: ingest bursts with the rules off and on, report ->
// alarm event on /api/live at 10,000 reports/s with 1% raising, and in
// this process the rule state per device and 1,000,000 no-data timers
// (bench/alarms.go); -alarm-* flags size it.
// firmware (not part of all) has 10,000 simulated devices (bench/fwdevice
// updaters) fetch a 1 MiB package at once, first from Go's http.FileServer
// (a child process of this binary), then through a devicehub rollout:
// download MB/s, the serving process's peak RSS and CPU, and the time
// until all are UPDATED (bench/firmware.go); -fw-* flags size it.
// storage (not part of all) generates a fleet's
// history (100M property values by default) into a database of its own and
// reports the bytes of every table and column per stored value, with
// insert and query rates of the same run (bench/storage.go);
// -storage-servers runs it against several servers one after the other.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"devicehub/bench"
)

const usage = `usage: go run ./cmd/bench <ingest|dashboard|dashboard-mixed|api|commands|live|soak|fleet|fleet-connect|shadow|firmware|alarms|storage|forward|all> [flags]

Runs the scenario against PostgreSQL, ClickHouse and Mosquitto (make services)
and writes report.json, summary.md and timeline.svg to -out/<timestamp>/.

flags:
`

// benchGCPercent is this process's GC target (see main).
const benchGCPercent = 400

func main() {
	bench.MaybeRunFleetGen()   // a fleet-connect generator child of this binary
	bench.MaybeRunFileServer() // the firmware scenario's http.FileServer child
	if len(os.Args) < 2 || strings.HasPrefix(os.Args[1], "-") {
		fmt.Fprint(os.Stderr, usage)
		newFlags().fs.PrintDefaults()
		os.Exit(2)
	}
	scenario := os.Args[1]
	f := newFlags()
	_ = f.fs.Parse(os.Args[2:])
	// The load clients and the ceilings' clients run in this process. With
	// Go's default GOGC and the small heap of a fresh process, the paho
	// publisher and subscriber of the first broker ceiling spent a quarter
	// of their CPU more than a minute later, which took the ceiling down by
	// up to a third and flattered every ratio to it (BENCHMARKS.md). A
	// larger GC target keeps what this process measures from depending on
	// its own heap. GOGC, when set, wins; the devicehub child keeps Go's
	// default unless GOGC is set for both.
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(benchGCPercent)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if f.cpuprofile != "" {
		pf, err := os.Create(f.cpuprofile)
		if err == nil {
			err = pprof.StartCPUProfile(pf)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench: -cpuprofile:", err)
			os.Exit(2)
		}
		defer pf.Close()
		defer pprof.StopCPUProfile()
	}
	if err := run(ctx, scenario, f); err != nil {
		pprof.StopCPUProfile()
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

type flags struct {
	fs                                                *flag.FlagSet
	out, broker, clickhouse, postgres, cpuprofile     string
	clickhouseCluster                                 string
	cmdDevices, cmdConc, cmdRequests, cmdWarmup       int
	cmdRates                                          string
	apiDevices, apiProducts, apiConc, apiReqs         int
	apiCachedReqs                                     int
	ingestDevices, ingestPublishers, ingestConns      int
	ingestDuration, brokerDuration, chDuration        time.Duration
	ingestQoS, serverBin, serverFlags                 string
	dashSizes, dashPGSizes                            string
	dashIter, dashConc                                int
	dashReqs, dashPropRows                            int
	dashKeep                                          bool
	dashPrefix                                        string
	dashMixedMsgs, dashMixedReqs, dashIngestRate      int
	dashMixedKinds                                    string
	dashMixedUncached                                 int
	soakDuration                                      time.Duration
	soakRate, soakDevices                             int
	liveRate, liveDevices, liveWatched, liveSubs      int
	liveDuration                                      time.Duration
	fleetDevices, fleetBatch, fleetClients            int
	fleetLogins, fleetVerify, fleetChurnRate          int
	fleetChurnPool, fleetWorkers                      int
	fleetIngestDevices, fleetIngestInflight           int
	fleetIngestRounds, fleetDynsecChanges             int
	fleetBaseline, fleetChurn, fleetProbe             time.Duration
	fleetIngestDuration, fleetDynsecTime              time.Duration
	fleetSyncTimeout                                  time.Duration
	fleetDynsecSizes                                  string
	fcDevices, fcBrokers, fcConcurrency, fcPerAddress int
	fcProbes, fcGenNice                               int
	fcGenCPUs                                         float64
	fcInterval, fcSteady, fcTimeout                   time.Duration
	fcSkipBroker, fcSkipDevicehub, fcSkipCeilings     bool
	shadowDevices                                     int
	shadowTimeout                                     time.Duration
	alarmDevices, alarmRate, alarmWatched             int
	alarmRounds, alarmTimers                          int
	alarmDuration, alarmTimerFor, alarmTimeout        time.Duration
	alarmTimerSpread                                  time.Duration
	alarmSkipServer, alarmOwnSession                  bool
	fwdRate, fwdDevices, fwdAlarms                    int
	fwdSteady, fwdOutage, fwdTimeout                  time.Duration
	fwDevices, fwSize, fwRate, fwGateways             int
	fwTimeout                                         time.Duration
	storageValues, storageQueries, storageInsert      int
	storageSpan                                       time.Duration
	storageServers                                    string
	storageKeep, storageLayouts                       bool
}

func newFlags() *flags {
	f := &flags{fs: flag.NewFlagSet("bench", flag.ExitOnError)}
	fs := f.fs
	fs.StringVar(&f.out, "out", "bench/results", "results directory; each run writes a <timestamp> folder in it")
	fs.StringVar(&f.broker, "broker", envOr("DEVICEHUB_MQTT_URL", "tcp://127.0.0.1:1884"), "MQTT broker URL")
	fs.StringVar(&f.clickhouse, "clickhouse", envOr("DEVICEHUB_CLICKHOUSE_ADDR", "127.0.0.1:9000"), "ClickHouse native address (with -clickhouse-cluster: a node of it, or a comma-separated list tried in order)")
	fs.StringVar(&f.clickhouseCluster, "clickhouse-cluster", os.Getenv("DEVICEHUB_CLICKHOUSE_CLUSTER"),
		"ingest, dashboard: spread the tables over this ClickHouse cluster, e.g. devicehub for `make cluster` with -clickhouse=127.0.0.1:9111,127.0.0.1:9121 (empty: one server)")
	fs.StringVar(&f.postgres, "postgres", envOr("DEVICEHUB_TEST_POSTGRES", "postgres://postgres@127.0.0.1:5432"), "PostgreSQL server DSN (no database)")
	fs.StringVar(&f.cpuprofile, "cpuprofile", "", "write a CPU profile of this process (load clients, devices, in-process ceilings; not the devicehub child: see -server-flags=-pprof-addr=...) to this file")
	fs.IntVar(&f.cmdDevices, "cmd-devices", 100, "commands: simulated devices")
	fs.IntVar(&f.cmdConc, "cmd-concurrency", 1000, "commands: concurrent reads (keep-alive clients)")
	fs.IntVar(&f.cmdRequests, "cmd-requests", 20000, "commands: measured reads")
	fs.IntVar(&f.cmdWarmup, "cmd-warmup", 0, "commands: warm-up reads (0: 2 x concurrency)")
	fs.StringVar(&f.cmdRates, "cmd-rate", "0,1000", "commands: comma-separated runs, each paced reads/s (open loop) or 0 for closed loop (every connection always has a read in flight)")
	fs.IntVar(&f.apiDevices, "api-devices", 100000, "api: seeded devices")
	fs.IntVar(&f.apiProducts, "api-products", 1000, "api: seeded products")
	fs.IntVar(&f.apiConc, "api-concurrency", 16, "api: concurrent clients")
	fs.IntVar(&f.apiReqs, "api-requests", 2000, "api: measured requests per query")
	fs.IntVar(&f.apiCachedReqs, "api-cached-requests", 50000, "api: measured requests per query with the page cache warm, and of the bare Fiber ceiling")
	fs.IntVar(&f.ingestDevices, "ingest-devices", 1000, "ingest: simulated devices")
	fs.IntVar(&f.ingestPublishers, "ingest-publishers", 4, "ingest: publishing connections")
	fs.DurationVar(&f.ingestDuration, "ingest-duration", 15*time.Second, "ingest: publishing time")
	fs.DurationVar(&f.brokerDuration, "broker-duration", 5*time.Second, "ingest: broker ceiling publishing time")
	fs.DurationVar(&f.chDuration, "clickhouse-duration", 0, "ingest: raw ClickHouse insert ceiling time (0: as -broker-duration)")
	fs.IntVar(&f.ingestConns, "ingest-connections", 0, "ingest: the server's subscriber connections (0: its default)")
	fs.StringVar(&f.serverBin, "server-bin", "", "every scenario with a devicehub child: a built cmd/devicehub to run (default: go build it once per run)")
	fs.StringVar(&f.serverFlags, "server-flags", "", "every scenario with a devicehub child: extra flags of it, space-separated (e.g. \"-ingest-batch-rows=100000 -pprof-addr=127.0.0.1:6060\"; api and commands run it with -roles api unless this says otherwise)")
	fs.StringVar(&f.ingestQoS, "ingest-qos", "0,1", "ingest: QoS levels, comma-separated")
	fs.StringVar(&f.dashSizes, "dash-sizes", "1000000", "dashboard: message counts, comma-separated")
	fs.StringVar(&f.dashPGSizes, "dash-pg-sizes", "1000000", "dashboard: sizes also loaded into PostgreSQL for the baseline")
	fs.IntVar(&f.dashIter, "dash-iterations", 200, "dashboard: timed requests per query")
	fs.IntVar(&f.dashConc, "dash-concurrency", 64, "dashboard: clients of the concurrent runs, each beside a bare Fiber handler under the same load (1: none)")
	fs.IntVar(&f.dashReqs, "dash-requests", 20000, "dashboard: measured requests of each concurrent run (a quarter of it for the runs ClickHouse answers every request of)")
	fs.IntVar(&f.dashPropRows, "dash-prop-rows", 1000000, "dashboard: property values of the property-aggregate scenario (0: skip it)")
	fs.BoolVar(&f.dashKeep, "dash-keep", false, "dashboard: keep generated data for the next run")
	fs.IntVar(&f.storageValues, "storage-values", 100_000_000, "storage: property values to generate (10 a report)")
	fs.DurationVar(&f.storageSpan, "storage-span", 14*24*time.Hour, "storage: history length (shorter when -storage-values needs less)")
	fs.IntVar(&f.storageQueries, "storage-queries", 300, "storage: timed queries of each kind (history, 1h x24 aggregate)")
	fs.IntVar(&f.storageInsert, "storage-insert-values", 1_000_000, "storage: values stored again through tsdb.InsertBatch for the insert rate (0: skip)")
	fs.StringVar(&f.storageServers, "storage-servers", "", "storage: comma-separated ClickHouse addresses to run against one after the other, e.g. one per compression config (empty: -clickhouse)")
	fs.BoolVar(&f.storageKeep, "storage-keep", false, "storage: keep the generated databases (devicehub_bench_storage_<n>)")
	fs.BoolVar(&f.storageLayouts, "storage-layouts", false, "storage: also copy a sample into each candidate layout of device_property (slow)")
	fs.StringVar(&f.dashPrefix, "dash-prefix", "devicehub_bench", "dashboard, dashboard-mixed: prefix of the generated ClickHouse databases and of the metadata database (two benches sharing the servers each need their own)")
	fs.IntVar(&f.dashMixedMsgs, "dash-mixed-msgs", 200000, "dashboard, dashboard-mixed: messages (each with 2 property values) of the mixed scenario, every request distinct under live ingest (0: skip it)")
	fs.IntVar(&f.dashMixedReqs, "dash-mixed-requests", 5000, "dashboard, dashboard-mixed: measured requests of each mixed run through the result cache (see -dash-mixed-uncached-requests for the others)")
	fs.IntVar(&f.dashIngestRate, "dash-ingest-rate", 10000, "dashboard, dashboard-mixed: reports/s stored during the mixed runs (0: none)")
	fs.IntVar(&f.dashMixedUncached, "dash-mixed-uncached-requests", 0, "dashboard, dashboard-mixed: measured requests of each mixed run without the result cache (0: a quarter of -dash-mixed-requests)")
	fs.StringVar(&f.dashMixedKinds, "dash-mixed-kinds", "mixed", "dashboard, dashboard-mixed: comma-separated kinds of distinct requests, each in its runs: mixed (counts and property aggregates), counts (message counts only), aggs (property aggregates only, product-wide, 1h x168)")
	fs.DurationVar(&f.soakDuration, "soak-duration", 10*time.Minute, "soak: publishing time (faults at 20%, 45% and 70% of it)")
	fs.IntVar(&f.soakRate, "soak-rate", 2000, "soak: QoS 1 reports per second")
	fs.IntVar(&f.soakDevices, "soak-devices", 100, "soak: devices")
	fs.IntVar(&f.liveRate, "live-rate", 2000, "live: QoS 1 reports per second (the soak's load)")
	fs.IntVar(&f.liveDevices, "live-devices", 100, "live: devices publishing")
	fs.IntVar(&f.liveWatched, "live-watched", 10, "live: devices each subscriber watches")
	fs.IntVar(&f.liveSubs, "live-subscribers", 4, "live: GET /api/live streams")
	fs.DurationVar(&f.liveDuration, "live-duration", 20*time.Second, "live: publishing time of each phase")
	fs.IntVar(&f.fleetDevices, "fleet-devices", 100000, "fleet: devices provisioned through the bulk API (phase 1)")
	fs.IntVar(&f.fleetBatch, "fleet-batch", 10000, "fleet: devices per bulk create call (at most 10,000)")
	fs.IntVar(&f.fleetClients, "fleet-clients", 4, "fleet: bulk calls at a time")
	fs.IntVar(&f.fleetVerify, "fleet-verify", 100, "fleet: devices each login check tries")
	fs.IntVar(&f.fleetLogins, "fleet-logins", 1000000, "fleet: logins after the PostgreSQL fill (phase 2; <= -fleet-devices skips the fill)")
	fs.DurationVar(&f.fleetSyncTimeout, "fleet-sync-timeout", 10*time.Minute, "fleet: bound of the full sync after the fill")
	fs.DurationVar(&f.fleetProbe, "fleet-probe-interval", 20*time.Millisecond, "fleet: a connected device's QoS 1 report interval (PUBACK probe)")
	fs.DurationVar(&f.fleetBaseline, "fleet-baseline", 10*time.Second, "fleet: quiet PUBACK probing before the churn")
	fs.DurationVar(&f.fleetChurn, "fleet-churn", 30*time.Second, "fleet: churn time (phases 3-4; negative skips them)")
	fs.IntVar(&f.fleetChurnRate, "fleet-churn-rate", 100, "fleet: deploy/undeploy/rotate calls per second during the churn")
	fs.IntVar(&f.fleetChurnPool, "fleet-churn-pool", 1000, "fleet: devices the churn cycles through")
	fs.IntVar(&f.fleetWorkers, "fleet-workers", 16, "fleet: API clients of the churn")
	fs.IntVar(&f.fleetIngestDevices, "fleet-ingest-devices", 1000, "fleet: devices publishing in the plugin vs dynamic-security comparison (phase 5; negative skips it)")
	fs.IntVar(&f.fleetIngestInflight, "fleet-ingest-inflight", 4, "fleet: unacknowledged QoS 1 publishes per device (closed loop)")
	fs.DurationVar(&f.fleetIngestDuration, "fleet-ingest-duration", 10*time.Second, "fleet: publishing time of each phase 5 round and side")
	fs.IntVar(&f.fleetIngestRounds, "fleet-ingest-rounds", 3, "fleet: phase 5 rounds (each measures both brokers, the order alternating; medians are reported)")
	fs.StringVar(&f.fleetDynsecSizes, "fleet-dynsec-sizes", "1000,10000", "fleet: device logins in the dynamic-security file, comma-separated (phase 6; empty skips it)")
	fs.IntVar(&f.fleetDynsecChanges, "fleet-dynsec-changes", 20, "fleet: devices created one command at a time at each dynamic-security size")
	fs.DurationVar(&f.fleetDynsecTime, "fleet-dynsec-time", 2*time.Minute, "fleet: time bound of the changes at each dynamic-security size")
	fs.IntVar(&f.fcDevices, "fc-devices", 100000, "fleet-connect: devices provisioned and connected at once (batch and clients: -fleet-batch, -fleet-clients)")
	fs.IntVar(&f.fcBrokers, "fc-brokers", 0, "fleet-connect: brokers in the pool, each with its share of the devices and a generator process; 0: enough for at most 18,000 devices each (the 20,000 open files a process may have)")
	fs.DurationVar(&f.fcInterval, "fc-interval", 10*time.Second, "fleet-connect: a device's QoS 1 report interval")
	fs.DurationVar(&f.fcSteady, "fc-steady", 60*time.Second, "fleet-connect: measured window with every device connected")
	fs.IntVar(&f.fcConcurrency, "fc-concurrency", 256, "fleet-connect: dials in flight")
	fs.IntVar(&f.fcPerAddress, "fc-per-address", 20000, "fleet-connect: connections per loopback source address (127.0.0.2, ...)")
	fs.IntVar(&f.fcProbes, "fc-probes", 1000, "fleet-connect: devices whose reports are timed publish to stored")
	fs.Float64Var(&f.fcGenCPUs, "fc-gen-cpus", 0, "fleet-connect: cap the generator children together at this many cores in every phase, the ceilings' and devicehub's (a cgroup CPU quota; needs root); 0: no cap")
	fs.IntVar(&f.fcGenNice, "fc-gen-nice", 0, "fleet-connect: nice value of the generator children, which stand for devices on other machines (19: devicehub, brokers and databases served first; 0: the bench's own priority)")
	fs.DurationVar(&f.fcTimeout, "fc-timeout", 3*time.Minute, "fleet-connect: bound of each wait (all connected, state correct, drained); a ceiling storm waits up to twice it, devicehub's storms past their target of 1.5x the ceiling")
	fs.BoolVar(&f.fcSkipBroker, "fc-skip-broker-restart", false, "fleet-connect: no broker restart")
	fs.BoolVar(&f.fcSkipDevicehub, "fc-skip-devicehub-restart", false, "fleet-connect: no devicehub restart")
	fs.BoolVar(&f.fcSkipCeilings, "fc-skip-ceilings", false, "fleet-connect: no ceilings (the same storms without devicehub, against brokers without the plugin and with it)")
	fs.IntVar(&f.shadowDevices, "shadow-devices", 10000, "shadow: devices reconnecting at once, each storm")
	fs.DurationVar(&f.shadowTimeout, "shadow-timeout", 5*time.Minute, "shadow: bound of each wait (a storm drained, every delta delivered)")
	fs.IntVar(&f.alarmDevices, "alarm-devices", 100000, "alarms: devices of the product with 10 rules")
	fs.IntVar(&f.alarmRate, "alarm-rate", 10000, "alarms: reports/s of the latency phase (1% raise an alarm)")
	fs.IntVar(&f.alarmWatched, "alarm-watched", 1000, "alarms: crossing devices watched on /api/live (streams of 100)")
	fs.IntVar(&f.alarmRounds, "alarm-rounds", 2, "alarms: throughput rounds (a burst of one report per device with the rules off, then on)")
	fs.IntVar(&f.alarmTimers, "alarm-timers", 1000000, "alarms: devices of the in-process no-data timer measure")
	fs.DurationVar(&f.alarmDuration, "alarm-duration", 30*time.Second, "alarms: length of the latency phase")
	fs.DurationVar(&f.alarmTimerFor, "alarm-timer-for", 30*time.Second, "alarms: the no-data timers' D")
	fs.DurationVar(&f.alarmTimerSpread, "alarm-timer-spread", 10*time.Second, "alarms: the no-data timers' deadlines fall within this span")
	fs.DurationVar(&f.alarmTimeout, "alarm-timeout", 5*time.Minute, "alarms: bound of each wait")
	fs.BoolVar(&f.alarmSkipServer, "alarm-skip-server", false, "alarms: only the in-process measures (rule state, timers)")
	fs.BoolVar(&f.alarmOwnSession, "alarm-own-session", false, "alarms: devicehub with a share group, the evaluator on a session of its own (default: none, on ingest's)")
	fs.IntVar(&f.fwdRate, "forward-rate", 10000, "forward: reports/s offered")
	fs.IntVar(&f.fwdDevices, "forward-devices", 1000, "forward: devices the reports go round")
	fs.IntVar(&f.fwdAlarms, "forward-alarms", 200, "forward: alarms raised during the phase with the sink up")
	fs.DurationVar(&f.fwdSteady, "forward-steady", time.Minute, "forward: the phase with the webhook up")
	fs.DurationVar(&f.fwdOutage, "forward-outage", 5*time.Minute, "forward: the phase with the webhook answering 503")
	fs.DurationVar(&f.fwdTimeout, "forward-timeout", 10*time.Minute, "forward: bound of the catch-up after the outage")
	fs.IntVar(&f.fwDevices, "fw-devices", 10000, "firmware: devices downloading the package at once")
	fs.IntVar(&f.fwSize, "fw-size", 1<<20, "firmware: package size in bytes")
	fs.IntVar(&f.fwRate, "fw-rate", 100000, "firmware: the rollout's devices started per minute (100,000: all at once)")
	fs.IntVar(&f.fwGateways, "fw-gateways", 4, "firmware: MQTT connections playing the devices")
	fs.DurationVar(&f.fwTimeout, "fw-timeout", 10*time.Minute, "firmware: bound of each phase (every device UPDATED)")
	return f
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func ints(s string) ([]int, error) {
	var out []int
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		n, err := strconv.Atoi(p)
		if err != nil {
			return nil, fmt.Errorf("%q is not a number", p)
		}
		out = append(out, n)
	}
	return out, nil
}

// splitList is the non-empty items of a comma-separated list.
func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func floats(s string) ([]float64, error) {
	var out []float64
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		n, err := strconv.ParseFloat(p, 64)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("%q is not a rate", p)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, errors.New("no rate")
	}
	return out, nil
}

func run(ctx context.Context, scenario string, f *flags) error {
	all := []string{"ingest", "dashboard", "api", "commands", "live"}
	var scenarios []string
	switch scenario {
	case "all":
		scenarios = all
	case "ingest", "dashboard", "dashboard-mixed", "api", "commands", "live", "soak", "fleet", "fleet-connect", "shadow", "firmware", "alarms", "storage", "forward":
		// soak is not part of all: it stops the services; nor are fleet
		// and fleet-connect: they fill a private broker with a million
		// logins, or connect 100,000 devices (minutes).
		scenarios = []string{scenario}
	default:
		return fmt.Errorf("unknown scenario %q (want ingest, dashboard, dashboard-mixed, api, commands, live, soak, fleet, fleet-connect, shadow, firmware, alarms, storage, forward or all)", scenario)
	}
	// Live progress only on a terminal; logs and results to stdout always.
	var progress io.Writer
	if fi, err := os.Stdout.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
		progress = os.Stdout
	}
	logf := func(format string, args ...any) {
		fmt.Printf("%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
	}

	started := time.Now()
	rep := &bench.Report{
		Scenario: scenario, Command: "go run ./cmd/bench " + strings.Join(os.Args[1:], " "), Started: started,
		Machine: bench.CollectMachine(), Versions: bench.CollectVersions(ctx, strings.Split(f.clickhouse, ",")[0], f.postgres),
		Results: map[string]any{}, Timelines: map[string][]bench.Second{},
	}
	gcPercent := debug.SetGCPercent(-1) // read it: set it back at once
	debug.SetGCPercent(gcPercent)
	logf("machine: %d CPUs, %.1f GiB; ClickHouse %s, PostgreSQL %s, %s; this process's GC percent %d", rep.Machine.CPUs,
		float64(rep.Machine.MemTotalB)/(1<<30), rep.Versions.ClickHouse, rep.Versions.PostgreSQL, rep.Versions.Mosquitto, gcPercent)
	if bs, ok, err := bench.ReadBrokerState(f.broker, 11*time.Second); err != nil {
		logf("broker: %v", err)
	} else if ok {
		rep.Broker = &bs
		logf("broker at start: %s", bs)
		if bs.Disconnected > 0 || bs.StoredMessages > 1000 {
			logf("WARNING: the broker keeps sessions of clients that are gone and queues messages for them; " +
				"broker-bound figures will be low. Stop `make run` and clear its sessions, or use a fresh broker.")
		}
	}
	// The devicehub binary the scenarios run as a child: -server-bin, else
	// built once, when a scenario first needs it.
	var (
		binOnce sync.Once
		bin     = f.serverBin
		binErr  error
		binDir  string
	)
	defer func() {
		if binDir != "" {
			os.RemoveAll(binDir)
		}
	}()
	serverBin := func() (string, error) {
		binOnce.Do(func() {
			if bin != "" {
				return
			}
			if binDir, binErr = os.MkdirTemp("", "devicehub-bench-bin-"); binErr != nil {
				return
			}
			logf("building cmd/devicehub")
			bin, binErr = bench.BuildServer(ctx, binDir)
		})
		return bin, binErr
	}
	var failed []string
	for _, s := range scenarios {
		if ctx.Err() != nil {
			break
		}
		logf("scenario %s", s)
		if err := runScenario(ctx, s, f, serverBin, rep, progress, logf); err != nil {
			rep.Errors = append(rep.Errors, s+": "+err.Error())
			failed = append(failed, s)
			logf("scenario %s failed: %v", s, err)
		}
	}
	rep.Seconds = time.Since(started).Seconds()
	dir := filepath.Join(f.out, started.Format("20060102-150405"))
	if err := bench.WriteReport(dir, rep); err != nil {
		return err
	}
	fmt.Println()
	fmt.Print(bench.Markdown(rep))
	fmt.Printf("\nwritten: %s/{report.json,summary.md,timeline.svg}\n", dir)
	if len(failed) > 0 {
		return fmt.Errorf("failed: %s", strings.Join(failed, ", "))
	}
	return ctx.Err()
}

// cpuFigures adds one figure per process of each CPU breakdown: its CPU
// time per message or request, the CPU-seconds and cores in the name;
// and how long this process's goroutines waited for a CPU.
func cpuFigures(add func(bench.Figure), prefix string, cpu ...bench.CPUBreakdown) {
	for _, c := range cpu {
		if c.WallSeconds == 0 {
			continue
		}
		unit := c.Unit
		if unit == "" {
			unit = "msg"
		}
		procs := append(append([]bench.ProcCPU(nil), c.Procs...), c.Total)
		if c.Machine != nil {
			procs = append(procs, *c.Machine)
		}
		for _, pc := range procs {
			add(bench.Figure{Name: fmt.Sprintf("%sCPU, %s: %s (%.2f CPU-s, %.2f of %d cores)", prefix, c.Phase, pc.Label(), pc.Seconds, pc.Cores, c.MachineCores),
				Value: pc.MicrosPerMsg, Unit: "µs/" + unit})
		}
		if w := c.SchedWait; w != nil {
			add(bench.Figure{Name: fmt.Sprintf("%sCPU, %s: this process's goroutines waited for a CPU, p99 of %d sampled wake-ups (p50 %.2f ms)", prefix, c.Phase, w.Count, w.P50Ms),
				Value: w.P99Ms, Unit: "ms"})
		}
	}
}

func runScenario(ctx context.Context, s string, f *flags, serverBin func() (string, error), rep *bench.Report, progress io.Writer, logf func(string, ...any)) error {
	add := func(fig bench.Figure) { fig.Scenario = s; rep.Figures = append(rep.Figures, fig) }
	// child is the devicehub child of a scenario that starts one, running bin.
	child := func(bin string) bench.ChildParams {
		return bench.ChildParams{PostgresDSN: f.postgres, ClickHouseAddr: f.clickhouse, ServerBinary: bin,
			ServerArgs: strings.Fields(f.serverFlags), Logf: logf}
	}
	// result records a scenario's result and its figures, and returns the
	// scenario's error.
	result := func(r interface{ Figures() []bench.Figure }, err error) error {
		rep.Results[s] = r
		logf("%s", r)
		for _, fig := range r.Figures() {
			add(fig)
		}
		return err
	}
	switch s {
	case "commands":
		bin, err := serverBin()
		if err != nil {
			return err
		}
		rates, err := floats(f.cmdRates)
		if err != nil {
			return fmt.Errorf("-cmd-rate: %w", err)
		}
		var results []bench.CommandsResult
		for _, rate := range rates {
			mode := "closed loop"
			if rate > 0 {
				mode = fmt.Sprintf("%.0f reads/s", rate)
			}
			r, err := bench.RunCommands(ctx, bench.CommandsParams{Devices: f.cmdDevices, Concurrency: f.cmdConc,
				Requests: f.cmdRequests, Warmup: f.cmdWarmup, Rate: rate, BrokerURL: f.broker,
				Progress: progress, ChildParams: child(bin)})
			results = append(results, r)
			rep.Results[s] = results
			rep.Timelines["commands: read property, "+mode] = r.Reads.Timeline
			if err != nil {
				return err
			}
			logf("%s", r)
			fig := func(name string, v float64, unit string, base float64, target string) {
				x := bench.Figure{Name: name, Value: v, Unit: unit, Target: target}
				if r.Ceiling != nil {
					x.Against, x.Baseline, x.Ratio = "bare Fiber handler, same load", base, bench.Ratio(v, base)
				}
				add(x)
			}
			var c bench.LoadResult
			if r.Ceiling != nil {
				c = *r.Ceiling
				rep.Timelines["commands: bare Fiber ceiling, "+mode] = c.Timeline
			}
			m := fmt.Sprintf(" (%s, %d connections, %d devices)", mode, r.Params.Concurrency, r.Params.Devices)
			fig("read p50"+m, r.Reads.Latency.P50Ms, "ms", c.Latency.P50Ms, "<= 2 ms")
			fig("read p90"+m, r.Reads.Latency.P90Ms, "ms", c.Latency.P90Ms, "")
			fig("read p99"+m, r.Reads.Latency.P99Ms, "ms", c.Latency.P99Ms, "<= 10 ms")
			fig("read max"+m, r.Reads.Latency.MaxMs, "ms", c.Latency.MaxMs, "")
			fig("reads/s (sustained median)"+m, r.Reads.SustainedRPS, "req/s", c.SustainedRPS, "")
			add(bench.Figure{Name: fmt.Sprintf("peak RSS (devicehub server process, roles %s)%s", r.ServerRoles, m), Value: float64(r.PeakRSS) / (1 << 20), Unit: "MiB"})
			add(bench.Figure{Name: "peak RSS (bench process: HTTP clients and simulated devices)" + m, Value: float64(r.BenchRSS) / (1 << 20), Unit: "MiB"})
			cpuFigures(add, mode+" ", r.CPU)
			if r.Ceiling != nil && r.Ceiling.CPU != nil {
				cpuFigures(add, mode+" ", *r.Ceiling.CPU)
			}
		}
	case "api":
		bin, err := serverBin()
		if err != nil {
			return err
		}
		r, err := bench.RunAPI(ctx, bench.APIParams{Devices: f.apiDevices, Products: f.apiProducts, Concurrency: f.apiConc,
			Requests: f.apiReqs, CachedRequests: f.apiCachedReqs, BrokerURL: f.broker,
			Progress: progress, ChildParams: child(bin)})
		rep.Results[s] = r
		for _, q := range r.Queries {
			rep.Timelines["api: "+q.Name] = q.Load.Timeline
		}
		if err != nil {
			return err
		}
		logf("%s", r)
		var c bench.LoadResult
		against := ""
		if r.Ceiling != nil {
			c, against = *r.Ceiling, "bare Fiber handler"
			rep.Timelines["api: bare Fiber ceiling"] = c.Timeline
		}
		for _, q := range r.Queries {
			if q.Limited { // the product scope's cost, against the administrator's same query
				add(bench.Figure{Name: q.Name + " p50 / administrator's", Value: q.ScopeP50Ratio, Unit: "x", Target: "<= 1.05"})
				add(bench.Figure{Name: q.Name + " req/s / administrator's", Value: q.ScopeRPSRatio, Unit: "x", Target: ">= 0.95"})
			}
			add(bench.Figure{Name: q.Name + " p50", Value: q.Load.Latency.P50Ms, Unit: "ms", Against: against, Baseline: c.Latency.P50Ms, Ratio: q.P50Ratio})
			add(bench.Figure{Name: q.Name + " p99", Value: q.Load.Latency.P99Ms, Unit: "ms", Against: against, Baseline: c.Latency.P99Ms, Ratio: q.P99Ratio})
			add(bench.Figure{Name: q.Name + " req/s", Value: q.Load.SustainedRPS, Unit: "req/s", Against: against, Baseline: c.SustainedRPS, Ratio: q.RPSRatio})
		}
		add(bench.Figure{Name: fmt.Sprintf("peak RSS (devicehub server process, roles %s)", r.ServerRoles), Value: float64(r.PeakRSS) / (1 << 20), Unit: "MiB"})
		add(bench.Figure{Name: "peak RSS (bench process: load clients)", Value: float64(r.BenchRSS) / (1 << 20), Unit: "MiB"})
		for _, q := range r.Queries {
			cpuFigures(add, "", q.CPU)
		}
	case "live":
		bin, err := serverBin()
		if err != nil {
			return err
		}
		r, err := bench.RunLive(ctx, bench.LiveParams{Rate: f.liveRate, Devices: f.liveDevices, QoS: 1, Watched: f.liveWatched,
			Subscribers: f.liveSubs, Duration: f.liveDuration, BrokerURL: f.broker,
			ChildParams: child(bin)})
		rep.Results[s] = r
		if err != nil {
			return err
		}
		logf("%s", r)
		m := fmt.Sprintf(" (%d reports/s, %d devices watched by %d streams)", r.Params.Rate, r.Params.Watched, r.Params.Subscribers)
		for _, x := range []struct {
			name, target string
			l            bench.LiveLatency
		}{{"published -> received", "", r.EndToEnd}, {"stored -> received", "<= 200 ms", r.AfterStorage}} {
			add(bench.Figure{Name: x.name + " p50" + m, Value: x.l.Latency.P50Ms, Unit: "ms"})
			add(bench.Figure{Name: x.name + " p99" + m, Value: x.l.Latency.P99Ms, Unit: "ms", Target: x.target})
			add(bench.Figure{Name: x.name + " max" + m, Value: x.l.Latency.MaxMs, Unit: "ms"})
			add(bench.Figure{Name: x.name + " skipped" + m, Value: float64(x.l.Skipped), Unit: "events", Target: "0"})
		}
		add(bench.Figure{Name: "peak RSS (devicehub server process)" + m, Value: float64(r.PeakRSS) / (1 << 20), Unit: "MiB"})
	case "fleet":
		bin, err := serverBin()
		if err != nil {
			return err
		}
		sizes, err := ints(f.fleetDynsecSizes)
		if err != nil {
			return fmt.Errorf("-fleet-dynsec-sizes: %w", err)
		}
		if sizes == nil {
			sizes = []int{} // none: skip phase 6
		}
		r, err := bench.RunFleet(ctx, bench.FleetParams{Devices: f.fleetDevices, Batch: f.fleetBatch, Clients: f.fleetClients,
			Verify: f.fleetVerify, Logins: f.fleetLogins, SyncTimeout: f.fleetSyncTimeout, ProbeInterval: f.fleetProbe,
			Baseline: f.fleetBaseline, Churn: f.fleetChurn, ChurnRate: f.fleetChurnRate, ChurnPool: f.fleetChurnPool,
			Workers: f.fleetWorkers, IngestDevices: f.fleetIngestDevices, IngestInflight: f.fleetIngestInflight,
			IngestDuration: f.fleetIngestDuration, IngestRounds: f.fleetIngestRounds, DynsecSizes: sizes,
			DynsecChanges: f.fleetDynsecChanges, DynsecTime: f.fleetDynsecTime,
			ChildParams: child(bin)})
		err = result(r, err)
		for _, ph := range r.Phases() {
			cpuFigures(add, "", ph.CPU)
		}
		if r.Churn != nil {
			rep.Timelines["fleet: PUBACK of a connected device, quiet then churn"] = r.Churn.Timeline
			rep.Timelines["fleet: churn calls"] = r.Churn.Ops.Timeline
		}
		return err
	case "shadow":
		bin, err := serverBin()
		if err != nil {
			return err
		}
		return result(bench.RunShadow(ctx, bench.ShadowParams{Devices: f.shadowDevices, Timeout: f.shadowTimeout,
			ChildParams: child(bin)}))
	case "alarms":
		var bin string
		if !f.alarmSkipServer {
			var err error
			if bin, err = serverBin(); err != nil {
				return err
			}
		}
		return result(bench.RunAlarms(ctx, bench.AlarmsParams{Devices: f.alarmDevices, Rate: f.alarmRate, Watched: f.alarmWatched,
			Rounds: f.alarmRounds, Timers: f.alarmTimers, Duration: f.alarmDuration, TimerFor: f.alarmTimerFor, TimerSpread: f.alarmTimerSpread, Timeout: f.alarmTimeout,
			SkipServer: f.alarmSkipServer, OwnSession: f.alarmOwnSession, ChildParams: child(bin)}))
	case "forward":
		bin, err := serverBin()
		if err != nil {
			return err
		}
		return result(bench.RunForward(ctx, bench.ForwardParams{Rate: f.fwdRate, Devices: f.fwdDevices, Alarms: f.fwdAlarms, Steady: f.fwdSteady,
			Outage: f.fwdOutage, Timeout: f.fwdTimeout, ChildParams: child(bin)}))
	case "firmware":
		bin, err := serverBin()
		if err != nil {
			return err
		}
		return result(bench.RunFirmware(ctx, bench.FirmwareParams{Devices: f.fwDevices, Size: f.fwSize, Rate: f.fwRate, Gateways: f.fwGateways,
			Timeout: f.fwTimeout, ChildParams: child(bin)}))
	case "fleet-connect":
		bin, err := serverBin()
		if err != nil {
			return err
		}
		r, err := bench.RunFleetConnect(ctx, bench.FleetConnectParams{Devices: f.fcDevices, Brokers: f.fcBrokers, Batch: f.fleetBatch, Clients: f.fleetClients,
			Interval: f.fcInterval, Steady: f.fcSteady, ConnectConcurrency: f.fcConcurrency, PerAddress: f.fcPerAddress,
			Probes: f.fcProbes, GenNice: f.fcGenNice, GenCPUs: f.fcGenCPUs, Timeout: f.fcTimeout, SkipBrokerRestart: f.fcSkipBroker, SkipDevicehubRestart: f.fcSkipDevicehub, SkipCeilings: f.fcSkipCeilings,
			ChildParams: child(bin)})
		rep.Timelines["fleet-connect: reports stored per second"] = r.StoredTimeline()
		return result(r, err)
	case "soak":
		bin, err := serverBin()
		if err != nil {
			return err
		}
		logf("soak: %s at %d QoS 1 reports/s from %d devices; the broker restarted, ClickHouse killed and PostgreSQL stopped on the way",
			f.soakDuration, f.soakRate, f.soakDevices)
		r, err := bench.RunSoak(ctx, bench.SoakParams{BrokerURL: f.broker, Duration: f.soakDuration, Rate: f.soakRate, Devices: f.soakDevices,
			ChildParams: child(bin)})
		rep.Results[s] = r
		if err != nil {
			return err
		}
		logf("soak: %s", r)
		add(bench.Figure{Name: "acknowledged reports", Value: float64(r.Acknowledged), Unit: "msgs"})
		add(bench.Figure{Name: "acknowledged and not stored", Value: float64(r.Lost), Unit: "msgs", Target: "0"})
		add(bench.Figure{Name: "duplicates stored", Value: float64(r.Duplicates), Unit: "rows"})
		add(bench.Figure{Name: "devicehub peak RSS", Value: float64(r.ServerPeakRSS) / (1 << 20), Unit: "MiB"})
		if r.Lost > 0 || r.ServerRestarted {
			return fmt.Errorf("soak: %d acknowledged reports lost, devicehub exited: %v", r.Lost, r.ServerRestarted)
		}
	case "ingest":
		qs, err := ints(f.ingestQoS)
		if err != nil {
			return fmt.Errorf("-ingest-qos: %w", err)
		}
		bin, err := serverBin()
		if err != nil {
			return err
		}
		var results []bench.IngestResult
		for _, q := range qs {
			logf("ingest: QoS %d, %d devices, %s (broker ceiling %s and raw ClickHouse ceiling first, the broker ceiling again after)", q, f.ingestDevices, f.ingestDuration, f.brokerDuration)
			r, err := bench.RunIngest(ctx, bench.IngestParams{BrokerURL: f.broker, ClickHouseCluster: f.clickhouseCluster,
				Devices: f.ingestDevices, Duration: f.ingestDuration, BrokerDuration: f.brokerDuration,
				ClickHouseDuration: f.chDuration, QoS: byte(q), Publishers: f.ingestPublishers, Connections: f.ingestConns,
				ChildParams: child(bin)})
			results = append(results, r)
			rep.Results[s] = results
			if err != nil {
				return err
			}
			logf("%s", r)
			add(bench.Figure{Name: fmt.Sprintf("QoS %d ingest msgs/s", q), Value: r.IngestRate, Unit: "msg/s",
				Against: fmt.Sprintf("broker pass-through (mean of %.0f before and %.0f after)", r.BrokerBefore, r.BrokerAfter), Baseline: r.BrokerRate, Ratio: r.Ratio, Target: ">= 0.8"})
			add(bench.Figure{Name: fmt.Sprintf("QoS %d ingest msgs/s", q), Value: r.IngestRate, Unit: "msg/s",
				Against: "raw ClickHouse insert (same rows, no MQTT)", Baseline: r.ClickHouse.Rate, Ratio: r.ClickHouseRatio})
			add(bench.Figure{Name: fmt.Sprintf("QoS %d ingest CPU bound msgs/s (cores / CPU per msg of pass-through + raw insert)", q), Value: r.CPUBound,
				Unit: "msg/s", Against: "broker pass-through", Baseline: r.BrokerRate, Ratio: r.BoundRatio})
			add(bench.Figure{Name: fmt.Sprintf("QoS %d raw ClickHouse insert msgs/s (%.0f rows/s)", q, r.ClickHouse.RowRate), Value: r.ClickHouse.Rate,
				Unit: "msg/s", Against: "broker pass-through", Baseline: r.BrokerRate, Ratio: bench.Ratio(r.ClickHouse.Rate, r.BrokerRate)})
			add(bench.Figure{Name: fmt.Sprintf("QoS %d ingest server peak RSS (devicehub process)", q), Value: float64(r.PeakRSS) / (1 << 20),
				Unit: "MiB", Target: "<= 200 MB (190.7 MiB)"})
			add(bench.Figure{Name: fmt.Sprintf("QoS %d generator peak RSS (bench process)", q), Value: float64(r.GeneratorRSS) / (1 << 20), Unit: "MiB"})
			cpuFigures(add, fmt.Sprintf("QoS %d ", q), r.CPU...)
		}
	case "dashboard":
		sizes, err := ints(f.dashSizes)
		if err != nil {
			return fmt.Errorf("-dash-sizes: %w", err)
		}
		pgSizes, err := ints(f.dashPGSizes)
		if err != nil {
			return fmt.Errorf("-dash-pg-sizes: %w", err)
		}
		propRows := f.dashPropRows
		if propRows == 0 {
			propRows = -1 // skip
		}
		r, err := bench.RunDashboard(ctx, bench.DashboardParams{Sizes: sizes, PGSizes: pgSizes, Iterations: f.dashIter,
			Concurrency: f.dashConc, Requests: f.dashReqs, PropRows: propRows, KeepData: f.dashKeep, Prefix: f.dashPrefix, ClickHouseAddr: f.clickhouse, ClickHouseCluster: f.clickhouseCluster, PostgresDSN: f.postgres, Logf: logf,
			MixedMessages: orSkip(f.dashMixedMsgs), MixedRequests: f.dashMixedReqs, MixedIngestRate: orSkip(f.dashIngestRate), MixedKinds: splitList(f.dashMixedKinds), MixedUncachedRequests: f.dashMixedUncached})
		rep.Results[s] = r
		if err != nil {
			return err
		}
		for _, z := range r.Sizes {
			n := fmt.Sprintf(" (%d msgs)", z.Rows)
			d30 := bench.Figure{Name: "1d x30 aggregate p50" + n, Value: z.Day30.P50, Unit: "ms"}
			m12 := bench.Figure{Name: "1M x12 aggregate p50" + n, Value: z.Month12.P50, Unit: "ms"}
			if z.PG != nil {
				// Ratio: how many times faster than PostgreSQL's raw table.
				d30.Against, d30.Baseline, d30.Ratio = "PostgreSQL raw table (speed-up)", z.PG.Day30.P50, z.PG.RatioDay30
				m12.Against, m12.Baseline, m12.Ratio = "PostgreSQL raw table (speed-up)", z.PG.Month12.P50, z.PG.RatioMonth12
			}
			add(d30)
			add(m12)
			add(bench.Figure{Name: "1d x30 aggregate p50, limited user / administrator's" + n, Value: z.Day30Scope, Unit: "x", Target: "<= 1.05"})
			add(bench.Figure{Name: "1M x12 aggregate p50, limited user / administrator's" + n, Value: z.Month12Scope, Unit: "x", Target: "<= 1.05"})
			add(bench.Figure{Name: "property history p50" + n, Value: z.History.P50, Unit: "ms"})
			dashLoadFigures(add, n, z.Concurrent, z.Ceiling)
			for _, d := range z.Concurrent {
				rep.Timelines["dashboard: "+d.Name+n] = d.Load.Timeline
			}
		}
		if r.Mixed != nil {
			mixedFigures(add, rep, *r.Mixed)
		}
		if pa := r.Props; pa != nil {
			n := fmt.Sprintf(" (%d property values)", pa.Rows)
			add(bench.Figure{Name: fmt.Sprintf("property avg 1h x24, one device p50 (%d rows read)", pa.DeviceRowsRead) + n, Value: pa.Device.P50, Unit: "ms"})
			add(bench.Figure{Name: "property avg 1h x24, one device p99" + n, Value: pa.Device.P99, Unit: "ms", Target: "<= 20 ms"})
			add(bench.Figure{Name: fmt.Sprintf("property avg 1h x24, product-wide p50 (%d rows read)", pa.ProductRowsRead) + n, Value: pa.Product.P50, Unit: "ms"})
			add(bench.Figure{Name: "property avg 1h x24, product-wide p99" + n, Value: pa.Product.P99, Unit: "ms"})
			dashLoadFigures(add, n, pa.Concurrent, pa.Ceiling)
			for _, d := range pa.Concurrent {
				rep.Timelines["dashboard: "+d.Name+n] = d.Load.Timeline
			}
		}
	case "storage":
		servers := splitList(f.storageServers)
		if len(servers) == 0 {
			servers = []string{f.clickhouse}
		}
		var results []bench.StorageResult
		for i, addr := range servers {
			r, err := bench.RunStorage(ctx, bench.StorageParams{Values: f.storageValues, Span: f.storageSpan, Queries: f.storageQueries,
				InsertValues: f.storageInsert, Database: fmt.Sprintf("devicehub_bench_storage_%d", i), ClickHouseAddr: addr, Keep: f.storageKeep, Layouts: f.storageLayouts, Logf: logf})
			results = append(results, r)
			rep.Results[s] = results
			if err != nil {
				return err
			}
			fmt.Println(r.Markdown())
			n := fmt.Sprintf(" (%s, %d values)", r.Server, r.Values)
			add(bench.Figure{Name: "device_property bytes a value" + n, Value: r.PropertyBytes, Unit: "B", Target: "<= 2"})
			add(bench.Figure{Name: "device_message bytes a message" + n, Value: r.MessageBytes, Unit: "B"})
			add(bench.Figure{Name: "all tables bytes a property value" + n, Value: r.AllBytes, Unit: "B"})
			add(bench.Figure{Name: "generate rows/s (INSERT ... SELECT)" + n, Value: r.GenRowsPerSec, Unit: "rows/s"})
			add(bench.Figure{Name: "tsdb.InsertBatch values/s" + n, Value: r.InsertPerSec, Unit: "values/s"})
			add(bench.Figure{Name: "history queries/s" + n, Value: r.HistoryPerSec, Unit: "q/s"})
			add(bench.Figure{Name: "1h x24 aggregate queries/s (device_property)" + n, Value: r.AggPerSec, Unit: "q/s"})
			add(bench.Figure{Name: "1h x24 aggregate queries/s (hourly rollup)" + n, Value: r.AggRollupPerSec, Unit: "q/s"})
			add(bench.Figure{Name: "conversion to the layout of 00006 values/s" + n, Value: float64(r.ConvertRows) / max(r.ConvertSeconds, 1e-9), Unit: "values/s"})
			if o := r.Before; o != nil {
				n := n + " before 00006"
				add(bench.Figure{Name: "device_property bytes a value" + n, Value: o.PropertyBytes, Unit: "B"})
				add(bench.Figure{Name: "all tables bytes a property value" + n, Value: o.AllBytes, Unit: "B"})
				add(bench.Figure{Name: "tsdb.InsertBatch values/s" + n, Value: o.InsertPerSec, Unit: "values/s"})
				add(bench.Figure{Name: "history queries/s" + n, Value: o.HistoryPerSec, Unit: "q/s"})
				add(bench.Figure{Name: "1h x24 aggregate queries/s (device_property)" + n, Value: o.AggPerSec, Unit: "q/s"})
				add(bench.Figure{Name: "1h x24 aggregate queries/s (hourly rollup)" + n, Value: o.AggRollupPerSec, Unit: "q/s"})
			}
		}
	case "dashboard-mixed":
		r, err := bench.RunDashboardMixed(ctx, bench.DashboardParams{Concurrency: f.dashConc, KeepData: f.dashKeep, Prefix: f.dashPrefix,
			ClickHouseAddr: f.clickhouse, ClickHouseCluster: f.clickhouseCluster, PostgresDSN: f.postgres, Logf: logf,
			MixedMessages: orSkip(f.dashMixedMsgs), MixedRequests: f.dashMixedReqs, MixedIngestRate: orSkip(f.dashIngestRate), MixedKinds: splitList(f.dashMixedKinds), MixedUncachedRequests: f.dashMixedUncached})
		rep.Results[s] = r
		if err != nil {
			return err
		}
		mixedFigures(add, rep, r)
	default:
		return errors.New("dashboard scenario: not built")
	}
	return nil
}

// orSkip maps a flag's 0 (skip) to the negative value the bench's
// parameters take for it.
func orSkip(n int) int {
	if n == 0 {
		return -1
	}
	return n
}

// mixedFigures adds the figures of the mixed dashboard scenario.
func mixedFigures(add func(bench.Figure), rep *bench.Report, m bench.MixedResult) {
	n := fmt.Sprintf(" (%d msgs, %d products, ingest %v reports/s)", m.Messages, m.Products, m.IngestRates)
	dashLoadFigures(add, n, m.Runs, m.Ceiling)
	for _, d := range m.Runs {
		rep.Timelines["dashboard: "+d.Name+n] = d.Load.Timeline
	}
	add(bench.Figure{Name: fmt.Sprintf("mixed: sampled answers checked against a direct ClickHouse count (%d after the 1 s TTL)", m.Rechecked),
		Value: float64(m.Checks), Unit: "answers"})
	add(bench.Figure{Name: "mixed: sampled answers wrong", Value: float64(m.Failures), Unit: "answers", Target: "0"})
	if m.IngestAlone != nil {
		cpuFigures(add, "mixed: ", *m.IngestAlone)
	}
}

// dashLoadFigures adds req/s, p50 and p99 of each concurrent dashboard run
// beside the bare Fiber handler under the same load, and their CPU.
func dashLoadFigures(add func(bench.Figure), size string, runs []bench.DashLoad, ceiling *bench.LoadResult) {
	for _, d := range runs {
		m := fmt.Sprintf(" (%d clients)%s", d.Load.Concurrency, size)
		fig := func(name string, v float64, unit string, base float64, target string) {
			x := bench.Figure{Name: d.Name + " " + name + m, Value: v, Unit: unit, Target: target}
			if ceiling != nil {
				x.Against, x.Baseline, x.Ratio = "bare Fiber handler, same load", base, bench.Ratio(v, base)
			}
			add(x)
		}
		var c bench.LoadResult
		if ceiling != nil {
			c = *ceiling
		}
		rpsTarget, p99Target := "", ""
		if d.Cached && strings.HasPrefix(d.Name, "1d x30") {
			rpsTarget, p99Target = ">= 5000", "<= 20 ms"
		}
		if d.Limited {
			add(bench.Figure{Name: d.Name + " req/s / administrator's" + m, Value: d.ScopeRPSRatio, Unit: "x", Target: ">= 0.95"})
			add(bench.Figure{Name: d.Name + " p50 / administrator's" + m, Value: d.ScopeP50Ratio, Unit: "x", Target: "<= 1.05"})
		}
		fig("req/s (sustained median)", d.Load.SustainedRPS, "req/s", c.SustainedRPS, rpsTarget)
		fig("p50", d.Load.Latency.P50Ms, "ms", c.Latency.P50Ms, "")
		fig("p99", d.Load.Latency.P99Ms, "ms", c.Latency.P99Ms, p99Target)
		cpuFigures(add, "", d.CPU)
	}
}
