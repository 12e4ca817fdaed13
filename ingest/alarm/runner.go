package alarm

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/prometheus/client_golang/prometheus"

	"devicehub/ingest"
	"devicehub/ingest/leader"
	"devicehub/ingest/mqttconn"
	"devicehub/ingest/wire"
	"devicehub/meta"
	"devicehub/schema"
)

// lockKey elects the evaluator's one owner among instances.
const lockKey = 0x616c61726d73 // "alarms"

// Options configure a Runner.
type Options struct {
	// BrokerURL is one broker or a comma-separated pool (mqttconn.Brokers).
	// Default tcp://127.0.0.1:1884.
	BrokerURL string
	// Login is devicehub's service login. Default mqttconn.DefaultLogin.
	Login mqttconn.Login
	// ClientID of the owner's persistent session ("-<n>" added per broker
	// of a pool). Every owner uses the same id, so that a new owner
	// resumes the session and its queued messages. Default
	// "devicehub-alarms-<installation id>".
	ClientID string
	// ProductIDs narrows the subscriptions to these products (tests);
	// default every product.
	ProductIDs []string
	// FlushInterval: how often what was evaluated is handed to the batch
	// lane's writer (written, then acknowledged), when it is idle; a
	// raise, escalation, de-escalation or clear goes to the express lane
	// at once. Default 50ms.
	FlushInterval time.Duration
	// TickInterval: how often timers are checked. Default 100ms.
	TickInterval time.Duration
	// PollInterval: how often rule changes and clears by hand are read.
	// Default 1s.
	PollInterval time.Duration
	// Retention of cleared alarms; 0 keeps them. Default 90 days.
	Retention time.Duration
	// Queue bounds the messages taken but not yet evaluated. Default 4096.
	Queue int
	// Retry: the wait after a turn that failed (a failed write ends the
	// turn: the next reloads the stored state). Default 500ms.
	Retry time.Duration
	// OnTransitions, if set, is given each batch's transitions as they
	// were stored (WriteResult.Written: no repeats; a repeat the store
	// made a new alarm as its raise; none of an alarm a hand cleared
	// meanwhile), once committed (the live feed), by the writer
	// goroutine that wrote them: in write order per alarm (a device is
	// in one batch being written at a time), from several goroutines
	// (the batch lane's writer and the express lane's); it must not
	// block.
	OnTransitions func([]Transition)
	// Refs gives the device values thresholds name (tags, configuration);
	// nil: the devices' own, read from PostgreSQL (Store.DeviceValues) at
	// each turn's start and every PollInterval for the devices changed.
	Refs Refs
	// Feed, if set, is ingest's AlarmHook on this instance, whose session
	// is the installation's one (ingest.NoShareGroup): the evaluator reads
	// what ingest reads instead of a session of its own (package doc,
	// "One session, or ingest's"). Only one instance may run with it.
	Feed *Feed
	// FeedReady reports whether ingest applied its sessions' backlogs
	// (ingest.Ingester.BacklogDrained): with a Feed, timers start once it
	// does. Nil: at once.
	FeedReady  func() bool
	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

func (o Options) withDefaults() Options {
	mqttconn.Defaults(&o.BrokerURL, &o.Login)
	if o.FlushInterval <= 0 {
		o.FlushInterval = 50 * time.Millisecond
	}
	if o.TickInterval <= 0 {
		o.TickInterval = 100 * time.Millisecond
	}
	if o.PollInterval <= 0 {
		o.PollInterval = time.Second
	}
	if o.Queue <= 0 {
		o.Queue = 4096
	}
	if o.Retry <= 0 {
		o.Retry = 500 * time.Millisecond
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// DefaultRetention of cleared alarms.
const DefaultRetention = 90 * 24 * time.Hour

// Runner runs the evaluator on the one instance that holds the alarm
// lock: see the package doc for why that is exact.
type Runner struct {
	opt     Options
	ms      *meta.Store
	store   *Store
	log     *slog.Logger
	m       *metrics
	brokers []string

	owner     atomic.Bool
	ready     atomic.Bool   // the owner's sessions are subscribed and their backlogs applied: timers run
	committed atomic.Uint64 // batches written

	afterWrite  func(*batch) error // tests: a crash between a write and its acks
	beforeWrite func(*batch) error // tests: a write that fails
	evaluated   atomic.Uint64      // messages taken and evaluated (tests)

	sub atomic.Pointer[mqttconn.Subscriber] // the owner's sessions, of the latest turn
}

type metrics struct {
	evals   prometheus.Counter
	lacking prometheus.Counter
	lag     prometheus.Histogram
	change  *prometheus.HistogramVec
	active  *prometheus.GaugeVec
	owner   prometheus.Gauge
}

// NewRunner returns a runner over ms's database.
func NewRunner(ms *meta.Store, opt Options) (*Runner, error) {
	opt = opt.withDefaults()
	brokers, err := mqttconn.Brokers(opt.BrokerURL)
	if err != nil {
		return nil, fmt.Errorf("alarm: %w", err)
	}
	r := &Runner{opt: opt, ms: ms, store: NewStore(ms), log: opt.Logger.With("component", "alarms"), brokers: brokers}
	r.m = &metrics{
		evals: prometheus.NewCounter(prometheus.CounterOpts{Name: "devicehub_alarm_evaluations_total",
			Help: "Rule evaluations (a rule over a message, or a timer that fired) on this instance."}),
		lacking: prometheus.NewCounter(prometheus.CounterOpts{Name: "devicehub_alarm_threshold_missing_total",
			Help: "Rule evaluations skipped: a threshold names a device value (tag, configuration, property) the device lacks, with no default."}),
		lag: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "devicehub_alarm_evaluation_lag_seconds",
			Help:    "From a message's arrival at the evaluator to the commit of what it changed.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}}),
		change: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "devicehub_alarm_change_lag_seconds",
			Help:    "From the arrival of the message (or the deadline) that raised, escalated, de-escalated or cleared an alarm to the commit of that change, by the lane that wrote it.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}}, []string{"lane"}),
		active: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "devicehub_alarms_active",
			Help: "Active alarms by severity (as the evaluator's owner last read them)."}, []string{"severity"}),
		owner: prometheus.NewGauge(prometheus.GaugeOpts{Name: "devicehub_alarm_owner",
			Help: "1 while this instance evaluates the alarm rules."}),
	}
	for _, s := range Severities() { // 0 until the owner reads the counts
		r.m.active.WithLabelValues(s)
	}
	cs := []prometheus.Collector{r.m.evals, r.m.lacking, r.m.lag, r.m.change, r.m.active, r.m.owner}
	if feed := opt.Feed; feed != nil {
		cs = append(cs, prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "devicehub_alarm_feed_held",
			Help: "Messages ingest handed the evaluator and is not yet let acknowledge (taken, not committed); at the feed's bound ingest waits."},
			func() float64 { return float64(feed.Held()) }))
	}
	if opt.Registerer != nil {
		for _, c := range cs {
			if err := opt.Registerer.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return r, nil
}

// Store is the runner's store (for the API).
func (r *Runner) Store() *Store { return r.store }

// Owner reports whether this instance evaluates now.
func (r *Runner) Owner() bool { return r.owner.Load() }

// Ready reports whether this instance evaluates with its timers running:
// its broker sessions are subscribed and their backlogs applied (every
// backlog marker came back, or markerWait passed).
func (r *Runner) Ready() bool { return r.ready.Load() }

// Batches is how many batches this instance committed.
func (r *Runner) Batches() uint64 { return r.committed.Load() }

// Run waits for the alarm lock and evaluates while it holds it, until ctx
// ends. A lost lock (its database session gone) ends the turn; the
// runner then waits for the lock again.
func (r *Runner) Run(ctx context.Context) {
	if r.opt.ClientID == "" {
		r.opt.ClientID = leader.SessionID(ctx, r.ms, "alarms", r.opt.Retry, r.log)
	}
	leader.Loop{Locker: r.ms, Key: lockKey, Retry: r.opt.Retry, Log: r.log,
		Waiting: "alarms: waiting for the evaluator lock", SteppedDown: "alarms: evaluator stepped down",
		Owner: &r.owner, Gauge: r.m.owner,
	}.Run(ctx, r.lead)
}

// lead is one turn as the owner.
func (r *Runner) lead(ctx context.Context, lost <-chan struct{}) error {
	epoch, err := r.store.Claim(ctx)
	if err != nil {
		return err
	}
	vals := &deviceValues{store: r.store}
	refs := r.opt.Refs
	if refs == nil {
		refs = vals.get
	}
	ev := New(refs)
	version, err := r.loadRules(ctx, ev)
	if err != nil {
		return err
	}
	if r.opt.Refs == nil {
		if err := vals.load(ctx, ev.RefKeys(), true); err != nil {
			return err
		}
	}
	handSince, err := r.store.LastTransitionID(ctx)
	if err != nil {
		return err
	}
	devs, err := r.store.Load(ctx)
	if err != nil {
		return err
	}
	if err := ev.Restore(devs); err != nil {
		return err
	}
	r.log.Info("alarms: evaluating", "rules", ev.Rules(), "devices", len(devs), "epoch", epoch)

	filters := r.filtersFor(ev)
	feed := r.opt.Feed
	var subFilters map[string]byte
	if feed == nil {
		subFilters = filters
	}
	// With a feed, the session opened here is only the one a run without
	// it left (nil filters: a kept session's subscriptions stand), read
	// up to its markers and then ended (package doc, "One session, or
	// ingest's").
	sub, err := mqttconn.Subscribe(ctx, mqttconn.SubscriberConfig{
		Brokers: r.brokers, ClientID: r.opt.ClientID, Login: r.opt.Login, Filters: subFilters, Queue: r.opt.Queue,
		KeepAlive: 10 * time.Second, ConnectTimeout: 10 * time.Second, Name: "alarms", Logger: r.log,
	})
	if err != nil {
		return fmt.Errorf("alarm: %w", err)
	}
	r.sub.Store(sub)
	defer func() {
		r.ready.Store(false)
		sub.Close() // unacknowledged messages go to the next owner
	}()
	clients, in := sub.Clients(), sub.C()
	// Timers wait for the sessions' backlogs: a device that reported while
	// no owner ran must not fire its restored no-data timer before that
	// report is applied. Each session publishes a marker (as ingest's
	// sessions do, ingest/backlog.go) behind its backlog; the timers start
	// once every marker came back, or after markerWait. With a feed, they
	// wait for the left session's markers, then for the feed's messages
	// held at the switch and for ingest's own backlog (Options.FeedReady).
	var marks map[string]bool
	var left leftSession // with a feed: the session a run without it left, being read
	var fed chan mqttconn.Received
	stopPump, pumped := make(chan struct{}), make(chan struct{})
	close(pumped)
	defer func() { close(stopPump); <-pumped }() // before the writers stop: nothing given to a turn that ended
	toFeed := func() {
		feed.restart()
		fed, pumped = make(chan mqttconn.Received, r.opt.Queue), make(chan struct{})
		go func(out chan<- mqttconn.Received, done chan<- struct{}) {
			defer close(done)
			feed.pump(out, stopPump)
		}(fed, pumped)
		in = fed
	}
	switch {
	case feed == nil:
		marks = r.markBacklogs(clients, filters, wire.LevelOnline)
	case sub.Present() && len(filters) > 0:
		// The markers go where ingest's data sessions take them too:
		// until ingest passed them, what it hands the feed may be in
		// the left session's backlog, and is read as a redelivery.
		sub.SetFilters(filters)
		marks = r.markBacklogs(clients, filters, wire.LevelReport)
		feed.await(slices.Collect(maps.Keys(marks)))
		left = leftSession{sub: sub, unacked: new(atomic.Int64)}
		r.log.Info("alarms: reading the session a run without ingest's feed left, then ending it")
	default:
		if err := sub.End(ctx); err != nil {
			r.log.Warn("alarms: ending the session a run without ingest's feed left failed", "err", err)
		}
		toFeed()
	}
	markDeadline := time.Now().Add(markerWait)
	backlogs := func() bool { // every backlog applied
		if len(marks) > 0 {
			return false
		}
		return feed == nil || (feed.caughtUp() && (r.opt.FeedReady == nil || r.opt.FeedReady()))
	}
	// marked ends the reading of the left session once its markers came
	// back (or markerWait passed): the feed is read from then on.
	marked := func() {
		if left.sub != nil && fed == nil && len(marks) == 0 {
			r.log.Info("alarms: the left session's backlog is read; reading ingest's feed")
			toFeed()
		}
	}
	r.ready.Store(backlogs())
	var born *ingest.BornAt
	if len(r.brokers) > 1 {
		born = ingest.NewBornAt()
	}

	flush := time.NewTicker(r.opt.FlushInterval)
	defer flush.Stop()
	tick := time.NewTicker(r.opt.TickInterval)
	defer tick.Stop()
	poll := time.NewTicker(r.opt.PollInterval)
	defer poll.Stop()

	// The write pipeline (package doc, "Write, then acknowledge"): two
	// lanes of writers, each writer writing one batch at a time,
	// acknowledging and announcing it after its commit and stopping at
	// the first failure: the batch lane's one writer takes what was
	// evaluated since its last batch, the express lane's writers the
	// devices of an alarm's change, so that a raise waits neither for the
	// rows of every device touched meanwhile nor for another alarm's
	// write. No device is in two batches being written at once (package
	// doc, "Two lanes"). Meanwhile this loop evaluates the next messages
	// in memory.
	wctx, wcancel := context.WithCancel(ctx)
	toWrite, wrote := make(chan *batch, 1), make(chan written, 1)
	var toExpress [expressWriters]chan *batch
	expressed := make(chan written, expressWriters)
	var writers sync.WaitGroup
	writers.Add(1 + expressWriters)
	go func() {
		defer writers.Done()
		r.writer(wctx, epoch, toWrite, wrote)
	}()
	for i := range toExpress {
		toExpress[i] = make(chan *batch, 1)
		go func(in <-chan *batch) {
			defer writers.Done()
			r.writer(wctx, epoch, in, expressed)
		}(toExpress[i])
	}
	defer func() { wcancel(); writers.Wait() }() // before sub.Close: nothing acknowledged after the turn
	// The poll's reads that decide nothing the evaluator holds (the rules'
	// version, the active counts, the retention's purge) run beside the
	// loop: it never waits for them (TestRunnerPollBeside). A new rules
	// version comes to the loop, which reloads the rules.
	versions := make(chan string, 1)
	writers.Add(1)
	go func() {
		defer writers.Done()
		r.poll(wctx, versions)
	}()
	var (
		pending    []mqttconn.Received
		pendingDev []string // the device of each pending message, "" for none
		seq        uint64
		flightDevs map[string]struct{} // the devices of the batch lane's batch being written (its messages, transitions, rows); nil: none is
		// expressing[i]: the devices of the batch express writer i is
		// writing; nil: it is idle.
		expressing [expressWriters]map[string]struct{}
		due        bool // the flush interval passed since the last batch was handed
		handDue    bool // the clears by hand are to be read once every writer is idle
	)
	var evals, lacking uint64
	var dec decoded // apply's scratch
	expressBusy := func() bool {
		for _, e := range expressing {
			if e != nil {
				return true
			}
		}
		return false
	}
	inExpress := func(dev string) bool {
		for _, e := range expressing {
			if _, ok := e[dev]; ok {
				return true
			}
		}
		return false
	}
	// split moves the pending messages of the devices take says to the
	// returned slice, in order; the others stay pending, in order.
	split := func(take func(dev string) bool) (out []mqttconn.Received) {
		keep, keepDev := pending[:0], pendingDev[:0]
		for i, m := range pending {
			if take(pendingDev[i]) {
				out = append(out, m)
				continue
			}
			keep, keepDev = append(keep, m), append(keepDev, pendingDev[i])
		}
		clear(pending[len(keep):])
		pending, pendingDev = keep, keepDev
		return out
	}
	// hand gives the batch lane what was evaluated since its last batch,
	// if anything, but for the devices of the express batches being
	// written (they stay pending: a row of theirs written beside such a
	// batch could commit before it, an older row over a newer) and the
	// devices of an alarm change not yet handed, which stay for the
	// express lane: an alarm never waits for a batch of every device's
	// rows.
	hand := func() {
		if len(pending) == 0 && !ev.Changed() {
			due = false
			return
		}
		var hold map[string]struct{}
		if ev.Alarming() || expressBusy() {
			hold = map[string]struct{}{}
			for _, e := range expressing {
				maps.Copy(hold, e)
			}
			for id := range ev.AlarmingDevices() {
				hold[id] = struct{}{}
			}
		}
		seq++
		b := &batch{seq: seq}
		b.trs, b.devs = ev.TakeOthers(hold)
		flightDevs = make(map[string]struct{}, len(b.devs))
		b.msgs = split(func(dev string) bool {
			if _, ok := hold[dev]; ok {
				return false
			}
			flightDevs[dev] = struct{}{}
			return true
		})
		for i := range b.trs {
			flightDevs[b.trs[i].DeviceID] = struct{}{}
		}
		for i := range b.devs {
			flightDevs[b.devs[i].DeviceID] = struct{}{}
		}
		toWrite <- b
		due = false
		if n := ev.Evaluations(); n != evals {
			r.m.evals.Add(float64(n - evals))
			evals = n
		}
		if n := ev.Lacking(); n != lacking {
			r.m.lacking.Add(float64(n - lacking))
			lacking = n
		}
	}
	// handExpress gives the idle express writer w the devices of the
	// alarm changes not yet handed that no batch being written holds
	// anything of: their transitions, rows and messages.
	handExpress := func(w int) {
		ids := map[string]struct{}{}
		for id := range ev.AlarmingDevices() {
			if _, busy := flightDevs[id]; !busy && !inExpress(id) {
				ids[id] = struct{}{}
			}
		}
		if len(ids) == 0 {
			return
		}
		seq++
		b := &batch{seq: seq, express: true, writer: w}
		b.trs, b.devs = ev.TakeDevices(ids)
		b.msgs = split(func(dev string) bool { _, ok := ids[dev]; return ok })
		toExpress[w] <- b
		expressing[w] = ids
	}
	// handClears reads the alarms cleared by hand. Only while no batch is
	// with a writer: a clear read while one is written may be older or
	// newer than its commit, which would leave the evaluator unsure which
	// alarm the hand cleared.
	handClears := func() {
		hc, next, err := r.store.HandClears(ctx, handSince)
		if err != nil {
			return
		}
		handSince = next
		for _, h := range hc {
			// A transition of it not yet written was evaluated on the alarm
			// being active: that write finds it cleared and says so
			// (WriteResult), as for a clear read after the write.
			if touched, _ := ev.Untaken(h.RuleID, h.DeviceID); !touched {
				ev.Forget(h.RuleID, h.DeviceID, h.RaisedAt)
			}
		}
	}
	// next hands what is due to the writers that are idle: an alarm's
	// change at once, the rest every FlushInterval or at maxPending
	// messages. While the clears by hand are due, the batch lane gets
	// nothing: they are read as soon as every writer is idle (the express
	// lane's batches are a few rows).
	next := func() {
		inFlight, express := flightDevs != nil, expressBusy()
		if handDue && !inFlight && !express {
			handDue = false
			handClears()
		}
		if ev.Alarming() {
			for w, e := range expressing {
				if e == nil {
					handExpress(w)
					break
				}
			}
		}
		if !handDue && !inFlight && (due || len(pending) >= maxPending) {
			hand()
		}
	}
	// done takes a writer's word on a committed batch: what its write
	// found cleared by hand, unless a transition not yet written is of
	// the same alarm (then its own write finds the same and says so).
	done := func(w written) {
		for _, g := range w.res.Gone {
			if touched, _ := ev.Untaken(g.RuleID, g.DeviceID); !touched {
				ev.Forget(g.RuleID, g.DeviceID, time.Time{})
			}
		}
		for _, g := range w.res.Reraised {
			if _, rc := ev.Untaken(g.RuleID, g.DeviceID); !rc {
				ev.Reraised(g.RuleID, g.DeviceID, g.RaisedAt)
			}
		}
		next()
	}
	for {
		in := in
		if len(pending) >= maxPending && (flightDevs != nil || expressBusy()) {
			in = nil // backpressure: the session's queue fills, then the broker holds the rest
		}
		select {
		case <-ctx.Done():
			return nil // nothing acknowledged that is not written
		case <-lost:
			return errors.New("alarm lock lost")
		case w := <-wrote:
			flightDevs = nil
			if w.err != nil {
				// The writer wrote nothing after it: the batches
				// evaluated on top of this one are dropped with the
				// evaluator's memory, their messages unacknowledged.
				return w.err
			}
			done(w)
		case w := <-expressed:
			expressing[w.writer] = nil
			if w.err != nil {
				return w.err // as for the batch lane's: the turn ends
			}
			done(w)
		case m := <-in:
			if left.sub != nil && fed == nil {
				left.unacked.Add(1)
				m.Msg = leftMsg{m.Msg, left.unacked}
			}
			pending = append(pending, m)
			if wire.IsMarker(m.Msg.Topic()) { // this runner's, or another session's
				pendingDev = append(pendingDev, "")
				delete(marks, string(m.Msg.Payload()))
				marked()
				r.ready.Store(backlogs())
				continue
			}
			pendingDev = append(pendingDev, r.apply(ev, born, m, &dec))
			r.evaluated.Add(1)
			next()
		case now := <-tick.C:
			if left.sub != nil && !now.Before(markDeadline) && !feed.awaited() {
				r.log.Warn("alarms: ingest did not pass the left session's markers in time", "waited", markerWait)
				feed.await(nil)
			}
			if left.sub != nil && fed != nil && left.unacked.Load() == 0 && feed.awaited() {
				// Every message read of the left session is committed:
				// what it still holds came to ingest's feed as well.
				if err := left.sub.End(ctx); err != nil {
					r.log.Warn("alarms: ending the session a run without ingest's feed left failed", "err", err)
				}
				left.sub = nil
				r.log.Info("alarms: the left session is ended")
			}
			if !r.ready.Load() {
				if !backlogs() && now.Before(markDeadline) {
					continue // a backlog not yet applied
				}
				if !backlogs() {
					r.log.Warn("alarms: a backlog was not applied in time; timers start", "waited", markerWait)
					clear(marks)
					marked()
				}
				r.ready.Store(true)
			}
			ev.Tick(now)
			next()
		case <-flush.C:
			due = true
			next()
		case v := <-versions:
			if v == version {
				continue
			}
			nv, err := r.loadRules(ctx, ev)
			if err != nil {
				continue
			}
			version = nv
			if feed == nil {
				sub.SetFilters(r.filtersFor(ev))
			}
			if r.opt.Refs == nil {
				if err := vals.load(ctx, ev.RefKeys(), true); err != nil {
					r.log.Warn("alarms: reading the devices' tags and configuration failed", "err", err)
				}
			}
			next()
		case <-poll.C:
			if r.opt.Refs == nil {
				if err := vals.load(ctx, ev.RefKeys(), false); err != nil {
					r.log.Warn("alarms: reading the devices' tags and configuration failed", "err", err)
				}
			}
			handDue = true
			next()
		}
	}
}

// poll reads, every PollInterval until ctx ends, the rules' version
// (handed to versions, the latest only), the active alarms by severity
// (the metric) and, hourly, purges the alarms cleared past the
// retention.
func (r *Runner) poll(ctx context.Context, versions chan string) {
	t := time.NewTicker(r.opt.PollInterval)
	defer t.Stop()
	var lastPurge time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if v, err := r.store.RulesVersion(ctx); err == nil {
			select { // the loop has not taken the previous one: this one replaces it
			case <-versions:
			default:
			}
			versions <- v // only this goroutine sends: there is room
		}
		if counts, err := r.store.ActiveCounts(ctx); err == nil {
			for s, n := range counts {
				r.m.active.WithLabelValues(s).Set(float64(n))
			}
		}
		if r.opt.Retention > 0 && time.Since(lastPurge) > time.Hour {
			lastPurge = time.Now()
			if n, err := r.store.Purge(ctx, lastPurge.Add(-r.opt.Retention)); err == nil && n > 0 {
				r.log.Info("alarms: cleared alarms past retention deleted", "records", n)
			}
		}
	}
}

