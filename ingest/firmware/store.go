package firmware

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"devicehub/meta"
	"devicehub/schema"
)

// Device states of a rollout (FIRMWARE.md).
const (
	StateQueued      = "QUEUED"
	StateInitiated   = "INITIATED"
	StateDownloading = "DOWNLOADING"
	StateDownloaded  = "DOWNLOADED"
	StateVerified    = "VERIFIED"
	StateUpdating    = "UPDATING"
	StateUpdated     = "UPDATED"
	StateFailed      = "FAILED"
	StateTimedOut    = "TIMED_OUT"
	StateCanceled    = "CANCELED"
)

// DeviceStates lists every device state, in the job's order.
var DeviceStates = []string{StateQueued, StateInitiated, StateDownloading, StateDownloaded, StateVerified,
	StateUpdating, StateUpdated, StateFailed, StateTimedOut, StateCanceled}

// Rollout states.
const (
	RolloutRunning   = "running"
	RolloutPaused    = "paused"
	RolloutCanceled  = "canceled"
	RolloutAborted   = "aborted"
	RolloutCompleted = "completed"
)

// inFlight are the states of a started job that has not ended: its
// deadline runs.
var inFlight = []string{StateInitiated, StateDownloading, StateDownloaded, StateVerified, StateUpdating}

// ErrInUse: a package a rollout refers to cannot be deleted.
var ErrInUse = errors.New("in use")

// Store keeps packages, rollouts, the devices' jobs and reported
// versions in PostgreSQL (00025-00027).
type Store struct {
	ms      *meta.Store
	db      *sqlx.DB
	timeout time.Duration
}

// NewStore is a store on ms's database; each call takes at most timeout
// (<= 0: 10 s).
func NewStore(ms *meta.Store, timeout time.Duration) *Store {
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	return &Store{ms: ms, db: ms.DB(), timeout: timeout}
}

func (s *Store) ctx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.timeout)
}

// NewID is a random id (16 hex digits).
func NewID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Package is a firmware file of a product.
type Package struct {
	ID           string `json:"id" db:"id"`
	ProductID    string `json:"productId" db:"product_id"`
	Name         string `json:"name" db:"name"`
	Version      string `json:"version" db:"version"`
	Size         int64  `json:"size" db:"size"`
	SHA256       string `json:"sha256" db:"sha256"`
	Signature    string `json:"signature,omitempty" db:"signature"`
	ReleaseNotes string `json:"releaseNotes" db:"release_notes"`
	FileName     string `json:"-" db:"file_name"`
	CreatorID    string `json:"creatorId" db:"creator_id"`
	CreateTime   int64  `json:"createTime" db:"create_ms"`
}

const packageCols = `id, product_id, name, version, size, sha256, signature, release_notes, file_name, creator_id,
	(extract(epoch FROM create_time) * 1000)::bigint AS create_ms`

// errCommit: a package's commit failed after its file was placed.
var errCommit = errors.New("commit failed")

// CreatePackage stores p's row, calling place (which puts its file in
// place) after the insert and before the commit: a row is committed only
// with its file, and a file placed only for an inserted row. A version
// the product has is meta.ErrDuplicateKey; an unknown product
// meta.ErrNotFound.
func (s *Store) CreatePackage(ctx context.Context, p Package, place func() error) (Package, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	tx, err := s.db.BeginTxx(ctx, nil)
	if err != nil {
		return Package{}, fmt.Errorf("firmware: create package: %w", err)
	}
	defer tx.Rollback()
	var out Package
	err = tx.GetContext(ctx, &out, `INSERT INTO firmware_packages (id, product_id, name, version, size, sha256, signature,
		release_notes, file_name, creator_id) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) RETURNING `+packageCols,
		p.ID, p.ProductID, p.Name, p.Version, p.Size, p.SHA256, p.Signature, p.ReleaseNotes, p.FileName, p.CreatorID)
	var pqErr *pq.Error
	if errors.As(err, &pqErr) {
		switch pqErr.Code {
		case "23505":
			return Package{}, fmt.Errorf("version %q of product %q: %w", p.Version, p.ProductID, meta.ErrDuplicateKey)
		case "23503":
			return Package{}, fmt.Errorf("product %q: %w", p.ProductID, meta.ErrNotFound)
		}
	}
	if err != nil {
		return Package{}, fmt.Errorf("firmware: create package: %w", err)
	}
	if err := place(); err != nil {
		return Package{}, err
	}
	if err := tx.Commit(); err != nil {
		return Package{}, fmt.Errorf("firmware: create package: %w: %w", errCommit, err)
	}
	return out, nil
}

