package firmware

import (
	"context"
	"errors"
	"hash/fnv"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/singleflight"

	"devicehub/ingest/leader"
	"devicehub/ingest/link"
	"devicehub/ingest/wire"
)

// lockKey elects the engine's one owner among instances.
const lockKey = 0x6669726d77 // "firmw"

// Sender sends an upgrade to a device (*link.Commands.SendFirmware).
type Sender interface {
	SendFirmware(ctx context.Context, t link.Target, m wire.FirmwareUpgrade) error
}

// Options configure a Service. Zero fields take DefaultOptions' values.
type Options struct {
	// PublicURL is devicehub's HTTP address as devices reach it; download
	// links are PublicURL + "/firmware/download/<token>".
	PublicURL string
	// URLLifetime is how long a download link works (at least the
	// rollout's timeout). Default 1h.
	URLLifetime time.Duration
	// Tick is how often the owner paces, times out and ends rollouts.
	// Default 1s.
	Tick time.Duration
	// Workers store devices' reports; a device's reports always go to the
	// same worker, in order. Default 4.
	Workers int
	// Lookups bounds the download lookups (a package's file, a device's
	// credentials when they are not those the link was signed for)
	// running at once on the database; LookupWait is how
	// long a download waits for one before it is answered 503 with
	// Retry-After. Default 8 and 2s.
	// They are rare: a download checks its credentials against the
	// digest its link carries, and its package is cached (PackageFile).
	Lookups    int
	LookupWait time.Duration
	// Retry is the wait after a failure (lock, storage). Default 1s.
	Retry time.Duration
	// Changed, if set, is told each committed change of a device's job
	// (live events); it must not block.
	Changed func(Change)
	// Registerer receives the metrics; nil registers nothing.
	Registerer prometheus.Registerer
	Logger     *slog.Logger
}

// DefaultOptions work with `make run`.
func DefaultOptions() Options {
	return Options{PublicURL: "http://127.0.0.1:8848", URLLifetime: time.Hour, Tick: time.Second, Workers: 4,
		Lookups: 8, LookupWait: 2 * time.Second, Retry: time.Second, Logger: slog.Default()}
}

// Service is firmware updates: the engine (one owner among instances),
// devices' reports (ingest's hook, every instance), and the API's reads
// and writes.
type Service struct {
	store  *Store
	files  *Files
	locker leader.Locker
	send   Sender // nil: nothing is sent
	signer *Signer
	opt    Options
	log    *slog.Logger
	m      *metrics

	owner  atomic.Bool
	wake   chan struct{}
	queues []chan report
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	lookups   chan struct{} // download lookups running
	refMu     sync.Mutex
	pkgFiles  map[string]cachedFile // PackageFile's
	fileReads singleflight.Group    // PackageFile's reads, one per package at a time

	// beforeSend, in tests, runs after starts are committed and before
	// their upgrades are sent.
	beforeSend func([]Start)
}

type report struct {
	productID, deviceID string
	progress            *wire.FirmwareProgress
	version             string
	done                func()
}

// New starts a service's report workers (Run runs the engine); the token
// key is read (made once) from the store.
func New(ctx context.Context, store *Store, files *Files, locker leader.Locker, send Sender, opt Options) (*Service, error) {
	d := DefaultOptions()
	if opt.PublicURL == "" {
		opt.PublicURL = d.PublicURL
	}
	if opt.URLLifetime <= 0 {
		opt.URLLifetime = d.URLLifetime
	}
	if opt.Tick <= 0 {
		opt.Tick = d.Tick
	}
	if opt.Workers <= 0 {
		opt.Workers = d.Workers
	}
	if opt.Retry <= 0 {
		opt.Retry = d.Retry
	}
	if opt.Lookups <= 0 {
		opt.Lookups = d.Lookups
	}
	if opt.LookupWait <= 0 {
		opt.LookupWait = d.LookupWait
	}
	if opt.Logger == nil {
		opt.Logger = d.Logger
	}
	key, err := store.TokenKey(ctx)
	if err != nil {
		return nil, err
	}
	s := &Service{store: store, files: files, locker: locker, send: send, signer: NewSigner(key), opt: opt,
		log: opt.Logger.With("component", "firmware"), m: newMetrics(opt.Registerer), wake: make(chan struct{}, 1),
		lookups: make(chan struct{}, opt.Lookups)}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	for range opt.Workers {
		q := make(chan report, 1024)
		s.queues = append(s.queues, q)
		s.wg.Add(1)
		go s.work(q)
	}
	return s, nil
}