// maxPending bounds the messages of the batch being evaluated: reached,
// the batch is handed to the batch lane's writer at once, or (a batch is
// being written) no more is read until it is.
const maxPending = 10000

// expressWriters is the number of the express lane's writers: an alarm's
// change waits for another's write only when they all write (or when its
// device is in a batch being written). With the batch lane's writer they
// fit meta.Store.OneTrip's pool (4 connections).
const expressWriters = 3

// batch is what the evaluator decided between two hand-offs to a lane's
// writer (of the express lane: for its devices only), and the messages
// that led to it, in the order they came.
type batch struct {
	seq     uint64
	express bool // of the express lane
	writer  int  // the express lane's writer it is handed to
	trs     []Transition
	devs    []DeviceRow
	msgs    []mqttconn.Received
}

// written is the writer's word on a batch: committed (res), or the
// error that stopped the writer.
type written struct {
	writer int // batch.writer
	res    WriteResult
	err    error
}

// writer writes the batches it is handed, in order, each in one
// transaction (Store.Write); after a batch's commit it acknowledges its
// messages, in order, and announces its transitions (OnTransitions),
// then tells the loop. A failed write stops it: no later batch is
// written or acknowledged (they were evaluated on top of the failed one),
// and the loop ends the turn.
func (r *Runner) writer(ctx context.Context, epoch int64, in <-chan *batch, out chan<- written) {
	for {
		var b *batch
		select {
		case <-ctx.Done():
			return
		case b = <-in:
		}
		res, err := r.writeBatch(ctx, epoch, b)
		out <- written{writer: b.writer, res: res, err: err} // the loop reads it, or has returned (buffered: one batch a writer at a time)
		if err != nil {
			return
		}
	}
}

