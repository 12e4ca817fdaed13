package fwdevice

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"devicehub/ingest/wire"
)

// Topic levels below /{productId}/{deviceId}/ (FIRMWARE.md).
const (
	LevelUpgrade  = "firmware/upgrade"  // downlink
	LevelProgress = "firmware/progress" // uplink
	LevelVersion  = "firmware/version"  // uplink
)

// State is a job's state as the device reports it on firmware/progress.
type State string

// The states a device reports (FIRMWARE.md).
const (
	Downloading State = "DOWNLOADING"
	Downloaded  State = "DOWNLOADED"
	Verified    State = "VERIFIED"
	Updating    State = "UPDATING"
	Updated     State = "UPDATED"
	Failed      State = "FAILED"
)

// Conn is the device's MQTT connection as the updater uses it. Publish
// sends at QoS 1 (it need not wait for the PUBACK); Subscribe subscribes
// at QoS 1 and calls handler with each message's payload, which handler
// may use only during the call. Handler must not block: the updater
// parses the payload and does its work on a goroutine of its own.
type Conn interface {
	Publish(topic string, payload []byte) error
	Subscribe(topic string, handler func(payload []byte)) error
}

// Upgrade is the firmware/upgrade downlink, as devicehub sends it.
type Upgrade = wire.FirmwareUpgrade

// Progress is the firmware/progress uplink. Percent is set with
// DOWNLOADING only, Reason with FAILED only.
type Progress struct {
	MessageID string `json:"messageId,omitempty"`
	Timestamp int64  `json:"timestamp,omitempty"`
	RolloutID string `json:"rolloutId"`
	Version   string `json:"version"`
	State     State  `json:"state"`
	Percent   *int   `json:"progress,omitempty"`
	Reason    string `json:"reason,omitempty"`
}

// Faults make a device misbehave on purpose. The zero value is a healthy
// device.
type Faults struct {
	// FailAt: where the device would report this state it reports FAILED
	// with FailReason instead, and stops the job (DOWNLOADING: before the
	// download starts).
	FailAt     State
	FailReason string
	// StallAt: the device reports this state and then nothing more for
	// the job (no state, no version): it hangs until an upgrade restarts
	// the job or the updater is closed.
	StallAt State
	// WrongHash: the device computes a wrong SHA-256 of what it
	// downloaded, so its verification fails (FAILED, "sha256 mismatch").
	WrongHash bool
	// Times limits FailAt, StallAt and WrongHash to the device's first
	// Times jobs (a retry then succeeds); 0: every job.
	Times int
	// CutAt, in (0,1): the device's first download is cut (its HTTP
	// connection closed) after this share of the file, once; the device
	// then resumes with a range request from the offset it holds.
	CutAt float64
	// RebootOld: once, the device reports UPDATING, reboots and comes
	// back on its old version (version report after its birth), and then
	// claims UPDATED for the target anyway, as a device whose new image
	// did not boot and whose updater kept its state would: devicehub must
	// not believe it.
	RebootOld bool
}

// Options configure an Updater.
type Options struct {
	ProductID, DeviceID string // required
	// Version is the firmware version the device runs at start.
	Version string
	// SecureID and SecureKey are the device's login (configuration), sent
	// as HTTP Basic auth with every download.
	SecureID, SecureKey string
	// HTTPClient downloads; nil: a client of this package (keep-alive
	// connections, no overall timeout: Timeout bounds a job's download).
	HTTPClient *http.Client
	// Timeout bounds one job's download, resumes included: past it the job
	// reports FAILED "timeout ...". Default 2 minutes.
	Timeout time.Duration
	// Step is the percentage between two DOWNLOADING reports. Default 10.
	Step int
	// MaxResumes is how many times a download whose connection broke, or
	// that the server answered with a 5xx (a transient error), is resumed
	// before the job fails. Default 5.
	MaxResumes int
	// RetryWait is the pause before a request after a 5xx answer,
	// doubling each time up to 16 times it. Default 1 s.
	RetryWait time.Duration
	// Reboot, if set, is the device's reboot once the image is installed:
	// it drops and re-establishes the MQTT connection and, after the
	// birth message, calls Connected, which reports the (new) version. It
	// runs on the job's goroutine. nil: the device "reboots" in place and
	// reports its version on the connection it has.
	Reboot func(ctx context.Context) error
	// KeepImage keeps the last verified image in memory (Image); without
	// it the device only hashes what it downloads (a fleet of simulated
	// devices does not hold a copy each).
	KeepImage bool
	// Faults make the device misbehave.
	Faults Faults
	// OnReport, if set, sees every progress report and version report
	// (State "" for a version report) before it is published. It must not
	// block.
	OnReport func(p Progress)
}

