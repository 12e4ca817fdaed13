package ingest

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"net"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"devicehub/ingest/link"
	"devicehub/ingest/mqttconn"
	"devicehub/ingest/wire"
	"devicehub/meta"
	"devicehub/schema/backoff"
	"devicehub/tsdb"
)

// Drop reasons, the label of devicehub_ingest_dropped_total.
const (
	DropUnknownTopic    = "unknown_topic"
	DropUnknownDevice   = "unknown_device"
	DropProductMismatch = "product_mismatch"
	DropNotActive       = "not_active"
	DropMalformed       = "malformed"
	DropOversize        = "oversize"
	// DropRetained: the broker replays a retained uplink to every new
	// subscription, so each (re)subscription would store it again; live
	// messages reach a subscriber without the retain flag.
	DropRetained = "retained"
	// DropHandedOver: a birth or will the broker sent to two sessions
	// while the presence session took births and wills over from the data
	// session (handoff.go); the other copy is the one stored.
	DropHandedOver = "handed_over"
)

var dropReasons = []string{DropUnknownTopic, DropUnknownDevice, DropProductMismatch, DropNotActive, DropMalformed, DropOversize, DropRetained, DropHandedOver}

// Options configure an Ingester. Zero fields take DefaultOptions' values.
type Options struct {
	// BrokerURL of the MQTT broker, or of several comma-separated (a
	// broker pool, mqttconn.Brokers): each broker gets its own Connections
	// subscriber connections, all feeding one pipeline. Default
	// "tcp://127.0.0.1:1884" (the project's Mosquitto, see
	// .ci/mosquitto.conf).
	BrokerURL string
	// Login is devicehub's login at the broker.
	Login mqttconn.Login
	// ClientID prefixes the ids of the subscriber connections,
	// "<ClientID>-<n>" and "<ClientID>-presence" (sessions.go), the same
	// at every broker of a pool. They must be
	// stable across restarts (the broker keeps their sessions and queued
	// messages) and differ between instances. Default
	// "devicehub-ingest-<hostname>".
	ClientID string
	// ShareGroup is the shared-subscription group that several ingest
	// instances join ($share/<group>/<filter>) to split the traffic; with
	// a broker pool each broker has its own group of that name, which the
	// instances join at every broker.
	// Default NoShareGroup: one plain, persistent subscription on one
	// connection, which Mosquitto 2.0 keeps across its restarts (it keeps
	// no shared one: what devices publish between its restart and the
	// resubscription is lost to a share group, REFERENCE.md "Broker settings").
	ShareGroup string
	// ProductIDs narrows the subscription to these products; empty means
	// every product ("+"). Meant for tests and product-sharded setups.
	ProductIDs []string
	// Connections is the number of subscriber connections sharing the
	// subscription, to pass one connection's ceiling (its reader is one
	// goroutine). Default one per two cores: on two cores, one connection
	// cost devicehub and Mosquitto 5-10% less CPU per message than two
	// (BENCHMARKS.md). Lowering it is safe: New retires the sessions of
	// the connections no longer used.
	Connections int
	// QoS of the subscription. Default 1 (0 gives up the no-loss promise).
	QoS byte
	// Queue bounds messages received but not yet handed to the writer;
	// when full, the MQTT callback waits and the broker holds the rest.
	// Default 20000.
	Queue int
	// Workers is the number of shards of the workers that decode and check
	// messages: a device's messages always go to the same shard, its
	// births, wills and shadow requests to the shard's presence worker and
	// the rest to its other worker, so that each kind stays in order.
	// Default 4.
	Workers int
	// Writer configures each ClickHouse batcher (rows per batch, interval,
	// retries). Default tsdb's: 300000 rows or 1s.
	Writer tsdb.WriterOptions
	// Writers is the number of batchers inserting concurrently. Each holds
	// up to two batches, so for a given memory one writer makes the
	// largest parts, which is what ClickHouse's merges cost depends on;
	// add writers where inserts, not merges, are the limit. Workers are
	// spread over them. Default 1.
	Writers int
	// DeviceCacheTTL is how often the devices unused for DeviceCacheIdle
	// are forgotten and, while PostgreSQL's announcements of device
	// changes are not heard, how often the statuses of the devices in use
	// are re-read, in one query: a deploy, undeploy or delete takes effect
	// as it is announced, else within about this long (devices.go).
	// Default 2s.
	DeviceCacheTTL time.Duration
	// DeviceCacheIdle is how long a device's status stays cached (and
	// kept current) without a message of it: longer than the
	// devices' report interval, or each report costs a lookup. Default 60s.
	DeviceCacheIdle time.Duration
	// StateFlushInterval and StateBatch: state changes are written to
	// PostgreSQL every interval or at this many, whichever first; a
	// backlog (a storm of births) up to ten times this many a write.
	// Defaults 200ms and 500.
	StateFlushInterval time.Duration
	StateBatch         int
	// StateWriters is how many such writes may be in PostgreSQL at once,
	// each for its share of the devices (stateShards). Default 4.
	StateWriters int
	// KeepAlive of the MQTT connections. Default 30s.
	KeepAlive time.Duration
	// PingTimeout is how long a keep-alive ping may wait for its answer
	// before the connection is dropped. The broker queues that answer
	// behind every message it has for us, so under backpressure it comes
	// only once the backlog ahead of it is stored: the timeout must cover
	// draining a backlog, not a network round trip (paho's 10s dropped the
	// connection, and with it the broker's QoS 0 backlog, when a burst
	// outran storage). Default 60s.
	PingTimeout time.Duration
	// ConnectTimeout bounds connecting, and subscribing a new session.
	// A kept session may hold any backlog, which the broker sends ahead of
	// its answers: its (re)subscription and a retired session's
	// unsubscription are not waited for. A first connect the broker does
	// not answer in time is tried again (connectAttempts in all) before
	// New fails. Default 10s.
	ConnectTimeout time.Duration
	// Registerer receives the metrics; nil registers nothing.
	Registerer prometheus.Registerer
	// Live, if set, is handed the property values of the devices it
	// watches as soon as they are decoded, before storage (livefeed.go).
	Live LiveFeed
	// Shadow, if set, is handed births and devices' shadow requests
	// (shadowhook.go); their acknowledgement waits for it.
	Shadow ShadowHook
	// Alarms, if set, is handed the uplinks the alarm evaluator reads
	// (alarmhook.go); their acknowledgement waits for it. Only with
	// NoShareGroup: a shared subscription gives each instance a share.
	Alarms AlarmHook
	// Firmware, if set, is handed devices' firmware progress and version
	// reports (firmwarehook.go); their acknowledgement waits for it.
	Firmware FirmwareHook
	// Logger; default slog.Default().
	Logger *slog.Logger

	// handoffSubscribed, if set (tests only), is called by a handoff
	// once the presence session's subscription is in place and before
	// the split marker is published: the window in which the broker sends
	// births and wills to both sessions (handoff.go).
	handoffSubscribed func()
}