// writeBatch commits b, then acknowledges and announces it.
func (r *Runner) writeBatch(ctx context.Context, epoch int64, b *batch) (WriteResult, error) {
	var res WriteResult
	if r.beforeWrite != nil {
		if err := r.beforeWrite(b); err != nil {
			return res, err
		}
	}
	if len(b.trs)+len(b.devs) > 0 {
		var err error
		if res, err = r.store.Write(ctx, epoch, b.trs, b.devs); err != nil {
			if !errors.Is(err, ErrNotOwner) && ctx.Err() == nil {
				r.log.Warn("alarms: writing a batch failed; the evaluator reloads its state", "err", err)
			}
			return res, err
		}
		r.committed.Add(1)
		lane := r.m.change.WithLabelValues("batch")
		if b.express {
			lane = r.m.change.WithLabelValues("express")
		}
		now := time.Now()
		for i := range b.trs {
			if b.trs[i].Kind != KindRepeated {
				lane.Observe(now.Sub(b.trs[i].At).Seconds())
			}
		}
		if r.afterWrite != nil {
			if err := r.afterWrite(b); err != nil {
				return res, err
			}
		}
	}
	now := time.Now()
	for _, p := range b.msgs {
		p.Msg.Ack()
		r.m.lag.Observe(now.Sub(p.At).Seconds())
	}
	if len(res.Written) > 0 && r.opt.OnTransitions != nil {
		r.opt.OnTransitions(res.Written)
	}
	return res, nil
}

