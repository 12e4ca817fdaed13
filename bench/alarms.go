package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/lib/pq"

	"devicehub/api/live"
	"devicehub/ingest"
	"devicehub/ingest/alarm"
	"devicehub/ingest/wire"
	"devicehub/schema"
)

// AlarmsParams configure RunAlarms. Zero fields take the defaults noted.
type AlarmsParams struct {
	Devices int `json:"devices"` // default 100,000
	Rate    int `json:"rate"`    // reports/s of the latency phase; default 10,000
	// CrossEvery: one device in CrossEvery crosses the threshold, on every
	// other report of it: 1/(2*CrossEvery) of the reports raise an alarm
	// (and as many clear one). Default 50: 1% of the reports raise.
	CrossEvery int `json:"crossEvery"`
	// Watched crossing devices are watched on /api/live (streams of 100);
	// default 1,000.
	Watched  int           `json:"watched"`
	Duration time.Duration `json:"duration"` // of the latency phase; default 30s
	// Rounds of the throughput phases (each a burst of one report per
	// device with the rules off and one with them on, the order
	// alternating from round to round), after a warm-up pair not counted;
	// default 2.
	Rounds int `json:"rounds"`
	// Timers: devices of the in-process no-data timer measure (default
	// 1,000,000), whose deadline (TimerFor after the report, default 15s)
	// falls within TimerSpread (default 10s).
	Timers      int           `json:"timers"`
	TimerFor    time.Duration `json:"timerFor"`
	TimerSpread time.Duration `json:"timerSpread"`
	Timeout     time.Duration `json:"timeout"` // bound of each wait; default 5 minutes
	// SkipServer runs only the in-process measures (state and timers).
	SkipServer bool `json:"skipServer"`
	// OwnSession runs devicehub with a share group, where the evaluator
	// reads a session of its own; default none, as one instance runs,
	// where it reads ingest's (alarm.Feed).
	OwnSession bool `json:"ownSession"`
	ChildParams
}

func (p *AlarmsParams) defaults() {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&p.Devices, 100_000)
	def(&p.Rate, 10_000)
	def(&p.CrossEvery, 50)
	def(&p.Watched, 1000)
	def(&p.Rounds, 2)
	def(&p.Timers, 1_000_000)
	for _, d := range []struct {
		v *time.Duration
		d time.Duration
	}{{&p.Duration, 30 * time.Second}, {&p.TimerFor, 30 * time.Second}, {&p.TimerSpread, 10 * time.Second}, {&p.Timeout, 5 * time.Minute}} {
		if *d.v <= 0 {
			*d.v = d.d
		}
	}
	p.childDefaults()
}

// AlarmsBurst is one burst of one report per device, as fast as the
// gateway can publish it.
type AlarmsBurst struct {
	Rules  bool    `json:"rules"`
	Ingest float64 `json:"ingestPerSecond"` // reports acknowledged by ingest (stored) per second
	// Evaluated: reports the evaluator acknowledged per second (rules on).
	Evaluated  float64 `json:"evaluatedPerSecond,omitempty"`
	CPUSeconds float64 `json:"cpuSeconds"` // devicehub's, until both drained
	// CPU is where the machine's CPU went over the burst: the bench (the
	// generator), devicehub, the run database's PostgreSQL backends, the
	// broker, ClickHouse and the whole machine (is it the bound?).
	CPU CPUBreakdown `json:"cpu"`
	// Rest is how the machine was before the burst: the bench waits until
	// its cores were busy less than restCores for a second (the previous
	// burst's merges, vacuum and writes done), at most restWait.
	Rest MachineRest `json:"rest"`
}

// AlarmsTimers is the in-process measure of the no-data timers.
type AlarmsTimers struct {
	Devices      int            `json:"devices"`
	HeapBytes    float64        `json:"heapBytesPerDevice"` // the evaluator's heap per device, timer included
	ApplySeconds float64        `json:"applySeconds"`       // the reports that set the timers
	Fired        int            `json:"fired"`
	Late         LatencySummary `json:"late"` // how long after its deadline each fired
}

// AlarmsLane is one write lane's share of the alarm changes.
type AlarmsLane struct {
	Changes float64 `json:"changes"`
	MeanMs  float64 `json:"meanMs"`
	// P99Ms: the upper bound of the histogram's bucket that holds the
	// 99th percentile (its buckets: 5, 10, 25, 50, 100, 250 ms, ...).
	P99Ms float64 `json:"p99UpperMs"`
}

