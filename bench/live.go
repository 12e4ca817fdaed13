package bench

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"devicehub/api"
	"devicehub/api/live"
	"devicehub/ingest/wire"
	"devicehub/meta"
	"devicehub/tsdb"
)

// LiveParams configure RunLive. Zero fields take the defaults noted.
type LiveParams struct {
	// The load: Rate reports/s of one property each, spread over Devices
	// devices, at QoS. Default 2,000/s from 100 devices at QoS 1, the
	// soak scenario's steady load.
	Rate    int  `json:"rate"`
	Devices int  `json:"devices"`
	QoS     byte `json:"qos"`
	// Watched devices (the first of Devices) are what each of
	// Subscribers streams watch. Default 10 and 4: 200 values/s to each.
	Watched     int `json:"watched"`
	Subscribers int `json:"subscribers"`
	// Duration of each phase's publishing. Default 20s.
	Duration  time.Duration `json:"duration"`
	BrokerURL string        `json:"brokerUrl"` // default tcp://127.0.0.1:1884
	// ChildParams: the devicehub child (it runs with roles api,ingest).
	ChildParams
}

func (p LiveParams) withDefaults() LiveParams {
	p.BrokerURL = cmp.Or(p.BrokerURL, "tcp://127.0.0.1:1884")
	p.childDefaults()
	if p.Rate <= 0 {
		p.Rate = 2000
	}
	if p.Devices <= 0 {
		p.Devices = 100
	}
	if p.Watched <= 0 {
		p.Watched = 10
	}
	p.Watched = min(p.Watched, p.Devices)
	if p.Subscribers <= 0 {
		p.Subscribers = 4
	}
	if p.Duration <= 0 {
		p.Duration = 20 * time.Second
	}
	return p
}

// LiveResult is what RunLive measured.
type LiveResult struct {
	Params LiveParams `json:"params"`
	// EndToEnd: from the publish of a report by the simulated device to
	// the receipt of its value by a subscriber of the devicehub binary (a
	// child process with its default settings, roles api,ingest): the
	// broker, ingest's batch (flushed every second by default) and its
	// insert, then the hub and the stream.
	EndToEnd LiveLatency `json:"endToEnd"`
	// AfterStorage: from the hub's Stored call, as ingest makes it once a
	// batch is committed, to the receipt by a subscriber; the same values
	// per second in one batch a second, through the real API server and
	// hub in this process.
	AfterStorage LiveLatency `json:"afterStorage"`
	ServerPID    int         `json:"serverPid"`
	PeakRSS      int64       `json:"serverPeakRssBytes"`
}

// LiveLatency is one phase's latencies and counts, over every subscriber.
type LiveLatency struct {
	Latency  LatencySummary `json:"latency"`
	Expected int64          `json:"expected"` // values of watched devices x subscribers
	Received int64          `json:"received"`
	Skipped  int64          `json:"skipped"` // told by skipped events
}

func (l LiveLatency) String() string {
	return fmt.Sprintf("%s received %d of %d, skipped %d", l.Latency, l.Received, l.Expected, l.Skipped)
}

func (r LiveResult) String() string {
	return fmt.Sprintf("live: %d reports/s from %d devices at QoS %d, %d watched by %d subscribers\n  published -> received (devicehub binary): %s\n  stored -> received (hub and HTTP, in process): %s\n  server peak RSS %d MiB",
		r.Params.Rate, r.Params.Devices, r.Params.QoS, r.Params.Watched, r.Params.Subscribers, r.EndToEnd, r.AfterStorage, r.PeakRSS>>20)
}

// RunLive measures live-update latency in two phases. End to end: the
// devicehub binary as a child (roles api,ingest, default settings) on
// fresh databases, a gateway publishing p.Rate reports/s round-robin over
// p.Devices devices, and p.Subscribers streams of GET /api/live watching
// the first p.Watched devices; each report carries its sequence number,
// which gives its publish time. After storage: the API server and a hub
// in this process, the watched devices' values of each second handed to
// the hub at once, as ingest's batch commit does.
func RunLive(ctx context.Context, p LiveParams) (LiveResult, error) {
	p = p.withDefaults()
	res := LiveResult{Params: p}
	var err error
	if res.EndToEnd, err = liveEndToEnd(ctx, p, &res); err != nil {
		return res, err
	}
	p.Logf("live: published -> received %s", res.EndToEnd)
	if res.AfterStorage, err = liveAfterStorage(ctx, p); err != nil {
		return res, err
	}
	p.Logf("live: stored -> received %s", res.AfterStorage)
	return res, nil
}

