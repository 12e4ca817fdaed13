// Package bench measures devicehub end to end against the real services:
// RunIngest starts the real devicehub binary as a child process, drives
// simulated devices through the MQTT broker into it and ClickHouse, and
// measures the broker's own pass-through and ClickHouse's raw insert rate
// in the same run, so results are ratios to what the machine can do. It is
// used by `go test -bench` here and by cmd tools.
package bench

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"devicehub/ingest"
	"devicehub/ingest/mqttconn"
	"devicehub/ingest/wire"
)

// IngestParams configure RunIngest. Zero fields take the defaults noted.
type IngestParams struct {
	gateway   mqttconn.Login // the publishers' broker login
	BrokerURL string         // default tcp://127.0.0.1:1884
	// ChildParams: the devicehub child.
	ChildParams
	Devices            int           // simulated devices, default 1000; device i reports 2 + i%13 properties
	Duration           time.Duration // publishing time of the ingest phase, default 15s
	BrokerDuration     time.Duration // publishing time of the broker-ceiling phase, default 5s
	ClickHouseDuration time.Duration // inserting time of the raw ClickHouse ceiling, default BrokerDuration
	// QoS of the publishers. The server subscribes at its default QoS 1,
	// so messages reach it at this QoS.
	QoS         byte
	Publishers  int // publishing connections, default 4
	Connections int // the server's subscriber connections (-ingest-connections), default the server's (one per two cores)

	// ClickHouseCluster spreads the tables over this cluster
	// (tsdb.Options.Cluster; ClickHouseAddr: a node, or nodes, of it).
	// Default "": one server.
	ClickHouseCluster string
}

// IngestResult is what RunIngest measured.
type IngestResult struct {
	QoS         byte
	Devices     int
	Published   int64         // messages published in the ingest phase
	Stored      int64         // of them in ClickHouse at the end
	Properties  int64         // property rows stored
	Elapsed     time.Duration // first publish to last message stored
	PublishRate float64       // msgs/s offered by the generator
	IngestRate  float64       // msgs/s published -> count() in ClickHouse
	// BrokerRate is the broker's pass-through, one paho publisher to one
	// paho subscriber: the mean of BrokerBefore, measured first, and
	// BrokerAfter, once the ingest phase is over and its databases are
	// dropped. The machine's speed drifts by tens of percent over minutes
	// (BENCHMARKS.md), so a ceiling on one side of the ingest phase alone
	// decided a run's ratio more than ingest did.
	BrokerRate                float64
	BrokerBefore, BrokerAfter float64
	Ratio                     float64 // IngestRate / BrokerRate
	// ClickHouse is the raw insert ceiling: the same rows through
	// tsdb.Writer, no MQTT.
	ClickHouse      ClickHouseCeilingResult
	ClickHouseRatio float64 // IngestRate / ClickHouse.Rate
	// CPUBound estimates the most msgs/s any ingest could store on this
	// machine from the same run's CPU figures (cpuBound): the machine's
	// cores over the CPU per message of the broker pass-through
	// (publisher, broker, subscriber) plus that of the raw ClickHouse
	// insert (client encoding, server). BoundRatio is CPUBound /
	// BrokerRate: the best ratio this machine allows, what a receiver that
	// costs no more than a bare paho subscriber and a decoder that costs
	// nothing would reach.
	CPUBound     float64
	BoundRatio   float64
	ServerPID    int
	PeakRSS      int64 // bytes, peak VmRSS of the devicehub server process during the ingest phase
	GeneratorRSS int64 // bytes, peak VmRSS of this process (the generator) meanwhile
	// From the server's /metrics at the end of the ingest phase.
	Received     int64             // MQTT messages the server received (any product on the broker)
	Flushes      int64             // successful ClickHouse inserts (messages and properties count apart)
	FlushTime    time.Duration     // total time inside them
	AvgBatchRows float64           // rows per insert
	FlushErrors  int64             // failed inserts (retried)
	Dropped      map[string]uint64 // by reason, zeros left out
	// CPU per process in each phase: broker ceiling, raw ClickHouse
	// insert, ingest, broker ceiling again.
	CPU []CPUBreakdown
}