// GetPackage reads a package (meta.ErrNotFound when there is none).
func (s *Store) GetPackage(ctx context.Context, id string) (Package, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	var p Package
	err := s.db.GetContext(ctx, &p, `SELECT `+packageCols+` FROM firmware_packages WHERE id = $1`, id)
	if errors.Is(err, sql.ErrNoRows) {
		return Package{}, fmt.Errorf("package %q: %w", short(id), meta.ErrNotFound)
	}
	if err != nil {
		return Package{}, fmt.Errorf("firmware: package: %w", err)
	}
	return p, nil
}

// ListPackages lists the packages of productID ("" every product of
// products, nil: all), newest first, at most limit from offset, and their
// total.
func (s *Store) ListPackages(ctx context.Context, productID string, products []string, offset, limit int) ([]Package, int, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	out, total, err := packageList.Range(ctx, s.ms, offset, limit, listParams(map[string]any{"product": productID}, products))
	if err != nil {
		return nil, 0, fmt.Errorf("firmware: packages: %w", err)
	}
	return out, total, nil
}

// packageList is ListPackages' statement, newest first.
var packageList = meta.NewList(&meta.Resource{Name: "firmware package", DefaultSort: "create_time DESC, id"}, meta.ListSQL{
	Select: packageCols,
	From:   "firmware_packages",
	Where:  []string{"product_id = @product", "product_id = ANY(@within)"},
}, func(p *Package) Package { return *p })

// listParams binds the lists' parameters: those of named that are not
// "", and @within to products unless nil (all).
func listParams(named map[string]any, products []string) meta.Params {
	params := meta.Params{}
	for k, v := range named {
		if v != "" {
			params[k] = v
		}
	}
	if products != nil {
		params["within"] = pq.StringArray(products)
	}
	return params
}

// DeletePackage deletes a package's row and returns it (its file is the
// caller's to remove); ErrInUse while a rollout refers to it.
func (s *Store) DeletePackage(ctx context.Context, id string) (Package, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	var p Package
	err := s.db.GetContext(ctx, &p, `DELETE FROM firmware_packages WHERE id = $1 RETURNING `+packageCols, id)
	var pqErr *pq.Error
	if errors.As(err, &pqErr) && pqErr.Code == "23503" {
		return Package{}, fmt.Errorf("package %q: a rollout uses it: %w", short(id), ErrInUse)
	}
	if errors.Is(err, sql.ErrNoRows) {
		return Package{}, fmt.Errorf("package %q: %w", short(id), meta.ErrNotFound)
	}
	if err != nil {
		return Package{}, fmt.Errorf("firmware: delete package: %w", err)
	}
	return p, nil
}

// RampUp raises the rate linearly from InitialRate to the rollout's rate
// over Minutes from its creation.
type RampUp struct {
	InitialRate int `json:"initialRate"`
	Minutes     int `json:"minutes"`
}

// Abort stops a rollout when more than Percent of at least MinStarted
// started devices failed (FAILED or TIMED_OUT).
type Abort struct {
	Percent    float64 `json:"percent"`
	MinStarted int     `json:"minStarted"`
}

// Target is what a rollout reaches: every device of its product, the
// devices listed, or those a query body's terms select (meta's device
// query columns); at most one of DeviceIDs and Query.
type Target struct {
	DeviceIDs []string        `json:"deviceIds,omitempty"`
	Query     json.RawMessage `json:"query,omitempty"`
}

// Spec is a rollout to create.
type Spec struct {
	PackageID      string  `json:"packageId"`
	Target         Target  `json:"target"`
	RatePerMinute  int     `json:"ratePerMinute"`
	RampUp         *RampUp `json:"rampUp,omitempty"`
	Abort          *Abort  `json:"abort,omitempty"`
	TimeoutSeconds int     `json:"timeoutSeconds"`
	Retries        int     `json:"retries"`
}

// Limits of a rollout's settings.
const (
	MaxRate       = 100_000
	MaxTimeout    = 7 * 24 * 3600
	MaxRetries    = 10
	MaxTargetList = 100_000
)

