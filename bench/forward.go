package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"devicehub/ingest/wire"
	"devicehub/meta"
)

// ForwardParams configure RunForward. Zero fields take the defaults noted.
type ForwardParams struct {
	Rate    int           `json:"rate"`    // reports/s offered; default 10,000
	Devices int           `json:"devices"` // default 1,000
	Steady  time.Duration `json:"steady"`  // the phase with the sink up; default 60 s
	Outage  time.Duration `json:"outage"`  // the phase with the sink down; default 5 min
	Alarms  int           `json:"alarms"`  // alarms raised during the steady phase; default 200
	// Timeout bounds the catch-up after the outage; default 10 min.
	Timeout time.Duration `json:"timeout"`
	ChildParams
}

// ForwardPhase is one phase at the offered rate.
type ForwardPhase struct {
	Seconds    float64 `json:"seconds"`
	Published  int64   `json:"published"`
	IngestRate float64 `json:"ingestRate"` // messages ingest acknowledged a second
	// Lag of the messages the webhook received in the phase: from the
	// report's timestamp (set when published) to its arrival.
	Received int64   `json:"received"`
	LagP50Ms float64 `json:"lagP50Ms"`
	LagP99Ms float64 `json:"lagP99Ms"`
	LagMaxMs float64 `json:"lagMaxMs"`
	// At the phase's end: the rule's lag and spool as devicehub reports
	// them (metrics).
	EndLagSeconds float64 `json:"endLagSeconds"`
	EndSpoolBytes float64 `json:"endSpoolBytes"`
	// CPU is where the machine's CPU went over the phase's load (the
	// generator, devicehub, the run database's PostgreSQL backends, the
	// broker, ClickHouse, the whole machine).
	CPU CPUBreakdown `json:"cpu"`
}

// ForwardResult is what RunForward measured.
type ForwardResult struct {
	Params      ForwardParams `json:"params"`
	Steady      ForwardPhase  `json:"steady"`
	Outage      ForwardPhase  `json:"outage"`
	IngestRatio float64       `json:"ingestRatio"` // Outage.IngestRate / Steady.IngestRate
	// After the outage: until the webhook had every message.
	CatchUpMs  float64 `json:"catchUpMs"`
	Published  int64   `json:"published"`
	Delivered  int64   `json:"delivered"`  // distinct messages the webhook accepted
	Missing    int64   `json:"missing"`    // published and never delivered
	OutOfOrder int64   `json:"outOfOrder"` // a device's message arriving past one not yet delivered
	Repeats    int64   `json:"repeats"`
	Dropped    float64 `json:"dropped"` // devicehub_forward_dropped_total
	Requests   int64   `json:"requests"`
	// Alarm raised (the report published) -> the notification's webhook
	// request received, during the steady phase.
	AlarmsRaised   int  `json:"alarmsRaised"`
	AlarmsNotified int  `json:"alarmsNotified"`
	Alarm          Span `json:"alarm"`
	// AlarmSplit divides those latencies at the commit of the alarm.
	AlarmSplit AlarmSplit `json:"alarmSplit"`
	// Commit: a transaction's commit on the same PostgreSQL server over
	// the steady phase, every 20 ms (startCommitProbe): an alarm reaches
	// the webhook after two (its write's, the dispatcher's claim).
	Commit          LatencySummary `json:"commit"`
	DevicehubCPU    float64        `json:"devicehubCpuSeconds"`
	DevicehubPeakMB float64        `json:"devicehubPeakRssMb"`
}

func (r ForwardResult) String() string {
	return fmt.Sprintf("forward: %d reports/s offered to %d devices; steady %.0fs: ingest %.0f msg/s, webhook lag p50 %.0f ms p99 %.0f ms max %.0f ms; "+
		"sink down %.0fs: ingest %.0f msg/s (%.3fx), spool %.0f MB, lag %.0f s at its end; caught up in %.1f s; %d published, %d delivered, %d missing, %d out of order, %d repeats, %.0f dropped; "+
		"alarms %d raised, %d notified, %s max %.0f ms; %s; a commit meanwhile p50 %.1f ms p99 %.1f ms",
		r.Params.Rate, r.Params.Devices, r.Steady.Seconds, r.Steady.IngestRate, r.Steady.LagP50Ms, r.Steady.LagP99Ms, r.Steady.LagMaxMs,
		r.Outage.Seconds, r.Outage.IngestRate, r.IngestRatio, r.Outage.EndSpoolBytes/1e6, r.Outage.EndLagSeconds, r.CatchUpMs/1000,
		r.Published, r.Delivered, r.Missing, r.OutOfOrder, r.Repeats, r.Dropped, r.AlarmsRaised, r.AlarmsNotified, r.Alarm, r.Alarm.MaxMs, r.AlarmSplit, r.Commit.P50Ms, r.Commit.P99Ms)
}