// Close stops the report workers. Reports not stored yet are left
// without their done: ingest does not acknowledge them, and the broker
// delivers them again.
func (s *Service) Close() {
	s.cancel()
	s.wg.Wait()
}

// Store is the service's store.
func (s *Service) Store() *Store { return s.store }

// Files is the package files.
func (s *Service) Files() *Files { return s.files }

// Signer checks download tokens.
func (s *Service) Signer() *Signer { return s.signer }

// Owner reports whether this instance runs the engine now.
func (s *Service) Owner() bool { return s.owner.Load() }

// Wake asks the owner to step now (a rollout created or resumed here).
func (s *Service) Wake() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Run waits for the engine's lock and runs the engine while it holds it,
// until ctx ends (ingest/leader's Loop, as the alarm runner and the
// forwarder take their turns).
func (s *Service) Run(ctx context.Context) {
	leader.Loop{Locker: s.locker, Key: lockKey, Retry: s.opt.Retry, Log: s.log,
		Waiting: "firmware: waiting for the engine lock", SteppedDown: "firmware: engine stepped down",
		Owner: &s.owner, Gauge: s.m.owner,
	}.Run(ctx, s.lead)
}

// lead is one turn as the owner: claim an epoch, then step every tick.
func (s *Service) lead(ctx context.Context, lost <-chan struct{}) error {
	epoch, err := s.store.Claim(ctx)
	if err != nil {
		return err
	}
	s.log.Info("firmware: engine running", "epoch", epoch)
	t := time.NewTicker(s.opt.Tick)
	defer t.Stop()
	for {
		if err := s.Step(ctx, epoch); err != nil {
			if errors.Is(err, ErrNotOwner) || ctx.Err() != nil {
				return err
			}
			s.log.Warn("firmware: engine step failed; retrying", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-lost:
			return errors.New("firmware engine lock lost")
		case <-t.C:
		case <-s.wake:
		}
	}
}

// restartBatch bounds the restarts of one rollout in a step.
const restartBatch = 1000

// Step is one round of the engine under epoch: time out late jobs, then
// for each running rollout mark the devices already at its version,
// apply its abort rule, end it when nothing is left, and start devices
// (restarts first, then new ones at its pace), sending their upgrades
// after the starts are committed.
func (s *Service) Step(ctx context.Context, epoch int64) error {
	exp, err := s.store.expire(ctx, epoch)
	if err != nil {
		return err
	}
	s.changed(exp)
	rs, err := s.store.active(ctx)
	if err != nil {
		return err
	}
	now := time.Now()
	for _, r := range rs {
		if err := s.stepRollout(ctx, epoch, r, now); err != nil {
			return err
		}
	}
	return nil
}

func (s *Service) stepRollout(ctx context.Context, epoch int64, r Rollout, now time.Time) error {
	reached, err := s.store.reached(ctx, r)
	if err != nil {
		return err
	}
	s.changed(reached)
	t, err := s.store.tally(ctx, r.ID)
	if err != nil {
		return err
	}
	if r.AbortMinStarted > 0 && t.Started >= r.AbortMinStarted && float64(t.Failed)*100 > r.AbortPercent*float64(t.Started) {
		reason := "aborted: " + itoa(t.Failed) + " of " + itoa(t.Started) + " started devices failed (more than " +
			strings.TrimRight(strings.TrimRight(ftoa(r.AbortPercent), "0"), ".") + "%)"
		if ok, err := s.store.end(ctx, epoch, r.ID, RolloutAborted, reason); err != nil || ok {
			if ok {
				s.m.rollouts.WithLabelValues(RolloutAborted).Inc()
				s.log.Warn("firmware: rollout aborted", "rollout", r.ID, "reason", reason)
			}
			return err
		}
	}
	if t.Open == 0 {
		ok, err := s.store.end(ctx, epoch, r.ID, RolloutCompleted, "")
		if ok {
			s.m.rollouts.WithLabelValues(RolloutCompleted).Inc()
		}
		return err
	}
	pkg, err := s.store.GetPackage(ctx, r.PackageID)
	if err != nil {
		return err
	}
	again, err := s.store.start(ctx, epoch, r, true, restartBatch)
	if err != nil {
		return err
	}
	s.sendAll(ctx, r, pkg, again)
	window, allowed := pace(r.rateAt(now))
	started, err := s.store.startedWithin(ctx, r.ID, now.Add(-window))
	if err != nil {
		return err
	}
	if n := allowed - started; n > 0 {
		fresh, err := s.store.start(ctx, epoch, r, false, n)
		if err != nil {
			return err
		}
		s.sendAll(ctx, r, pkg, fresh)
	}
	return nil
}

// pace is the sliding window first starts are counted in, and how many
// it may hold, for a rate a minute: at least 6 s (so that 200 a minute
// starts 20 every 6 s rather than 200 at once), longer for slow rates
// (one start a window).
func pace(ratePerMinute float64) (time.Duration, int) {
	window := 6 * time.Second
	if ratePerMinute > 0 {
		if per := time.Duration(float64(time.Minute) / ratePerMinute); per > window {
			window = per
		}
	}
	return window, max(1, int(ratePerMinute*window.Minutes()+1e-9))
}

// sendAll sends the upgrades of starts (committed), 32 at a time. An
// upgrade not sent is not retried here: its job times out and is
// started again (doc.go).
func (s *Service) sendAll(ctx context.Context, r Rollout, pkg Package, starts []Start) {
	if len(starts) == 0 {
		return
	}
	if s.beforeSend != nil {
		s.beforeSend(starts)
	}
	ch := make([]Change, len(starts))
	for i, st := range starts {
		ch[i] = Change{RolloutID: r.ID, ProductID: r.ProductID, DeviceID: st.DeviceID, State: StateInitiated, Version: r.Version, Attempts: st.Attempts}
	}
	s.changed(ch)
	if s.send == nil {
		return
	}
	sem := make(chan struct{}, 32)
	var wg sync.WaitGroup
	for _, st := range starts {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			m := s.Upgrade(r, pkg, st, time.Now())
			if err := s.send.SendFirmware(ctx, link.Target{ProductID: r.ProductID, DeviceID: st.DeviceID}, m); err != nil {
				s.m.sent.WithLabelValues("error").Inc()
				s.log.Warn("firmware: upgrade not sent; the job times out and is started again", "device", st.DeviceID, "err", err)
				return
			}
			s.m.sent.WithLabelValues("sent").Inc()
		}()
	}
	wg.Wait()
}