func (r IngestResult) String() string {
	s := fmt.Sprintf("qos=%d devices=%d published=%d stored=%d props=%d elapsed=%s publish=%.0f/s ingest=%.0f msg/s"+
		" broker=%.0f msg/s (ratio %.2f; before %.0f, after %.0f) clickhouse=%.0f msg/s, %.0f rows/s (ratio %.2f)"+
		" CPU bound=%.0f msg/s (ratio %.2f) server peakRSS=%dMiB generator peakRSS=%dMiB inserts=%d avg=%s rows/insert=%.0f",
		r.QoS, r.Devices, r.Published, r.Stored, r.Properties, r.Elapsed.Round(time.Millisecond), r.PublishRate,
		r.IngestRate, r.BrokerRate, r.Ratio, r.BrokerBefore, r.BrokerAfter, r.ClickHouse.Rate, r.ClickHouse.RowRate, r.ClickHouseRatio,
		r.CPUBound, r.BoundRatio, r.PeakRSS>>20, r.GeneratorRSS>>20, r.Flushes, (r.FlushTime / time.Duration(max(r.Flushes, 1))).Round(time.Millisecond), r.AvgBatchRows)
	if r.FlushErrors > 0 {
		s += fmt.Sprintf(" insert-errors=%d", r.FlushErrors)
	}
	if len(r.Dropped) > 0 {
		reasons := make([]string, 0, len(r.Dropped))
		for k, v := range r.Dropped {
			reasons = append(reasons, k+"="+strconv.FormatUint(v, 10))
		}
		sort.Strings(reasons)
		s += " dropped: " + strings.Join(reasons, ",")
	}
	for _, c := range r.CPU {
		s += "\n  " + c.String()
	}
	return s
}

func (p IngestParams) withDefaults() IngestParams {
	p.BrokerURL = cmp.Or(p.BrokerURL, "tcp://127.0.0.1:1884")
	p.childDefaults()
	if p.Devices <= 0 {
		p.Devices = 1000
	}
	if p.Duration <= 0 {
		p.Duration = 15 * time.Second
	}
	if p.BrokerDuration <= 0 {
		p.BrokerDuration = 5 * time.Second
	}
	if p.ClickHouseDuration <= 0 {
		p.ClickHouseDuration = p.BrokerDuration
	}
	if p.Publishers <= 0 {
		p.Publishers = 4
	}
	return p
}