// Check refuses a spec's bad fields, naming them.
func (sp *Spec) Check() error {
	switch {
	case sp.PackageID == "":
		return schema.Invalid("packageId", "is required")
	case sp.RatePerMinute < 1 || sp.RatePerMinute > MaxRate:
		return schema.Invalid("ratePerMinute", "must be 1 to %d devices a minute", MaxRate)
	case sp.TimeoutSeconds < 1 || sp.TimeoutSeconds > MaxTimeout:
		return schema.Invalid("timeoutSeconds", "must be 1 to %d", MaxTimeout)
	case sp.Retries < 0 || sp.Retries > MaxRetries:
		return schema.Invalid("retries", "must be 0 to %d", MaxRetries)
	case sp.Target.DeviceIDs != nil && sp.Target.Query != nil:
		return schema.Invalid("target", "name deviceIds or query, not both")
	case sp.Target.DeviceIDs != nil && len(sp.Target.DeviceIDs) == 0:
		return schema.Invalid("target.deviceIds", "name at least one device")
	case len(sp.Target.DeviceIDs) > MaxTargetList:
		return schema.Invalid("target.deviceIds", "at most %d devices", MaxTargetList)
	}
	for _, id := range sp.Target.DeviceIDs {
		if id == "" {
			return schema.Invalid("target.deviceIds", "an id is empty")
		}
	}
	if r := sp.RampUp; r != nil {
		if r.InitialRate < 1 || r.InitialRate > sp.RatePerMinute {
			return schema.Invalid("rampUp.initialRate", "must be 1 to ratePerMinute (%d)", sp.RatePerMinute)
		}
		if r.Minutes < 1 || r.Minutes > 24*60 {
			return schema.Invalid("rampUp.minutes", "must be 1 to %d", 24*60)
		}
	}
	if a := sp.Abort; a != nil {
		if !(a.Percent >= 0 && a.Percent < 100) {
			return schema.Invalid("abort.percent", "must be at least 0 and below 100")
		}
		if a.MinStarted < 1 {
			return schema.Invalid("abort.minStarted", "must be 1 or more")
		}
	}
	return nil
}

// Rollout is a rollout as stored, with its devices' counts by state.
type Rollout struct {
	ID             string          `json:"id" db:"id"`
	ProductID      string          `json:"productId" db:"product_id"`
	PackageID      string          `json:"packageId" db:"package_id"`
	Version        string          `json:"version" db:"version"`
	Target         json.RawMessage `json:"target" db:"target"`
	RatePerMinute  int             `json:"ratePerMinute" db:"rate_per_minute"`
	RampUp         *RampUp         `json:"rampUp,omitempty" db:"-"`
	Abort          *Abort          `json:"abort,omitempty" db:"-"`
	TimeoutSeconds int             `json:"timeoutSeconds" db:"timeout_seconds"`
	Retries        int             `json:"retries" db:"retries"`
	State          string          `json:"state" db:"state"`
	Reason         string          `json:"reason,omitempty" db:"reason"`
	Devices        int             `json:"devices" db:"devices"`
	Counts         map[string]int  `json:"counts" db:"-"`
	CreatorID      string          `json:"creatorId" db:"creator_id"`
	CreateTime     int64           `json:"createTime" db:"create_ms"`
	UpdateTime     int64           `json:"updateTime" db:"update_ms"`
	EndTime        *int64          `json:"endTime,omitempty" db:"end_ms"`

	RampInitial     int     `json:"-" db:"ramp_initial_rate"`
	RampMinutes     int     `json:"-" db:"ramp_minutes"`
	AbortPercent    float64 `json:"-" db:"abort_percent"`
	AbortMinStarted int     `json:"-" db:"abort_min_started"`
}

const rolloutCols = `id, product_id, package_id, version, target, rate_per_minute, ramp_initial_rate, ramp_minutes,
	abort_percent, abort_min_started, timeout_seconds, retries, state, reason, devices, creator_id,
	(extract(epoch FROM create_time) * 1000)::bigint AS create_ms,
	(extract(epoch FROM update_time) * 1000)::bigint AS update_ms,
	(extract(epoch FROM end_time) * 1000)::bigint AS end_ms`

func (r *Rollout) fill() {
	if r.RampMinutes > 0 {
		r.RampUp = &RampUp{InitialRate: r.RampInitial, Minutes: r.RampMinutes}
	}
	if r.AbortMinStarted > 0 {
		r.Abort = &Abort{Percent: r.AbortPercent, MinStarted: r.AbortMinStarted}
	}
	if r.Counts == nil {
		r.Counts = map[string]int{}
	}
}