// DefaultOptions returns options that work with `make run`.
func DefaultOptions() Options {
	host, _ := os.Hostname()
	if host == "" {
		host = "local"
	}
	return Options{
		BrokerURL:          mqttconn.DefaultBrokerURL,
		Login:              mqttconn.DefaultLogin,
		ClientID:           "devicehub-ingest-" + host,      // stable per machine
		ShareGroup:         NoShareGroup,                    // one instance; a kept subscription
		Connections:        max(1, runtime.GOMAXPROCS(0)/2), // one per two cores, see Options
		QoS:                1,                               // at-least-once with manual acks
		Queue:              20000,                           // about two writer batches of messages
		Workers:            4,                               // decoding is cheap; lookups may wait
		Writers:            1,                               // the largest parts for the memory
		DeviceCacheTTL:     2 * time.Second,                 // unannounced, undeploy takes effect within 2s
		DeviceCacheIdle:    time.Minute,                     // quiet devices report every few seconds to a minute
		StateFlushInterval: 200 * time.Millisecond,          // state visible within 200ms
		StateBatch:         500,                             // one UPDATE per 500 changes
		StateWriters:       4,                               // a storm's births not behind one write
		KeepAlive:          30 * time.Second,                // paho's default
		PingTimeout:        60 * time.Second,                // a backlog's drain, see above
		ConnectTimeout:     10 * time.Second,                // a local broker answers in ms
		Logger:             slog.Default(),
	}
}

// NoShareGroup as Options.ShareGroup makes one plain, persistent
// subscription instead of a shared one.
const NoShareGroup = "none"

func (o Options) withDefaults() Options {
	d := DefaultOptions()
	if o.BrokerURL == "" {
		o.BrokerURL = d.BrokerURL
	}
	if o.ClientID == "" {
		o.ClientID = d.ClientID
	}
	if o.Login == (mqttconn.Login{}) {
		o.Login = d.Login
	}
	if o.ShareGroup == "" {
		o.ShareGroup = d.ShareGroup
	}
	if o.Connections <= 0 {
		o.Connections = d.Connections
	}
	if o.ShareGroup == NoShareGroup {
		o.Connections = 1 // plain subscriptions would each get every message
	}
	if o.QoS > 1 {
		o.QoS = 1
	}
	if o.Queue <= 0 {
		o.Queue = d.Queue
	}
	if o.Workers <= 0 {
		o.Workers = d.Workers
	}
	if o.Writers <= 0 {
		o.Writers = d.Writers
	}
	if o.Writers > o.Workers {
		o.Writers = o.Workers
	}
	if o.DeviceCacheIdle <= 0 {
		o.DeviceCacheIdle = d.DeviceCacheIdle
	}
	if o.DeviceCacheTTL <= 0 {
		o.DeviceCacheTTL = d.DeviceCacheTTL
	}
	if o.StateFlushInterval <= 0 {
		o.StateFlushInterval = d.StateFlushInterval
	}
	if o.StateBatch <= 0 {
		o.StateBatch = d.StateBatch
	}
	if o.StateWriters <= 0 {
		o.StateWriters = d.StateWriters
	}
	if o.KeepAlive <= 0 {
		o.KeepAlive = d.KeepAlive
	}
	if o.PingTimeout <= 0 {
		o.PingTimeout = d.PingTimeout
	}
	if o.ConnectTimeout <= 0 {
		o.ConnectTimeout = d.ConnectTimeout
	}
	if o.Logger == nil {
		o.Logger = d.Logger
	}
	return o
}

// metrics of one Ingester.
type metrics struct {
	received, stored, acked prometheus.Counter
	dropped                 *prometheus.CounterVec
	batchRows               prometheus.Histogram
	flushSeconds            prometheus.Histogram
	flushErrors             prometheus.Counter
	stateChanges            prometheus.Counter
	stateFolded             prometheus.Counter
	stateErrors             prometheus.Counter
	stateDelay              *prometheus.HistogramVec // by stage (state.go)
	badTimes                prometheus.Counter
	parked                  prometheus.GaugeFunc
	queueDepth              prometheus.GaugeFunc
	inflightFull            prometheus.Counter
}