// randHex is n random bytes in hex, for the names of a run's databases,
// products and clients.
func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// RunIngest measures, at p.QoS, the broker ceiling, the raw ClickHouse
// insert ceiling, then ingest end to end through the devicehub binary
// running as a child process, then the broker ceiling again, with the CPU
// each process spent in each phase. It creates (and drops) its own PostgreSQL and ClickHouse
// databases.
func RunIngest(ctx context.Context, p IngestParams) (IngestResult, error) {
	p = p.withDefaults()
	res := IngestResult{QoS: p.QoS, Devices: p.Devices}
	gateway, removeGateway, err := newGateway(ctx, p.BrokerURL)
	if err != nil {
		return res, err
	}
	defer removeGateway()
	p.gateway = gateway
	tmp, bin, err := p.workDir(ctx, "ingest")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(tmp)
	mosq, chs := brokerPID(p.BrokerURL), clickhouseProcs(ctx, p.ClickHouseAddr, p.ClickHouseCluster)
	procs := func(self string, server int) []namedProc {
		ps := []namedProc{{Name: "bench (" + self + ")", PID: 0}}
		if server > 0 {
			ps = append(ps, namedProc{Name: "devicehub (server)", PID: server})
		}
		if mosq > 0 {
			ps = append(ps, namedProc{Name: "mosquitto", PID: mosq})
		}
		return append(ps, chs...)
	}

	product := "bench-" + randHex(3)
	ids := make([]string, p.Devices)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s-%06d", product, i)
	}

	// Ceilings first, with nothing else of this run running.
	bc, err := brokerCeiling(ctx, "broker pass-through", p.BrokerURL, p.gateway, p.QoS, p.BrokerDuration, procs("paho publisher and subscriber", 0))
	if err != nil {
		return res, err
	}
	res.BrokerBefore = bc.rate
	res.CPU = append(res.CPU, bc.cpu)
	if res.ClickHouse, err = clickHouseCeiling(ctx, p, product, ids, procs("tsdb writers", 0)); err != nil {
		return res, err
	}
	res.CPU = append(res.CPU, res.ClickHouse.CPU)
	// Give the ceiling's rows back, so the generator's RSS is its own.
	debug.FreeOSMemory()

	// Databases of this run, the product and its deployed devices.
	db, err := openRunDB(ctx, p.PostgresDSN, p.ClickHouseAddr, p.ClickHouseCluster, "devicehub_bench_", product, ids)
	if err != nil {
		return res, err
	}
	defer db.close()
	ch, name := db.ch, db.name

	// The server, configured as an operator would, on this run's databases.
	clientID := "bench-ingest-" + randHex(4)
	conns := ingest.DefaultOptions().Connections
	args := append([]string(nil), p.ServerArgs...)
	// Its default subscription (one plain one), unless more connections
	// are asked for: they share a group of their own.
	shareGroup := ingest.NoShareGroup
	if p.Connections > 0 {
		conns = p.Connections
		args = append(args, "-ingest-connections="+strconv.Itoa(p.Connections))
		shareGroup = "bench" + randHex(4)
	}
	if p.ClickHouseCluster != "" {
		args = append(args, "-clickhouse-cluster="+p.ClickHouseCluster)
	}
	srv, err := startServer(ctx, bin, tmp, serverConfig{Args: args, Env: map[string]string{
		"POSTGRES_DSN":     db.dsn,
		"CLICKHOUSE_ADDR":  p.ClickHouseAddr,
		"CLICKHOUSE_DB":    name,
		"TIMEZONE":         "UTC", // as this process opened the database
		"MQTT_URL":         p.BrokerURL,
		"MQTT_CLIENT_ID":   clientID,
		"MQTT_SHARE_GROUP": shareGroup,
		"ROLES":            "api,ingest",
		"ADMIN_PASSWORD":   randHex(8),
		"LOG_LEVEL":        "warn",
		"DEVICE_AUTH":      "none", // the generator logs in as a gateway
		"SHUTDOWN_TIMEOUT": "30s",
	}})
	if err != nil {
		return res, err
	}
	res.ServerPID = srv.pid()
	stopped := false
	defer func() {
		if !stopped {
			_ = srv.stop(35 * time.Second)
		}
		purgeSessions(p.BrokerURL, clientID, conns)
	}()
	stopRSS := pidRSSSampler(srv.pid())
	defer stopRSS()
	stopGenRSS := rssSampler()
	defer stopGenRSS()

	span := startCPUSpan("ingest", procs("generator", srv.pid()))
	start := time.Now()
	published, err := publishDevices(ctx, p, product, ids)
	pubElapsed := time.Since(start)
	res.Published = published
	res.PublishRate = float64(published) / pubElapsed.Seconds()
	if err != nil {
		return res, err
	}
	// Wait until ClickHouse has every message (or progress stops); the
	// phase ends at the last progress.
	var stored uint64
	end, last := span.snapshot(), uint64(0)
	for {
		if err := ch.Conn().QueryRow(ctx, "SELECT count() FROM device_message").Scan(&stored); err != nil {
			return res, err
		}
		if stored != last {
			last, end = stored, span.snapshot()
		}
		if int64(stored) >= published || time.Since(end.at) > 10*time.Second {
			break
		}
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	res.Elapsed = end.at.Sub(start)
	res.Stored = int64(last)
	res.CPU = append(res.CPU, span.breakdown(end, res.Stored))
	res.PeakRSS, res.GeneratorRSS = stopRSS(), stopGenRSS()
	var props uint64
	_ = ch.Conn().QueryRow(ctx, "SELECT count() FROM device_property").Scan(&props)
	res.Properties = int64(props)
	res.IngestRate = float64(res.Stored) / res.Elapsed.Seconds()
	res.ClickHouseRatio = Ratio(res.IngestRate, res.ClickHouse.Rate)

	// The server's own counters.
	m, merr := srv.scrapeMetrics(ctx)
	if merr == nil {
		res.Received = int64(m.sum("devicehub_ingest_received_total"))
		res.Flushes = int64(m.sum("devicehub_ingest_flush_seconds_count"))
		res.FlushTime = time.Duration(m.sum("devicehub_ingest_flush_seconds_sum") * float64(time.Second))
		res.AvgBatchRows = Ratio(m.sum("devicehub_ingest_batch_rows_sum"), m.sum("devicehub_ingest_batch_rows_count"))
		res.FlushErrors = int64(m.sum("devicehub_ingest_flush_errors_total"))
		res.Dropped = m.byLabel("devicehub_ingest_dropped_total", "reason")
	}
	stopped = true
	serr := srv.stop(35 * time.Second)
	if res.Stored < res.Published {
		return res, fmt.Errorf("bench: %d of %d messages stored", res.Stored, res.Published)
	}

	// The ceiling again, on the far side of the ingest phase: this run's
	// ClickHouse database goes first, so no merge of its parts runs
	// meanwhile.
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	derr := ch.DropDatabase(dctx)
	cancel()
	if derr != nil {
		return res, derr
	}
	bc, err = brokerCeiling(ctx, "broker pass-through, after ingest", p.BrokerURL, p.gateway, p.QoS, p.BrokerDuration, procs("paho publisher and subscriber", 0))
	if err != nil {
		return res, err
	}
	res.BrokerAfter = bc.rate
	res.CPU = append(res.CPU, bc.cpu)
	res.BrokerRate = (res.BrokerBefore + res.BrokerAfter) / 2
	res.Ratio = Ratio(res.IngestRate, res.BrokerRate)
	res.CPUBound = cpuBound(res.ClickHouse.CPU, res.CPU[0], bc.cpu)
	res.BoundRatio = Ratio(res.CPUBound, res.BrokerRate)
	return res, errors.Join(merr, serr)
}

