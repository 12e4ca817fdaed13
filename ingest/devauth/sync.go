package devauth

import (
	"context"
	"crypto/md5"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"devicehub/ingest/dynsec"
	"devicehub/ingest/leader"
	"devicehub/ingest/mqttconn"
	"devicehub/meta"
)

// ControlTopic is the plugin's control topic; it answers on ControlTopic +
// "/response".
const ControlTopic = "$CONTROL/devicehub-auth/v1"

// Source is what the syncer reads of meta.
type Source interface {
	// DeviceLogins returns the logins of the devices of ids that exist.
	DeviceLogins(ctx context.Context, ids []string) ([]meta.DeviceLogin, error)
	// EachDeployedDeviceLogin calls fn with every deployed device's login.
	EachDeployedDeviceLogin(ctx context.Context, fn func(meta.DeviceLogin) error) error
	// RecentLoginChanges returns the versions of the devices written
	// within window.
	RecentLoginChanges(ctx context.Context, window time.Duration) ([]meta.LoginChange, error)
	// InstallationID names the database's deployment (the legacy
	// dynamic-security clients it wrote carry it).
	InstallationID(ctx context.Context) (string, error)
	// WatchDevices calls changed with the ids of devices whose login may
	// have changed, and with none when anything may have (on start, once
	// listening, and after a reconnection); it returns when ctx ends.
	WatchDevices(ctx context.Context, changed func(ids ...string)) error
	// Lock blocks until this process holds the lock key among all that
	// share the database; lost is closed if it is lost.
	Lock(ctx context.Context, key int64) (lost <-chan struct{}, release func(), err error)
	// NotifyLoginsApplied and WatchLoginsApplied carry what the leader
	// applied to every instance's waiters.
	NotifyLoginsApplied(ctx context.Context, applied []meta.LoginChange) error
	WatchLoginsApplied(ctx context.Context, applied func([]meta.LoginChange), lost func()) error
}

// lockKey elects the one instance that writes the plugin's logins: two
// writers could apply one device's changes in opposite orders. It is the
// key the dynamic-security syncer used, so that an old and a new version
// never write at once during an upgrade.
const lockKey = 0x64796e736563 // "dynsec"

// Options configure a Syncer.
type Options struct {
	// BrokerURL of the broker whose plugin is fed, or of several
	// comma-separated (a broker pool, mqttconn.Brokers): each broker's plugin
	// is fed on its own connections, and a change is confirmed to its
	// writers once every plugin holds it. Default "tcp://127.0.0.1:1884".
	BrokerURL string
	// Username and Password are devicehub's service login: one of the
	// plugin's service_users, with the dynamic-security plugin's admin
	// rights (its own rights are granted there).
	Username, Password string
	// ClientID prefix of the control connections. Default
	// "devicehub-devauth-<random>".
	ClientID string
	// Retry is how long a failed change waits before it is tried again.
	// Default 1s.
	Retry time.Duration
	// Timeout bounds one exchange with a plugin. Default 10s.
	Timeout time.Duration
	// BatchBytes bounds one control message (the broker's max_packet_size
	// must admit it). Default 128 KiB.
	BatchBytes int
	// ConfirmWindow: a full sync confirms to their writers the devices
	// written this long before it (a writer waits at most its login wait).
	// Default 30s.
	ConfirmWindow time.Duration
	// CheckInterval: how often the leader asks each broker's plugin for
	// the count and digest of this installation's logins, syncs again at
	// once when they are not what it synced, and refreshes the usernames
	// reserved for the broker's other logins. Default 30s.
	CheckInterval time.Duration
	// Logger; default slog.Default().
	Logger *slog.Logger
	// Registerer for the devicehub_devauth_* metrics; nil registers none.
	Registerer prometheus.Registerer
}

// Syncer keeps the plugin's device logins equal to meta's deployed
// devices while this instance leads (Run), and confirms to writers on
// every instance that the broker holds their changes (Await).
type Syncer struct {
	opt Options
	src Source
	log *slog.Logger

	feeds []*feed // one per broker
	tally *tally  // what every broker holds, of what each applied

	mu   sync.Mutex
	inst string // installation id, leader only

	waiters *waiters

	commands *prometheus.CounterVec
	fulls    prometheus.Counter
	resyncs  *prometheus.CounterVec
	checks   prometheus.Counter
	refused  *prometheus.CounterVec
	applyDur prometheus.Histogram
	held     prometheus.Gauge
}