// loadRules reads every rule and its product's thing model into ev.
func (r *Runner) loadRules(ctx context.Context, ev *Evaluator) (string, error) {
	version, err := r.store.RulesVersion(ctx)
	if err != nil {
		return "", err
	}
	rules, err := r.store.AllRules(ctx)
	if err != nil {
		return "", err
	}
	models := map[string]*schema.ThingModel{}
	var keep []Rule
	for _, rule := range rules {
		if !rule.Enabled {
			continue
		}
		m, ok := models[rule.ProductID]
		if !ok {
			p, err := r.ms.GetProduct(ctx, rule.ProductID)
			switch {
			case errors.Is(err, meta.ErrNotFound):
			case err != nil:
				return "", err
			default:
				m, _ = schema.ParseThingModelString(p.Metadata)
			}
			models[rule.ProductID] = m
		}
		if m == nil {
			r.log.Warn("alarms: rule of a product that is gone ignored", "rule", rule.ID, "product", rule.ProductID)
			continue
		}
		keep = append(keep, rule)
	}
	ev.SetRules(keep, models)
	if r.opt.Feed != nil {
		products := r.opt.ProductIDs
		if len(products) == 0 {
			products = ev.Products()
		}
		r.opt.Feed.want(products)
	}
	return version, nil
}