// cpuBound is the msgs/s a CPU-bound machine could sustain if every
// message cost the broker pass-through's CPU (the mean of the phases in
// passThrough: one publisher, Mosquitto, one subscriber) plus the raw
// insert's (insert: the tsdb client and ClickHouse), the least an ingest
// spends on a message end to end. Each phase counts the whole machine's
// busy time where it was read, else its processes'. 0 when a phase has no
// figures.
func cpuBound(insert CPUBreakdown, passThrough ...CPUBreakdown) float64 {
	perMsg := func(c CPUBreakdown) float64 {
		if c.Machine != nil {
			return c.Machine.MicrosPerMsg
		}
		return c.Total.MicrosPerMsg
	}
	var pt float64
	for _, c := range passThrough {
		if perMsg(c) <= 0 {
			return 0
		}
		pt += perMsg(c) / float64(len(passThrough))
	}
	if len(passThrough) == 0 || perMsg(insert) <= 0 || insert.MachineCores <= 0 {
		return 0
	}
	return float64(insert.MachineCores) * 1e6 / (pt + perMsg(insert))
}

// reportPayload builds a report of device i at sequence n.
func reportPayload(buf []byte, id string, i int, n int64) []byte {
	buf = append(buf[:0], `{"messageId":"`...)
	buf = append(buf, id...)
	buf = append(buf, '-')
	buf = strconv.AppendInt(buf, n, 10)
	buf = append(buf, `","timestamp":`...)
	buf = strconv.AppendInt(buf, time.Now().UnixMilli(), 10)
	buf = append(buf, `,"properties":{`...)
	for j := range 2 + i%13 {
		if j > 0 {
			buf = append(buf, ',')
		}
		buf = append(buf, `"p`...)
		buf = strconv.AppendInt(buf, int64(j), 10)
		buf = append(buf, `":`...)
		if j%4 == 3 {
			buf = append(buf, `"on"`...)
		} else {
			buf = strconv.AppendFloat(buf, float64(n%1000)+float64(j)/10, 'f', 1, 64)
		}
	}
	return append(buf, "}}"...)
}

// publishDevices publishes reports of every device round robin from
// p.Publishers connections for p.Duration, as fast as they go.
func publishDevices(ctx context.Context, p IngestParams, product string, ids []string) (int64, error) {
	var total atomic.Int64
	var wg sync.WaitGroup
	errc := make(chan error, p.Publishers)
	deadline := time.Now().Add(p.Duration)
	for w := range p.Publishers {
		c, err := mqttConnect(p.BrokerURL, "bench-pub-"+randHex(4), true, p.gateway)
		if err != nil {
			return 0, err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Disconnect(100)
			n, err := publishLoop(ctx, c, p.QoS, deadline, func(buf []byte, k int64) (string, []byte) {
				i := (w + int(k)*p.Publishers) % len(ids)
				return wire.DeviceTopic(product, ids[i], wire.LevelReport), reportPayload(buf, ids[i], i, k)
			})
			total.Add(n)
			if err != nil {
				errc <- err
			}
		}()
	}
	wg.Wait()
	close(errc)
	return total.Load(), <-errc
}