// New returns a Syncer of src's devices; Run runs it.
func New(src Source, opt Options) *Syncer {
	if opt.BrokerURL == "" {
		opt.BrokerURL = mqttconn.DefaultBrokerURL
	}
	if opt.ClientID == "" {
		opt.ClientID = "devicehub-devauth-" + strings.ToLower(rand.Text()[:8])
	}
	if opt.Retry <= 0 {
		opt.Retry = time.Second
	}
	if opt.Timeout <= 0 {
		opt.Timeout = 10 * time.Second
	}
	if opt.BatchBytes <= 0 {
		opt.BatchBytes = 128 << 10
	}
	if opt.ConfirmWindow <= 0 {
		opt.ConfirmWindow = 30 * time.Second
	}
	if opt.CheckInterval <= 0 {
		opt.CheckInterval = 30 * time.Second
	}
	if opt.Logger == nil {
		opt.Logger = slog.Default()
	}
	s := &Syncer{opt: opt, src: src, log: opt.Logger.With("component", "devauth"), waiters: newWaiters(),
		commands: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "devicehub_devauth_commands_total",
			Help: "Commands sent to the broker's device-login plugin, by result (ok, error)."}, []string{"result"}),
		fulls: prometheus.NewCounter(prometheus.CounterOpts{Name: "devicehub_devauth_full_syncs_total",
			Help: "Full syncs of every device login into the broker's plugin (not counted: a sync that found the plugin holding every login already, and sent none)."}),
		resyncs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "devicehub_devauth_resyncs_total",
			Help: "Full syncs started because a broker's plugin did not hold what was synced, by reason (mismatch: another count or digest at the regular check; unconfirmed: an exchange failed midway; reconnected: another count or digest, or logins without an installation, when the plugin's connection came back)."},
			[]string{"reason"}),
		checks: prometheus.NewCounter(prometheus.CounterOpts{Name: "devicehub_devauth_checks_total",
			Help: "Comparisons of a broker's plugin's count and digest of this installation's logins with what was synced, at the regular check and when the plugin's connection comes back (leader only)."}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "devicehub_devauth_refused_logins_total",
			Help: "Device logins the broker's plugin refused, by reason (other_installation: its id or username is another installation's; reserved: the username is another login of the broker; invalid)."},
			[]string{"reason"}),
		applyDur: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "devicehub_devauth_apply_seconds",
			Help:    "Time from reading changed device logins to the broker's plugin holding them.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)}),
		held: prometheus.NewGauge(prometheus.GaugeOpts{Name: "devicehub_devauth_logins",
			Help: "Device logins the broker's plugin held after the last full sync (leader only)."}),
	}
	if opt.Registerer != nil {
		opt.Registerer.MustRegister(s.commands, s.fulls, s.resyncs, s.checks, s.refused, s.applyDur, s.held)
	}
	brokers := mqttconn.MustBrokers(opt.BrokerURL)
	for i, b := range brokers {
		s.feeds = append(s.feeds, &feed{s: s, index: i, broker: b, dirty: map[string]struct{}{},
			wake: make(chan struct{}, 1), held: -1})
	}
	s.tally = newTally(len(brokers))
	return s
}

// Run syncs until ctx ends: it waits to lead, then follows changes; on
// every instance it also hears what the leader applied (Await).
func (s *Syncer) Run(ctx context.Context) {
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		for ctx.Err() == nil {
			err := s.src.WatchLoginsApplied(ctx, s.waiters.applied, nil)
			if err != nil && ctx.Err() == nil {
				s.log.Warn("devauth: watching applied logins failed; retrying", "err", err)
				leader.Sleep(ctx, s.opt.Retry)
			}
		}
	}()
	defer func() { <-watchDone }()
	leader.Loop{Locker: s.src, Key: lockKey, Retry: s.opt.Retry, Log: s.log,
		Waiting: "devauth: waiting for the sync lock"}.Run(ctx, func(ctx context.Context, lost <-chan struct{}) error {
		s.lead(ctx, lost)
		return nil
	})
}

// Await returns once the broker holds every change of changes (or a later
// one of the same device), or when ctx ends.
func (s *Syncer) Await(ctx context.Context, changes []meta.LoginChange) error {
	return s.waiters.await(ctx, changes)
}

// changed marks devices to apply at every broker; none marks everything.
func (s *Syncer) changed(ids ...string) {
	for _, f := range s.feeds {
		f.changed(ids...)
	}
}