// liveReceiver counts and times what subscribers receive; sent holds each
// sequence number's send time (unix ns, 0 until sent).
type liveReceiver struct {
	sent              []atomic.Int64
	hist              Histogram
	received, skipped atomic.Int64
	firstErr          atomic.Pointer[error]
	wg                sync.WaitGroup
	mu                sync.Mutex
	bodies            []interface{ Close() error }
}

// subscribe opens a stream at base with token and reads it on a
// goroutine until it ends.
func (r *liveReceiver) subscribe(ctx context.Context, base, token string, devices []string) error {
	return r.subscribeFunc(ctx, base, token, devices, r.event)
}

// subscribeFunc opens a stream as subscribe does and hands each event to
// fn with its receipt time.
func (r *liveReceiver) subscribeFunc(ctx context.Context, base, token string, devices []string, fn func(name string, data []byte, now time.Time)) error {
	q := url.Values{"deviceId": devices, "token": {token}}
	req, err := http.NewRequestWithContext(ctx, "GET", base+"/api/live?"+q.Encode(), nil)
	if err != nil {
		return err
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	if res.StatusCode != 200 {
		res.Body.Close()
		return fmt.Errorf("bench: GET /api/live: %s", res.Status)
	}
	r.mu.Lock()
	r.bodies = append(r.bodies, res.Body)
	r.mu.Unlock()
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		br := bufio.NewReaderSize(res.Body, 64<<10)
		var name string
		for {
			line, err := br.ReadSlice('\n')
			if err != nil {
				return
			}
			now := time.Now()
			switch {
			case len(line) > 7 && string(line[:7]) == "event: ":
				name = strings.TrimSpace(string(line[7:]))
			case len(line) > 6 && string(line[:6]) == "data: ":
				fn(name, line[6:], now)
			}
		}
	}()
	return nil
}

func (r *liveReceiver) event(name string, data []byte, now time.Time) {
	switch name {
	case live.EventProperty:
		var e struct {
			Value float64 `json:"value"`
		}
		if err := json.Unmarshal(data, &e); err != nil || e.Value < 0 || int(e.Value) >= len(r.sent) {
			err = fmt.Errorf("bench: live event %q: %v", data, err)
			r.firstErr.CompareAndSwap(nil, &err)
			return
		}
		if at := r.sent[int(e.Value)].Load(); at > 0 {
			r.hist.Record(now.Sub(time.Unix(0, at)))
		}
		r.received.Add(1)
	case live.EventSkipped:
		var e live.SkippedEvent
		if json.Unmarshal(data, &e) == nil {
			r.skipped.Add(int64(e.Count))
		}
	}
}

func (r *liveReceiver) close() {
	r.mu.Lock()
	for _, b := range r.bodies {
		b.Close()
	}
	r.mu.Unlock()
	r.wg.Wait()
}

// result waits until every expected value arrived (or was told skipped),
// at most grace, then closes the streams.
func (r *liveReceiver) result(expected int64, grace time.Duration) (LiveLatency, error) {
	deadline := time.Now().Add(grace)
	for r.received.Load()+r.skipped.Load() < expected && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	r.close()
	l := LiveLatency{Latency: r.hist.Summary(), Expected: expected, Received: r.received.Load(), Skipped: r.skipped.Load()}
	if e := r.firstErr.Load(); e != nil {
		return l, *e
	}
	return l, nil
}

func liveIDs(prefix string, n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = prefix + "-" + strconv.Itoa(i)
	}
	return ids
}