// rateAt is the rollout's rate at now, ramped up.
func (r *Rollout) rateAt(now time.Time) float64 {
	rate := float64(r.RatePerMinute)
	if r.RampMinutes <= 0 {
		return rate
	}
	f := now.Sub(time.UnixMilli(r.CreateTime)).Minutes() / float64(r.RampMinutes)
	if f >= 1 {
		return rate
	}
	f = max(f, 0)
	return float64(r.RampInitial) + (rate-float64(r.RampInitial))*f
}

// CreateRollout creates a rollout of pkg over the devices spec selects,
// each QUEUED, in one transaction; a product with a running or paused
// rollout refuses another (meta.ErrConflict). Listed devices that are not
// the product's are refused by name.
func (s *Store) CreateRollout(ctx context.Context, pkg Package, sp Spec, creatorID string) (Rollout, error) {
	target, err := json.Marshal(sp.Target)
	if err != nil {
		return Rollout{}, fmt.Errorf("firmware: target: %w", err)
	}
	var where string
	var args []any
	switch {
	case sp.Target.DeviceIDs != nil:
		where, args = `d.id = ANY($2)`, []any{pkg.ProductID, pq.Array(sp.Target.DeviceIDs)}
	case sp.Target.Query != nil:
		q, err := meta.DecodeQuery(sp.Target.Query)
		if err != nil {
			return Rollout{}, prefixField(err, "target.query")
		}
		c, err := meta.DeviceResource.Compile(q)
		if err != nil {
			return Rollout{}, prefixField(err, "target.query")
		}
		args = append([]any{}, c.Args...)
		args = append(args, pkg.ProductID)
		where = "d.product_id = $" + strconv.Itoa(len(args))
		if c.Where != "" {
			where += " AND " + c.Where
		}
	default:
		where, args = `true`, []any{pkg.ProductID}
	}
	if sp.Target.Query == nil {
		where = "d.product_id = $1 AND " + where
	}
	ctx, cancel := context.WithTimeout(ctx, 2*s.timeout)
	defer cancel()
	tx, err := s.db.BeginTxx(ctx, nil)
	if err != nil {
		return Rollout{}, fmt.Errorf("firmware: create rollout: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // after Commit: a no-op
	if sp.Target.DeviceIDs != nil {
		var missing []string
		if err := tx.SelectContext(ctx, &missing, `SELECT x FROM unnest($1::text[]) x
			WHERE NOT EXISTS (SELECT 1 FROM devices d WHERE d.id = x AND d.product_id = $2) LIMIT 5`,
			pq.Array(sp.Target.DeviceIDs), pkg.ProductID); err != nil {
			return Rollout{}, fmt.Errorf("firmware: create rollout: %w", err)
		}
		if len(missing) > 0 {
			return Rollout{}, schema.Invalid("target.deviceIds", "not devices of product %q: %s", pkg.ProductID, strings.Join(missing, ", "))
		}
	}
	r := Rollout{ID: NewID()}
	var rampInit, rampMin, abortMin int
	var abortPct float64
	if sp.RampUp != nil {
		rampInit, rampMin = sp.RampUp.InitialRate, sp.RampUp.Minutes
	}
	if sp.Abort != nil {
		abortPct, abortMin = sp.Abort.Percent, sp.Abort.MinStarted
	}
	_, err = tx.ExecContext(ctx, `INSERT INTO firmware_rollouts (id, product_id, package_id, version, target, rate_per_minute,
		ramp_initial_rate, ramp_minutes, abort_percent, abort_min_started, timeout_seconds, retries, state, creator_id)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, 'running', $13)`,
		r.ID, pkg.ProductID, pkg.ID, pkg.Version, target, sp.RatePerMinute, rampInit, rampMin, abortPct, abortMin,
		sp.TimeoutSeconds, sp.Retries, creatorID)
	var pqErr *pq.Error
	if errors.As(err, &pqErr) && pqErr.Code == "23505" {
		return Rollout{}, fmt.Errorf("product %q has a running or paused rollout: cancel it first: %w", pkg.ProductID, meta.ErrConflict)
	}
	if err != nil {
		return Rollout{}, fmt.Errorf("firmware: create rollout: %w", err)
	}
	n := len(args) + 1
	args = append(args, r.ID)
	res, err := tx.ExecContext(ctx, `INSERT INTO firmware_devices (rollout_id, device_id)
		SELECT $`+strconv.Itoa(n)+`, d.id FROM devices d JOIN products p ON p.id = d.product_id WHERE `+where, args...)
	if err != nil {
		return Rollout{}, fmt.Errorf("firmware: create rollout: %w", err)
	}
	count, _ := res.RowsAffected()
	if _, err := tx.ExecContext(ctx, `UPDATE firmware_rollouts SET devices = $2 WHERE id = $1`, r.ID, count); err != nil {
		return Rollout{}, fmt.Errorf("firmware: create rollout: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return Rollout{}, fmt.Errorf("firmware: create rollout: %w", err)
	}
	// The planner's statistics learn of the rollout's rows now rather than
	// at autovacuum's next turn (the engine's joins, e.g. reached, are
	// planned from them; the start does not depend on them). Best effort:
	// the rollout is created either way.
	if count >= 1000 {
		_, _ = s.db.ExecContext(ctx, `ANALYZE firmware_devices`)
	}
	return s.GetRollout(ctx, r.ID)
}

// prefixField names the query body's fields under field.
func prefixField(err error, field string) error {
	var ae *schema.ArgError
	if errors.As(err, &ae) {
		c := *ae
		c.Field = field + "." + c.Field
		return &c
	}
	return err
}

// GetRollout reads a rollout with its counts.
func (s *Store) GetRollout(ctx context.Context, id string) (Rollout, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	var r Rollout
	err := s.db.GetContext(ctx, &r, `SELECT `+rolloutCols+` FROM firmware_rollouts WHERE id = $1`, id)
	if errors.Is(err, sql.ErrNoRows) {
		return Rollout{}, fmt.Errorf("rollout %q: %w", short(id), meta.ErrNotFound)
	}
	if err != nil {
		return Rollout{}, fmt.Errorf("firmware: rollout: %w", err)
	}
	r.fill()
	r.Counts, err = s.Counts(ctx, id)
	return r, err
}

// Counts counts a rollout's devices by state (every state, 0 included).
func (s *Store) Counts(ctx context.Context, rolloutID string) (map[string]int, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	var rows []struct {
		State string `db:"state"`
		N     int    `db:"n"`
	}
	if err := s.db.SelectContext(ctx, &rows, `SELECT state, count(*) AS n FROM firmware_devices WHERE rollout_id = $1 GROUP BY state`, rolloutID); err != nil {
		return nil, fmt.Errorf("firmware: counts: %w", err)
	}
	out := make(map[string]int, len(DeviceStates))
	for _, st := range DeviceStates {
		out[st] = 0
	}
	for _, r := range rows {
		out[r.State] = r.N
	}
	return out, nil
}

// ListRollouts lists rollouts of productID ("": of products, nil: all)
// in state ("": any), newest first, and their total.
func (s *Store) ListRollouts(ctx context.Context, productID, state string, products []string, offset, limit int) ([]Rollout, int, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	out, total, err := rolloutList.Range(ctx, s.ms, offset, limit, listParams(map[string]any{"product": productID, "state": state}, products))
	if err != nil {
		return nil, 0, fmt.Errorf("firmware: rollouts: %w", err)
	}
	for i := range out {
		c, err := s.Counts(ctx, out[i].ID)
		if err != nil {
			return nil, 0, err
		}
		out[i].Counts = c
	}
	return out, total, nil
}

// rolloutList is ListRollouts' statement, newest first.
var rolloutList = meta.NewList(&meta.Resource{Name: "firmware rollout", DefaultSort: "create_time DESC, id"}, meta.ListSQL{
	Select: rolloutCols,
	From:   "firmware_rollouts",
	Where:  []string{"product_id = @product", "state = @state", "product_id = ANY(@within)"},
}, func(r *Rollout) Rollout { r.fill(); return *r })

// SetState moves a rollout to state from one of from (pause: running;
// resume: paused; cancel: running or paused). Canceling marks its QUEUED
// devices CANCELED in the same transaction. A rollout in another state
// is meta.ErrConflict.
func (s *Store) SetState(ctx context.Context, id, state, reason string, from ...string) (Rollout, error) {
	ctx2, cancel := s.ctx(ctx)
	defer cancel()
	tx, err := s.db.BeginTxx(ctx2, nil)
	if err != nil {
		return Rollout{}, fmt.Errorf("firmware: rollout state: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // after Commit: a no-op
	var cur string
	err = tx.GetContext(ctx2, &cur, `SELECT state FROM firmware_rollouts WHERE id = $1 FOR UPDATE`, id)
	if errors.Is(err, sql.ErrNoRows) {
		return Rollout{}, fmt.Errorf("rollout %q: %w", short(id), meta.ErrNotFound)
	}
	if err != nil {
		return Rollout{}, fmt.Errorf("firmware: rollout state: %w", err)
	}
	okFrom := false
	for _, f := range from {
		okFrom = okFrom || f == cur
	}
	if !okFrom {
		return Rollout{}, fmt.Errorf("rollout %q is %s, not %s: %w", short(id), cur, strings.Join(from, " or "), meta.ErrConflict)
	}
	if err := endOrSet(ctx2, tx, id, state, reason); err != nil {
		return Rollout{}, err
	}
	if err := tx.Commit(); err != nil {
		return Rollout{}, fmt.Errorf("firmware: rollout state: %w", err)
	}
	return s.GetRollout(ctx, id)
}

// endOrSet sets a rollout's state in tx; an ended one's QUEUED devices
// become CANCELED (they will not be started).
func endOrSet(ctx context.Context, tx *sqlx.Tx, id, state, reason string) error {
	ended := state == RolloutCanceled || state == RolloutAborted || state == RolloutCompleted
	_, err := tx.ExecContext(ctx, `UPDATE firmware_rollouts SET state = $2, reason = $3, update_time = now(),
		end_time = CASE WHEN $4 THEN now() END WHERE id = $1`, id, state, reason, ended)
	if err == nil && ended {
		_, err = tx.ExecContext(ctx, `UPDATE firmware_devices SET state = 'CANCELED', reason = $2, update_time = now()
			WHERE rollout_id = $1 AND state = 'QUEUED'`, id, "rollout "+state)
	}
	if err != nil {
		return fmt.Errorf("firmware: rollout state: %w", err)
	}
	return nil
}

// Job is a device's job in a rollout, with the version it last reported.
type Job struct {
	RolloutID  string `json:"rolloutId" db:"rollout_id"`
	DeviceID   string `json:"deviceId" db:"device_id"`
	State      string `json:"state" db:"state"`
	Reported   string `json:"reported,omitempty" db:"reported"`
	Progress   int    `json:"progress" db:"progress"`
	Reason     string `json:"reason,omitempty" db:"reason"`
	Attempts   int    `json:"attempts" db:"attempts"`
	Version    string `json:"version,omitempty" db:"version"` // reported on firmware/version
	StartTime  *int64 `json:"startTime,omitempty" db:"start_ms"`
	UpdateTime int64  `json:"updateTime" db:"update_ms"`
}

// Jobs lists a rollout's devices in states (none: all), by device id,
// and their total.
func (s *Store) Jobs(ctx context.Context, rolloutID string, states []string, offset, limit int) ([]Job, int, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	params := meta.Params{"rollout": rolloutID}
	if len(states) > 0 {
		params["states"] = pq.StringArray(states)
	}
	out, total, err := jobList.Range(ctx, s.ms, offset, limit, params)
	if err != nil {
		return nil, 0, fmt.Errorf("firmware: jobs: %w", err)
	}
	return out, total, nil
}

// jobList is Jobs' statement, by device id.
var jobList = meta.NewList(&meta.Resource{Name: "firmware job", DefaultSort: "j.device_id"}, meta.ListSQL{
	Select: `j.rollout_id, j.device_id, j.state, j.reported, j.progress, j.reason, j.attempts,
		COALESCE(v.version, '') AS version, (extract(epoch FROM j.start_time) * 1000)::bigint AS start_ms,
		(extract(epoch FROM j.update_time) * 1000)::bigint AS update_ms`,
	From:  "firmware_devices j",
	Joins: " LEFT JOIN device_firmware v ON v.device_id = j.device_id",
	Where: []string{"j.rollout_id = @rollout", "j.state = ANY(@states)"},
}, func(j *Job) Job { return *j })

// DeviceVersion is the version a device last reported ("" none).
func (s *Store) DeviceVersion(ctx context.Context, deviceID string) (string, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	var v string
	err := s.db.GetContext(ctx, &v, `SELECT version FROM device_firmware WHERE device_id = $1`, deviceID)
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("firmware: device version: %w", err)
	}
	return v, nil
}

func short(s string) string {
	if len(s) > 80 {
		return s[:80]
	}
	return s
}