// Upgrade is the upgrade message of r's package for a started device,
// with a download link for it alone (bound to its credentials as the
// start read them), working for the longer of URLLifetime and the
// rollout's timeout.
func (s *Service) Upgrade(r Rollout, pkg Package, st Start, now time.Time) wire.FirmwareUpgrade {
	life := max(s.opt.URLLifetime, time.Duration(r.TimeoutSeconds)*time.Second)
	exp := now.Add(life)
	return wire.FirmwareUpgrade{MessageID: st.MessageID, RolloutID: r.ID, Version: pkg.Version, Size: pkg.Size,
		SHA256: pkg.SHA256, Signature: pkg.Signature, URL: s.DownloadURL(st.DeviceID, st.SecureID, st.SecureKey, pkg.ID, exp),
		Expires: exp.UnixMilli(), Timestamp: now.UnixMilli()}
}

// DownloadURL is the link that lets deviceID, whose credentials are
// secureID and secureKey, download packageID until exp.
func (s *Service) DownloadURL(deviceID, secureID, secureKey, packageID string, exp time.Time) string {
	return strings.TrimRight(s.opt.PublicURL, "/") + "/firmware/download/" +
		s.signer.Sign(Grant{DeviceID: deviceID, PackageID: packageID, Expires: exp}, secureID, secureKey)
}

func (s *Service) changed(cs []Change) {
	for _, c := range cs {
		s.m.transitions.WithLabelValues(c.State).Inc()
		if s.opt.Changed != nil {
			s.opt.Changed(c)
		}
	}
}

// Progress is ingest's hook for a device's progress report: stored, then
// done is called (ingest acknowledges the report only then).
func (s *Service) Progress(productID, deviceID string, p wire.FirmwareProgress, _ time.Time, done func()) {
	s.enqueue(report{productID: productID, deviceID: deviceID, progress: &p, done: done})
}