// filtersFor are the uplinks the evaluator reads: those of the products
// with an enabled rule (Options.ProductIDs if set). No rule, no
// subscription: the broker sends the evaluator nothing.
func (r *Runner) filtersFor(ev *Evaluator) map[string]byte {
	products := r.opt.ProductIDs
	if len(products) == 0 {
		products = ev.Products()
	}
	f := map[string]byte{}
	for _, p := range products {
		for _, l := range []string{wire.LevelReport, wire.LevelEvent + "+", wire.LevelOnline, wire.LevelOffline} {
			f[wire.DeviceTopic(p, "+", l)] = 1
		}
	}
	return f
}

// decoded is apply's memory, kept from one message to the next: a
// message's rows and properties (the evaluator keeps neither).
type decoded struct {
	rows  wire.Rows
	props []Prop
}

// apply decodes one message and evaluates it. It returns the message's
// device, "" for a message of none or of a product without rules.
func (r *Runner) apply(ev *Evaluator, born *ingest.BornAt, in mqttconn.Received, dec *decoded) string {
	m := in.Msg
	if m.Retained() {
		return ""
	}
	t, ok := wire.ParseTopic(m.Topic())
	if !ok || !ev.HasRules(t.ProductID) || strings.HasPrefix(t.DeviceID, "$") { // "$": another session's marker, no device
		return ""
	}
	payload := m.Payload()
	rows := &dec.rows
	rows.Reset()
	msg := Message{ProductID: t.ProductID, DeviceID: t.DeviceID}
	switch t.Kind {
	case wire.KindReport:
		if wire.DecodeReport(rows, t, payload, in.At) != nil {
			return t.DeviceID
		}
		msg.Kind = MsgReport
		msg.Props = dec.props[:0]
		for _, p := range rows.Props {
			var v Value
			switch p.ValueType {
			case "number":
				v = NumberValue(p.Num)
			case "bool":
				v = BoolValue(p.Num != 0)
			case "json":
				v = JSONValue(p.Str)
			case "string":
				v = StringValue(p.Str)
			default:
				continue // null
			}
			msg.Props = append(msg.Props, Prop{ID: p.Property, Value: v})
		}
		dec.props = msg.Props[:0] // its memory, for the next report
	case wire.KindEvent:
		if wire.DecodeEvent(rows, t, payload, in.At) != nil {
			return t.DeviceID
		}
		msg.Kind, msg.Event = MsgEvent, t.EventID
		msg.Fields = eventFields(payload)
	case wire.KindOnline, wire.KindOffline:
		if _, err := wire.DecodePresence(rows, t, payload, in.At); err != nil {
			return t.DeviceID
		}
		online := t.Kind == wire.KindOnline
		if born != nil && !born.Keep(t.DeviceID, int8(in.Broker), online) {
			return t.DeviceID // a will from another broker than the last birth's
		}
		msg.Kind = MsgOffline
		if online {
			msg.Kind = MsgOnline
		}
	default:
		return t.DeviceID
	}
	if len(rows.Msgs) == 0 {
		return t.DeviceID
	}
	msg.At, msg.Arrived = rows.Msgs[0].Time, in.At
	msg.Key, msg.KeyUnique = messageKey(rows.Msgs[0].MessageID, m.Topic(), payload)
	msg.KeyUnique = msg.KeyUnique || m.Duplicate()
	ev.Apply(msg)
	return t.DeviceID
}