// Updater is one simulated device's firmware updater.
type Updater struct {
	opts   Options
	client *http.Client

	mu       sync.Mutex
	conn     Conn
	version  string
	job      *job
	partial  *partial // bytes downloaded of an image, kept across a restart of its job
	image    []byte
	jobs     int  // jobs started, for Faults.Times
	cutDone  bool // Faults.CutAt used
	oldDone  bool // Faults.RebootOld used
	closed   bool
	jobsDone sync.WaitGroup

	// Counters for tests and the bench.
	Started, Updates, Failures, Resumes atomic.Int64
	// ServerErrors counts 5xx answers (each retried within MaxResumes).
	ServerErrors atomic.Int64
	// Downloaded counts the bytes received over HTTP.
	Downloaded atomic.Int64
}

// defaultClient is shared by the updaters that bring none.
var defaultClient = &http.Client{Transport: &http.Transport{
	Proxy:               nil,
	MaxIdleConnsPerHost: 64,
	IdleConnTimeout:     30 * time.Second,
	DisableCompression:  true,
}}

// New returns an updater; it does nothing until Connected.
func New(opts Options) (*Updater, error) {
	if opts.ProductID == "" || opts.DeviceID == "" {
		return nil, errors.New("fwdevice: ProductID and DeviceID are required")
	}
	if c := opts.Faults.CutAt; c < 0 || c >= 1 {
		return nil, fmt.Errorf("fwdevice: Faults.CutAt %v: not in [0,1)", c)
	}
	if opts.Faults.FailAt != "" && opts.Faults.FailReason == "" {
		opts.Faults.FailReason = "simulated failure at " + string(opts.Faults.FailAt)
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 2 * time.Minute
	}
	if opts.Step <= 0 {
		opts.Step = 10
	}
	if opts.MaxResumes <= 0 {
		opts.MaxResumes = 5
	}
	if opts.RetryWait <= 0 {
		opts.RetryWait = time.Second
	}
	u := &Updater{opts: opts, client: opts.HTTPClient, version: opts.Version}
	if u.client == nil {
		u.client = defaultClient
	}
	return u, nil
}

func (u *Updater) topic(level string) string {
	return "/" + u.opts.ProductID + "/" + u.opts.DeviceID + "/" + level
}

// Version is the firmware version the device runs.
func (u *Updater) Version() string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.version
}

// Image is the last verified image (Options.KeepImage), nil if none.
func (u *Updater) Image() []byte {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.image
}

// Connected is called by the device after each connect, after its birth
// message: it subscribes to the device's firmware/upgrade on c (the
// connection the updater publishes on from then on) and reports the
// running version on firmware/version.
func (u *Updater) Connected(c Conn) error {
	u.mu.Lock()
	u.conn = c
	u.mu.Unlock()
	if err := c.Subscribe(u.topic(LevelUpgrade), u.onUpgrade); err != nil {
		return fmt.Errorf("fwdevice: subscribe %s: %w", u.topic(LevelUpgrade), err)
	}
	return u.reportVersion()
}

func (u *Updater) reportVersion() error {
	u.mu.Lock()
	c, v := u.conn, u.version
	u.mu.Unlock()
	if u.opts.OnReport != nil {
		u.opts.OnReport(Progress{Version: v})
	}
	b, _ := json.Marshal(struct {
		Version   string `json:"version"`
		Timestamp int64  `json:"timestamp"`
	}{v, time.Now().UnixMilli()})
	return c.Publish(u.topic(LevelVersion), b)
}

// Close cancels the running job, if any, and waits for it to end.
func (u *Updater) Close() {
	u.mu.Lock()
	u.closed = true
	if u.job != nil {
		u.job.cancel()
	}
	u.mu.Unlock()
	u.jobsDone.Wait()
}

// job is one upgrade being carried out.
type job struct {
	up     Upgrade
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
	// The faults that apply to this job.
	failAt, stallAt State
	wrongHash       bool
}

// partial is what a device holds of an image: the hash of the first n
// bytes (and the bytes with KeepImage).
type partial struct {
	sha256 string
	size   int64
	h      hash.Hash
	n      int64
	buf    []byte
}