// feed is the leader's work for one broker's plugin: what to apply there,
// and what it holds.
type feed struct {
	s      *Syncer
	index  int    // in Brokers' order
	broker string // URL

	mu     sync.Mutex
	dirty  map[string]struct{} // devices to apply
	full   bool                // everything to compare
	verify bool                // the control connection came back: does the plugin hold what was synced?
	wake   chan struct{}
	held   int // logins held after the last full sync; -1 before one

	gen int64 // generation of the last full sync

	// What this installation's logins in the plugin should be: their
	// count and digest (the sum of loginSum), from the last full sync and
	// the changes since, as the plugin answered them; valid once a full
	// sync succeeded and while no exchange failed midway.
	wantCount int64
	wantSum   uint64
	wantValid bool

	// The dynamic-security plugin's client count when the reserved
	// usernames were last sent, and checks since: the check lists its
	// clients (verbose, every one) only when the count changed or every
	// reserveEvery checks.
	reservedCount  int
	sinceReserving int

	// legacy maps the device id of each dynamic-security client an older
	// devicehub made for a device, still in that broker's plugin, to its
	// username (migrate.go).
	legacy map[string]string
}

// changed marks devices to apply at this broker; none marks everything.
func (f *feed) changed(ids ...string) {
	f.mu.Lock()
	if len(ids) == 0 {
		f.full = true
	}
	for _, id := range ids {
		f.dirty[id] = struct{}{}
	}
	f.mu.Unlock()
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

// reconnected marks the plugin's control connection back (a broker that
// restarted, or a connection that dropped): the plugin is compared with
// what was synced to it before everything is sent again (run, kept).
func (f *feed) reconnected() {
	f.mu.Lock()
	f.verify = true
	f.mu.Unlock()
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

// lead syncs while this instance holds the lock.
func (s *Syncer) lead(ctx context.Context, lost <-chan struct{}) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-lost:
			s.log.Warn("devauth: sync lock lost; waiting to lead again")
			cancel()
		case <-ctx.Done():
		}
	}()
	var inst string
	for {
		var err error
		if inst, err = s.src.InstallationID(ctx); err == nil {
			break
		}
		if ctx.Err() != nil {
			return
		}
		s.log.Warn("devauth: reading the installation id failed; retrying", "err", err)
		leader.Sleep(ctx, s.opt.Retry)
	}
	s.mu.Lock()
	s.inst = inst
	s.mu.Unlock()
	for _, f := range s.feeds {
		f.mu.Lock()
		f.full, f.legacy = true, nil
		f.mu.Unlock()
	}
	watchDone := make(chan struct{})
	listening := make(chan struct{}) // closed at the watch's first "anything may have changed"
	var once sync.Once
	go func() {
		defer close(watchDone)
		err := s.src.WatchDevices(ctx, func(ids ...string) {
			s.changed(ids...)
			if len(ids) == 0 {
				once.Do(func() { close(listening) })
			}
		})
		if err != nil && ctx.Err() == nil {
			s.log.Error("devauth: watching devices stopped", "err", err)
			cancel()
		}
	}()
	defer func() { <-watchDone }()
	// The first full sync starts once changes are heard: one sync covers
	// the start (at a million logins each takes seconds of the broker).
	select {
	case <-listening:
	case <-ctx.Done():
		return
	}
	var wg sync.WaitGroup
	for _, f := range s.feeds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f.run(ctx)
		}()
	}
	wg.Wait()
}