func newMetrics(depth, parked func() float64) *metrics {
	m := &metrics{
		received: prometheus.NewCounter(prometheus.CounterOpts{Name: "devicehub_ingest_received_total",
			Help: "Uplink MQTT messages received."}),
		stored: prometheus.NewCounter(prometheus.CounterOpts{Name: "devicehub_ingest_stored_total",
			Help: "Uplink messages stored in ClickHouse."}),
		acked: prometheus.NewCounter(prometheus.CounterOpts{Name: "devicehub_ingest_acked_total",
			Help: "Uplink messages acknowledged to the broker (stored or deliberately dropped)."}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "devicehub_ingest_dropped_total",
			Help: "Uplink messages dropped, never stored, by reason."}, []string{"reason"}),
		batchRows: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "devicehub_ingest_batch_rows",
			Help: "Rows per ClickHouse insert.", Buckets: prometheus.ExponentialBuckets(10, 4, 8)}),
		flushSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "devicehub_ingest_flush_seconds",
			Help: "Duration of ClickHouse inserts.", Buckets: prometheus.ExponentialBuckets(0.001, 3, 10)}),
		flushErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "devicehub_ingest_flush_errors_total",
			Help: "Failed ClickHouse inserts (retried)."}),
		stateChanges: prometheus.NewCounter(prometheus.CounterOpts{Name: "devicehub_ingest_state_changes_total",
			Help: "Online/offline changes written to PostgreSQL."}),
		stateFolded: prometheus.NewCounter(prometheus.CounterOpts{Name: "devicehub_ingest_state_folded_total",
			Help: "Online/offline changes folded into a later change of the same device queued behind them, and written with it (not counted as written)."}),
		stateErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "devicehub_ingest_state_errors_total",
			Help: "Failed state-change writes (retried)."}),
		stateDelay: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "devicehub_ingest_state_delay_seconds",
			Help:    "Where online/offline changes wait, by stage: delivery (from the message's own timestamp to its arrival at ingest; births with one), queue (arrival to the state writer), write (the state writer to committed in PostgreSQL).",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 10)}, []string{"stage"}),
		badTimes: prometheus.NewCounter(prometheus.CounterOpts{Name: "devicehub_ingest_bad_timestamps_total",
			Help: "Uplink messages whose timestamp was not a number, before 2000 or more than 10 minutes ahead; stored at their arrival time."}),
		parked: prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "devicehub_ingest_parked",
			Help: "Messages waiting for PostgreSQL to answer their device's lookup (the others go on)."}, parked),
		queueDepth: prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "devicehub_ingest_queue_depth",
			Help: "Messages received and waiting for a worker."}, depth),
		inflightFull: prometheus.NewCounter(prometheus.CounterOpts{Name: "devicehub_ingest_inflight_full_seconds_total",
			Help: "Time a connection stopped reading because 60,000 of its messages were taken and not yet acknowledged (ackorder.go); the broker held the rest."}),
	}
	for _, r := range dropReasons {
		m.dropped.WithLabelValues(r)
	}
	return m
}

func (m *metrics) register(r prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{m.received, m.stored, m.acked, m.dropped, m.batchRows,
		m.flushSeconds, m.flushErrors, m.stateChanges, m.stateFolded, m.stateErrors, m.stateDelay, m.badTimes, m.parked, m.queueDepth,
		m.inflightFull} {
		if err := r.Register(c); err != nil {
			return fmt.Errorf("ingest: register metrics: %w", err)
		}
	}
	return nil
}

// Stats are an Ingester's counters so far.
type Stats struct {
	Received, Stored, Acked uint64
	Dropped                 map[string]uint64 // by reason
	StateChanges            uint64            // written to PostgreSQL
	StateFolded             uint64            // folded into a later change of their device, written with it
	BadTimestamps           uint64            // stored at their arrival time instead
}

// item is one received message on its way to a worker.
type item struct {
	msg   mqtt.Message
	topic wire.Topic
	at    time.Time
	order *ackOrder // the connection's ack order; nil at QoS 0
	seq   uint64    // the message's place in it
	// detached: taken out of order's sequence (detach); order still counts
	// it among the connection's unacknowledged packet ids.
	detached bool
	broker   int8 // index of the broker it came from (brokers)
}

// Ingester stores every uplink message and property value from the broker
// in ClickHouse and device connection state in PostgreSQL. See the
// package documentation.
type Ingester struct {
	opt      Options
	log      *slog.Logger
	brokers  []string      // mqttconn.Brokers(opt.BrokerURL)
	clients  []mqtt.Client // subscriber connections of every broker
	atBroker []int         // clients[i] is connected to brokers[atBroker[i]]
	born     *BornAt       // with several brokers, where each device's last birth came from
	writers  []*tsdb.Writer
	// presenceW stores the message rows of births, wills and shadow
	// requests (presenceWork) apart from the reports' writers, under bounds of its own (presenceWriterOptions):
	// in a storm the reports fill their writers' queues, and a birth
	// waiting there for room held its state back too.
	presenceW *tsdb.Writer
	devices   *deviceCache
	models    *modelCache // nil: values are not checked (models.go)
	states    *stateShards
	m         *metrics
	seed      maphash.Seed

	// The subscriptions of the data sessions (every uplink but births and
	// wills) and of the presence session (births and wills), sessions.go.
	dataFilters, presenceFilters map[string]byte
	handoffs                     []atomic.Pointer[handoff] // per broker, set by a start that hands over (handoff.go)

	// Each shard's queues: births, wills and shadow requests
	// (presenceWork), and the rest, each taken by a worker of its own.
	presenceQ, queues []chan item
	backlog           *backlog // when each kept session's backlog is drained (backlog.go)
	depth             atomic.Int64
	parking           parking // messages waiting for PostgreSQL (park.go)

	// Intake gate: callbacks register in active; Close waits for them.
	gate     sync.Mutex
	closed   bool
	active   int
	idle     *sync.Cond
	stopping chan struct{} // closed by Close: callbacks stop waiting
	drained  chan struct{} // closed once no callback runs: workers drain and exit

	runCtx  context.Context // cancelled when Close's deadline passes
	abort   context.CancelFunc
	workers sync.WaitGroup
	// refresher runs the device cache's refresh until runCtx ends.
	refresher sync.WaitGroup

	received, stored, acked, stateN, foldedN atomic.Uint64
	badTimes                                 atomic.Uint64 // messages stored at arrival time: a bad timestamp
	storedQoS0                               func()        // the done of a QoS 0 message's rows (process)
	dropped                                  sync.Map      // reason -> *atomic.Uint64
	closeOnce                                sync.Once
	closeErr                                 error
}