// Version is ingest's hook for a device's version report.
func (s *Service) Version(productID, deviceID, version string, _ time.Time, done func()) {
	s.enqueue(report{productID: productID, deviceID: deviceID, version: version, done: done})
}

func (s *Service) enqueue(r report) {
	h := fnv.New32a()
	h.Write([]byte(r.deviceID))
	select {
	case s.queues[h.Sum32()%uint32(len(s.queues))] <- r:
	case <-s.ctx.Done(): // closed: left unacknowledged, delivered again
	}
}

// reportBatch bounds the reports stored in one batch.
const reportBatch = 256

// work stores a worker's reports: what is queued is taken at once (up to
// reportBatch) and stored in batches, each one statement for its
// progress reports and one transaction for its version reports. A
// device's reports stay in order: a batch holds one report per device (a
// second one first commits the batch before it), and batches commit one
// after another.
func (s *Service) work(q chan report) {
	defer s.wg.Done()
	var list []report
	for {
		select {
		case r := <-q:
			list = append(list[:0], r)
		case <-s.ctx.Done():
			return
		}
	drain:
		for len(list) < reportBatch {
			select {
			case r := <-q:
				list = append(list, r)
			default:
				break drain
			}
		}
		if !s.storeAll(list) {
			return
		}
	}
}

// storeAll stores list in order; false when the service closed first
// (what was not stored stays unacknowledged).
func (s *Service) storeAll(list []report) bool {
	var progress, versions []report
	seen := map[string]bool{}
	flush := func() bool {
		if len(progress)+len(versions) == 0 {
			return true
		}
		// One report per device in the batch: the order of its two
		// commits does not matter. Acknowledged once both committed; a
		// retry of one re-applies nothing of the other.
		ok := (len(progress) == 0 || s.retry(progress[0].deviceID, func() error { return s.applyProgress(progress) })) &&
			(len(versions) == 0 || s.retry(versions[0].deviceID, func() error { return s.applyVersions(versions) }))
		if ok {
			for _, r := range progress {
				r.done()
			}
			for _, r := range versions {
				r.done()
			}
		}
		progress, versions = progress[:0], versions[:0]
		clear(seen)
		return ok
	}
	for _, r := range list {
		if seen[r.deviceID] && !flush() {
			return false
		}
		seen[r.deviceID] = true
		if r.progress != nil {
			progress = append(progress, r)
		} else {
			versions = append(versions, r)
		}
	}
	return flush()
}

// retry runs store until it succeeds (true), with backoff, or the
// service closes (false).
func (s *Service) retry(device string, store func() error) bool {
	wait := 100 * time.Millisecond
	for {
		err := store()
		if err == nil {
			return true
		}
		if s.ctx.Err() != nil {
			return false
		}
		s.log.Warn("firmware: storing a report failed; retrying", "device", device, "err", err)
		select {
		case <-time.After(wait):
		case <-s.ctx.Done():
			return false
		}
		wait = min(2*wait, 5*time.Second)
	}
}

// applyProgress stores progress reports in one statement.
func (s *Service) applyProgress(batch []report) error {
	reps := make([]ProgressReport, len(batch))
	for i, r := range batch {
		p := r.progress
		reps[i] = ProgressReport{DeviceID: r.deviceID, RolloutID: p.RolloutID, Version: p.Version, State: p.State,
			Progress: p.Progress, Reason: p.Reason}
	}
	cs, err := s.store.ProgressBatch(s.ctx, reps)
	if err != nil {
		return err
	}
	s.m.reports.WithLabelValues("progress").Add(float64(len(batch)))
	s.changed(cs)
	return nil
}

// applyVersions stores version reports in one transaction.
func (s *Service) applyVersions(batch []report) error {
	reps := make([]VersionReport, len(batch))
	for i, r := range batch {
		reps[i] = VersionReport{DeviceID: r.deviceID, Version: r.version}
	}
	cs, err := s.store.VersionBatch(s.ctx, reps)
	if err != nil {
		return err
	}
	s.m.reports.WithLabelValues("version").Add(float64(len(batch)))
	s.changed(cs)
	for _, c := range cs {
		if c.State == StateQueued {
			s.Wake() // started again at this owner's next step (another's tick)
			break
		}
	}
	return nil
}