// Figures are the result's report lines.
func (r ForwardResult) Figures() []Figure {
	n := fmt.Sprintf(" (%d reports/s, %d devices)", r.Params.Rate, r.Params.Devices)
	return []Figure{
		{Name: "webhook lag p99, sink up" + n, Value: r.Steady.LagP99Ms, Unit: "ms", Target: "<= 1000"},
		{Name: "ingest with the sink down" + n, Value: r.Outage.IngestRate, Unit: "msg/s", Against: "ingest with the sink up, same run",
			Baseline: r.Steady.IngestRate, Ratio: r.IngestRatio, Target: "ratio >= 0.95"},
		{Name: "messages never delivered" + n, Value: float64(r.Missing), Unit: "messages", Target: "0"},
		{Name: "catch-up after the outage" + n, Value: r.CatchUpMs, Unit: "ms"},
		{Name: "alarm raised -> webhook received p99 (under the same load)", Value: r.Alarm.P99Ms, Unit: "ms", Target: "<= 200"},
		{Name: "alarm: report published -> alarm committed p99", Value: r.AlarmSplit.PublishToCommit.P99Ms, Unit: "ms"},
		{Name: "alarm: committed -> webhook received p99", Value: r.AlarmSplit.CommitToWebhook.P99Ms, Unit: "ms"},
		{Name: "a commit on the same PostgreSQL during the steady phase, p99", Value: r.Commit.P99Ms, Unit: "ms"},
	}
}

// fwdReceiver is the webhook: JSON lines of the forwarding rule on
// /forward, notifications on /alarm.
type fwdReceiver struct {
	devices int
	down    atomic.Bool
	reqs    atomic.Int64

	mu         sync.Mutex
	next       []int64 // per device: the next message index due
	delivered  int64
	repeats    int64
	outOfOrder int64
	lags       []int32 // ms, of first arrivals while recording
	recording  bool
	alarmAt    map[string]time.Time // device -> when its alarm's report was published
	alarmGot   map[string]time.Time // device -> when its first notification arrived
	alarmLags  []float64
}

func (r *fwdReceiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	now := time.Now()
	if req.URL.Path == "/alarm" {
		var n struct {
			Alarm map[string]any `json:"alarm"`
		}
		_ = json.Unmarshal(body, &n)
		dev, _ := n.Alarm["deviceId"].(string)
		r.mu.Lock()
		if _, again := r.alarmGot[dev]; !again {
			if at, ok := r.alarmAt[dev]; ok {
				r.alarmLags = append(r.alarmLags, float64(now.Sub(at).Microseconds())/1000)
				r.alarmGot[dev] = now
			}
		}
		r.mu.Unlock()
		return
	}
	if r.down.Load() {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	r.reqs.Add(1)
	nowMs := now.UnixMilli()
	r.mu.Lock()
	defer r.mu.Unlock()
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		l := sc.Bytes()
		k, ok1 := jsonInt(l, `"messageId":"`)
		ts, ok2 := jsonInt(l, `"time":`)
		if !ok1 || !ok2 {
			continue // an alarm device's report, or not ours
		}
		dev, idx := int(k%int64(r.devices)), k/int64(r.devices)
		switch {
		case idx == r.next[dev]:
			r.next[dev]++
			r.delivered++
			if r.recording {
				r.lags = append(r.lags, int32(nowMs-ts))
			}
		case idx < r.next[dev]:
			r.repeats++
		default:
			r.outOfOrder++
		}
	}
}

// jsonInt reads the integer after key in a line (the messageId is the
// message's global index as a string).
func jsonInt(l []byte, key string) (int64, bool) {
	i := bytes.Index(l, []byte(key))
	if i < 0 {
		return 0, false
	}
	l = l[i+len(key):]
	j := 0
	for j < len(l) && l[j] >= '0' && l[j] <= '9' {
		j++
	}
	v, err := strconv.ParseInt(string(l[:j]), 10, 64)
	return v, err == nil && j > 0
}