// New connects Options.Connections subscriber clients to the broker,
// subscribes them to the shared uplink filters and starts storing. db is
// usually a *tsdb.DB, devices and states a *meta.Store.
func New(ctx context.Context, opt Options, db tsdb.Inserter, devices Devices, states StateApplier) (*Ingester, error) {
	opt = opt.withDefaults()
	brokers, err := mqttconn.Brokers(opt.BrokerURL)
	if err != nil {
		return nil, fmt.Errorf("ingest: %w", err)
	}
	if len(brokers) > maxBrokers {
		return nil, fmt.Errorf("ingest: %d brokers, at most %d", len(brokers), maxBrokers)
	}
	runCtx, abort := context.WithCancel(context.Background())
	in := &Ingester{
		opt:             opt,
		brokers:         brokers,
		log:             opt.Logger.With("component", "ingest"),
		seed:            maphash.MakeSeed(),
		stopping:        make(chan struct{}),
		drained:         make(chan struct{}),
		runCtx:          runCtx,
		abort:           abort,
		dataFilters:     make(map[string]byte),
		presenceFilters: make(map[string]byte),
		handoffs:        make([]atomic.Pointer[handoff], len(brokers)),
	}
	in.idle = sync.NewCond(&in.gate)
	if len(brokers) > 1 {
		in.born = NewBornAt()
	}
	in.storedQoS0 = func() {
		in.stored.Add(1)
		in.m.stored.Inc()
		in.ack(nil)
	}
	in.devices = newDeviceCache(devices, opt.DeviceCacheTTL, int(opt.DeviceCacheIdle/opt.DeviceCacheTTL), in.log)
	// The devices stored as online are about to send: their statuses in
	// a few queries now rather than one query each as their messages come
	// (a restarted instance under 100,000 connected devices). Best
	// effort: what fails is looked up as before.
	if l, ok := devices.(onlineLister); ok {
		pctx, cancel := context.WithTimeout(ctx, opt.ConnectTimeout)
		ids, err := l.OnlineDeviceIDs(pctx)
		if err == nil {
			var n int
			n, err = in.devices.prefetch(pctx, ids)
			in.log.Debug("device statuses prefetched", "devices", n)
		}
		cancel()
		if err != nil {
			in.log.Warn("device status prefetch failed; looking devices up one by one", "err", err)
		}
	}
	in.backlog = newBacklog(opt, in.log)
	in.refresher.Add(1)
	go func() {
		defer in.refresher.Done()
		in.devices.run(runCtx)
	}()
	in.m = newMetrics(func() float64 { return float64(in.depth.Load()) }, func() float64 { return float64(in.parked()) })
	if mr, ok := devices.(ModelReader); ok {
		in.models = newModelCache(mr, opt.DeviceCacheTTL, opt.DeviceCacheIdle, in.log)
	}
	if opt.Registerer != nil {
		err := in.m.register(opt.Registerer)
		if err == nil && in.models != nil {
			if err = opt.Registerer.Register(in.models.counts); err != nil {
				err = fmt.Errorf("ingest: register metrics: %w", err)
			}
		}
		if err != nil {
			abort()
			return nil, err
		}
	}
	wopt := opt.Writer
	userFlush := wopt.OnFlush
	wopt.OnFlush = func(n int, d time.Duration, err error) {
		if err != nil {
			in.m.flushErrors.Inc()
			in.log.Warn("ClickHouse insert failed; retrying", "rows", n, "err", err)
		} else {
			in.m.batchRows.Observe(float64(n))
			in.m.flushSeconds.Observe(d.Seconds())
		}
		if userFlush != nil {
			userFlush(n, d, err)
		}
	}
	for range opt.Writers {
		in.writers = append(in.writers, tsdb.NewWriter(db, wopt))
	}
	in.presenceW = tsdb.NewWriter(db, presenceWriterOptions(wopt))
	in.states = newStateShards(states, opt.StateWriters, opt.StateFlushInterval, opt.StateBatch, in.log, in.m,
		func(n int) { in.stateN.Add(uint64(n)) }, func() { in.foldedN.Add(1) })
	for _, f := range wire.DataFilters(opt.ProductIDs...) {
		in.dataFilters[in.shared(f)] = opt.QoS
	}
	for _, f := range wire.PresenceFilters(opt.ProductIDs...) {
		in.presenceFilters[in.shared(f)] = opt.QoS
	}
	per := max(1, opt.Queue/opt.Workers)
	for n := range opt.Workers {
		pq, q := make(chan item, per), make(chan item, per)
		in.presenceQ, in.queues = append(in.presenceQ, pq), append(in.queues, q)
		in.workers.Add(2)
		go in.work(pq, in.presenceW)
		go in.work(q, in.writers[n%len(in.writers)])
	}
	in.workers.Add(1)
	go in.runParking()
	// Every broker's sessions at once: a restart during a storm finds each
	// broker slow to answer, and one broker after another those waits
	// would add up (a pool of six, two or three CONNECTs each). The first
	// failure cancels the rest.
	conns := make([][]mqtt.Client, len(brokers))
	g, gctx := errgroup.WithContext(ctx)
	for b := range brokers {
		g.Go(func() (err error) {
			conns[b], err = in.connectBroker(gctx, b)
			return err
		})
	}
	err = g.Wait()
	for b, cs := range conns { // in broker order, also those to close
		for _, c := range cs {
			in.clients = append(in.clients, c)
			in.atBroker = append(in.atBroker, b)
		}
	}
	if err != nil {
		_ = in.Close(context.Background())
		return nil, err
	}
	return in, nil
}

// connectBroker connects broker b's sessions: Connections data sessions,
// those a run with more left there (retireSessions), then the presence
// session, to which births and wills are handed over (handOver). The
// clients connected are returned also with an error, to be closed.
func (in *Ingester) connectBroker(ctx context.Context, b int) ([]mqtt.Client, error) {
	var out []mqtt.Client
	kept := false // a data session kept from an earlier run
	for n := range in.opt.Connections {
		c, present, err := in.connect(ctx, b, in.sessionID(n), roleData, nil)
		if err != nil {
			return out, err
		}
		out = append(out, c)
		kept = kept || present
	}
	data := out
	retired, err := in.retireSessions(ctx, b)
	out = append(out, retired...)
	if err != nil {
		return out, err
	}
	var h *handoff
	if kept && in.opt.ShareGroup == NoShareGroup {
		h = newHandoff(in.presenceID())
	}
	p, present, err := in.connect(ctx, b, in.presenceID(), rolePresence, h)
	if err != nil {
		return out, err
	}
	out = append(out, p)
	if present {
		h = nil // a kept presence session: births and wills were handed over before
	}
	if err := in.handOver(b, p, data, h); err != nil {
		return out, err
	}
	in.log.Info("ingest subscribed", "broker", in.brokers[b], "connections", in.opt.Connections, "qos", in.opt.QoS)
	return out, nil
}

