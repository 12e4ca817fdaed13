// Package bench measures devicehub end to end against the real services:
// RunIngest drives simulated devices through the MQTT broker into a
// running ingest.Ingester and ClickHouse, and measures the broker's own
// pass-through in the same run, so results are ratios to what the machine
// can do. It is used by `go test -bench` here and by cmd tools.
package bench

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/lib/pq"

	"devicehub/ingest"
	"devicehub/meta"
	"devicehub/tsdb"
)

// IngestParams configure RunIngest. Zero fields take the defaults noted.
type IngestParams struct {
	BrokerURL      string        // default tcp://127.0.0.1:1884
	ClickHouseAddr string        // default 127.0.0.1:9000
	PostgresServer string        // DSN without database, default postgres://postgres@127.0.0.1:5432
	Devices        int           // simulated devices, default 1000; device i reports 2 + i%13 properties
	Duration       time.Duration // publishing time of the ingest phase, default 15s
	BrokerDuration time.Duration // publishing time of the broker-ceiling phase, default 5s
	QoS            byte          // of publishers and subscription
	Publishers     int           // publishing connections, default 4
	Connections    int           // ingest subscriber connections, default ingest's (2)
	Workers        int           // ingest workers, default ingest's
	Writer         tsdb.WriterOptions
	Logger         *slog.Logger
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
	BrokerRate  float64       // msgs/s one paho publisher -> one paho subscriber
	Ratio       float64       // IngestRate / BrokerRate
	PeakRSS     int64         // bytes, VmRSS of this process (generator included)
	Flushes     int64         // ClickHouse inserts (messages and properties count apart)
	FlushTime   time.Duration // total time inside them
	Dropped     map[string]uint64
}

func (r IngestResult) String() string {
	return fmt.Sprintf("qos=%d devices=%d published=%d stored=%d props=%d elapsed=%s publish=%.0f/s ingest=%.0f msg/s broker=%.0f msg/s ratio=%.2f peakRSS=%dMiB inserts=%d avg=%s",
		r.QoS, r.Devices, r.Published, r.Stored, r.Properties, r.Elapsed.Round(time.Millisecond), r.PublishRate,
		r.IngestRate, r.BrokerRate, r.Ratio, r.PeakRSS>>20, r.Flushes, (r.FlushTime / time.Duration(max(r.Flushes, 1))).Round(time.Millisecond))
}