// messageKey is the device's messageId when the payload has one, else a
// hash of topic and payload (then not unique: two equal reports are two
// reports unless the broker marks one a redelivery).
func messageKey(id, topic string, payload []byte) (string, bool) {
	if id != "" && bytes.Contains(payload, []byte(`"messageId"`)) {
		return "i" + id, true
	}
	// FNV-1a, 64 bits (hash/fnv's New64a), written out: no allocation
	h := uint64(fnvOffset)
	for i := 0; i < len(topic); i++ {
		h = (h ^ uint64(topic[i])) * fnvPrime
	}
	h *= fnvPrime // the 0 byte between topic and payload
	for _, c := range payload {
		h = (h ^ uint64(c)) * fnvPrime
	}
	var b [17]byte
	b[0] = 'h'
	for i := range 8 {
		c := byte(h >> (56 - 8*i))
		b[1+2*i], b[2+2*i] = hexDigits[c>>4], hexDigits[c&15]
	}
	return string(b[:]), false
}

// FNV-1a's 64-bit offset basis and prime, and the hex digits of a key.
const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
	hexDigits = "0123456789abcdef"
)

// eventFields reads an event's data object into fields.
func eventFields(payload []byte) map[string]Value {
	var body struct {
		Data map[string]json.RawMessage `json:"data"`
	}
	if json.Unmarshal(payload, &body) != nil || len(body.Data) == 0 {
		return nil
	}
	out := make(map[string]Value, len(body.Data))
	for k, raw := range body.Data {
		raw = bytes.TrimSpace(raw)
		if len(raw) == 0 {
			continue
		}
		switch raw[0] {
		case '"':
			var s string
			if json.Unmarshal(raw, &s) == nil {
				out[k] = StringValue(s)
			}
		case 't', 'f':
			out[k] = BoolValue(raw[0] == 't')
		case 'n':
		case '{', '[':
			out[k] = JSONValue(string(raw))
		default:
			if f, err := strconv.ParseFloat(string(raw), 64); err == nil {
				out[k] = NumberValue(f)
			}
		}
	}
	return out
}