// maxBrokers bounds a pool (a broker's index is an int8 in each item).
const maxBrokers = 127

// sessionKey names subscriber session id at broker b in the backlog
// markers: the id itself with one broker, else id@host:port.
func (in *Ingester) sessionKey(b int, id string) string {
	if len(in.brokers) == 1 {
		return id
	}
	return id + "@" + mqttconn.BrokerName(in.brokers[b])
}

// onlineLister lists the devices stored as online; *meta.Store is one.
type onlineLister interface {
	OnlineDeviceIDs(ctx context.Context) ([]string, error)
}

// sessionID is the client id of subscriber connection n.
func (in *Ingester) sessionID(n int) string { return in.opt.ClientID + "-" + strconv.Itoa(n) }

// connect connects subscriber id in role r and subscribes it to its
// filters; present reports whether the broker kept a session for id. A
// retired session subscribes to nothing: when the broker had a session
// for id, it unsubscribes that session from the uplink filters and returns
// the client; else it removes the session its own connect made and
// returns a nil client. h, for a new presence session, is armed before it
// subscribes (handoff.go).
func (in *Ingester) connect(ctx context.Context, b int, id string, r role, h *handoff) (mqtt.Client, bool, error) {
	s := &session{
		order:  newAckOrder(in.ack), // kept across reconnects: older messages still settle first
		broker: int8(b),
		key:    in.sessionKey(b, id),
		role:   r,
	}
	filters := in.dataFilters
	if r == rolePresence {
		filters = in.presenceFilters
	}
	var reconnect atomic.Bool
	broker := in.brokers[b]
	c := mqttconn.New(mqttconn.Config{
		Broker: broker, ClientID: id, Login: in.opt.Login,
		Persistent:     true, // the broker keeps our subscription and queued QoS 1 messages
		ManualAck:      true, // acknowledged once stored
		Resume:         true,
		KeepAlive:      in.opt.KeepAlive,
		PingTimeout:    in.opt.PingTimeout,
		ConnectTimeout: in.opt.ConnectTimeout,
		// In order on one goroutine: blocking it is the backpressure.
		OnMessage: func(_ mqtt.Client, m mqtt.Message) { in.receive(s, m) },
		OnConnect: func(c mqtt.Client) {
			if r == roleRetired || !reconnect.Swap(true) {
				return // a retired session subscribes to nothing; the first connect is connect's
			}
			// Resubscribe on every reconnect; with a kept session this is
			// a no-op for the broker, after a lost session it is needed.
			in.subscribe(c, id, filters)
			if h := in.handoffs[b].Load(); r == roleData && (h == nil || h.isDecided()) {
				in.releasePresence(c, id) // again, in case the connection was lost before its answer
			}
			in.backlog.mark(c, b, s.key, r == rolePresence)
		},
		OnLost: func(_ mqtt.Client, err error) {
			in.backlog.connectionLost(s.key)
			in.log.Warn("ingest connection lost; reconnecting", "client", id, "broker", mqttconn.BrokerName(broker), "err", err)
		},
	})
	present, err := in.connectPatiently(ctx, c, broker, id)
	if err != nil {
		if ctx.Err() != nil {
			return nil, false, ctx.Err()
		}
		return nil, false, fmt.Errorf("ingest: connect %s as %s: %w", broker, id, err)
	}
	if r == roleRetired {
		if !present {
			c.Disconnect(0)
			in.removeSession(broker, id)
			return nil, false, nil
		}
		// The broker answers behind the backlog the session holds, which
		// the callback stores meanwhile: no deadline to wait for.
		go logFailure(in.log, "ingest: unsubscribing a retired session failed", id, c.Unsubscribe(in.retiredFilters()...))
		return c, true, nil
	}
	// A kept session is subscribed already: it is renewed without waiting,
	// since the broker answers behind the backlog it holds for the
	// session. A new one has no backlog, so its SUBACK is waited for and
	// New returns subscribed.
	if present {
		in.subscribe(c, id, filters)
		in.backlog.mark(c, b, s.key, r == rolePresence)
		// A run with the other ShareGroup form left its subscriptions.
		go logFailure(in.log, "ingest: unsubscribing the other subscription form failed", id, c.Unsubscribe(in.otherFilters()...))
		return c, true, nil
	}
	if h != nil {
		in.handoffs[b].Store(h) // before SUBSCRIBE: a new session gets nothing before it
	}
	if err := mqttconn.WaitToken(c.SubscribeMultiple(filters, nil), in.opt.ConnectTimeout); err != nil {
		c.Disconnect(0)
		return nil, false, fmt.Errorf("ingest: subscribe as %s: %w", id, err)
	}
	in.backlog.mark(c, b, s.key, r == rolePresence)
	return c, false, nil
}

// connectAttempts: a broker that does not answer a CONNECT within
// ConnectTimeout is asked this many times in all, a backoff apart (from a
// tenth of ConnectTimeout to ConnectTimeout), before New fails. A saturated broker answers late: an instance restarted
// during a reconnect storm of 100,000 devices on two cores exited after
// 10 s (bench fleet-connect), where it should wait for its brokers. A
// refusal (a bad login, an unreachable address) fails at once.
const connectAttempts = 6

// connectPatiently connects c, again while the broker's answer times out
// (connectAttempts in all).
func (in *Ingester) connectPatiently(ctx context.Context, c mqtt.Client, broker, id string) (bool, error) {
	wait := backoff.Backoff{Min: in.opt.ConnectTimeout / 10, Max: in.opt.ConnectTimeout, Jitter: 0.2} // 1 s to 10 s by default
	for attempt := 1; ; attempt++ {
		present, err := mqttconn.Connect(ctx, c)
		var ne net.Error
		if err == nil || ctx.Err() != nil || attempt == connectAttempts || !errors.As(err, &ne) || !ne.Timeout() {
			return present, err
		}
		in.log.Warn("ingest: the broker did not answer in time; connecting again", "client", id,
			"broker", mqttconn.BrokerName(broker), "attempt", attempt, "of", connectAttempts, "err", err)
		if err := wait.Wait(ctx); err != nil {
			return false, err
		}
	}
}