// run feeds the broker's plugin until ctx ends (the lead is lost).
func (f *feed) run(ctx context.Context) {
	s := f.s
	// The plugin's control connection, and the dynamic-security plugin's
	// (the service login's rights, legacy device clients).
	var cl, ds *dynsec.Client
	defer func() {
		for _, c := range []*dynsec.Client{cl, ds} {
			if c != nil {
				c.Close()
			}
		}
	}()
	for cl == nil || ds == nil {
		var err error
		if cl == nil {
			cl, err = dynsec.DialTopic(ctx, f.mqttConfig("-0"), ControlTopic, f.reconnected)
		}
		if err == nil && ds == nil {
			ds, err = dynsec.Dial(ctx, f.mqttConfig("-1"), nil)
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			s.log.Warn("devauth: broker not reachable; retrying", "broker", mqttconn.BrokerName(f.broker), "err", err)
			leader.Sleep(ctx, s.opt.Retry)
		}
	}
	for {
		cctx, ccancel := context.WithTimeout(ctx, s.opt.Timeout)
		err := dynsec.EnsureService(cctx, ds, s.opt.Username)
		ccancel()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return
		}
		s.log.Warn("devauth: granting the service login its rights failed; retrying", "broker", mqttconn.BrokerName(f.broker), "err", err)
		leader.Sleep(ctx, s.opt.Retry)
	}

	retry := time.NewTimer(time.Hour)
	defer retry.Stop()
	check := time.NewTicker(s.opt.CheckInterval)
	defer check.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-f.wake:
		case <-retry.C:
		case <-check.C:
			if err := f.check(ctx, cl, ds); err != nil {
				if ctx.Err() != nil {
					return
				}
				s.log.Warn("devauth: checking the broker's plugin failed", "broker", mqttconn.BrokerName(f.broker), "err", err)
			}
		}
		f.mu.Lock()
		full, ids, verify := f.full, f.dirty, f.verify
		f.full, f.dirty, f.verify = false, map[string]struct{}{}, false
		f.mu.Unlock()
		if verify && !full {
			kept, err := f.kept(ctx, cl, ds)
			if err != nil && ctx.Err() == nil {
				s.log.Warn("devauth: comparing the broker's plugin after a reconnection failed; syncing every login again",
					"broker", mqttconn.BrokerName(f.broker), "err", err)
			}
			full = !kept
		}
		var err error
		if full {
			err = f.syncAll(ctx, cl, ds)
		}
		// After a full sync too: the writers of ids wait for their
		// versions to be confirmed.
		if err == nil && len(ids) > 0 {
			err = f.apply(ctx, cl, ds, ids)
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			f.wantValid = false // what the plugin took of it is unknown
			s.log.Warn("devauth: sync failed; retrying", "broker", mqttconn.BrokerName(f.broker), "err", err, "retry", s.opt.Retry)
			f.mu.Lock()
			f.full = f.full || full
			for id := range ids {
				f.dirty[id] = struct{}{}
			}
			f.mu.Unlock()
			retry.Reset(s.opt.Retry)
		}
	}
}

func (f *feed) mqttConfig(suffix string) mqttconn.Config {
	s := f.s
	return mqttconn.Config{Broker: f.broker, ClientID: s.opt.ClientID + suffix,
		Login: mqttconn.Login{Username: s.opt.Username, Password: s.opt.Password}}
}

// syncAll gives the plugin every deployed device's login, and removes
// what it holds besides, in one generation: the plugin keeps admitting
// every device meanwhile (a login it holds already is not touched).
func (f *feed) syncAll(ctx context.Context, cl, ds *dynsec.Client) error {
	s := f.s
	start := time.Now()
	// A generation the plugin has not seen: JSON numbers stay exact up
	// to 2^53, so milliseconds, not nanoseconds.
	f.gen = max(f.gen+1, time.Now().UnixMilli())
	gen := f.gen
	// Writers may wait for changes whose announcement no syncer saw (made
	// while none led, or before this one listened): the sync covers them,
	// and confirms them once it is done, at the version it sent (or the
	// one read before it, for a device it removes).
	recent := map[string]int64{}
	rc, err := s.src.RecentLoginChanges(ctx, s.opt.ConfirmWindow)
	if err != nil {
		return err
	}
	for _, c := range rc {
		recent[c.ID] = c.Version
	}
	if err := f.reserve(ctx, cl, ds); err != nil {
		return err
	}
	if same, err := f.holds(ctx, cl, recent); err != nil {
		return err
	} else if same {
		s.log.Info("devauth: the broker's plugin holds every device login already", "broker", mqttconn.BrokerName(f.broker),
			"devices", f.wantCount, "took", time.Since(start).Round(time.Millisecond))
		confirmed := make([]meta.LoginChange, 0, len(recent))
		for id, v := range recent {
			confirmed = append(confirmed, meta.LoginChange{ID: id, Version: v})
		}
		f.confirm(ctx, confirmed)
		if err := f.migrate(ctx, ds); err != nil {
			s.log.Warn("devauth: removing the dynamic-security plugin's device clients failed", "err", err)
		}
		return nil
	}
	s.fulls.Inc()
	inst := s.installation()
	b := s.newBatcher(ctx, cl)
	n := 0
	err = b.add(dynsec.Command{"command": "beginSync", "generation": gen, "installation": inst}, 0)
	if err == nil {
		err = s.src.EachDeployedDeviceLogin(ctx, func(d meta.DeviceLogin) error {
			n++
			if _, ok := recent[d.ID]; ok {
				recent[d.ID] = d.Version
			}
			return b.add(setDevice(d, inst), loginSum(d))
		})
	}
	if err == nil {
		err = b.add(dynsec.Command{"command": "endSync", "generation": gen, "installation": inst}, 0)
	}
	if err == nil {
		err = b.flush()
	}
	if err != nil {
		return err
	}
	if b.failedSync {
		return errors.New("the plugin refused beginSync or endSync")
	}
	// endSync removed whatever else the plugin held of this installation.
	f.wantCount, f.wantSum, f.wantValid = b.setCount, b.setSum, true
	f.setHeld(n - len(b.failed))
	if len(s.feeds) == 1 {
		s.log.Info("devauth: device logins synced", "devices", n, "took", time.Since(start).Round(time.Millisecond))
	} else {
		s.log.Info("devauth: device logins synced", "broker", mqttconn.BrokerName(f.broker), "devices", n, "took", time.Since(start).Round(time.Millisecond))
	}
	confirmed := make([]meta.LoginChange, 0, len(recent))
	for id, v := range recent {
		if !b.failed[id] {
			confirmed = append(confirmed, meta.LoginChange{ID: id, Version: v})
		}
	}
	f.confirm(ctx, confirmed)
	if err := f.migrate(ctx, ds); err != nil {
		// The plugin is in step; the legacy clients are tried again at
		// the next full sync.
		s.log.Warn("devauth: removing the dynamic-security plugin's device clients failed", "err", err)
	}
	return nil
}

