package forward

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/prometheus/client_golang/prometheus"

	"devicehub/ingest/leader"
	"devicehub/ingest/mqttconn"
	"devicehub/ingest/wire"
	"devicehub/meta"
	"devicehub/schema/backoff"
)

// lockKey elects the forwarder's one owner among instances.
const lockKey = 0x666f7277617264 // "forward"

// Options configure a Forwarder.
type Options struct {
	// BrokerURL is one broker or a comma-separated pool (mqttconn.Brokers).
	// Default tcp://127.0.0.1:1884.
	BrokerURL string
	// Login is devicehub's service login. Default mqttconn.DefaultLogin.
	Login mqttconn.Login
	// ClientID of the owner's persistent session ("-<n>" added per broker
	// of a pool), the same for every owner. Default
	// "devicehub-forward-<installation id>".
	ClientID string
	// Dir holds the spools, one directory per rule. Default
	// ".data/forward" in the working directory (beside the firmware packages' .data/firmware).
	Dir string
	// MaxBytes bounds each rule's spool; at the bound the oldest unsent
	// messages are dropped and counted. Default 1 GiB.
	MaxBytes int64
	// FlushInterval: how often taken messages are synced to the spools
	// and then acknowledged to the broker. Default 20ms.
	FlushInterval time.Duration
	// PollInterval: how often rules are re-read and the status written.
	// Default 1s.
	PollInterval time.Duration
	// BackoffMin and BackoffMax bound the wait between attempts of a
	// batch the sink refused (doubling, with jitter). Defaults 200ms, 5s.
	BackoffMin, BackoffMax time.Duration
	// Queue bounds the messages taken but not yet spooled. Default 10000.
	Queue int
	// Retry: how long a failed start waits. Default 500ms.
	Retry time.Duration
	// Instance names this instance in the rules' status. Default the
	// host name.
	Instance   string
	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

func (o Options) withDefaults() Options {
	mqttconn.Defaults(&o.BrokerURL, &o.Login)
	if o.Dir == "" {
		o.Dir = ".data/forward"
	}
	if o.MaxBytes <= 0 {
		o.MaxBytes = 1 << 30
	}
	if o.FlushInterval <= 0 {
		o.FlushInterval = 20 * time.Millisecond
	}
	if o.PollInterval <= 0 {
		o.PollInterval = time.Second
	}
	if o.BackoffMin <= 0 {
		o.BackoffMin = 200 * time.Millisecond
	}
	if o.BackoffMax < o.BackoffMin {
		o.BackoffMax = max(5*time.Second, o.BackoffMin)
	}
	if o.Queue <= 0 {
		o.Queue = 10000
	}
	if o.Retry <= 0 {
		o.Retry = 500 * time.Millisecond
	}
	if o.Instance == "" {
		o.Instance, _ = os.Hostname()
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// Forwarder sends the messages of the forwarding rules to their sinks on
// the one instance that holds the forwarding lock: see the package doc.
type Forwarder struct {
	opt     Options
	ms      *meta.Store
	store   *Store
	log     *slog.Logger
	brokers []string

	owner atomic.Bool
	ready atomic.Bool
	// redelivered counts the messages the broker delivered again (their
	// DUP flag): sent to an earlier connection of the session and not
	// acknowledged. The intake's only repeats are among them.
	redelivered atomic.Int64

	mu    sync.Mutex // rules, for the metrics and Status
	rules map[string]*ruleState

	sub  atomic.Pointer[mqttconn.Subscriber] // the owner's sessions, of the latest turn
	want map[string]byte                     // what the enabled rules need (reload)

	// Tests: a crash at the worst moments. afterSync runs between the
	// spools' sync and the broker acks of n messages; beforeAck between
	// the sink's acceptance of a batch of n and the cursor's save; a
	// receive on kill ends the turn at once, appends unsynced (onKill is
	// told how many messages were taken and not acknowledged). A non-nil
	// error ends the turn as a crash would: nothing further acknowledged
	// or saved.
	afterSync func(n int) error
	beforeAck func(ruleID string, n int) error
	kill      chan struct{}
	onKill    func(n int)
	crashed   chan struct{} // a sender's hook crashed the turn
}

// ruleState is a rule as the owner runs it.
type ruleState struct {
	rule  Rule
	match matcher
	spool *spool
	stop  context.CancelFunc // the sender's
	done  chan struct{}
	dirty bool // appended since the last sync
}

// New returns a forwarder over ms's database.
func New(ms *meta.Store, opt Options) (*Forwarder, error) {
	opt = opt.withDefaults()
	brokers, err := mqttconn.Brokers(opt.BrokerURL)
	if err != nil {
		return nil, fmt.Errorf("forward: %w", err)
	}
	f := &Forwarder{opt: opt, ms: ms, store: NewStore(ms), log: opt.Logger.With("component", "forward"), brokers: brokers,
		rules: map[string]*ruleState{}}
	if opt.Registerer != nil {
		if err := opt.Registerer.Register(f); err != nil {
			return nil, fmt.Errorf("forward: register metrics: %w", err)
		}
	}
	return f, nil
}

// Store is the forwarder's store (for the API).
func (f *Forwarder) Store() *Store { return f.store }

// Owner reports whether this instance forwards now; Ready whether its
// broker sessions are connected and subscribed too.
func (f *Forwarder) Owner() bool { return f.owner.Load() }

// Ready: see Owner.
func (f *Forwarder) Ready() bool { return f.ready.Load() }

// Status is this instance's view of a rule (ok false: not forwarding it).
func (f *Forwarder) Status(id string) (Status, bool) {
	f.mu.Lock()
	rs := f.rules[id]
	f.mu.Unlock()
	if rs == nil {
		return Status{}, false
	}
	st := rs.spool.stats(time.Now())
	st.Owner = f.opt.Instance
	return st, true
}

var (
	descLag     = prometheus.NewDesc("devicehub_forward_lag_seconds", "Age of the oldest message of a forwarding rule not yet accepted by its sink (0: caught up).", []string{"rule"}, nil)
	descPending = prometheus.NewDesc("devicehub_forward_pending_messages", "Messages spooled for a forwarding rule and not yet accepted by its sink.", []string{"rule"}, nil)
	descBytes   = prometheus.NewDesc("devicehub_forward_spool_bytes", "Size on disk of a forwarding rule's spool.", []string{"rule"}, nil)
	descDropped = prometheus.NewDesc("devicehub_forward_dropped_total", "Messages of a forwarding rule dropped unsent at its spool's bound (the oldest first).", []string{"rule"}, nil)
	descSent    = prometheus.NewDesc("devicehub_forward_sent_total", "Messages of a forwarding rule its sink accepted.", []string{"rule"}, nil)
	descFailed  = prometheus.NewDesc("devicehub_forward_failed_total", "Requests (or publish rounds) of a forwarding rule its sink refused or that failed; each is retried.", []string{"rule"}, nil)
	descOwner   = prometheus.NewDesc("devicehub_forward_owner", "1 while this instance forwards telemetry (holds the forwarding lock).", nil, nil)
	descRedeliv = prometheus.NewDesc("devicehub_forward_redelivered_total", "Messages the broker delivered to the forwarder again (DUP): sent to an earlier connection or owner and not acknowledged. Those spooled before a crash are forwarded again with new seqs (at-least-once).", nil, nil)
)

// Describe implements prometheus.Collector.
func (f *Forwarder) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descLag, descPending, descBytes, descDropped, descSent, descFailed, descOwner, descRedeliv} {
		ch <- d
	}
}

// Collect implements prometheus.Collector: the rules this instance runs.
func (f *Forwarder) Collect(ch chan<- prometheus.Metric) {
	owner := 0.0
	if f.owner.Load() {
		owner = 1
	}
	ch <- prometheus.MustNewConstMetric(descOwner, prometheus.GaugeValue, owner)
	ch <- prometheus.MustNewConstMetric(descRedeliv, prometheus.CounterValue, float64(f.redelivered.Load()))
	f.mu.Lock()
	defer f.mu.Unlock()
	now := time.Now()
	for id, rs := range f.rules {
		st := rs.spool.stats(now)
		ch <- prometheus.MustNewConstMetric(descLag, prometheus.GaugeValue, float64(st.LagMs)/1000, id)
		ch <- prometheus.MustNewConstMetric(descPending, prometheus.GaugeValue, float64(st.Pending), id)
		ch <- prometheus.MustNewConstMetric(descBytes, prometheus.GaugeValue, float64(st.SpooledBytes), id)
		ch <- prometheus.MustNewConstMetric(descDropped, prometheus.CounterValue, float64(st.Dropped), id)
		ch <- prometheus.MustNewConstMetric(descSent, prometheus.CounterValue, float64(st.Sent), id)
		ch <- prometheus.MustNewConstMetric(descFailed, prometheus.CounterValue, float64(st.Failed), id)
	}
}

// Run waits for the forwarding lock and forwards while it holds it,
// until ctx ends; a lost lock ends the turn and the wait starts again.
func (f *Forwarder) Run(ctx context.Context) {
	if f.opt.ClientID == "" {
		f.opt.ClientID = leader.SessionID(ctx, f.ms, "forward", f.opt.Retry, f.log)
	}
	leader.Loop{Locker: f.ms, Key: lockKey, Retry: f.opt.Retry, Log: f.log,
		Waiting: "forward: waiting for the forwarding lock", SteppedDown: "forward: forwarder stepped down",
		Owner: &f.owner,
	}.Run(ctx, f.lead)
}

// errCrash ends a turn as a crash would (tests).
var errCrash = errors.New("forward: crash")

// lead is one turn as the owner.
func (f *Forwarder) lead(ctx context.Context, lost <-chan struct{}) (err error) {
	if err := os.MkdirAll(f.opt.Dir, 0o750); err != nil {
		return fmt.Errorf("forward: spool directory: %w", err)
	}
	f.crashed = make(chan struct{}, 1)
	sctx, stopSenders := context.WithCancel(ctx)
	defer func() {
		stopSenders()
		f.mu.Lock()
		rules := f.rules
		f.rules = map[string]*ruleState{}
		f.mu.Unlock()
		for _, rs := range rules {
			if rs.done != nil {
				<-rs.done
			}
			if err == nil {
				// A stop: an MQTT sender's cursor past what was
				// acknowledged and not yet saved is saved.
				if serr := rs.spool.save(); serr != nil {
					f.log.Error("forward: saving the cursor failed", "rule", rs.rule.ID, "err", serr)
				}
			}
			rs.spool.close()
		}
	}()
	if err := f.reload(sctx); err != nil {
		return err
	}
	sub, err := mqttconn.Subscribe(ctx, mqttconn.SubscriberConfig{
		Brokers: f.brokers, ClientID: f.opt.ClientID, Login: f.opt.Login, Filters: f.want, Queue: f.opt.Queue,
		KeepAlive:      10 * time.Second,
		PingTimeout:    60 * time.Second, // the answer queues behind a backlog
		ConnectTimeout: 10 * time.Second, Name: "forward", Logger: f.log,
	})
	if err != nil {
		return fmt.Errorf("forward: %w", err)
	}
	f.sub.Store(sub)
	defer func() {
		f.ready.Store(false)
		sub.Close() // what is unacknowledged goes to the next owner
	}()
	in := sub.C()
	f.ready.Store(true)
	f.log.Info("forward: forwarding", "rules", len(f.rules), "dir", f.opt.Dir)

	flush := time.NewTicker(f.opt.FlushInterval)
	defer flush.Stop()
	poll := time.NewTicker(f.opt.PollInterval)
	defer poll.Stop()
	var pending []mqtt.Message
	var scratch []byte
	var dups, dupsLogged int64 // redelivered this turn, and told
	byProduct := f.byProduct()
	sync := func() error {
		for _, rs := range f.rules {
			if rs.dirty {
				if err := rs.spool.sync(); err != nil {
					return err
				}
				rs.dirty = false
			}
		}
		if f.afterSync != nil && len(pending) > 0 {
			if err := f.afterSync(len(pending)); err != nil {
				return err
			}
		}
		for _, m := range pending {
			m.Ack()
		}
		pending = pending[:0]
		return nil
	}
	for {
		select {
		case <-ctx.Done():
			return sync() // a stop, not a crash: what was taken is kept and acknowledged
		case <-lost:
			return errors.New("forwarding lock lost")
		case <-f.kill:
			if f.onKill != nil {
				f.onKill(len(pending) + len(in))
			}
			return errCrash
		case <-f.crashed:
			return errCrash
		case m := <-in:
			pending = append(pending, m.Msg)
			if m.Msg.Duplicate() {
				f.redelivered.Add(1)
				dups++
			}
			if m.Msg.Retained() {
				break
			}
			msg, ok := decode(m.Msg.Topic(), m.Msg.Payload(), m.At)
			if !ok {
				break
			}
			for _, rs := range byProduct[msg.productID] {
				var take bool
				scratch, take = rs.match.encode(append(scratch[:0], '{'), &msg, m.At)
				if !take {
					continue
				}
				if err := rs.spool.append(scratch[1:], m.At); err != nil {
					return err
				}
				rs.dirty = true
			}
			if len(pending) >= 5000 {
				if err := sync(); err != nil {
					return err
				}
			}
		case <-flush.C:
			if err := sync(); err != nil {
				return err
			}
		case <-poll.C:
			// Rules change between syncs only: what was appended under
			// the old rules is synced and acknowledged first.
			if err := sync(); err != nil {
				return err
			}
			if err := f.reload(sctx); err != nil {
				f.log.Warn("forward: reading the rules failed", "err", err)
			} else {
				byProduct = f.byProduct()
				sub.SetFilters(f.want)
			}
			f.writeStatus(ctx)
			if dups > dupsLogged {
				f.log.Info("forward: the broker delivered messages again", "redelivered", dups-dupsLogged,
					"why", "not acknowledged to an earlier connection or owner (cut or crashed between the spool's write and the acks): those spooled then are forwarded again, with new seqs")
				dupsLogged = dups
			}
		}
	}
}

// byProduct indexes the enabled rules by product.
func (f *Forwarder) byProduct() map[string][]*ruleState {
	out := map[string][]*ruleState{}
	for _, rs := range f.rules {
		if rs.rule.Enabled {
			out[rs.rule.ProductID] = append(out[rs.rule.ProductID], rs)
		}
	}
	return out
}

// sameSink: a change that needs no new sender.
func sameSink(a, b Rule) bool {
	if a.Kind != b.Kind || a.Secret != b.Secret || a.Enabled != b.Enabled {
		return false
	}
	if a.Webhook != nil {
		x, y := *a.Webhook, *b.Webhook
		return x.URL == y.URL && x.BatchSize == y.BatchSize && x.BatchMs == y.BatchMs && x.TimeoutMs == y.TimeoutMs &&
			maps.Equal(x.Headers, y.Headers)
	}
	return *a.MQTT == *b.MQTT
}

// reload reads the rules and brings the running ones in line: a new rule
// gets a spool and a sender, a changed sink a new sender (from the
// cursor), a disabled rule no sender, a deleted one neither, and its
// spool is removed. Spool directories of rules that no longer exist are
// removed too.
func (f *Forwarder) reload(ctx context.Context) error {
	rules, err := f.store.Rules(ctx, nil)
	if err != nil {
		return err
	}
	seen := map[string]bool{}
	next := map[string]*ruleState{}
	for _, r := range rules {
		seen[r.ID] = true
		r.Status = nil
		rs := f.rules[r.ID]
		if rs == nil {
			sp, err := openSpool(filepath.Join(f.opt.Dir, r.ID), f.opt.MaxBytes)
			if err != nil {
				return err
			}
			rs = &ruleState{rule: r, spool: sp}
		} else if !sameSink(rs.rule, r) {
			f.stopSender(rs)
		}
		rs.rule, rs.match = r, newMatcher(r)
		if r.Enabled && rs.done == nil {
			f.startSender(ctx, rs)
		}
		next[r.ID] = rs
	}
	for id, rs := range f.rules {
		if next[id] == nil {
			f.stopSender(rs)
			rs.spool.close()
			_ = os.RemoveAll(rs.spool.dir)
		}
	}
	f.mu.Lock()
	f.rules = next
	f.mu.Unlock()
	if ents, err := os.ReadDir(f.opt.Dir); err == nil {
		for _, e := range ents {
			if e.IsDir() && !seen[e.Name()] {
				_ = os.RemoveAll(filepath.Join(f.opt.Dir, e.Name()))
			}
		}
	}
	// The subscriptions: the products of enabled rules.
	filters := map[string]byte{}
	for _, rs := range next {
		if !rs.rule.Enabled {
			continue
		}
		for _, l := range []string{wire.LevelReport, wire.LevelEvent + "+", wire.LevelOnline, wire.LevelOffline} {
			filters[wire.DeviceTopic(rs.rule.ProductID, "+", l)] = 1
		}
	}
	f.want = filters
	return nil
}

func (f *Forwarder) stopSender(rs *ruleState) {
	if rs.done == nil {
		return
	}
	rs.stop()
	<-rs.done
	rs.stop, rs.done = nil, nil
	rs.spool.rewind() // what the old sender read and did not send
}

func (f *Forwarder) startSender(ctx context.Context, rs *ruleState) {
	sctx, cancel := context.WithCancel(ctx)
	rs.stop, rs.done = cancel, make(chan struct{})
	go func(r Rule, sp *spool, done chan struct{}) {
		defer close(done)
		f.send(sctx, r, sp)
	}(rs.rule, rs.spool, rs.done)
}

// send is a rule's sender. A webhook's: batches in spool order, each
// retried with backoff until the sink accepts it, then the cursor moves
// past it. An MQTT sink's: sendMQTT.
func (f *Forwarder) send(ctx context.Context, r Rule, sp *spool) {
	if r.Kind == KindMQTT {
		f.sendMQTT(ctx, r, sp)
		return
	}
	sk := &webhook{cfg: *r.Webhook, secret: r.Secret}
	size, wait := r.batchSize(), r.batchWait()
	for ctx.Err() == nil {
		batch, err := sp.read(size)
		if err != nil {
			f.log.Error("forward: reading the spool failed", "rule", r.ID, "err", err)
			leader.Sleep(ctx, f.opt.Retry)
			sp.rewind()
			continue
		}
		if len(batch) == 0 {
			select {
			case <-sp.wake:
			case <-ctx.Done():
				return
			}
			continue
		}
		if len(batch) < size && wait > 0 {
			deadline := time.NewTimer(wait)
		fill:
			for len(batch) < size {
				select {
				case <-sp.wake:
					more, err := sp.read(size - len(batch))
					if err != nil {
						break fill
					}
					batch = append(batch, more...)
				case <-deadline.C:
					break fill
				case <-ctx.Done():
					deadline.Stop()
					return
				}
			}
			deadline.Stop()
		}
		retry := backoff.Backoff{Min: f.opt.BackoffMin, Max: f.opt.BackoffMax, Jitter: 0.5}
		for attempt := 0; len(batch) > 0; attempt++ {
			if attempt > 0 {
				// The bound may have dropped the batch's oldest messages
				// meanwhile: they are counted dropped, not sent.
				c := sp.position()
				for len(batch) > 0 && batch[0].seq <= c {
					batch = batch[1:]
				}
				if len(batch) == 0 {
					break
				}
			}
			// A batch in flight is finished, not abandoned, when the
			// sender is stopped (a stop, a changed rule, a lost lock): the
			// receiver may already hold it, and an answer not waited for
			// leaves the cursor behind it, so that the next owner sends
			// it again. The webhook's timeout bounds the wait.
			err := sk.send(context.WithoutCancel(ctx), r.ID, batch)
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				return
			}
			sp.failure(err)
			f.log.Debug("forward: sink refused a batch; retrying", "rule", r.ID, "attempt", attempt+1, "err", err)
			if retry.Wait(ctx) != nil {
				return
			}
		}
		if len(batch) == 0 {
			continue
		}
		if f.beforeAck != nil {
			if err := f.beforeAck(r.ID, len(batch)); err != nil {
				select {
				case f.crashed <- struct{}{}:
				default:
				}
				return
			}
		}
		if err := sp.ack(batch[len(batch)-1].seq, len(batch)); err != nil {
			f.log.Error("forward: saving the cursor failed", "rule", r.ID, "err", err)
		}
	}
}