// RunForward runs the devicehub binary (api and ingest) on a private
// broker with a forwarding rule to a webhook in this process, and offers
// Rate reports/s: first with the webhook up (its lag), then with it
// answering 503 for Outage (ingest's rate against the first phase's),
// then until the webhook has every message (nothing missing, in order).
// During the first phase an alarm rule with a notification webhook sees
// Alarms reports over its threshold, one device at a time.
func RunForward(ctx context.Context, p ForwardParams) (res ForwardResult, err error) {
	if p.Rate <= 0 {
		p.Rate = 10_000
	}
	if p.Devices <= 0 {
		p.Devices = 1000
	}
	if p.Steady <= 0 {
		p.Steady = time.Minute
	}
	if p.Outage <= 0 {
		p.Outage = 5 * time.Minute
	}
	if p.Alarms <= 0 {
		p.Alarms = 200
	}
	if p.Timeout <= 0 {
		p.Timeout = 10 * time.Minute
	}
	run, err := p.withBroker(ctx, "forward")
	res.Params = p
	if err != nil {
		return res, err
	}
	defer run.cleanup()

	rcv := &fwdReceiver{devices: p.Devices, next: make([]int64, p.Devices), alarmAt: map[string]time.Time{},
		alarmGot: map[string]time.Time{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return res, err
	}
	hs := &http.Server{Handler: rcv, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = hs.Serve(ln) }()
	defer hs.Close()
	hook := "http://" + ln.Addr().String()

	p.Logf("forward: starting devicehub (api, ingest) on a private broker")
	args := append([]string{"-forward-dir", run.tmp + "/spool", "-forward-spool-bytes", "8GiB"}, p.ServerArgs...)
	srv, err := startChildAPI(ctx, childAPIConfig{Binary: run.bin, LogDir: run.tmp, DB: run.db, ClickHouseAddr: p.ClickHouseAddr,
		BrokerURL: run.broker.url(), Roles: "api,ingest", Args: args, Conns: 4})
	if err != nil {
		return res, err
	}
	defer srv.stop()
	peakRSS := pidRSSSampler(srv.pid())
	cpu0, _ := procCPUTime(srv.pid())

	product := "benchfwd" + randHex(4)
	if err := srv.deployProduct(ctx, product, "Bench forward", `{"properties":[{"id":"temp","name":"Temperature","valueType":{"type":"float"}},{"id":"hum","name":"Humidity","valueType":{"type":"float"}}]}`); err != nil {
		return res, err
	}
	ids := make([]string, p.Devices+p.Alarms)
	batch := make([]map[string]any, 0, len(ids))
	for i := range ids {
		ids[i] = product + "-" + strconv.Itoa(i)
		batch = append(batch, map[string]any{"id": ids[i], "name": ids[i], "productId": product})
	}
	for lo := 0; lo < len(batch); lo += 10_000 {
		if err := srv.call(ctx, "POST", "/api/device/instance/batch/_create?deploy=true", batch[lo:min(lo+10_000, len(batch))], nil); err != nil {
			return res, err
		}
	}
	// The forwarding rule (property reports of the load's devices), the
	// alarm rule and its notification.
	if err := srv.call(ctx, "POST", "/api/notify/forward", map[string]any{"id": "bench", "name": "Bench webhook", "productId": product,
		"types": []string{"property"}, "deviceIds": ids[:p.Devices], "secret": "bench-secret",
		"webhook": map[string]any{"url": hook + "/forward", "batchSize": 1000, "batchMs": 50}}, nil); err != nil {
		return res, err
	}
	if err := srv.call(ctx, "POST", "/api/alarm/config", map[string]any{"id": "hot", "name": "Hot", "productId": product, "severity": "major",
		"enabled": true, "trigger": map[string]any{"type": "property", "all": []any{map[string]any{"property": "temp", "op": "gt", "value": 1000}}}}, nil); err != nil {
		return res, err
	}
	if err := srv.call(ctx, "POST", "/api/notify/channel", map[string]any{"id": "hook", "name": "Hook", "webhook": map[string]any{"url": hook + "/alarm"}}, nil); err != nil {
		return res, err
	}
	if err := srv.call(ctx, "POST", "/api/notify/subscription", map[string]any{"name": "All", "products": []string{product},
		"kinds": []string{"raised"}, "channels": []string{"hook"}}, nil); err != nil {
		return res, err
	}

	// The private broker goes with its logins: no removal.
	gw, _, err := newGateway(ctx, run.broker.url())
	if err != nil {
		return res, err
	}
	pub, err := mqttConnect(run.broker.url(), "bench-pub-"+randHex(4), true, gw)
	if err != nil {
		return res, err
	}
	defer pub.Disconnect(100)
	metric := func(name string) float64 {
		m, err := srv.proc.scrapeMetrics(ctx)
		if err != nil {
			return -1
		}
		return m.sum(name)
	}
	// The forwarder and the alarm evaluator subscribe within a second of
	// their rules (their poll): wait until the forwarder's status shows.
	p.Logf("forward: waiting for the forwarder and the evaluator")
	deadline := time.Now().Add(30 * time.Second)
	for metric("devicehub_forward_owner") != 1 || metric("devicehub_alarm_owner") != 1 {
		if time.Now().After(deadline) {
			return res, fmt.Errorf("bench: the forwarder or the evaluator did not start\n%s", srv.proc.logTail())
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(2 * time.Second) // their subscriptions follow the rules within a poll

	backends, closeBackends := run.db.backends()
	defer closeBackends()
	procs := childProcs("generator and webhook", srv.pid(), backends, run.broker.url(), p.ClickHouseAddr)
	var k atomic.Int64 // the next message's global index
	phase := func(name string, d time.Duration, alarms bool) (ForwardPhase, error) {
		ph := ForwardPhase{}
		acked0 := metric("devicehub_ingest_acked_total")
		pub0 := k.Load()
		span := startCPUSpan(name, procs)
		t0 := time.Now()
		var alarmDone chan struct{}
		if alarms {
			alarmDone = make(chan struct{})
			go func() {
				defer close(alarmDone)
				gap := min(d/time.Duration(p.Alarms+1), 200*time.Millisecond)
				for i := range p.Alarms {
					time.Sleep(gap)
					dev := ids[p.Devices+i]
					rcv.mu.Lock()
					rcv.alarmAt[dev] = time.Now()
					rcv.mu.Unlock()
					pub.Publish(wire.DeviceTopic(product, dev, wire.LevelReport), 1, false, `{"properties":{"temp":2000}}`)
					res.AlarmsRaised++
				}
			}()
		}
		err := publishPaced(ctx, pub, p.Rate, t0.Add(d), func(buf []byte) (string, []byte) {
			n := k.Add(1) - 1
			dev := ids[n%int64(p.Devices)]
			buf = append(buf, `{"messageId":"`...)
			buf = strconv.AppendInt(buf, n, 10)
			buf = append(buf, `","timestamp":`...)
			buf = strconv.AppendInt(buf, time.Now().UnixMilli(), 10)
			buf = append(buf, `,"properties":{"temp":`...)
			buf = strconv.AppendInt(buf, n%100, 10)
			buf = append(buf, `,"hum":`...)
			buf = strconv.AppendInt(buf, n%50, 10)
			return wire.DeviceTopic(product, dev, wire.LevelReport), append(buf, "}}"...)
		})
		if alarmDone != nil {
			<-alarmDone
		}
		if err != nil {
			return ph, err
		}
		ph.CPU = span.breakdown(span.snapshot(), k.Load()-pub0)
		ph.Seconds = time.Since(t0).Seconds()
		ph.Published = k.Load() - pub0
		// Ingest's rate: what it acknowledged while the load ran, until
		// it had taken every message published in the phase.
		for metric("devicehub_ingest_acked_total")-acked0 < float64(ph.Published) && time.Since(t0) < d+time.Minute {
			time.Sleep(20 * time.Millisecond)
		}
		ph.IngestRate = (metric("devicehub_ingest_acked_total") - acked0) / time.Since(t0).Seconds()
		ph.EndLagSeconds = metric("devicehub_forward_lag_seconds")
		ph.EndSpoolBytes = metric("devicehub_forward_spool_bytes")
		p.Logf("forward: %s: %d published in %.1f s, ingest %.0f msg/s, forward lag %.1f s, spool %.1f MB\n%s", name, ph.Published,
			ph.Seconds, ph.IngestRate, ph.EndLagSeconds, ph.EndSpoolBytes/1e6, ph.CPU)
		return ph, nil
	}
	lagStats := func(ph *ForwardPhase) {
		rcv.mu.Lock()
		lags := slices.Clone(rcv.lags)
		rcv.lags, rcv.recording = rcv.lags[:0], false
		rcv.mu.Unlock()
		slices.Sort(lags)
		ph.Received = int64(len(lags))
		if len(lags) > 0 {
			ph.LagP50Ms = float64(lags[len(lags)/2])
			ph.LagP99Ms = float64(lags[min(len(lags)-1, len(lags)*99/100)])
			ph.LagMaxMs = float64(lags[len(lags)-1])
		}
	}

	commits, err := watchCommits(run.db.dsn())
	if err != nil {
		return res, err
	}
	defer commits.close()
	p.Logf("forward: steady phase, %d reports/s for %s, the webhook up, %d alarms raised meanwhile", p.Rate, p.Steady, p.Alarms)
	rcv.mu.Lock()
	rcv.recording = true
	rcv.mu.Unlock()
	stopProbe, err := startCommitProbe(ctx, run.db.dsn(), 20*time.Millisecond)
	if err != nil {
		return res, err
	}
	res.Steady, err = phase("sink up", p.Steady, true)
	res.Commit = stopProbe()
	if err != nil {
		return res, err
	}
	// Every steady message and alarm delivered before the outage starts.
	steadyAll := k.Load()
	for wait := time.Now().Add(time.Minute); ; {
		rcv.mu.Lock()
		d, notified := rcv.delivered, len(rcv.alarmLags)
		rcv.mu.Unlock()
		if d >= steadyAll && notified >= res.AlarmsRaised || time.Now().After(wait) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	lagStats(&res.Steady)
	rcv.mu.Lock()
	res.AlarmsNotified = len(rcv.alarmLags)
	res.Alarm = spanOf(slices.Clone(rcv.alarmLags))
	pubAt, gotAt := maps.Clone(rcv.alarmAt), maps.Clone(rcv.alarmGot)
	rcv.mu.Unlock()
	at, whole := commits.close()
	if res.AlarmSplit, err = splitAlarms(ctx, run.db.dsn(), pubAt, gotAt, at, whole); err != nil {
		return res, err
	}
	p.Logf("forward: alarms %s", res.AlarmSplit)

	p.Logf("forward: the webhook answers 503 for %s", p.Outage)
	rcv.down.Store(true)
	if res.Outage, err = phase("sink down", p.Outage, false); err != nil {
		return res, err
	}
	res.IngestRatio = Ratio(res.Outage.IngestRate, res.Steady.IngestRate)
	rcv.down.Store(false)
	t0 := time.Now()
	res.Published = k.Load()
	p.Logf("forward: the webhook is back; waiting for the backlog of %d messages", res.Published-steadyAll)
	for {
		rcv.mu.Lock()
		d := rcv.delivered
		rcv.mu.Unlock()
		if d >= res.Published || time.Since(t0) > p.Timeout || ctx.Err() != nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	res.CatchUpMs = float64(time.Since(t0).Milliseconds())
	rcv.mu.Lock()
	res.Delivered, res.Repeats, res.OutOfOrder = rcv.delivered, rcv.repeats, rcv.outOfOrder
	rcv.mu.Unlock()
	res.Missing = res.Published - res.Delivered
	res.Dropped = metric("devicehub_forward_dropped_total")
	res.Requests = rcv.reqs.Load()
	cpu1, _ := procCPUTime(srv.pid())
	res.DevicehubCPU = (cpu1 - cpu0).Seconds()
	res.DevicehubPeakMB = float64(peakRSS()) / (1 << 20)
	if res.Missing > 0 || res.OutOfOrder > 0 {
		return res, fmt.Errorf("bench: %d messages missing, %d out of order after %s", res.Missing, res.OutOfOrder, p.Timeout)
	}
	return res, nil
}

// publishPaced publishes next() at rate messages/s until deadline (QoS 1,
// a window of unacknowledged publishes).
func publishPaced(ctx context.Context, c mqtt.Client, rate int, deadline time.Time, next func(buf []byte) (string, []byte)) error {
	const window = 4096
	var ring [window]mqtt.Token
	start := time.Now()
	for n := int64(0); ctx.Err() == nil; n++ {
		due := start.Add(time.Duration(n) * time.Second / time.Duration(rate))
		if now := time.Now(); due.After(now) {
			if due.After(deadline) {
				break
			}
			if d := due.Sub(now); d > 2*time.Millisecond {
				time.Sleep(d)
			}
		} else if now.After(deadline) {
			break
		}
		slot := n % window
		if t := ring[slot]; t != nil && (!t.WaitTimeout(30*time.Second) || t.Error() != nil) {
			return fmt.Errorf("bench: publish: %v", t.Error())
		}
		topic, body := next(make([]byte, 0, 128))
		ring[slot] = c.Publish(topic, 1, false, body)
	}
	for _, t := range ring {
		if t != nil && (!t.WaitTimeout(30*time.Second) || t.Error() != nil) {
			return fmt.Errorf("bench: publish: %v", t.Error())
		}
	}
	return nil
}

// Span is one stretch of the alarms' latencies: its p50, p99 and max.
type Span struct {
	P50Ms float64 `json:"p50Ms"`
	P99Ms float64 `json:"p99Ms"`
	MaxMs float64 `json:"maxMs"`
}

func (s Span) String() string { return fmt.Sprintf("p50 %.0f ms p99 %.0f ms", s.P50Ms, s.P99Ms) }

// spanOf is the span of ms (sorted in place).
func spanOf(ms []float64) Span {
	if len(ms) == 0 {
		return Span{}
	}
	slices.Sort(ms)
	return Span{P50Ms: ms[len(ms)/2], P99Ms: ms[min(len(ms)-1, len(ms)*99/100)], MaxMs: ms[len(ms)-1]}
}

// AlarmSplit divides each notified alarm's latency (the report published
// -> its notification received) at the times PostgreSQL and the bench saw
// in between. All clocks are the one machine's.
type AlarmSplit struct {
	Alarms int `json:"alarms"` // alarms whose every time is known
	// Commit is how the commit was seen: "listen" (the outbox trigger's
	// announcement, sent at the commit, arriving at a LISTEN connection
	// of the bench: the same wake the dispatcher gets), or "write start"
	// (the write's transaction start, when the announcements and the
	// transactions did not pair one to one).
	Commit          string `json:"commit"`
	PublishToCommit Span   `json:"publishToCommit"`
	CommitToWebhook Span   `json:"commitToWebhook"`
	// The stretches within those two: published -> the evaluator received
	// the report (the transition's time: its arrival, to the millisecond
	// below, so a few are slightly negative) -> its write's
	// transaction began (the outbox row's create_time, now()) -> committed
	// -> the dispatcher's transaction that sent it began (done_time,
	// now()) -> the webhook received it.
	PublishToEvaluator Span `json:"publishToEvaluator"`
	EvaluatorToWrite   Span `json:"evaluatorToWrite"`
	WriteToCommit      Span `json:"writeToCommit"`
	CommitToClaim      Span `json:"commitToClaim"`
	ClaimToWebhook     Span `json:"claimToWebhook"`
}

func (a AlarmSplit) String() string {
	return fmt.Sprintf("split of %d (commit by %s): published -> committed %s (-> evaluator %s, -> write began %s, -> committed %s); "+
		"committed -> webhook %s (-> dispatcher's transaction began %s, -> webhook %s)", a.Alarms, a.Commit,
		a.PublishToCommit, a.PublishToEvaluator, a.EvaluatorToWrite, a.WriteToCommit, a.CommitToWebhook, a.CommitToClaim, a.ClaimToWebhook)
}

// commitWatch records when each announcement of the outbox trigger
// (devicehub_notify: one per transaction that enqueued, sent at its
// commit) reaches a LISTEN connection of the bench.
type commitWatch struct {
	mu      sync.Mutex
	at      []time.Time
	listens int // more than one: reconnected, announcements may be lost
	stop    chan struct{}
	done    chan struct{}
	once    sync.Once
}

func watchCommits(dsn string) (*commitWatch, error) {
	w := &commitWatch{stop: make(chan struct{}), done: make(chan struct{})}
	ready := make(chan struct{}, 1)
	var err error
	go func() {
		defer close(w.done)
		err = meta.Listen(dsn, []string{"devicehub_notify"}, meta.ListenHandler{
			Notify: func(string, string) {
				now := time.Now()
				w.mu.Lock()
				w.at = append(w.at, now)
				w.mu.Unlock()
			},
			Listening: func() {
				w.mu.Lock()
				w.listens++
				w.mu.Unlock()
				select {
				case ready <- struct{}{}:
				default:
				}
			},
		}, w.stop)
	}()
	select {
	case <-ready:
		return w, nil
	case <-w.done:
		return nil, fmt.Errorf("bench: LISTEN devicehub_notify: %v", err)
	case <-time.After(10 * time.Second):
		close(w.stop)
		<-w.done
		return nil, fmt.Errorf("bench: LISTEN devicehub_notify: no connection in 10 s")
	}
}

// close ends the watch (again: no-op): the announcements' arrivals, and
// whether none can have been lost (one connection throughout).
func (w *commitWatch) close() ([]time.Time, bool) {
	w.once.Do(func() { close(w.stop) })
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.at, w.listens == 1
}

// splitAlarms reads the raised notifications' times in the database of
// dsn and pairs them with the bench's: published (pub) and received
// (got), per device. commits are the announcements' arrivals; whole says
// none was lost. The alarm evaluator writes one transaction at a time,
// so the k-th transaction that enqueued commits before the (k+1)-th
// begins and is the k-th announcement.
func splitAlarms(ctx context.Context, dsn string, pub, got map[string]time.Time, commits []time.Time, whole bool) (AlarmSplit, error) {
	var a AlarmSplit
	db, err := openPG(dsn, 1)
	if err != nil {
		return a, err
	}
	defer db.Close()
	rows, err := db.QueryContext(ctx, `SELECT o.payload->>'deviceId', t.time, o.create_time, o.done_time
		FROM notify_outbox o JOIN alarm_transitions t ON o.step = 't' || t.id
		WHERE o.kind = 'raised' AND o.state = 'delivered'`)
	if err != nil {
		return a, fmt.Errorf("bench: alarm times: %w", err)
	}
	defer rows.Close()
	type alarmTimes struct {
		dev                  string
		eval, write, claimed time.Time
	}
	var all []alarmTimes
	writes := map[time.Time]bool{}
	for rows.Next() {
		var t alarmTimes
		if err := rows.Scan(&t.dev, &t.eval, &t.write, &t.claimed); err != nil {
			return a, fmt.Errorf("bench: alarm times: %w", err)
		}
		all = append(all, t)
		writes[t.write] = true
	}
	if err := rows.Err(); err != nil {
		return a, fmt.Errorf("bench: alarm times: %w", err)
	}
	// Every enqueuing transaction's start: a raise not yet delivered
	// counts too.
	var starts []time.Time
	if err := func() error {
		r, err := db.QueryContext(ctx, `SELECT DISTINCT create_time FROM notify_outbox WHERE kind = 'raised' ORDER BY 1`)
		if err != nil {
			return err
		}
		defer r.Close()
		for r.Next() {
			var t time.Time
			if err := r.Scan(&t); err != nil {
				return err
			}
			starts = append(starts, t)
		}
		return r.Err()
	}(); err != nil {
		return a, fmt.Errorf("bench: alarm transactions: %w", err)
	}
	commitOf := func(write time.Time) time.Time { return write }
	a.Commit = "write start"
	if whole && len(starts) == len(commits) {
		a.Commit = "listen"
		commitOf = func(write time.Time) time.Time {
			i, _ := slices.BinarySearchFunc(starts, write, time.Time.Compare)
			return commits[i]
		}
	}
	msOf := func(from, to time.Time) float64 { return float64(to.Sub(from).Microseconds()) / 1000 }
	var pubCommit, commitHook, pubEval, evalWrite, writeCommit, commitClaim, claimHook []float64
	for _, t := range all {
		p, ok1 := pub[t.dev]
		g, ok2 := got[t.dev]
		if !ok1 || !ok2 {
			continue
		}
		c := commitOf(t.write)
		pubCommit, commitHook = append(pubCommit, msOf(p, c)), append(commitHook, msOf(c, g))
		pubEval, evalWrite, writeCommit = append(pubEval, msOf(p, t.eval)), append(evalWrite, msOf(t.eval, t.write)), append(writeCommit, msOf(t.write, c))
		commitClaim, claimHook = append(commitClaim, msOf(c, t.claimed)), append(claimHook, msOf(t.claimed, g))
	}
	a.Alarms = len(pubCommit)
	a.PublishToCommit, a.CommitToWebhook = spanOf(pubCommit), spanOf(commitHook)
	a.PublishToEvaluator, a.EvaluatorToWrite, a.WriteToCommit = spanOf(pubEval), spanOf(evalWrite), spanOf(writeCommit)
	a.CommitToClaim, a.ClaimToWebhook = spanOf(commitClaim), spanOf(claimHook)
	return a, nil
}