// apply gives the plugin what meta says now of the devices of ids.
func (f *feed) apply(ctx context.Context, cl, ds *dynsec.Client, ids map[string]struct{}) error {
	s := f.s
	start := time.Now()
	list := make([]string, 0, len(ids))
	for id := range ids {
		list = append(list, id)
	}
	logins, err := s.src.DeviceLogins(ctx, list)
	if err != nil {
		return err
	}
	now := make(map[string]meta.DeviceLogin, len(logins))
	for _, d := range logins {
		now[d.ID] = d
	}
	inst := s.installation()
	b := s.newBatcher(ctx, cl)
	applied := make([]meta.LoginChange, 0, len(list))
	for _, id := range list {
		d, ok := now[id]
		if ok && d.Deployed {
			err = b.add(setDevice(d, inst), loginSum(d))
		} else {
			err = b.add(dynsec.Command{"command": "deleteDevice", "id": id, "installation": inst}, 0)
		}
		if err != nil {
			return err
		}
		if ok {
			applied = append(applied, meta.LoginChange{ID: id, Version: d.Version})
		}
	}
	if err := b.flush(); err != nil {
		return err
	}
	f.wantCount += b.deltaCount
	f.wantSum += b.deltaSum
	if len(b.failed) > 0 { // refused for good (logged): not confirmed to their writers
		kept := applied[:0]
		for _, a := range applied {
			if !b.failed[a.ID] {
				kept = append(kept, a)
			}
		}
		applied = kept
	}
	// A legacy client would still admit a device this plugin no longer
	// holds: gone before the change is confirmed.
	if err := f.retireLegacy(ctx, ds, list, now); err != nil {
		return fmt.Errorf("removing a device's dynamic-security client: %w", err)
	}
	s.applyDur.Observe(time.Since(start).Seconds())
	f.confirm(ctx, applied)
	return nil
}

// confirm notes that this broker's plugin holds applied, and confirms to
// their writers what every broker's plugin now holds.
func (f *feed) confirm(ctx context.Context, applied []meta.LoginChange) {
	f.s.confirm(ctx, f.s.tally.add(f.index, applied, time.Now()))
}

// setHeld records how many logins the plugin held after a full sync; the
// gauge shows the fewest any broker's plugin held.
func (f *feed) setHeld(n int) {
	f.mu.Lock()
	f.held = n
	f.mu.Unlock()
	least := -1
	for _, o := range f.s.feeds {
		o.mu.Lock()
		if o.held >= 0 && (least < 0 || o.held < least) {
			least = o.held
		}
		o.mu.Unlock()
	}
	f.s.held.Set(float64(least))
}