// subscribe (re)subscribes c to filters without waiting: the broker
// answers behind the backlog it holds for the session.
func (in *Ingester) subscribe(c mqtt.Client, id string, filters map[string]byte) {
	go logFailure(in.log, "ingest subscribe failed", id, c.SubscribeMultiple(filters, nil))
}

// logFailure waits for t however long the broker takes, and logs its error.
func logFailure(log *slog.Logger, msg, client string, t mqtt.Token) {
	<-t.Done()
	if err := t.Error(); err != nil {
		log.Error(msg, "client", client, "err", err)
	}
}

// receive is the MQTT callback of session s: it never touches storage,
// only hands the message to its worker's bounded queue, waiting while that
// is full.
func (in *Ingester) receive(s *session, m mqtt.Message) {
	in.gate.Lock()
	if in.closed {
		in.gate.Unlock()
		return // not acked: the broker delivers it again to this session
	}
	in.active++
	in.gate.Unlock()
	defer func() {
		in.gate.Lock()
		in.active--
		if in.active == 0 {
			in.idle.Broadcast()
		}
		in.gate.Unlock()
	}()

	h := in.handoffs[s.broker].Load()
	if wire.IsMarker(m.Topic()) {
		if h != nil && !in.handoffMarker(h, s, m) {
			return // stopping while the presence session waited: delivered again
		}
		in.backlog.arrived(s.order, s.key, m)
		return
	}
	var seq uint64
	if m.Qos() > 0 {
		var ok bool
		var waited time.Duration
		seq, ok, waited = s.order.addRoom(m, in.stopping)
		if waited > 0 {
			in.m.inflightFull.Add(waited.Seconds())
		}
		if !ok {
			return // stopping: not acked, the broker delivers it again
		}
	}
	in.received.Add(1)
	in.m.received.Inc()
	it := item{msg: m, at: time.Now(), broker: s.broker}
	if m.Qos() > 0 {
		it.order, it.seq = s.order, seq
	}
	if m.Retained() {
		in.drop(it, DropRetained)
		return
	}
	t, ok := wire.ParseTopic(m.Topic())
	if !ok {
		in.drop(it, DropUnknownTopic)
		return
	}
	it.topic = t
	if h != nil && (t.Kind == wire.KindOnline || t.Kind == wire.KindOffline) && in.handedOver(h, s, it) {
		return
	}
	in.enqueue(it)
}

// enqueue hands it to its device's shard, waiting while the queue is
// full: births, wills and shadow requests to the shard's presence worker,
// the rest to its other worker (work, presenceWork).
func (in *Ingester) enqueue(it item) {
	in.devices.hint(it.topic.DeviceID)
	n := maphash.String(in.seed, it.topic.DeviceID) % uint64(len(in.queues))
	q := in.queues[n]
	if presenceWork(it.topic.Kind) {
		q = in.presenceQ[n]
	}
	in.depth.Add(1)
	select {
	case q <- it:
	case <-in.stopping:
		in.depth.Add(-1)
		in.settle(it, false) // not taken: the broker delivers it again
	}
}

func (in *Ingester) drop(it item, reason string) {
	in.m.dropped.WithLabelValues(reason).Inc()
	v, _ := in.dropped.LoadOrStore(reason, new(atomic.Uint64))
	v.(*atomic.Uint64).Add(1)
	in.settle(it, true)
}

// settle is the end of a message: acknowledged (stored, or deliberately
// dropped) or, with ack false, left for the broker to deliver again. At
// QoS 1 the ack waits for every older message of its connection.
func (in *Ingester) settle(it item, ack bool) {
	switch {
	case it.order == nil:
		if ack {
			in.ack(it.msg)
		}
	case it.detached:
		if ack {
			it.order.ackDetached(it.msg)
		}
	default:
		it.order.settle(it.seq, ack)
	}
}

func (in *Ingester) ack(m mqtt.Message) {
	if mm, ok := m.(markerMessage); ok {
		mm.Ack() // not a device message
		return
	}
	if m != nil { // nil: a QoS 0 message, let go once queued (process)
		m.Ack()
	}
	in.acked.Add(1)
	in.m.acked.Inc()
}

// work processes q until intake has stopped and it is empty. Each shard
// has two workers: one for births, wills and shadow requests
// (presenceWork), storing their message rows through the presence
// writer, and one for the rest. A birth waits for
// no report: not in a queue, and not for room in the reports' writer,
// which a storm's backlog of reports fills (bench fleet-connect). A
// device's births and wills stay in their order (one queue, one session,
// one worker); their order against its reports changes no state
// (sessions.go).
func (in *Ingester) work(q chan item, w *tsdb.Writer) {
	defer in.workers.Done()
	var rows wire.Rows
	for {
		select {
		case it := <-q:
			in.depth.Add(-1)
			in.process(&rows, it, w)
		case <-in.drained:
			// Intake has stopped and no callback runs: drain and exit.
			for {
				select {
				case it := <-q:
					in.depth.Add(-1)
					in.process(&rows, it, w)
				default:
					return
				}
			}
		}
	}
}

// presenceWork tells the messages a shard's presence worker takes: births
// and wills, and a device's requests for its shadow, so that a device
// that asks for its shadow right after its birth gets the delta its birth
// sends before the answer (the shadow service answers a device's calls
// in order), as when one worker took both.
func presenceWork(k wire.Kind) bool {
	return k == wire.KindOnline || k == wire.KindOffline || k == wire.KindShadowGet
}

// writerFor is the writer of its rows: the presence writer for the
// presence worker's messages, else the reports' writer of index i.
func (in *Ingester) writerFor(it item, i int) *tsdb.Writer {
	if presenceWork(it.topic.Kind) {
		return in.presenceW
	}
	return in.writers[i%len(in.writers)]
}