// AlarmsResult is what RunAlarms measured.
type AlarmsResult struct {
	Params AlarmsParams `json:"params"`
	// Latency: report published -> alarm event (raised) on /api/live,
	// split at the evaluator's receipt of the report (the event's
	// timestamp: the transition's time, its arrival at the evaluator, to
	// the millisecond): published -> received (ToEvaluator), received ->
	// on /api/live (EvaluatorToLive: evaluated, written, announced).
	Latency LatencySummary `json:"latency"`
	// ValueOnLive: the same crossing reports published -> their value
	// (temp 85) on the same /api/live streams, as ingest decodes it: the
	// report's way through the broker, ingest and the live hub without
	// the evaluator, at the same load: the floor under Latency.
	ValueOnLive     LatencySummary `json:"valueOnLive"`
	ToEvaluator     LatencySummary `json:"toEvaluator"`
	EvaluatorToLive LatencySummary `json:"evaluatorToLive"`
	// Delivery: the same crossing reports published -> received by a
	// plain subscriber of the bench (QoS 1, the watched devices' report
	// topics), in the same phase: the broker's delivery on this machine
	// at this load, the floor under ToEvaluator.
	Delivery LatencySummary `json:"delivery"`
	// Commit: a transaction's commit on the same PostgreSQL server over
	// the same phase, every 20 ms (startCommitProbe): the floor under
	// EvaluatorToLive, which waits for at least one commit.
	Commit LatencySummary `json:"commit"`
	// Lanes: the alarm changes (raised, escalated, de-escalated,
	// cleared) the evaluator committed in the latency phase, by its
	// write lane (express, batch), and their mean time from the
	// report's arrival to the commit (devicehub_alarm_change_lag_seconds).
	Lanes    map[string]AlarmsLane `json:"lanes"`
	Raised   int64                 `json:"raised"`  // raised events received for watched devices
	Cleared  int64                 `json:"cleared"` // cleared events received
	Expected int64                 `json:"expected"`
	// StoredRaised: the watched devices' raises of the phase in
	// PostgreSQL, once the wait for the events ended; Skipped: the
	// events the streams said they dropped (a subscriber's full queue).
	// Raised short of Expected is the evaluator's when StoredRaised is
	// short too, the announcement's otherwise.
	StoredRaised int64 `json:"storedRaised"`
	// PublishFailed: the phase's reports the broker did not take (the
	// gateway's connection lost), left out of Expected; 0 in a sound run.
	PublishFailed int `json:"publishFailed"`
	// Published: the latency phase's reports per second as the gateway
	// handed them to the broker (below Rate when the broker held it back).
	Published   float64       `json:"publishedPerSecond"`
	Skipped     uint64        `json:"skipped"`
	SteadyCPU   float64       `json:"steadyCpuSeconds"` // devicehub's CPU during the latency phase
	Bursts      []AlarmsBurst `json:"bursts"`
	IngestOff   float64       `json:"ingestOff"` // medians
	IngestOn    float64       `json:"ingestOn"`
	EvaluatedOn float64       `json:"evaluatedOn"`
	Ratio       float64       `json:"ratio"` // IngestOn / IngestOff
	// The machine in the bursts (medians, rules off and on): the cores
	// busy (of MachineCores), and its CPU per report, every process. On
	// a machine whose cores are all busy in both, throughput follows CPU
	// per report: CPUOff / CPUOn is the ratio the bursts can show there
	// (CPUBound), whatever runs where.
	CoresOff float64 `json:"machineCoresOff"`
	CoresOn  float64 `json:"machineCoresOn"`
	CPUOff   float64 `json:"machineMicrosPerReportOff"`
	CPUOn    float64 `json:"machineMicrosPerReportOn"`
	CPUBound float64 `json:"cpuBoundRatio"`
	// StateBytes: the evaluator's heap per device (10 rules, one report
	// each), measured in this process; StoredBytes: PostgreSQL's
	// alarm_state per device after the run.
	StateBytes  float64      `json:"stateBytesPerDevice"`
	StoredBytes float64      `json:"storedBytesPerDevice"`
	Timers      AlarmsTimers `json:"timers"`
}

func (r AlarmsResult) String() string {
	p := r.Params
	return fmt.Sprintf("alarms: %d devices, %d rules, %d reports/s, 1 in %d reports raising: published -> alarm event p50 %.1f ms p99 %.1f ms max %.1f ms (%d of %d raised, %d cleared, %d skipped; %d raised in PostgreSQL; %d reports not taken by the broker, %.0f/s published; devicehub %.1f CPU s in %s)\n"+
		"  split: published -> evaluator received p50 %.1f ms p99 %.1f ms; -> alarm event p50 %.1f ms p99 %.1f ms\n"+
		"  the same reports published -> their value on /api/live (ingest, no evaluator): p50 %.1f ms p99 %.1f ms max %.1f ms (%d)\n"+
		"  the same reports published -> a plain subscriber of the bench: p50 %.1f ms p99 %.1f ms max %.1f ms (%d)\n"+
		"  alarm changes committed by the express lane %.0f (from arrival: mean %.1f ms, p99 <= %.0f ms), by the batch lane %.0f (mean %.1f ms, p99 <= %.0f ms)\n"+
		"  a commit on the same PostgreSQL meanwhile: p50 %.1f ms p99 %.1f ms max %.1f ms (%d)\n"+
		"  ingest burst: rules off %.0f/s, on %.0f/s (%.3fx), evaluator %.0f/s; the machine: %.2f / %.2f cores busy, %.1f / %.1f µs a report (%.3fx)\n"+
		"  rule state: %.0f heap bytes a device (in process), %.0f stored bytes a device (PostgreSQL)\n"+
		"  no-data timers: %d devices, %.0f heap bytes a device, set in %.1f s; %d fired, late p50 %.1f ms p99 %.1f ms max %.1f ms",
		p.Devices, 10, p.Rate, 2*p.CrossEvery, r.Latency.P50Ms, r.Latency.P99Ms, r.Latency.MaxMs, r.Raised, r.Expected, r.Cleared, r.Skipped, r.StoredRaised, r.PublishFailed, r.Published, r.SteadyCPU, p.Duration,
		r.ToEvaluator.P50Ms, r.ToEvaluator.P99Ms, r.EvaluatorToLive.P50Ms, r.EvaluatorToLive.P99Ms,
		r.ValueOnLive.P50Ms, r.ValueOnLive.P99Ms, r.ValueOnLive.MaxMs, r.ValueOnLive.N,
		r.Delivery.P50Ms, r.Delivery.P99Ms, r.Delivery.MaxMs, r.Delivery.N,
		r.Lanes["express"].Changes, r.Lanes["express"].MeanMs, r.Lanes["express"].P99Ms, r.Lanes["batch"].Changes, r.Lanes["batch"].MeanMs, r.Lanes["batch"].P99Ms,
		r.Commit.P50Ms, r.Commit.P99Ms, r.Commit.MaxMs, r.Commit.N,
		r.IngestOff, r.IngestOn, r.Ratio, r.EvaluatedOn, r.CoresOff, r.CoresOn, r.CPUOff, r.CPUOn, r.CPUBound, r.StateBytes, r.StoredBytes,
		r.Timers.Devices, r.Timers.HeapBytes, r.Timers.ApplySeconds, r.Timers.Fired, r.Timers.Late.P50Ms, r.Timers.Late.P99Ms, r.Timers.Late.MaxMs)
}