func liveEndToEnd(ctx context.Context, p LiveParams, res *LiveResult) (LiveLatency, error) {
	var out LiveLatency
	tmp, bin, db, cleanup, err := p.prepare(ctx, "live")
	if err != nil {
		return out, err
	}
	defer cleanup()
	gateway, removeGateway, err := newGateway(ctx, p.BrokerURL)
	if err != nil {
		return out, err
	}
	defer removeGateway()
	p.Logf("live: starting devicehub (roles api,ingest)")
	srv, err := startChildAPI(ctx, childAPIConfig{Binary: bin, LogDir: tmp, DB: db, ClickHouseAddr: p.ClickHouseAddr,
		BrokerURL: p.BrokerURL, Roles: "api,ingest", Args: p.ServerArgs, Conns: 4})
	if err != nil {
		return out, err
	}
	defer srv.stop()
	res.ServerPID = srv.pid()
	product := "benchlive" + randHex(3)
	ids := liveIDs(product, p.Devices)
	if err := addDevices(ctx, db.dsn(), product, ids); err != nil {
		return out, err
	}

	n := p.Rate * int(p.Duration/time.Second)
	r := &liveReceiver{sent: make([]atomic.Int64, n)}
	for range p.Subscribers {
		if err := r.subscribe(ctx, srv.base, srv.token, ids[:p.Watched]); err != nil {
			return out, err
		}
	}
	pub := mqtt.NewClient(pahoOptions(gateway, p.BrokerURL, "bench-live-pub-"+randHex(4)).
		SetCleanSession(true).SetAutoReconnect(false).SetWriteTimeout(10 * time.Second))
	if t := pub.Connect(); !t.WaitTimeout(10*time.Second) || t.Error() != nil {
		return out, fmt.Errorf("bench: live publisher: %v", t.Error())
	}
	defer pub.Disconnect(250)

	p.Logf("live: %d reports/s for %s, %d devices watched by %d subscribers", p.Rate, p.Duration, p.Watched, p.Subscribers)
	stopRSS := pidRSSSampler(srv.pid())
	watched := 0
	if err := pace(ctx, p.Rate, n, func(k int) {
		d := k % len(ids)
		if d < p.Watched {
			watched++
		}
		r.sent[k].Store(time.Now().UnixNano())
		pub.Publish(wire.DeviceTopic(product, ids[d], wire.LevelReport), p.QoS, false, `{"properties":{"v":`+strconv.Itoa(k)+`}}`)
	}); err != nil {
		return out, err
	}
	out, err = r.result(int64(watched*p.Subscribers), 10*time.Second)
	res.PeakRSS = stopRSS()
	if err != nil {
		return out, err
	}
	if out.Received+out.Skipped < out.Expected {
		return out, fmt.Errorf("bench: live end to end: %d received and %d skipped of %d\n%s", out.Received, out.Skipped, out.Expected, srv.proc.logTail())
	}
	return out, nil
}

// pace calls publish(k) for k in 0..n-1 at rate per second, in ticks of
// 10 ms.
func pace(ctx context.Context, rate, n int, publish func(k int)) error {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	start := time.Now()
	for k := 0; k < n; {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
		due := min(n, int(time.Since(start).Seconds()*float64(rate)))
		for ; k < due; k++ {
			publish(k)
		}
	}
	return nil
}

// liveAfterStorage: the API server and a hub in this process; once a
// second the hub is handed the watched devices' values of that second,
// one call per value, as ingest's writer does after committing a batch.
func liveAfterStorage(ctx context.Context, p LiveParams) (LiveLatency, error) {
	var out LiveLatency
	hub, err := live.New(ctx, live.Options{})
	if err != nil {
		return out, err
	}
	product := "benchlive" + randHex(3)
	ids := liveIDs(product, p.Devices)
	s, err := startBenchServer(ctx, p.PostgresDSN, "devicehub_bench_live", 4, func(store *meta.Store, deps *api.Deps, bs *benchServer) error {
		deps.Live, deps.LiveDevices = hub, store
		bs.closers = append(bs.closers, hub.Close)
		return addDevices(ctx, bs.db.dsn(), product, ids)
	})
	if err != nil {
		hub.Close()
		return out, err
	}
	defer s.close()
	n := p.Rate * int(p.Duration/time.Second)
	r := &liveReceiver{sent: make([]atomic.Int64, n)}
	for range p.Subscribers {
		if err := r.subscribe(ctx, s.base, s.token, ids[:p.Watched]); err != nil {
			return out, err
		}
	}
	p.Logf("live: hub and HTTP in process, %d values/s in one batch a second", p.Rate)
	watched := 0
	value := []tsdb.PropertyValue{{ProductID: product, Property: "v", ValueType: "number"}}
	batch := time.NewTicker(time.Second)
	defer batch.Stop()
	for k := 0; k < n; {
		select {
		case <-ctx.Done():
			return out, ctx.Err()
		case <-batch.C:
		}
		for end := min(n, k+p.Rate); k < end; k++ {
			d := k % len(ids)
			if d >= p.Watched {
				continue // ingest asks Watching first: no call for these
			}
			watched++
			value[0].DeviceID, value[0].Num, value[0].Time = ids[d], float64(k), time.Now()
			r.sent[k].Store(time.Now().UnixNano())
			hub.Stored(value)
		}
	}
	out, err = r.result(int64(watched*p.Subscribers), 10*time.Second)
	if err != nil {
		return out, err
	}
	if out.Received+out.Skipped < out.Expected {
		return out, errors.New("bench: live after storage: values missing")
	}
	return out, nil
}