// confirm tells the writers of applied, on this instance and the others,
// that the brokers hold their changes.
func (s *Syncer) confirm(ctx context.Context, applied []meta.LoginChange) {
	if len(applied) == 0 {
		return
	}
	s.waiters.applied(applied)
	if err := s.src.NotifyLoginsApplied(ctx, applied); err != nil {
		// Waiters on other instances time out; the broker holds the change.
		s.log.Warn("devauth: announcing applied logins failed", "err", err)
	}
}

func setDevice(d meta.DeviceLogin, installation string) dynsec.Command {
	return dynsec.Command{"command": "setDevice", "id": d.ID, "product": d.ProductID, "username": d.SecureID, "key": d.SecureKey,
		"installation": installation}
}

// loginSum is a login's share of its installation's digest in the plugin
// (dev_sum in ingest/devauth/mosquitto/store.c): the first 8 bytes of the
// MD5 of "id\nproduct\nusername\nkey". The digest, the sum of these
// modulo 2^64, does not depend on the order the logins came in.
func loginSum(d meta.DeviceLogin) uint64 {
	h := md5.Sum([]byte(d.ID + "\n" + d.ProductID + "\n" + d.SecureID + "\n" + d.SecureKey))
	return binary.BigEndian.Uint64(h[:8])
}

// installation is the installation id the leader read.
func (s *Syncer) installation() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.inst
}

// reserveEvery: the check sends the reserved usernames at least every
// this many checks, even when the dynamic-security plugin's client count
// did not change (one login removed, another made).
const reserveEvery = 10

// reserve tells the plugin the usernames of the broker's other logins
// (the dynamic-security plugin's clients, but those an older devicehub
// made for devices, migrate.go): no device may take one, and the
// operator's own password keeps working.
func (f *feed) reserve(ctx context.Context, cl, ds *dynsec.Client) error {
	s := f.s
	lctx, cancel := context.WithTimeout(ctx, 3*s.opt.Timeout)
	clients, err := ds.ListClients(lctx)
	cancel()
	if err != nil {
		return fmt.Errorf("listing the dynamic-security clients: %w", err)
	}
	f.reservedCount, f.sinceReserving = len(clients), 0
	names := make([]string, 0, len(clients))
	for _, c := range clients {
		if !strings.HasPrefix(c.TextName, dynsec.DeviceText("")) {
			names = append(names, c.Username)
		}
	}
	cctx, cancel := context.WithTimeout(ctx, s.opt.Timeout)
	rs, err := cl.Do(cctx, dynsec.Command{"command": "setReserved", "usernames": names})
	cancel()
	if err != nil {
		return err
	}
	if rs[0].Error == "Unknown command" {
		// A plugin older than reserved usernames (and installations):
		// nothing to refresh, and the check has nothing to compare.
		return nil
	}
	if err := rs[0].Err(); err != nil {
		return err
	}
	var data struct{ Removed int }
	if json.Unmarshal(rs[0].Data, &data) == nil && data.Removed > 0 {
		s.log.Warn("devauth: the broker's plugin removed device logins whose usernames are other logins of the broker",
			"broker", mqttconn.BrokerName(f.broker), "removed", data.Removed)
	}
	return nil
}

// check refreshes the reserved usernames and compares the count and
// digest of this installation's logins in the plugin with what the leader
// synced: on a difference (another installation's or an operator's
// command, a restored snapshot, a bug) it syncs everything again at once.
func (f *feed) check(ctx context.Context, cl, ds *dynsec.Client) error {
	s := f.s
	cctx, cancel := context.WithTimeout(ctx, s.opt.Timeout)
	n, err := ds.CountClients(cctx)
	cancel()
	if err != nil {
		return fmt.Errorf("counting the dynamic-security clients: %w", err)
	}
	if f.sinceReserving++; n != f.reservedCount || f.sinceReserving >= reserveEvery {
		if err := f.reserve(ctx, cl, ds); err != nil {
			return err
		}
	}
	f.mu.Lock()
	pending := f.full
	f.mu.Unlock()
	if pending {
		return nil // a full sync is on its way
	}
	if !f.wantValid {
		s.resyncs.WithLabelValues("unconfirmed").Inc()
		s.log.Warn("devauth: what the broker's plugin holds is unconfirmed; syncing every login again", "broker", mqttconn.BrokerName(f.broker))
		f.changed()
		return nil
	}
	got, ok, err := f.stats(ctx, cl)
	if err != nil || !ok {
		return err // !ok: a plugin older than installations has nothing to compare
	}
	s.checks.Inc()
	if got.devices == f.wantCount && got.sum == f.wantSum {
		return nil
	}
	s.resyncs.WithLabelValues("mismatch").Inc()
	s.log.Warn("devauth: the broker's plugin does not hold what was synced; syncing every login again",
		"broker", mqttconn.BrokerName(f.broker), "installation", s.installation(), "held", got.devices, "synced", f.wantCount,
		"digest", fmt.Sprintf("%016x", got.sum), "want", fmt.Sprintf("%016x", f.wantSum))
	f.changed()
	return nil
}