// presenceWriterOptions are the presence writer's: the reports' writer's
// with an eighth of its byte bounds (4 MiB a batch, 8 MiB queued at the
// defaults). Births and wills are a row each, held until stored; 8 MiB
// holds about 20,000 of them, more than PostgreSQL's state writes take
// in the seconds an insert of them lasts.
func presenceWriterOptions(o tsdb.WriterOptions) tsdb.WriterOptions {
	d := tsdb.DefaultWriterOptions()
	if o.MaxBytes <= 0 {
		o.MaxBytes = d.MaxBytes
	}
	o.MaxBytes = max(o.MaxBytes/8, 1<<20)
	o.QueueBytes = 2 * o.MaxBytes
	o.QueueRows = 0 // 2*MaxRows: the bytes bound first
	return o
}

// process checks, decodes and queues one message for storage; it is
// acknowledged when stored, or now when deliberately dropped.
func (in *Ingester) process(rows *wire.Rows, it item, w *tsdb.Writer) {
	m, t := it.msg, it.topic
	payload := m.Payload()
	if len(payload) > wire.MaxPayload {
		in.drop(it, DropOversize)
		return
	}
	ref, found, err := in.devices.get(in.runCtx, t.DeviceID)
	if err != nil && in.runCtx.Err() == nil {
		if in.park(it) {
			return // PostgreSQL is away: other devices' messages go on
		}
		ref, found, err = in.lookup(t.DeviceID) // the parking is full: wait here
	}
	if err != nil {
		in.settle(it, false) // Close's deadline passed while PostgreSQL was down
		return
	}
	switch {
	case !found:
		in.drop(it, DropUnknownDevice)
		return
	case ref.ProductID != t.ProductID:
		in.drop(it, DropProductMismatch)
		return
	case ref.State == "notActive":
		in.drop(it, DropNotActive)
		return
	}
	rows.Reset()
	var at time.Time
	var fwProgress wire.FirmwareProgress
	var fwVersion string
	if t.Kind == wire.KindOnline || t.Kind == wire.KindOffline {
		at, err = wire.DecodePresence(rows, t, payload, it.at)
		if err == nil && !at.IsZero() && in.born != nil && !in.born.Keep(t.DeviceID, it.broker, t.Kind == wire.KindOnline) {
			// A will from a broker the device has left: stored as a
			// message, but its state stays what its birth on the other
			// broker made it (BornAt).
			at = time.Time{}
		}
	} else if fw := in.opt.Firmware != nil; fw && t.Kind == wire.KindFirmwareProgress {
		err = wire.DecodeFirmwareProgress(rows, t, payload, it.at, &fwProgress) // firmwarehook.go
	} else if fw && t.Kind == wire.KindFirmwareVersion {
		err = wire.DecodeFirmwareVersion(rows, t, payload, it.at, &fwVersion)
	} else {
		err = wire.Decode(rows, t, payload, it.at, nil)
	}
	if err != nil {
		if errors.Is(err, wire.ErrTooLarge) {
			in.drop(it, DropOversize)
		} else {
			in.drop(it, DropMalformed)
		}
		in.log.Debug("ingest dropped message", "topic", t.Name, "err", err)
		return
	}
	if rows.BadTimes > 0 {
		in.badTimes.Add(uint64(rows.BadTimes))
		in.m.badTimes.Add(float64(rows.BadTimes))
	}
	if in.models != nil && len(rows.Props) > 0 {
		rows.Props = in.models.check(in.runCtx, t.DeviceID, ref, rows.Props) // outside the thing model (models.go)
	}
	hooked := in.opt.Shadow != nil && (t.Kind == wire.KindOnline || t.Kind == wire.KindShadowGet)
	fwHooked := in.opt.Firmware != nil && (t.Kind == wire.KindFirmwareProgress || t.Kind == wire.KindFirmwareVersion)
	hooked = hooked || fwHooked
	alarmed := in.opt.Alarms != nil && alarmKind(t.Kind) && in.opt.Alarms.Wants(t.ProductID)
	var done func()
	held := 0 // bytes of the paho message kept until done
	if it.order == nil && at.IsZero() && !hooked && !alarmed {
		// QoS 0 and no state change: nothing goes back to the broker and
		// nothing waits for a second part, so such messages share one
		// callback. Neither it nor the writer, which copies the rows, keeps
		// paho's packet, payload included, until the batch is stored.
		done = in.storedQoS0
	} else {
		if it.order == nil {
			it.msg = nil // QoS 0: nothing to acknowledge
		} else {
			held = len(payload) + len(t.Name) + pahoMessageBytes
		}
		var left atomic.Int32
		left.Store(1)
		if !at.IsZero() {
			left.Add(1)
		}
		if hooked {
			left.Add(1)
		}
		if alarmed {
			left.Add(1)
		}
		done = func() {
			if left.Add(-1) == 0 {
				in.stored.Add(1)
				in.m.stored.Inc()
				in.settle(it, true)
			}
		}
	}
	// The evaluator's share: in the connection's order (not detached), as
	// it commits within a flush or two (alarmhook.go).
	if alarmed && !in.opt.Alarms.Take(m, int(it.broker), it.at, done, in.stopping) {
		in.settle(it, false) // stopping: the broker delivers it again
		return
	}
	if hooked && at.IsZero() {
		detach(&it) // its ack waits for the shadow: later messages' do not
	}
	if !at.IsZero() {
		// Its ack waits for PostgreSQL too: detached, so that later
		// messages' acks do not (park.go).
		detach(&it)
		// The state change is ordered by arrival, not by the payload's
		// timestamp: a birth carries the device's clock, a will (fixed at
		// CONNECT) none, and mixing the two clocks lost births. After a
		// broker restart the wills Mosquitto sent at shutdown reach the
		// kept ingest session after the devices have reconnected and
		// published their births; stamped at arrival, such a will looked
		// newer than the birth behind it in the same stream, and 420 of
		// 2,000 reconnected devices stayed offline (bench fleet-connect).
		// The broker delivers a device's birth and will in order, and so
		// do the workers (one per device): arrival order is their order.
		if at.Before(it.at) { // a timestamp of its own: the device's clock
			in.m.stateDelay.WithLabelValues(StageDelivery).Observe(it.at.Sub(at).Seconds())
		}
		in.m.stateDelay.WithLabelValues(StageQueue).Observe(time.Since(it.at).Seconds())
		in.states.add(meta.StateChange{DeviceID: t.DeviceID, Online: t.Kind == wire.KindOnline, At: it.at}, done)
	}
	if fwHooked {
		in.toFirmware(t, fwProgress, fwVersion, it.at, done) // firmwarehook.go
	} else if hooked {
		in.toShadow(t, rows, done) // shadowhook.go
	}
	in.liveDecoded(t.DeviceID, rows.Props) // live updates, before storage (livefeed.go)
	if err := w.AddHolding(in.runCtx, rows.Msgs, rows.Props, held, done); err != nil {
		// Only after Close's deadline (or a row tsdb refuses, which the
		// decoder prevents): leave it unacked for redelivery.
		in.log.Warn("ingest could not queue rows", "topic", t.Name, "err", err)
		in.settle(it, false)
	}
}