// flight is a record published to an MQTT sink, its PUBACK not yet
// taken into account.
type flight struct {
	rec record
	tok mqtt.Token
	at  time.Time // published
}

// sendMQTT is an MQTT rule's sender, pipelined: it publishes in spool
// order while fewer than the rule's batchSize publishes await their
// PUBACK, and moves the cursor past the longest prefix of publishes that
// were all acknowledged, never past one that was not. The cursor is saved
// once half a window was acknowledged since the last save, and whenever
// nothing is in flight. A publish that failed or whose PUBACK is late
// (timeoutMs), or a lost connection, drops the connection and everything
// in flight: the next connection publishes again from the cursor, in
// spool order. A stop waits for the publishes in flight and saves the
// cursor past those acknowledged (finish; the package doc).
func (f *Forwarder) sendMQTT(ctx context.Context, r Rule, sp *spool) {
	m := &mqttSink{cfg: *r.MQTT, secret: r.Secret, ruleID: r.ID}
	defer m.close()
	window := r.batchSize()
	// The window is refilled once an eighth of it is free: a spool read
	// costs about the same for a few messages as for many.
	refill := max(1, window/8)
	timeout := time.Duration(r.MQTT.TimeoutMs) * time.Millisecond
	retry := backoff.Backoff{Min: f.opt.BackoffMin, Max: f.opt.BackoffMax, Jitter: 0.5}
	var fly []flight // published, in spool order
	unsaved := 0     // acknowledged, the saved cursor not past them
	late := time.NewTimer(time.Hour)
	// fail drops the connection and what is in flight (sent again from
	// the cursor) and waits; false: the sender is stopping.
	fail := func(err error) bool {
		m.drop()
		fly = nil
		sp.rewind()
		sp.failure(err)
		f.log.Debug("forward: MQTT sink failed; publishing again from the cursor", "rule", r.ID, "err", err)
		return retry.Wait(ctx) == nil
	}
	// save saves the cursor; false: a test's crash.
	save := func() bool {
		if f.beforeAck != nil {
			if err := f.beforeAck(r.ID, unsaved); err != nil {
				select {
				case f.crashed <- struct{}{}:
				default:
				}
				return false
			}
		}
		if err := sp.save(); err != nil {
			f.log.Error("forward: saving the cursor failed", "rule", r.ID, "err", err)
		}
		unsaved = 0
		return true
	}
	// settle moves the cursor past the publishes at the front of fly that
	// were all acknowledged, never past one that was not, and returns the
	// error of the first that failed.
	settle := func() error {
		k := 0
		var failed error
	prefix:
		for ; k < len(fly); k++ {
			select {
			case <-fly[k].tok.Done():
				if err := fly[k].tok.Error(); err != nil {
					failed = err
					break prefix
				}
			default:
				break prefix
			}
		}
		if k > 0 {
			sp.advance(fly[0].rec.seq, fly[k-1].rec.seq)
			unsaved += k
			fly = fly[k:]
			retry.Reset()
		}
		return failed
	}
	// finish ends a stopped sender (a stop, a changed rule, a lost lock)
	// as a webhook's ends its batch in flight: it waits for the publishes
	// in flight, at most timeoutMs after the newest was published, and
	// saves the cursor past those acknowledged, so that the next owner
	// publishes none of them again (TestForwardMQTTHandover).
	finish := func() {
		if len(fly) > 0 {
			wait := time.NewTimer(time.Until(fly[len(fly)-1].at.Add(timeout)))
			defer wait.Stop()
		all:
			for _, fl := range fly {
				select {
				case <-fl.tok.Done():
				case <-wait.C:
					break all
				}
			}
			_ = settle()
		}
		if unsaved > 0 {
			save()
		}
	}
	defer late.Stop()
	for ctx.Err() == nil {
		if !m.connected() {
			// A lost connection is failed before anything is published
			// on the next one: the next starts from the cursor, never
			// after publishes that were lost.
			err := errors.New("mqtt: connection lost")
			if len(fly) == 0 {
				err = m.connect()
			}
			if err != nil {
				if !fail(err) {
					finish()
					return
				}
				continue
			}
		}
		if window-len(fly) >= refill {
			recs, err := sp.read(window - len(fly))
			if err != nil {
				f.log.Error("forward: reading the spool failed", "rule", r.ID, "err", err)
				m.drop()
				fly = nil
				sp.rewind()
				leader.Sleep(ctx, f.opt.Retry)
				continue
			}
			now := time.Now()
			for _, rec := range recs {
				fly = append(fly, flight{rec: rec, tok: m.publish(rec), at: now})
			}
		}
		if len(fly) == 0 {
			if unsaved > 0 && !save() {
				return
			}
			select {
			case <-sp.wake:
			case <-ctx.Done():
				return
			}
			continue
		}
		var more <-chan struct{} // room in the window: wait for messages too
		if window-len(fly) >= refill {
			more = sp.wake
		}
		late.Reset(time.Until(fly[0].at.Add(timeout)))
		select {
		case <-fly[0].tok.Done():
		case <-more:
		case <-late.C:
		case <-ctx.Done():
			finish()
			return
		}
		late.Stop()
		failed := settle()
		switch {
		case failed != nil:
			if !fail(fmt.Errorf("mqtt publish: %w", failed)) {
				finish()
				return
			}
			continue
		case len(fly) > 0 && time.Since(fly[0].at) >= timeout:
			if !fail(fmt.Errorf("mqtt publish: no PUBACK within %s", timeout)) {
				finish()
				return
			}
			continue
		}
		if unsaved >= max(1, window/2) && !save() {
			return
		}
	}
	finish()
}

// writeStatus records this owner's view of its rules in PostgreSQL.
func (f *Forwarder) writeStatus(ctx context.Context) {
	sts := map[string]Status{}
	now := time.Now()
	for id, rs := range f.rules {
		sts[id] = rs.spool.stats(now)
	}
	if err := f.store.writeStatus(ctx, f.opt.Instance, sts); err != nil && ctx.Err() == nil {
		f.log.Warn("forward: writing the status failed", "err", err)
	}
}