// pluginStats is what getStats says the plugin holds: this installation's
// logins (count and digest) and those of installation "" (an older
// devicehub's, or set by hand without one).
type pluginStats struct {
	devices, anonymous int64
	sum                uint64
}

// exactly tells whether the plugin holds n logins of this installation
// with digest sum and none without an installation: what a full sync
// leaves.
func (p pluginStats) exactly(n int64, sum uint64) bool {
	return p.devices == n && p.sum == sum && p.anonymous == 0
}

// stats asks the plugin what it holds; ok is false for a plugin older
// than installations, which does not say.
func (f *feed) stats(ctx context.Context, cl *dynsec.Client) (pluginStats, bool, error) {
	cctx, cancel := context.WithTimeout(ctx, f.s.opt.Timeout)
	rs, err := cl.Do(cctx, dynsec.Command{"command": "getStats"})
	cancel()
	if err != nil {
		return pluginStats{}, false, err
	}
	if err := rs[0].Err(); err != nil {
		return pluginStats{}, false, err
	}
	var stats struct {
		Installations map[string]struct {
			Devices int64  `json:"devices"`
			Digest  string `json:"digest"`
		} `json:"installations"`
	}
	if err := json.Unmarshal(rs[0].Data, &stats); err != nil {
		return pluginStats{}, false, fmt.Errorf("getStats: %w", err)
	}
	if stats.Installations == nil {
		return pluginStats{}, false, nil
	}
	got := stats.Installations[f.s.installation()]
	sum, _ := strconv.ParseUint(got.Digest, 16, 64)
	return pluginStats{devices: got.Devices, anonymous: stats.Installations[""].Devices, sum: sum}, true, nil
}

// holds reads every deployed login and tells whether the plugin holds
// exactly them, as a full sync would leave it: this installation's logins
// with the same count and digest, and none without an installation. Then
// the full sync sends nothing: a devicehub that restarts (a new leader)
// finds its brokers holding every login, and sending them all again cost
// each broker a command a device (600,000 at 100,000 devices and 6
// brokers) while it delivered the sessions' backlog. It notes the
// versions of the recent changes it read (syncAll confirms them); the
// logins are not kept, a full sync reads them again. A plugin that does
// not say (older than installations) holds nothing here.
func (f *feed) holds(ctx context.Context, cl *dynsec.Client, recent map[string]int64) (bool, error) {
	var n int64
	var sum uint64
	err := f.s.src.EachDeployedDeviceLogin(ctx, func(d meta.DeviceLogin) error {
		n++
		sum += loginSum(d)
		if _, ok := recent[d.ID]; ok {
			recent[d.ID] = d.Version
		}
		return nil
	})
	if err != nil {
		return false, err
	}
	got, ok, err := f.stats(ctx, cl)
	if err != nil || !ok {
		return false, err
	}
	if !got.exactly(n, sum) {
		return false, nil
	}
	f.wantCount, f.wantSum, f.wantValid = n, sum, true
	f.setHeld(int(n))
	return true, nil
}

// kept tells, once the plugin's control connection is back, whether the
// plugin still holds exactly what was synced to it, so that a broker
// restarted from its snapshot (written at shutdown) is not sent every
// login again: at 100,000 devices and 6 brokers that was 600,000 setDevice
// commands and 6 reads of every login in the middle of the devices'
// reconnection storm. It holds them when the count and digest of this
// installation's logins are what the feed synced and applied since, and no
// login without an installation is there (a full sync's endSync would
// remove those). The reserved usernames are not in the snapshot: they are
// sent first. Changes made while the broker was away are in dirty and are
// applied next; a restart from an older snapshot (the broker killed), an
// empty one, or a login set by hand meanwhile differs, and everything is
// synced again, as before.
func (f *feed) kept(ctx context.Context, cl, ds *dynsec.Client) (bool, error) {
	defer f.s.checks.Inc()
	if !f.wantValid {
		return false, nil
	}
	if err := f.reserve(ctx, cl, ds); err != nil {
		return false, err
	}
	got, ok, err := f.stats(ctx, cl)
	if err != nil || !ok {
		return false, err
	}
	if !got.exactly(f.wantCount, f.wantSum) {
		f.s.resyncs.WithLabelValues("reconnected").Inc()
		return false, nil
	}
	f.s.log.Info("devauth: the broker's plugin kept every login across the reconnection", "broker", mqttconn.BrokerName(f.broker), "devices", got.devices)
	return true, nil
}