// Figures are the result's report lines.
func (r AlarmsResult) Figures() []Figure {
	p := r.Params
	load := fmt.Sprintf(" (%d devices, 10 rules, %d reports/s, 1%% raising)", p.Devices, p.Rate)
	return []Figure{
		{Name: "report published -> alarm on /api/live, p50" + load, Value: r.Latency.P50Ms, Unit: "ms"},
		{Name: "report published -> alarm on /api/live, p99" + load, Value: r.Latency.P99Ms, Unit: "ms", Target: "<= 100 ms",
			Against: "the same reports published -> their value on /api/live (no evaluator), p99", Baseline: r.ValueOnLive.P99Ms},
		{Name: "report published -> evaluator received, p99" + load, Value: r.ToEvaluator.P99Ms, Unit: "ms",
			Against: "the same reports published -> a plain subscriber, p99", Baseline: r.Delivery.P99Ms},
		{Name: "evaluator received -> alarm on /api/live, p99" + load, Value: r.EvaluatorToLive.P99Ms, Unit: "ms",
			Against: "a commit on the same PostgreSQL meanwhile, p99", Baseline: r.Commit.P99Ms},
		{Name: "alarm events received" + load, Value: float64(r.Raised), Unit: "events", Target: "all " + strconv.FormatInt(r.Expected, 10)},
		{Name: "reports published in the latency phase, per second" + load, Value: r.Published, Unit: "reports/s",
			Target: strconv.Itoa(p.Rate) + " (the broker's acknowledgements pace the gateway, at most 20,000 unacknowledged)"},
		{Name: "alarms raised in PostgreSQL" + load, Value: float64(r.StoredRaised), Unit: "alarms", Target: "all " + strconv.FormatInt(r.Expected, 10)},
		{Name: fmt.Sprintf("ingest throughput with 10 rules on (bursts of %d reports)", p.Devices), Value: r.IngestOn, Unit: "reports/s",
			Against: "the same bursts with the rules off", Baseline: r.IngestOff, Ratio: Ratio(r.IngestOn, r.IngestOff), Target: ">= 0.9x"},
		{Name: "the machine's CPU per report in the bursts, rules on (every process)", Value: r.CPUOn, Unit: "µs",
			Against: "rules off", Baseline: r.CPUOff, Ratio: r.CPUBound,
			Target: fmt.Sprintf("the ratio the bursts can reach while the machine is the bound (cores busy: %.2f off, %.2f on)", r.CoresOff, r.CoresOn)},
		{Name: "evaluator throughput (10 rules)", Value: r.EvaluatedOn, Unit: "reports/s"},
		{Name: "rule state per device (10 rules, heap in process)", Value: r.StateBytes, Unit: "bytes"},
		{Name: "rule state per device (PostgreSQL)", Value: r.StoredBytes, Unit: "bytes"},
		{Name: fmt.Sprintf("no-data timers: heap per device (%d devices)", r.Timers.Devices), Value: r.Timers.HeapBytes, Unit: "bytes"},
		{Name: fmt.Sprintf("no-data timers: fired late, p99 (%d devices)", r.Timers.Devices), Value: r.Timers.Late.P99Ms, Unit: "ms", Target: "<= 1000 ms"},
		{Name: fmt.Sprintf("no-data timers: fired late, max (%d devices)", r.Timers.Devices), Value: r.Timers.Late.MaxMs, Unit: "ms", Target: "<= 1000 ms"},
	}
}

// alarmsModel is the bench product's thing model.
const alarmsModel = `{"properties":[
{"id":"temp","name":"Temperature","valueType":{"type":"float"}},
{"id":"hum","name":"Humidity","valueType":{"type":"float"}},
{"id":"volt","name":"Voltage","valueType":{"type":"float"}},
{"id":"curr","name":"Current","valueType":{"type":"float"}}]}`