// deviceValues holds the tags and configuration keys the rules'
// thresholds name, of the devices of the products whose rules name any:
// read whole when the rules change, then the devices changed since.
type deviceValues struct {
	store *Store
	keys  map[string][]string // by product, as last loaded
	vals  map[string]map[string]Value
	since time.Time
}

func (v *deviceValues) get(device, kind, id string) (Value, bool) {
	x, ok := v.vals[device][kind+"."+id]
	return x, ok
}

// load reads the values keys (Evaluator.RefKeys) name: all of them when
// all is set, else those of devices modified since the last read (a few
// seconds back, for transactions that committed late).
func (v *deviceValues) load(ctx context.Context, keys map[string][]string, all bool) error {
	if len(keys) == 0 {
		v.keys, v.vals = nil, nil
		return nil
	}
	var products []string
	want := map[string]bool{}
	for p, ks := range keys {
		products = append(products, p)
		for _, k := range ks {
			want[k] = true
		}
	}
	since := v.since.Add(-5 * time.Second)
	if all || v.vals == nil {
		since, v.vals = time.Time{}, map[string]map[string]Value{}
	}
	got, latest, err := v.store.DeviceValues(ctx, products, want, since)
	if err != nil {
		return err
	}
	for id, m := range got {
		v.vals[id] = m
	}
	v.keys = keys
	if latest.After(v.since) {
		v.since = latest
	}
	return nil
}