// publishLoop publishes next() until deadline, keeping a window of
// unacknowledged QoS 1 publishes; it returns the messages published.
func publishLoop(ctx context.Context, c mqtt.Client, qos byte, deadline time.Time, next func(buf []byte, k int64) (string, []byte)) (int64, error) {
	const window = 4096
	var ring [window]mqtt.Token
	var n int64
	for ; time.Now().Before(deadline) && ctx.Err() == nil; n++ {
		slot := n % window
		if t := ring[slot]; t != nil {
			if !t.WaitTimeout(30*time.Second) || t.Error() != nil {
				return n, fmt.Errorf("bench: publish: %v", t.Error())
			}
		}
		topic, body := next(make([]byte, 0, 256), n)
		ring[slot] = c.Publish(topic, qos, false, body)
	}
	for _, t := range ring {
		if t != nil && (!t.WaitTimeout(30*time.Second) || t.Error() != nil) {
			return n, fmt.Errorf("bench: publish: %v", t.Error())
		}
	}
	return n, nil
}

func mqttConnect(broker, id string, clean bool, login mqttconn.Login) (mqtt.Client, error) {
	c := mqtt.NewClient(pahoOptions(login, broker, id).SetCleanSession(clean).
		SetAutoReconnect(false).SetWriteTimeout(30 * time.Second))
	t := c.Connect()
	if !t.WaitTimeout(10*time.Second) || t.Error() != nil {
		return nil, fmt.Errorf("bench: connect %s: %v", broker, t.Error())
	}
	return c, nil
}

// purgeSessions removes the persistent sessions of an ingester's n
// clients, and of at least minPurge: n comes from this build's default,
// and a server built from other code (-server-bin) may have used more
// connections. A session left behind keeps its share-group subscription
// to every product's topics, so the broker would queue a copy of every
// later run's messages for it (1.2M messages, 190 MB, seen here), and
// its autosaves stall the broker for seconds.
func purgeSessions(broker, prefix string, n int) {
	for i := range max(n, minPurge) {
		if c, err := mqttConnect(broker, prefix+"-"+strconv.Itoa(i), true, serviceLogin()); err == nil {
			c.Disconnect(0)
		}
	}
}

const minPurge = 4

type brokerCeilingResult struct {
	rate float64
	cpu  CPUBreakdown // of procs, first publish to last message received
}

// brokerCeiling measures the broker's pass-through at qos: one paho
// publisher (with login pub) to one paho subscriber (default options,
// auto-ack), payloads like RunIngest's, publishing for d; rate is
// received msgs/s, from the first publish to the last message received.
// The topic is no device's: ingest does not subscribe to it.
func brokerCeiling(ctx context.Context, label, broker string, pub mqttconn.Login, qos byte, d time.Duration, procs []namedProc) (brokerCeilingResult, error) {
	var res brokerCeilingResult
	topic := "/bench-" + randHex(4) + "/ceiling"
	var got atomic.Int64
	var lastAt atomic.Int64
	sub := mqtt.NewClient(pahoOptions(serviceLogin(), broker, "bench-sub-"+randHex(4)).SetCleanSession(true))
	if t := sub.Connect(); !t.WaitTimeout(10*time.Second) || t.Error() != nil {
		return res, fmt.Errorf("bench: connect: %v", t.Error())
	}
	defer sub.Disconnect(100)
	if t := sub.Subscribe(topic, qos, func(mqtt.Client, mqtt.Message) {
		got.Add(1)
		lastAt.Store(time.Now().UnixNano())
	}); !t.WaitTimeout(10*time.Second) || t.Error() != nil {
		return res, fmt.Errorf("bench: subscribe: %v", t.Error())
	}
	pc, err := mqttConnect(broker, "bench-cpub-"+randHex(4), true, pub)
	if err != nil {
		return res, err
	}
	defer pc.Disconnect(100)
	span := startCPUSpan(label, procs)
	start := time.Now()
	n, err := publishLoop(ctx, pc, qos, start.Add(d), func(buf []byte, k int64) (string, []byte) {
		return topic, reportPayload(buf, "ceiling", int(k%13), k)
	})
	if err != nil {
		return res, err
	}
	// Wait for the subscriber to catch up (or stall); the CPU span ends at
	// the last progress.
	prev, end := int64(-1), span.snapshot()
	for {
		g := got.Load()
		if g != prev {
			prev, end = g, span.snapshot()
		}
		if g >= n || time.Since(end.at) > 5*time.Second {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if prev == 0 {
		return res, errors.New("bench: broker ceiling: nothing received")
	}
	res.rate = float64(prev) / time.Duration(lastAt.Load()-start.UnixNano()).Seconds()
	res.cpu = span.breakdown(end, prev)
	return res, nil
}