// alarmsRules are the product's 10 rules: every kind of property
// condition, a duration, a repetition, hysteresis, a ladder and a no-data
// timer; only the first is met by the bench's crossing reports.
func alarmsRules(product string) []alarm.Rule {
	raw := []string{
		`{"id":"hot","name":"Hot","severity":"major","trigger":{"type":"property","all":[{"property":"temp","op":"gt","value":80}]},"clear":{"type":"trigger"}}`,
		`{"id":"hot-long","name":"Hot for long","severity":"critical","trigger":{"type":"property","all":[{"property":"temp","op":"gt","value":95}]},"duration":"30s"}`,
		`{"id":"dry","name":"Dry","severity":"minor","trigger":{"type":"property","all":[{"property":"hum","op":"lt","value":-10}]}}`,
		`{"id":"wet","name":"Wet","severity":"warning","trigger":{"type":"property","all":[{"property":"hum","op":"gt","value":150}]},"ladder":[{"severity":"major","all":[{"property":"hum","op":"gt","value":180}]}]}`,
		`{"id":"volt-band","name":"Voltage out of band","severity":"major","trigger":{"type":"property","all":[{"property":"volt","op":"between","value":[-100,-50]}]}}`,
		`{"id":"volt-rate","name":"Voltage jump","severity":"minor","trigger":{"type":"property","all":[{"property":"volt","of":"rate","op":"gt","value":1000}]}}`,
		`{"id":"overcurrent","name":"Overcurrent bursts","severity":"major","trigger":{"type":"property","all":[{"property":"curr","op":"gt","value":1000}]},"repeat":{"count":3,"within":"1m"}}`,
		`{"id":"extreme","name":"Extreme","severity":"critical","trigger":{"type":"property","any":[{"property":"temp","op":"gt","value":200},{"all":[{"property":"hum","op":"gt","value":200},{"property":"volt","op":"gt","value":400}]}]}}`,
		`{"id":"hot-hyst","name":"Hot (hysteresis)","severity":"major","trigger":{"type":"property","all":[{"property":"temp","op":"gt","value":100}]},"clear":{"type":"condition","all":[{"property":"temp","op":"lt","value":90}]}}`,
		`{"id":"silent","name":"Silent","severity":"warning","trigger":{"type":"nodata","for":"1h"}}`,
	}
	out := make([]alarm.Rule, len(raw))
	for i, s := range raw {
		r, err := alarm.ParseRule([]byte(s))
		if err != nil {
			panic(err)
		}
		r.ID, r.ProductID, r.Enabled = product+"-"+r.ID, product, true
		out[i] = r
	}
	return out
}

// alarmsReport is report round of device d: crossing devices (every
// CrossEvery-th) are above the threshold on every other round.
func alarmsReport(p *AlarmsParams, d, round int) (payload string, crossing, high bool) {
	temp := 20 + float64(d%10)
	crossing = d%p.CrossEvery == 0
	if crossing && (round+d/p.CrossEvery)%2 == 0 {
		temp, high = 85, true
	}
	return fmt.Sprintf(`{"properties":{"temp":%g,"hum":%d,"volt":%d,"curr":%d}}`, temp, 40+round%7, 220+d%5, 5+round%3), crossing, high
}

// RunAlarms runs devicehub (api and ingest, alarms on) on a private broker
// with Devices devices of one product with 10 rules, and measures: ingest
// throughput in bursts with the rules off and on, then report published
// -> alarm event on /api/live at Rate reports/s with 1% raising; in this
// process, the evaluator's heap per device and Timers devices' no-data
// timers (memory, how late they fire).
func RunAlarms(ctx context.Context, p AlarmsParams) (res AlarmsResult, err error) {
	p.defaults()
	res.Params = p
	p.Logf("alarms: rule state in process, %d devices", p.Devices)
	res.StateBytes = alarmsStateBytes(p.Devices)
	p.Logf("alarms: %.0f heap bytes a device", res.StateBytes)
	if !p.SkipServer {
		if err := runAlarmsServer(ctx, &p, &res); err != nil {
			return res, err
		}
	}
	p.Logf("alarms: no-data timers in process, %d devices", p.Timers)
	res.Timers = alarmsTimers(p.Timers, p.TimerFor, p.TimerSpread)
	return res, nil
}

// heapInUse is the live heap after a collection.
func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// alarmsStateBytes: an evaluator with the bench's 10 rules, one report of
// each of n devices applied (and its dirty rows taken, as a flush does):
// the heap it holds per device.
func alarmsStateBytes(n int) float64 {
	product := "p"
	m, _ := schema.ParseThingModelString(alarmsModel)
	ids := make([]string, n)
	for i := range ids {
		ids[i] = product + "-" + strconv.Itoa(i)
	}
	before := heapInUse()
	ev := alarm.New(nil)
	ev.SetRules(alarmsRules(product), map[string]*schema.ThingModel{product: m})
	at := time.Now()
	for i, id := range ids {
		ev.Apply(alarm.Message{Kind: alarm.MsgReport, ProductID: product, DeviceID: id, At: at, Key: "i" + strconv.Itoa(i), KeyUnique: true,
			Props: []alarm.Prop{{ID: "temp", Value: alarm.NumberValue(21.5)}, {ID: "hum", Value: alarm.NumberValue(40)},
				{ID: "volt", Value: alarm.NumberValue(221)}, {ID: "curr", Value: alarm.NumberValue(5)}}})
		if i%10_000 == 0 {
			ev.Transitions()
			ev.Dirty()
		}
	}
	ev.Transitions()
	ev.Dirty()
	after := heapInUse()
	runtime.KeepAlive(ev)
	runtime.KeepAlive(ids)
	return float64(int64(after)-int64(before)) / float64(n)
}