func (p IngestParams) withDefaults() IngestParams {
	if p.BrokerURL == "" {
		p.BrokerURL = "tcp://127.0.0.1:1884"
	}
	if p.ClickHouseAddr == "" {
		p.ClickHouseAddr = "127.0.0.1:9000"
	}
	if p.PostgresServer == "" {
		p.PostgresServer = "postgres://postgres@127.0.0.1:5432"
	}
	if p.Devices <= 0 {
		p.Devices = 1000
	}
	if p.Duration <= 0 {
		p.Duration = 15 * time.Second
	}
	if p.BrokerDuration <= 0 {
		p.BrokerDuration = 5 * time.Second
	}
	if p.Publishers <= 0 {
		p.Publishers = 4
	}
	if p.Logger == nil {
		p.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	return p
}

func ingestRandHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// RunIngest measures the broker ceiling, then ingest end to end, at p.QoS.
// It creates (and drops) its own PostgreSQL and ClickHouse databases.
func RunIngest(ctx context.Context, p IngestParams) (IngestResult, error) {
	p = p.withDefaults()
	res := IngestResult{QoS: p.QoS, Devices: p.Devices}
	var err error
	if res.BrokerRate, err = BrokerCeiling(ctx, p.BrokerURL, p.QoS, p.BrokerDuration); err != nil {
		return res, err
	}

	// Databases of this run.
	name := "devicehub_bench_" + ingestRandHex(4)
	admin, err := sql.Open("postgres", p.PostgresServer+"/postgres?sslmode=disable")
	if err != nil {
		return res, err
	}
	defer admin.Close()
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		return res, fmt.Errorf("bench: create PostgreSQL database: %w", err)
	}
	defer func() { _, _ = admin.Exec("DROP DATABASE IF EXISTS " + name + " WITH (FORCE)") }()
	mopt := meta.DefaultOptions()
	mopt.DSN = p.PostgresServer + "/" + name + "?sslmode=disable"
	mopt.MaxOpenConns = 8
	store, err := meta.Open(ctx, mopt)
	if err != nil {
		return res, err
	}
	defer store.Close()
	topt := tsdb.DefaultOptions()
	topt.Addr, topt.Database, topt.TimeZone = p.ClickHouseAddr, name, time.UTC
	ch, err := tsdb.Open(ctx, topt)
	if err != nil {
		return res, err
	}
	defer ch.Close()
	defer func() {
		dctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = ch.DropDatabase(dctx)
	}()

	product := "bench-" + ingestRandHex(3)
	if _, err := store.DB().ExecContext(ctx, `INSERT INTO products (id, name, device_type, state) VALUES ($1, $1, 'device', 1)`, product); err != nil {
		return res, err
	}
	ids := make([]string, p.Devices)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s-%06d", product, i)
	}
	if _, err := store.DB().ExecContext(ctx, `INSERT INTO devices (id, name, product_id, state)
		SELECT id, id, $2, 'offline' FROM unnest($1::text[]) AS id`, pq.StringArray(ids), product); err != nil {
		return res, err
	}

	iopt := ingest.DefaultOptions()
	iopt.BrokerURL = p.BrokerURL
	iopt.ClientID = "bench-ingest-" + ingestRandHex(4)
	iopt.ShareGroup = "bench" + ingestRandHex(4)
	iopt.ProductIDs = []string{product}
	iopt.QoS = p.QoS
	iopt.Logger = p.Logger
	if p.Connections > 0 {
		iopt.Connections = p.Connections
	}
	if p.Workers > 0 {
		iopt.Workers = p.Workers
	}
	iopt.Writer = p.Writer
	var flushes, flushNanos atomic.Int64
	iopt.Writer.OnFlush = func(n int, d time.Duration, err error) {
		flushes.Add(1)
		flushNanos.Add(int64(d))
	}
	in, err := ingest.New(ctx, iopt, ch, store, store)
	if err != nil {
		return res, err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = in.Close(cctx)
		purgeSessions(p.BrokerURL, iopt.ClientID, iopt.Connections)
	}()

	// RSS sampler; stopping it twice returns the same peak.
	stopRSS := sync.OnceValue(rssSampler())
	defer stopRSS()

	start := time.Now()
	published, err := publishDevices(ctx, p, product, ids)
	pubElapsed := time.Since(start)
	res.Published = published
	res.PublishRate = float64(published) / pubElapsed.Seconds()
	if err != nil {
		return res, err
	}
	// Wait until ClickHouse has every message (or progress stops).
	var stored uint64
	lastChange, last := time.Now(), uint64(0)
	for {
		if err := ch.Conn().QueryRow(ctx, "SELECT count() FROM device_message").Scan(&stored); err != nil {
			return res, err
		}
		if int64(stored) >= published {
			break
		}
		if stored != last {
			last, lastChange = stored, time.Now()
		} else if time.Since(lastChange) > 10*time.Second {
			break
		}
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	res.Elapsed = time.Since(start)
	res.Stored = int64(stored)
	var props uint64
	_ = ch.Conn().QueryRow(ctx, "SELECT count() FROM device_property").Scan(&props)
	res.Properties = int64(props)
	res.IngestRate = float64(stored) / res.Elapsed.Seconds()
	if res.BrokerRate > 0 {
		res.Ratio = res.IngestRate / res.BrokerRate
	}
	res.PeakRSS = stopRSS()
	res.Dropped = in.Stats().Dropped
	res.Flushes, res.FlushTime = flushes.Load(), time.Duration(flushNanos.Load())
	if res.Stored < res.Published {
		return res, fmt.Errorf("bench: %d of %d messages stored", res.Stored, res.Published)
	}
	return res, nil
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
		c, err := mqttConnect(p.BrokerURL, "bench-pub-"+ingestRandHex(4), true)
		if err != nil {
			return 0, err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Disconnect(100)
			n, err := publishLoop(ctx, c, p.QoS, deadline, func(buf []byte, k int64) (string, []byte) {
				i := (w + int(k)*p.Publishers) % len(ids)
				return "/" + product + "/" + ids[i] + "/properties/report", reportPayload(buf, ids[i], i, k)
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

func mqttConnect(broker, id string, clean bool) (mqtt.Client, error) {
	c := mqtt.NewClient(mqtt.NewClientOptions().AddBroker(broker).SetClientID(id).SetCleanSession(clean).
		SetAutoReconnect(false).SetWriteTimeout(30 * time.Second))
	t := c.Connect()
	if !t.WaitTimeout(10*time.Second) || t.Error() != nil {
		return nil, fmt.Errorf("bench: connect %s: %v", broker, t.Error())
	}
	return c, nil
}

// purgeSessions removes the persistent sessions of an ingester's clients.
func purgeSessions(broker, prefix string, n int) {
	for i := range n {
		if c, err := mqttConnect(broker, prefix+"-"+strconv.Itoa(i), true); err == nil {
			c.Disconnect(0)
		}
	}
}

// BrokerCeiling measures the broker's pass-through at qos: one paho
// publisher to one paho subscriber (default options, auto-ack), payloads
// like RunIngest's, publishing for d. It returns received msgs/s, from
// the first publish to the last message received.
func BrokerCeiling(ctx context.Context, broker string, qos byte, d time.Duration) (float64, error) {
	topic := "bench/" + ingestRandHex(4) + "/ceiling"
	var got atomic.Int64
	var lastAt atomic.Int64
	sub := mqtt.NewClient(mqtt.NewClientOptions().AddBroker(broker).SetClientID("bench-sub-" + ingestRandHex(4)).SetCleanSession(true))
	if t := sub.Connect(); !t.WaitTimeout(10*time.Second) || t.Error() != nil {
		return 0, fmt.Errorf("bench: connect: %v", t.Error())
	}
	defer sub.Disconnect(100)
	if t := sub.Subscribe(topic, qos, func(mqtt.Client, mqtt.Message) {
		got.Add(1)
		lastAt.Store(time.Now().UnixNano())
	}); !t.WaitTimeout(10*time.Second) || t.Error() != nil {
		return 0, fmt.Errorf("bench: subscribe: %v", t.Error())
	}
	pub, err := mqttConnect(broker, "bench-cpub-"+ingestRandHex(4), true)
	if err != nil {
		return 0, err
	}
	defer pub.Disconnect(100)
	start := time.Now()
	n, err := publishLoop(ctx, pub, qos, start.Add(d), func(buf []byte, k int64) (string, []byte) {
		return topic, reportPayload(buf, "ceiling", int(k%13), k)
	})
	if err != nil {
		return 0, err
	}
	// Wait for the subscriber to catch up (or stall).
	prev, since := int64(-1), time.Now()
	for got.Load() < n {
		if g := got.Load(); g != prev {
			prev, since = g, time.Now()
		} else if time.Since(since) > 5*time.Second {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got.Load() == 0 {
		return 0, errors.New("bench: broker ceiling: nothing received")
	}
	return float64(got.Load()) / time.Duration(lastAt.Load()-start.UnixNano()).Seconds(), nil
}

// processRSS is this process's resident set size in bytes (VmRSS).
func processRSS() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}