// batcher sends commands in control messages of at most BatchBytes (and
// 1,000 commands), noting the devices whose command the plugin refused
// (logged): invalid input, which a retry would not mend.
type batcher struct {
	s          *Syncer
	ctx        context.Context
	cl         *dynsec.Client
	cmds       []dynsec.Command
	sums       []uint64 // each setDevice's loginSum
	bytes      int
	failed     map[string]bool // device ids
	failedSync bool            // beginSync or endSync

	// What the commands the plugin carried out did to this
	// installation's logins there: the setDevice ones alone (a full sync's
	// outcome), and the change in count and digest (with what each
	// command replaced or removed).
	setCount, deltaCount int64
	setSum, deltaSum     uint64
}

func (s *Syncer) newBatcher(ctx context.Context, cl *dynsec.Client) *batcher {
	return &batcher{s: s, ctx: ctx, cl: cl}
}

// approxSize is a command's size in the control message, within a few
// bytes (its correlation data included).
func approxSize(c dynsec.Command) int {
	n := 64
	for k, v := range c {
		n += len(k) + 6
		if s, ok := v.(string); ok {
			n += 2 * len(s) // JSON escapes at most double most text
		} else {
			n += 20
		}
	}
	return n
}

// add queues c; sum is a setDevice's loginSum.
func (b *batcher) add(c dynsec.Command, sum uint64) error {
	size := approxSize(c)
	if len(b.cmds) > 0 && (b.bytes+size > b.s.opt.BatchBytes || len(b.cmds) >= 1000) {
		if err := b.flush(); err != nil {
			return err
		}
	}
	b.cmds = append(b.cmds, c)
	b.sums = append(b.sums, sum)
	b.bytes += size
	return nil
}

// refusal names why the plugin refused a device's login, for the metric.
func refusal(err error) string {
	switch msg := err.Error(); {
	case strings.Contains(msg, "another installation"):
		return "other_installation"
	case strings.Contains(msg, "reserved"), strings.Contains(msg, "service login"):
		return "reserved"
	default:
		return "invalid"
	}
}

func (b *batcher) flush() error {
	if len(b.cmds) == 0 {
		return nil
	}
	cmds, sums := b.cmds, b.sums
	b.cmds, b.sums, b.bytes = nil, nil, 0
	ctx, cancel := context.WithTimeout(b.ctx, b.s.opt.Timeout)
	rs, err := b.cl.Do(ctx, cmds...)
	cancel()
	if err != nil {
		return err
	}
	for i, r := range rs {
		if err := r.Err(); err != nil {
			b.s.commands.WithLabelValues("error").Inc()
			id, ok := cmds[i]["id"].(string)
			if !ok {
				b.failedSync = true
				b.s.log.Error("devauth: command refused", "err", err)
				continue
			}
			if b.failed == nil {
				b.failed = map[string]bool{}
			}
			b.failed[id] = true
			b.s.refused.WithLabelValues(refusal(err)).Inc()
			b.s.log.Error("devauth: the broker's plugin refused a device login", "err", err, "device", id)
			continue
		}
		b.s.commands.WithLabelValues("ok").Inc()
		var data struct {
			Removed       int64  `json:"removed"`
			RemovedDigest string `json:"removedDigest"`
		}
		if len(r.Data) > 0 && cmds[i]["command"] != "endSync" {
			_ = json.Unmarshal(r.Data, &data)
		}
		removedSum, _ := strconv.ParseUint(data.RemovedDigest, 16, 64)
		switch cmds[i]["command"] {
		case "setDevice":
			b.setCount++
			b.setSum += sums[i]
			b.deltaCount += 1 - data.Removed
			b.deltaSum += sums[i] - removedSum
		case "deleteDevice":
			b.deltaCount -= data.Removed
			b.deltaSum -= removedSum
		}
	}
	return nil
}