// alarmsTimers: an evaluator with one no-data rule, n devices each
// reporting once, their deadlines spread over spread, forD after their
// reports; then the runner's loop (Tick every 100 ms, the batch taken
// every 50 ms) until all fired, each timer's lateness measured. The
// evaluator takes time from its messages and from Tick's argument only,
// so the loop's clock is the wall clock shifted to make the first
// deadline fall 1 s after the loop starts: setting a million timers may
// take longer than forD on a busy machine, which is not lateness.
func alarmsTimers(n int, forD, spread time.Duration) AlarmsTimers {
	out := AlarmsTimers{Devices: n}
	product := "p"
	r, _ := alarm.ParseRule([]byte(`{"id":"silent","name":"Silent","productId":"p","severity":"warning","enabled":true,"trigger":{"type":"nodata","for":"` + forD.String() + `"}}`))
	ids := make([]string, n)
	for i := range ids {
		ids[i] = "d-" + strconv.Itoa(i)
	}
	before := heapInUse()
	ev := alarm.New(nil)
	ev.SetRules([]alarm.Rule{r}, map[string]*schema.ThingModel{product: schema.EmptyThingModel()})
	start := time.Now()
	base := start
	prop := []alarm.Prop{{ID: "v", Value: alarm.NumberValue(1)}}
	for i, id := range ids {
		at := base.Add(time.Duration(int64(spread) * int64(i) / int64(n)))
		ev.Apply(alarm.Message{Kind: alarm.MsgReport, ProductID: product, DeviceID: id, At: at, Arrived: at, Key: "i" + strconv.Itoa(i), KeyUnique: true, Props: prop})
		if i%10_000 == 0 {
			ev.Dirty()
		}
	}
	ev.Dirty()
	out.ApplySeconds = time.Since(start).Seconds()
	out.HeapBytes = float64(int64(heapInUse())-int64(before)) / float64(n)
	loop := time.Now()
	offset := loop.Add(time.Second).Sub(base.Add(forD)) // the loop's clock: now - offset
	clock := func() time.Time { return time.Now().Add(-offset) }
	var late Histogram
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	flush := time.NewTicker(50 * time.Millisecond)
	defer flush.Stop()
	end := loop.Add(time.Second + spread + 30*time.Second)
	for out.Fired < n && time.Now().Before(end) {
		select {
		case <-tick.C:
			ev.Tick(clock())
			now := clock()
			for _, t := range ev.Transitions() {
				late.Record(now.Sub(t.At))
				out.Fired++
			}
		case <-flush.C:
			ev.Dirty()
		}
	}
	out.Late = late.Summary()
	runtime.KeepAlive(ev)
	return out
}