// onUpgrade handles a firmware/upgrade message: a new job, or a restart of
// the running one for the same version (FIRMWARE.md). It does not block.
func (u *Updater) onUpgrade(payload []byte) {
	var up Upgrade
	if err := json.Unmarshal(payload, &up); err != nil {
		return // not an upgrade: nothing to report against
	}
	if up.Version == "" || up.RolloutID == "" {
		return
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.closed {
		return
	}
	prev := u.job
	if prev == nil && up.Version == u.version {
		// Already running it (a retry after a report was lost): say so.
		go u.alreadyThere(up)
		return
	}
	if prev != nil {
		prev.cancel() // a restart of the job (same version) or a new target
	}
	u.jobs++
	f := u.opts.Faults
	applies := f.Times == 0 || u.jobs <= f.Times
	j := &job{up: up, done: make(chan struct{})}
	j.ctx, j.cancel = context.WithTimeout(context.Background(), u.opts.Timeout)
	if applies {
		j.failAt, j.stallAt, j.wrongHash = f.FailAt, f.StallAt, f.WrongHash
	}
	u.job = j
	u.Started.Add(1)
	u.jobsDone.Add(1)
	go func() {
		defer u.jobsDone.Done()
		defer close(j.done)
		if prev != nil {
			<-prev.done // the job it replaces no longer touches the partial image
		}
		u.run(j)
		j.cancel()
	}()
}

func (u *Updater) alreadyThere(up Upgrade) {
	_ = u.reportVersion()
	_ = u.report(up, Updated, nil, "")
}

// report publishes a progress report of j's rollout and target.
func (u *Updater) report(up Upgrade, s State, percent *int, reason string) error {
	p := Progress{MessageID: newID(), Timestamp: time.Now().UnixMilli(), RolloutID: up.RolloutID, Version: up.Version,
		State: s, Percent: percent, Reason: reason}
	if u.opts.OnReport != nil {
		u.opts.OnReport(p)
	}
	b, _ := json.Marshal(p)
	u.mu.Lock()
	c := u.conn
	u.mu.Unlock()
	return c.Publish(u.topic(LevelProgress), b)
}

func newID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// stepErr ends a job: FAILED with reason, or (stalled) nothing more.
type stepErr struct {
	reason string
	stall  bool
}

func (e *stepErr) Error() string { return e.reason }

// enter reports state s of j, unless a fault says otherwise: FAILED in its
// place (an error) or s and then silence (a stall error).
func (u *Updater) enter(j *job, s State, percent *int) error {
	if j.ctx.Err() != nil {
		return &stepErr{stall: true} // replaced or closed: the new job reports
	}
	if j.failAt == s {
		return &stepErr{reason: u.opts.Faults.FailReason}
	}
	_ = u.report(j.up, s, percent, "")
	if j.stallAt == s {
		return &stepErr{stall: true}
	}
	return nil
}

// run carries out a job to UPDATED or FAILED. The job stops being the
// device's running job before its last report, so that an upgrade that
// follows the report is never taken for a restart of it.
func (u *Updater) run(j *job) {
	err := u.steps(j)
	var se *stepErr
	if errors.As(err, &se) && se.stall {
		<-j.ctx.Done() // hung until replaced, closed or timed out, silently
	}
	u.mu.Lock()
	if u.job == j {
		u.job = nil
	}
	u.mu.Unlock()
	switch {
	case err == nil:
		u.Updates.Add(1)
		_ = u.report(j.up, Updated, nil, "")
	case se != nil && se.stall:
	case j.ctx.Err() != nil && errors.Is(err, context.Canceled):
		// replaced by a restart: that job reports
	default:
		u.Failures.Add(1)
		_ = u.report(j.up, Failed, nil, err.Error())
	}
}

func (u *Updater) steps(j *job) error {
	zero := 0
	if err := u.enter(j, Downloading, &zero); err != nil {
		return err
	}
	p, err := u.download(j)
	if err != nil {
		return err
	}
	if err := u.enter(j, Downloaded, nil); err != nil {
		return err
	}
	sum := p.h.Sum(nil)
	if j.wrongHash {
		sum[0] ^= 0xff
	}
	if got := hex.EncodeToString(sum); got != j.up.SHA256 {
		u.mu.Lock()
		u.partial = nil // download it again next time
		u.mu.Unlock()
		return fmt.Errorf("sha256 mismatch: downloaded %s, expected %s", got, j.up.SHA256)
	}
	if err := u.enter(j, Verified, nil); err != nil {
		return err
	}
	if err := u.enter(j, Updating, nil); err != nil {
		return err
	}
	u.mu.Lock()
	u.partial = nil
	rebootOld := u.opts.Faults.RebootOld && !u.oldDone
	if rebootOld {
		u.oldDone = true
	} else {
		u.version = j.up.Version
		if u.opts.KeepImage {
			u.image = p.buf
		}
	}
	u.mu.Unlock()
	if u.opts.Reboot != nil {
		if err := u.opts.Reboot(j.ctx); err != nil {
			return fmt.Errorf("reboot: %w", err)
		}
	} else if err := u.reportVersion(); err != nil {
		return fmt.Errorf("version report: %w", err)
	}
	if j.failAt == Updated {
		return &stepErr{reason: u.opts.Faults.FailReason}
	}
	if j.stallAt == Updated {
		return &stepErr{stall: true}
	}
	return nil // run reports UPDATED
}