// markerWait bounds the wait for the sessions' backlog markers (a broker
// that refuses the marker's publish, or drops it).
const markerWait = 30 * time.Second

// markBacklogs publishes a marker on each client, QoS 1, to a topic its
// filters match; it returns the markers' payloads still awaited. A
// session's queued messages come before it (Mosquitto keeps a session's
// QoS 1 queue in order).
func (r *Runner) markBacklogs(clients []mqtt.Client, filters map[string]byte, level string) map[string]bool {
	marks := map[string]bool{}
	var product string
	for f := range filters {
		if t, ok := strings.CutPrefix(f, "/"); ok {
			if p, _, ok := strings.Cut(t, "/"); ok && p != "+" && (product == "" || p < product) {
				product = p
			}
		}
	}
	if product == "" {
		return marks // no subscription: no backlog
	}
	topic := wire.DeviceTopic(product, wire.MarkerDevice, level)
	for _, c := range clients {
		payload := ingest.AlarmMarkerPrefix + r.opt.ClientID + " " + rand.Text()
		marks[payload] = true
		go r.logFailure("publish the backlog marker", c.Publish(topic, 1, false, payload))
	}
	return marks
}

func (r *Runner) logFailure(what string, t mqtt.Token) {
	<-t.Done()
	if err := t.Error(); err != nil {
		r.log.Warn("alarms: "+what+" failed", "err", err)
	}
}

// leftSession is, with a feed, the session a run without it left at the
// broker: read up to its markers, then ended once what was read of it is
// committed (Runner.lead).
type leftSession struct {
	sub     *mqttconn.Subscriber
	unacked *atomic.Int64 // its messages read and not acknowledged
}

// leftMsg is a message of the left session: its Ack counts.
type leftMsg struct {
	mqtt.Message
	unacked *atomic.Int64
}

func (m leftMsg) Ack() {
	m.Message.Ack()
	m.unacked.Add(-1)
}