func runAlarmsServer(ctx context.Context, p *AlarmsParams, res *AlarmsResult) error {
	tmp, bin, db, broker, cleanup, err := p.prepareBroker(ctx, "alarms")
	if err != nil {
		return err
	}
	defer cleanup()
	p.Logf("alarms: starting devicehub (api, ingest, alarms) on a private broker")
	// A memory limit for 100,000 devices, as the README's capacity notes
	// give one (and fleet-connect runs with): at the default 160 MiB the
	// evaluator's state (about 750 bytes a device) and ingest's held the
	// live heap near the limit, and the collector ran without pause: in
	// one window on a shared machine the evaluator took 1,291 reports/s
	// of a burst at 160 MiB and 5,234/s with no limit (devicehub's CPU
	// 21.8 s against 8.4 s for the same 100,000 reports).
	args := append([]string{"-memory-limit=512MiB"}, p.ServerArgs...)
	env := map[string]string{"MQTT_SHARE_GROUP": ingest.NoShareGroup} // the broker is the run's own
	if p.OwnSession {
		env = nil // startChildAPI's group of its own
		p.Logf("alarms: with a share group: the evaluator reads a session of its own")
	}
	srv, err := startChildAPI(ctx, childAPIConfig{Binary: bin, LogDir: tmp, DB: db, ClickHouseAddr: p.ClickHouseAddr,
		BrokerURL: broker.url(), Roles: "api,ingest", Args: args, Conns: 8, Env: env})
	if err != nil {
		return err
	}
	defer srv.stop()
	backends, closeBackends := db.backends()
	defer closeBackends()
	procs := childProcs("generator", srv.pid(), backends, broker.url(), p.ClickHouseAddr)

	product := "benchalarm" + randHex(4)
	if err := srv.deployProduct(ctx, product, "Bench alarms", alarmsModel); err != nil {
		return err
	}
	ids := liveIDs(product, p.Devices)
	p.Logf("alarms: %d devices", p.Devices)
	if err := addDevices(ctx, db.dsn(), product, ids); err != nil {
		return err
	}
	rules := alarmsRules(product)
	for _, r := range rules {
		r.Enabled = false
		if err := srv.call(ctx, "POST", "/api/alarm/config", r, nil); err != nil {
			return err
		}
	}
	setRules := func(on bool) error {
		verb := "/_disable"
		if on {
			verb = "/_enable"
		}
		for _, r := range rules {
			if err := srv.call(ctx, "POST", "/api/alarm/config/"+r.ID+verb, nil, nil); err != nil {
				return err
			}
		}
		return nil
	}

	// The private broker goes with its logins: no removal.
	gateway, _, err := newGateway(ctx, broker.url())
	if err != nil {
		return err
	}
	gw := mqtt.NewClient(mqtt.NewClientOptions().AddBroker(broker.url()).SetClientID("bench-gw-" + randHex(4)).
		SetUsername(gateway.Username).SetPassword(gateway.Password).SetCleanSession(true).
		// No write timeout: a paced report waits for the broker rather
		// than fail. The ping's answer comes behind every acknowledgement
		// the busy broker owes: paho's 10 s dropped the connection.
		SetPingTimeout(time.Minute).
		SetConnectionLostHandler(func(_ mqtt.Client, err error) { p.Logf("alarms: the gateway's connection lost: %v", err) }))
	if err := waitToken(gw.Connect(), 30*time.Second); err != nil {
		return fmt.Errorf("bench: gateway connect: %w", err)
	}
	defer gw.Disconnect(0)

	metric := func(name string) (float64, error) {
		m, err := srv.proc.scrapeMetrics(ctx)
		if err != nil {
			return 0, err
		}
		return m[name], nil
	}
	const (
		ackedMetric = "devicehub_ingest_acked_total"
		evalMetric  = "devicehub_alarm_evaluation_lag_seconds_count" // messages the evaluator acknowledged
	)
	waitMetric := func(name string, atLeast float64, deadline time.Time) (time.Time, error) {
		for {
			n, err := metric(name)
			if err != nil {
				return time.Time{}, err
			}
			if n >= atLeast {
				return time.Now(), nil
			}
			if time.Now().After(deadline) || ctx.Err() != nil {
				return time.Time{}, fmt.Errorf("bench: %s %.0f, not %.0f, within %s\n%s", name, n, atLeast, p.Timeout, srv.proc.logTail())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	round := 0
	// burst publishes one report per device (none crossing) as fast as a
	// window of publishWindow unacknowledged allows, and waits until
	// ingest (and with rules, the evaluator) acknowledged them all.
	burst := func(rulesOn bool) (AlarmsBurst, error) {
		b := AlarmsBurst{Rules: rulesOn}
		acked0, err := metric(ackedMetric)
		if err != nil {
			return b, err
		}
		eval0, err := metric(evalMetric)
		if err != nil {
			return b, err
		}
		cpu0, _ := procCPUTime(srv.pid())
		phase := "burst, rules off"
		if rulesOn {
			phase = "burst, rules on"
		}
		span := startCPUSpan(phase, procs)
		t0 := time.Now()
		toks := make([]mqtt.Token, 0, len(ids))
		payload := fmt.Sprintf(`{"properties":{"temp":21,"hum":%d,"volt":221,"curr":5}}`, 40+round%7)
		round++
		for i, id := range ids {
			if i >= publishWindow {
				if err := waitToken(toks[i-publishWindow], p.Timeout); err != nil {
					return b, fmt.Errorf("bench: publish: %w", err)
				}
			}
			toks = append(toks, gw.Publish(wire.DeviceTopic(product, id, wire.LevelReport), 1, false, payload))
		}
		deadline := t0.Add(p.Timeout)
		done, err := waitMetric(ackedMetric, acked0+float64(len(ids)), deadline)
		if err != nil {
			return b, err
		}
		b.Ingest = float64(len(ids)) / done.Sub(t0).Seconds()
		if rulesOn {
			edone, err := waitMetric(evalMetric, eval0+float64(len(ids)), deadline)
			if err != nil {
				return b, err
			}
			b.Evaluated = float64(len(ids)) / edone.Sub(t0).Seconds()
		}
		cpu1, _ := procCPUTime(srv.pid())
		b.CPUSeconds = (cpu1 - cpu0).Seconds()
		b.CPU = span.breakdown(span.snapshot(), int64(len(ids)))
		return b, nil
	}
	// evaluating waits until the evaluator takes the product's reports
	// (rules on) or no longer does (off): probes to device 1 (not a
	// crossing one) until its count moves, or stays.
	evaluating := func(on bool) error {
		deadline := time.Now().Add(p.Timeout)
		probe := func() error {
			return waitToken(gw.Publish(wire.DeviceTopic(product, ids[1], wire.LevelReport), 1, false, `{"properties":{"temp":21}}`), p.Timeout)
		}
		for ctx.Err() == nil && time.Now().Before(deadline) {
			e0, err := metric(evalMetric)
			if err != nil {
				return err
			}
			if err := probe(); err != nil {
				return err
			}
			time.Sleep(1500 * time.Millisecond) // past the evaluator's flush and rule poll
			e1, err := metric(evalMetric)
			if err != nil {
				return err
			}
			if (e1 > e0) == on {
				return nil
			}
		}
		return fmt.Errorf("bench: the evaluator did not follow the rules turned on=%v", on)
	}

	// A warm-up pair first, not counted: the first burst of each mode
	// meets what later ones do not (ingest's first lookup of every
	// device; the evaluator's first state row of every device is an
	// insert, later ones are updates). Then the rounds alternate their
	// order (off, on; on, off; ...), and each burst waits for the machine
	// to come to rest: a burst's ClickHouse merges, PostgreSQL's vacuum
	// and writes left behind are charged to no later burst of either mode.
	rulesOn := false
	switchRules := func(on bool) error {
		if on == rulesOn {
			return nil
		}
		if err := setRules(on); err != nil {
			return err
		}
		if err := evaluating(on); err != nil {
			return err
		}
		rulesOn = on
		return nil
	}
	for r := -1; r < p.Rounds; r++ {
		order := []bool{false, true}
		if r%2 == 1 {
			order = []bool{true, false}
		}
		for _, on := range order {
			if err := switchRules(on); err != nil {
				return err
			}
			rest := waitRest(ctx)
			what := "burst"
			if r < 0 {
				what = "warm-up burst"
			}
			p.Logf("alarms: %s of %d reports, rules on=%v (machine at rest after %.1f s: %.2f cores busy, rested %v)",
				what, len(ids), on, rest.WaitedSeconds, rest.Cores, rest.Rested)
			b, err := burst(on)
			if err != nil {
				return err
			}
			b.Rest = rest
			p.Logf("alarms: ingest %.0f/s, evaluator %.0f/s, devicehub %.1f CPU s\n%s", b.Ingest, b.Evaluated, b.CPUSeconds, b.CPU)
			if r >= 0 {
				res.Bursts = append(res.Bursts, b)
			}
		}
	}
	if err := switchRules(true); err != nil { // an even number of rounds ends with the rules off
		return err
	}
	var off, on, ev, coresOff, coresOn, cpuOff, cpuOn []float64
	for _, b := range res.Bursts {
		m := b.CPU.Machine
		if b.Rules {
			on, ev = append(on, b.Ingest), append(ev, b.Evaluated)
			if m != nil {
				coresOn, cpuOn = append(coresOn, m.Cores), append(cpuOn, m.MicrosPerMsg)
			}
		} else {
			off = append(off, b.Ingest)
			if m != nil {
				coresOff, cpuOff = append(coresOff, m.Cores), append(cpuOff, m.MicrosPerMsg)
			}
		}
	}
	res.IngestOff, res.IngestOn, res.EvaluatedOn = median(off), median(on), median(ev)
	res.Ratio = Ratio(res.IngestOn, res.IngestOff)
	res.CoresOff, res.CoresOn, res.CPUOff, res.CPUOn = median(coresOff), median(coresOn), median(cpuOff), median(cpuOn)
	res.CPUBound = Ratio(res.CPUOff, res.CPUOn)

	// Latency: the rules are on; crossing devices watched in streams of 100.
	var watched []string
	for d := 0; d < len(ids) && len(watched) < p.Watched; d += p.CrossEvery {
		watched = append(watched, ids[d])
	}
	index := make(map[string]int, len(ids))
	for i, id := range ids {
		index[id] = i
	}
	lastHigh := make([]atomic.Int64, len(ids)) // publish time (unix ns) of the device's latest crossing report
	var hist, toEval, evalToLive, valueOnLive Histogram
	var raised, cleared atomic.Int64
	var skipped atomic.Uint64
	var wg sync.WaitGroup
	var bodies []interface{ Close() error }
	defer func() {
		for _, b := range bodies {
			b.Close()
		}
		wg.Wait()
	}()
	for lo := 0; lo < len(watched); lo += 100 {
		body, err := openLive(ctx, srv.base, srv.token, watched[lo:min(lo+100, len(watched))], &wg, func(name string, data []byte, now time.Time) {
			if name == live.EventSkipped {
				var e live.SkippedEvent
				if json.Unmarshal(data, &e) == nil {
					skipped.Add(e.Count)
				}
				return
			}
			if name == live.EventProperty {
				// The crossing report's value, as ingest decoded it: the
				// same report's way to the same stream without the
				// evaluator.
				var e live.PropertyEvent
				if json.Unmarshal(data, &e) != nil || e.Property != "temp" || e.Value != float64(85) {
					return
				}
				if i, ok := index[e.DeviceID]; ok {
					if at := lastHigh[i].Load(); at > 0 {
						valueOnLive.Record(now.Sub(time.Unix(0, at)))
					}
				}
				return
			}
			if name != live.EventAlarm {
				return
			}
			var e live.AlarmEvent
			if json.Unmarshal(data, &e) != nil {
				return
			}
			switch e.Kind {
			case alarm.KindRaised:
				if i, ok := index[e.DeviceID]; ok {
					if at := lastHigh[i].Load(); at > 0 {
						pub, got := time.Unix(0, at), time.UnixMilli(e.Timestamp)
						hist.Record(now.Sub(pub))
						toEval.Record(max(got.Sub(pub), 0))
						evalToLive.Record(max(now.Sub(got), 0))
						raised.Add(1)
					}
				}
			case alarm.KindCleared:
				cleared.Add(1)
			}
		})
		if err != nil {
			return err
		}
		bodies = append(bodies, body)
	}
	isWatched := make([]bool, len(ids))
	for _, id := range watched {
		isWatched[index[id]] = true
	}
	// The floor under the evaluator's receipt: a plain subscriber of the
	// watched devices' reports, timing the crossing ones as the events are.
	var delivery Histogram
	floor := mqtt.NewClient(pahoOptions(serviceLogin(), broker.url(), "bench-floor-"+randHex(4)).SetCleanSession(true).
		SetOrderMatters(false).SetPingTimeout(time.Minute))
	if err := waitToken(floor.Connect(), 30*time.Second); err != nil {
		return fmt.Errorf("bench: floor subscriber connect: %w", err)
	}
	defer floor.Disconnect(0)
	filters := make(map[string]byte, len(watched))
	for _, id := range watched {
		filters[wire.DeviceTopic(product, id, wire.LevelReport)] = 1
	}
	high := []byte(`"temp":85`)
	if err := waitToken(floor.SubscribeMultiple(filters, func(_ mqtt.Client, m mqtt.Message) {
		now := time.Now()
		t, ok := wire.ParseTopic(m.Topic())
		if !ok || !bytes.Contains(m.Payload(), high) {
			return
		}
		if i, ok := index[t.DeviceID]; ok {
			if at := lastHigh[i].Load(); at > 0 {
				delivery.Record(now.Sub(time.Unix(0, at)))
			}
		}
	}), 30*time.Second); err != nil {
		return fmt.Errorf("bench: floor subscriber subscribe: %w", err)
	}
	n := p.Rate * int(p.Duration/time.Second)
	p.Logf("alarms: %d reports/s for %s, %d crossing devices watched", p.Rate, p.Duration, len(watched))
	var expected int64
	round++
	base := round
	phaseStart := time.Now()
	eval0, err := metric(evalMetric)
	if err != nil {
		return err
	}
	lanes0, err := srv.proc.scrapeMetrics(ctx)
	if err != nil {
		return err
	}
	cpu0, _ := procCPUTime(srv.pid())
	stopProbe, err := startCommitProbe(ctx, db.dsn(), 20*time.Millisecond)
	if err != nil {
		return err
	}
	type sent struct {
		tok   mqtt.Token
		raise bool // a watched device's crossing report
	}
	sends := make([]sent, 0, n)
	paceStart := time.Now()
	if err := pace(ctx, p.Rate, n, func(k int) {
		if k >= publishWindow { // at most publishWindow unacknowledged: past 65,535 a publish fails
			_ = waitToken(sends[k-publishWindow].tok, p.Timeout)
		}
		d := k % len(ids)
		payload, _, high := alarmsReport(p, d, base+k/len(ids))
		if high && isWatched[d] { // timed from here: the wait for the window is the gateway's, not devicehub's
			expected++
			lastHigh[d].Store(time.Now().UnixNano())
		}
		sends = append(sends, sent{gw.Publish(wire.DeviceTopic(product, ids[d], wire.LevelReport), 1, false, payload), high && isWatched[d]})
	}); err != nil {
		stopProbe()
		return err
	}
	res.Commit = stopProbe()
	res.Published = float64(n) / time.Since(paceStart).Seconds()
	cpu1, _ := procCPUTime(srv.pid())
	res.SteadyCPU = (cpu1 - cpu0).Seconds()
	// A report the broker did not take is no report of the phase. (A
	// phase past the machine's rate lost 0.3-1% so, on a write timeout
	// or past 65,535 unacknowledged, and the next crossing of a device
	// whose low report was lost raised nothing: the gateway now waits
	// for the broker, in a window.)
	failures := map[string]int{}
	defer func() {
		for e, c := range failures {
			p.Logf("alarms: %d reports not taken by the broker: %s", c, e)
		}
	}()
	for _, s := range sends {
		if err := waitToken(s.tok, p.Timeout); err != nil {
			failures[err.Error()]++
			res.PublishFailed++
			n--
			if s.raise {
				expected--
			}
		}
	}
	// The events are awaited until every one came, or until the evaluator
	// acknowledged every report of the phase (its backlog, when the rate
	// is past the machine's) and 5 s more for the last announcements.
	if _, err := waitMetric(evalMetric, eval0+float64(n), time.Now().Add(p.Timeout)); err != nil {
		return err
	}
	deadline := time.Now().Add(5 * time.Second)
	for raised.Load() < expected && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	res.Latency, res.Raised, res.Cleared, res.Expected = hist.Summary(), raised.Load(), cleared.Load(), expected
	res.ValueOnLive = valueOnLive.Summary()
	lanes1, err := srv.proc.scrapeMetrics(ctx)
	if err != nil {
		return err
	}
	res.Lanes = map[string]AlarmsLane{}
	for _, lane := range []string{"express", "batch"} {
		series := `devicehub_alarm_change_lag_seconds_%s{lane="` + lane + `"}`
		count := lanes1[fmt.Sprintf(series, "count")] - lanes0[fmt.Sprintf(series, "count")]
		sum := lanes1[fmt.Sprintf(series, "sum")] - lanes0[fmt.Sprintf(series, "sum")]
		l := AlarmsLane{Changes: count}
		if count > 0 {
			l.MeanMs = 1000 * sum / count
			for _, le := range []string{"0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1", "2.5", "5", "10", "+Inf"} {
				b := `devicehub_alarm_change_lag_seconds_bucket{lane="` + lane + `",le="` + le + `"}`
				if lanes1[b]-lanes0[b] >= 0.99*count {
					l.P99Ms, _ = strconv.ParseFloat(le, 64)
					l.P99Ms *= 1000
					break
				}
			}
		}
		res.Lanes[lane] = l
	}
	res.Skipped = skipped.Load()
	res.ToEvaluator, res.EvaluatorToLive, res.Delivery = toEval.Summary(), evalToLive.Summary(), delivery.Summary()
	res.StoredRaised, res.StoredBytes, err = storedAlarms(ctx, db.dsn(), product+"-hot", watched, phaseStart)
	return err
}

// openLive opens GET /api/live for devices and hands each event to fn on
// a goroutine until the body is closed.
func openLive(ctx context.Context, base, token string, devices []string, wg *sync.WaitGroup, fn func(name string, data []byte, now time.Time)) (interface{ Close() error }, error) {
	r := &liveReceiver{}
	if err := r.subscribeFunc(ctx, base, token, devices, fn); err != nil {
		return nil, err
	}
	wg.Add(1)
	return closerFunc(func() error { r.close(); wg.Done(); return nil }), nil
}

type closerFunc func() error

func (f closerFunc) Close() error { return f() }

// storedAlarms reads, in the database of dsn, the raises of rule of
// devices since since, and the evaluator's state tables' size per device.
func storedAlarms(ctx context.Context, dsn, rule string, devices []string, since time.Time) (raised int64, stateBytes float64, err error) {
	db, err := openPG(dsn, 1)
	if err != nil {
		return 0, 0, err
	}
	defer db.Close()
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM alarm_transitions t JOIN alarm_records r ON r.id = t.record_id
		WHERE t.kind = 'raised' AND r.rule_id = $1 AND r.device_id = ANY($2) AND t.time >= $3`,
		rule, pq.StringArray(devices), since).Scan(&raised); err != nil {
		return 0, 0, fmt.Errorf("bench: raises stored: %w", err)
	}
	var size, n float64
	if err := db.QueryRowContext(ctx, `SELECT pg_total_relation_size('alarm_state'), (SELECT count(*) FROM alarm_state)`).Scan(&size, &n); err != nil {
		return 0, 0, fmt.Errorf("bench: state stored: %w", err)
	}
	if n > 0 {
		stateBytes = size / n
	}
	return raised, stateBytes, nil
}