// pahoMessageBytes is about what a received message takes beyond its
// payload and topic while it waits for its acknowledgement: paho's message,
// packet and ack closure, and this package's item and done closure. At
// QoS 1 the writer counts it against its byte bounds (AddHolding), or
// batches of held messages would take the process past its memory limit.
const pahoMessageBytes = 384

// storeRetry is the schedule of a retried PostgreSQL read or write: 100 ms,
// doubling up to 5 s.
func storeRetry() backoff.Backoff {
	return backoff.Backoff{Min: 100 * time.Millisecond, Max: 5 * time.Second}
}

// lookup asks the device cache, retrying with backoff while PostgreSQL
// fails; err only when Close's deadline passed.
func (in *Ingester) lookup(id string) (meta.DeviceStatus, bool, error) {
	b := storeRetry()
	for {
		ref, found, err := in.devices.get(in.runCtx, id)
		if err == nil {
			return ref, found, nil
		}
		if in.runCtx.Err() != nil {
			return ref, false, err
		}
		in.log.Warn("device lookup failed; retrying", "device", id, "err", err)
		if err := b.Wait(in.runCtx); err != nil {
			return ref, false, err
		}
	}
}

// The command path records its downlinks through the ingester.
var _ link.DownlinkRecorder = (*Ingester)(nil)

// RecordDownlink stores a message the platform sent to a device (a
// command), with the uplink messages.
func (in *Ingester) RecordDownlink(ctx context.Context, m tsdb.Message) error {
	m.Direction = "down"
	if m.Time.IsZero() {
		m.Time = time.Now()
	}
	return in.writers[0].Add(ctx, []tsdb.Message{m}, nil, nil)
}

// Stats returns the counters so far.
func (in *Ingester) Stats() Stats {
	s := Stats{
		Received:      in.received.Load(),
		Stored:        in.stored.Load(),
		Acked:         in.acked.Load(),
		StateChanges:  in.stateN.Load(),
		StateFolded:   in.foldedN.Load(),
		BadTimestamps: in.badTimes.Load(),
		Dropped:       make(map[string]uint64),
	}
	in.dropped.Range(func(k, v any) bool {
		s.Dropped[k.(string)] = v.(*atomic.Uint64).Load()
		return true
	})
	return s
}

// BacklogDrained reports whether every subscriber session has stored (or
// dropped) what the broker held for it when it last connected (backlog.go).
func (in *Ingester) BacklogDrained() bool { return in.backlog.Drained(-1) }

// BacklogDrainedAt is BacklogDrained for the sessions of broker b
// (Brokers' index).
func (in *Ingester) BacklogDrainedAt(b int) bool { return in.backlog.Drained(b) }

// Connected reports whether every subscriber connection, retired sessions
// included, is open to its broker; paho reconnects a lost one by itself.
func (in *Ingester) Connected() bool { return in.connectedAt(-1) }

// ConnectedTo is Connected for the connections of broker b (Brokers'
// index).
func (in *Ingester) ConnectedTo(b int) bool { return in.connectedAt(b) }

// Brokers are the URLs of the brokers the Ingester subscribes at, in the
// order of Options.BrokerURL.
func (in *Ingester) Brokers() []string { return in.brokers }

// connectedAt: every connection of broker b (-1: of every broker) is open.
func (in *Ingester) connectedAt(b int) bool {
	n := 0
	for i, c := range in.clients {
		if b >= 0 && in.atBroker[i] != b {
			continue
		}
		if !c.IsConnectionOpen() {
			return false
		}
		n++
	}
	return n > 0
}

// Close stops taking messages, stores what was taken (acknowledging it),
// then disconnects. Messages delivered but not taken stay unacknowledged
// in the broker's session for the next start. It reports what could not be
// stored before ctx ended.
func (in *Ingester) Close(ctx context.Context) error {
	in.closeOnce.Do(func() { in.closeErr = in.close(ctx) })
	return in.closeErr
}

func (in *Ingester) close(ctx context.Context) error {
	// 1. Stop intake: new callbacks return at once, waiting ones give up.
	in.gate.Lock()
	in.closed = true
	close(in.stopping)
	for in.active > 0 {
		in.idle.Wait()
	}
	in.gate.Unlock()
	close(in.drained)
	stop := context.AfterFunc(ctx, in.abort)
	defer stop()
	// 2. Drain the queues into the writer.
	in.workers.Wait()
	// 3. Flush rows and state changes; their done callbacks ack.
	var errs []error
	var wg sync.WaitGroup
	var mu sync.Mutex
	for _, w := range append(in.writers[:len(in.writers):len(in.writers)], in.presenceW) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := w.Close(ctx); err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("ingest: %w", err))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if err := in.states.close(ctx); err != nil {
		errs = append(errs, err)
	}
	// 4. Disconnect, giving the acks a moment to reach the broker.
	for _, c := range in.clients {
		c.Disconnect(250)
	}
	in.abort()
	in.refresher.Wait()
	s := in.Stats()
	in.log.Info("ingest stopped", "received", s.Received, "stored", s.Stored, "acked", s.Acked)
	return errors.Join(errs...)
}
