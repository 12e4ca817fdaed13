package firmware

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/lib/pq"
)

// ErrNotOwner: another instance became the engine's owner; a start made
// under this one's epoch was refused.
var ErrNotOwner = errors.New("firmware: no longer the engine's owner")

// Change is a device's job changing state, for live events and metrics.
type Change struct {
	RolloutID string `json:"rolloutId"`
	ProductID string `json:"productId"`
	DeviceID  string `json:"deviceId"`
	State     string `json:"state"`
	Progress  int    `json:"progress,omitempty"`
	Reason    string `json:"reason,omitempty"`
	Version   string `json:"version,omitempty"` // the rollout's target
	Attempts  int    `json:"attempts,omitempty"`
}

// Claim makes this instance the engine's owner: the epoch grows by one,
// and starts made under an older epoch are refused from then on.
func (s *Store) Claim(ctx context.Context) (int64, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	var epoch int64
	if err := s.db.GetContext(ctx, &epoch, `UPDATE firmware_owner SET epoch = epoch + 1 WHERE id = 1 RETURNING epoch`); err != nil {
		return 0, fmt.Errorf("firmware: claim: %w", err)
	}
	return epoch, nil
}

// TokenKey is the key download tokens are signed with: made by the first
// instance that asks and kept, so every instance checks every token.
func (s *Store) TokenKey(ctx context.Context) ([]byte, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	key := make([]byte, 32)
	if _, err := randRead(key); err != nil {
		return nil, err
	}
	var out []byte
	err := s.db.GetContext(ctx, &out, `UPDATE firmware_owner SET token_key = COALESCE(token_key, $1) WHERE id = 1 RETURNING token_key`, key)
	if err != nil {
		return nil, fmt.Errorf("firmware: token key: %w", err)
	}
	return out, nil
}

// active lists the running rollouts.
func (s *Store) active(ctx context.Context) ([]Rollout, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	var out []Rollout
	if err := s.db.SelectContext(ctx, &out, `SELECT `+rolloutCols+` FROM firmware_rollouts WHERE state = 'running' ORDER BY create_time`); err != nil {
		return nil, fmt.Errorf("firmware: running rollouts: %w", err)
	}
	for i := range out {
		out[i].fill()
	}
	return out, nil
}

// expire ends the started jobs of running rollouts whose deadline passed:
// QUEUED again (started again by the pace, first) while attempts are
// left, else TIMED_OUT.
func (s *Store) expire(ctx context.Context, epoch int64) ([]Change, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	var rows []changeRow
	err := s.db.SelectContext(ctx, &rows, `UPDATE firmware_devices j SET
		state = CASE WHEN j.attempts <= r.retries THEN 'QUEUED' ELSE 'TIMED_OUT' END,
		reason = 'no answer within ' || r.timeout_seconds || ' s (attempt ' || j.attempts || ')',
		deadline = NULL, update_time = now()
		FROM firmware_rollouts r, firmware_owner o
		WHERE r.id = j.rollout_id AND r.state = 'running' AND j.state = ANY($1) AND j.deadline < now()
			AND o.id = 1 AND o.epoch = $2
		RETURNING j.rollout_id, r.product_id, j.device_id, j.state, j.reason, r.version, j.attempts`,
		pq.Array(inFlight), epoch)
	if err != nil {
		return nil, fmt.Errorf("firmware: expire: %w", err)
	}
	return changes(rows), nil
}

type changeRow struct {
	RolloutID string `db:"rollout_id"`
	ProductID string `db:"product_id"`
	DeviceID  string `db:"device_id"`
	State     string `db:"state"`
	Reason    string `db:"reason"`
	Version   string `db:"version"`
	Attempts  int    `db:"attempts"`
}

func changes(rows []changeRow) []Change {
	out := make([]Change, len(rows))
	for i, r := range rows {
		out[i] = Change{RolloutID: r.RolloutID, ProductID: r.ProductID, DeviceID: r.DeviceID, State: r.State,
			Reason: r.Reason, Version: r.Version, Attempts: r.Attempts}
	}
	return out
}

// reached marks UPDATED the queued jobs of r whose device already
// reports the target version: nothing to send.
func (s *Store) reached(ctx context.Context, r Rollout) ([]Change, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	var rows []changeRow
	err := s.db.SelectContext(ctx, &rows, `UPDATE firmware_devices j SET state = 'UPDATED', reason = '', update_time = now(), deadline = NULL
		FROM device_firmware v WHERE v.device_id = j.device_id AND j.rollout_id = $1 AND j.state = 'QUEUED' AND v.version = $2
		RETURNING j.rollout_id, $3::text AS product_id, j.device_id, j.state, j.reason, $2::text AS version, j.attempts`,
		r.ID, r.Version, r.ProductID)
	if err != nil {
		return nil, fmt.Errorf("firmware: reached: %w", err)
	}
	return changes(rows), nil
}

// tally is what the abort rule and the end of a rollout look at.
type tally struct {
	Started int `db:"started"` // jobs started at least once
	Failed  int `db:"failed"`  // FAILED or TIMED_OUT
	Open    int `db:"open"`    // QUEUED or started and not ended
}

func (s *Store) tally(ctx context.Context, rolloutID string) (tally, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	var t tally
	err := s.db.GetContext(ctx, &t, `SELECT count(*) FILTER (WHERE first_start IS NOT NULL) AS started,
		count(*) FILTER (WHERE state IN ('FAILED', 'TIMED_OUT')) AS failed,
		count(*) FILTER (WHERE state = 'QUEUED' OR state = ANY($2)) AS open
		FROM firmware_devices WHERE rollout_id = $1`, rolloutID, pq.Array(inFlight))
	if err != nil {
		return tally{}, fmt.Errorf("firmware: tally: %w", err)
	}
	return t, nil
}

// end ends a running rollout (aborted or completed) if it is still
// running and this instance still owns the engine.
func (s *Store) end(ctx context.Context, epoch int64, id, state, reason string) (bool, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	tx, err := s.db.BeginTxx(ctx, nil)
	if err != nil {
		return false, fmt.Errorf("firmware: end rollout: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // after Commit: a no-op
	var cur string
	err = tx.GetContext(ctx, &cur, `SELECT r.state FROM firmware_rollouts r, firmware_owner o
		WHERE r.id = $1 AND o.id = 1 AND o.epoch = $2 FOR UPDATE OF r`, id, epoch)
	if errors.Is(err, sql.ErrNoRows) {
		return false, ErrNotOwner
	}
	if err != nil || cur != RolloutRunning {
		return false, err
	}
	if err := endOrSet(ctx, tx, id, state, reason); err != nil {
		return false, err
	}
	return true, tx.Commit()
}

// startedWithin counts r's jobs first started since from.
func (s *Store) startedWithin(ctx context.Context, rolloutID string, from time.Time) (int, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	var n int
	err := s.db.GetContext(ctx, &n, `SELECT count(*) FROM firmware_devices WHERE rollout_id = $1 AND first_start >= $2`, rolloutID, from)
	if err != nil {
		return 0, fmt.Errorf("firmware: pace: %w", err)
	}
	return n, nil
}

// startSQL moves up to $3 QUEUED jobs of rollout $1 to INITIATED. The
// rows chosen and locked are handed to the UPDATE as one array of their
// row addresses (ctid; an InitPlan run once) and fetched by them (a TID
// scan): no join, and no filter of one set against another, whose order
// the planner would pick from its estimates. A join with the CTE, with
// the statistics taken before a rollout's rows arrived (1 row
// estimated), ran as a nested loop over the CTE, and a device_id =
// ANY(array) filter on the (rollout_id, state) index the same (hence no rollout_id here: the
// rows are the rollout's, locked): n x n
// comparisons, 100M at 10,000 devices, past the store's timeout on every
// step. A locked row keeps its address until this statement's UPDATE;
// were it another (the row moved before the lock), the UPDATE's re-check
// of the address and of state = 'QUEUED' leaves it for the next step.
const startSQL = `WITH c AS (
			SELECT j.ctid AS tid FROM firmware_devices j JOIN devices d ON d.id = j.device_id
			WHERE j.rollout_id = $1 AND j.state = 'QUEUED' AND d.state = 'online' AND (j.attempts > 0) = $2
			ORDER BY j.update_time, j.device_id LIMIT $3 FOR UPDATE OF j SKIP LOCKED)
		UPDATE firmware_devices j SET state = 'INITIATED', attempts = j.attempts + 1, first_start = COALESCE(j.first_start, now()),
			start_time = now(), deadline = now() + make_interval(secs => $4), progress = 0, reported = '', reason = '',
			message_id = md5(random()::text || j.device_id), update_time = now()
		WHERE j.ctid = ANY(ARRAY(SELECT tid FROM c)) AND j.state = 'QUEUED'
		RETURNING j.device_id, j.message_id, j.attempts,
			COALESCE((SELECT d.secure_id FROM devices d WHERE d.id = j.device_id), '') AS secure_id,
			COALESCE((SELECT d.secure_key FROM devices d WHERE d.id = j.device_id), '') AS secure_key`

// Start is a job just started: its upgrade is to be sent, with a link
// bound to the device's credentials (read by the start, by primary key,
// for the rows it returns).
type Start struct {
	DeviceID  string `db:"device_id"`
	MessageID string `db:"message_id"`
	Attempts  int    `db:"attempts"`
	SecureID  string `db:"secure_id"`
	SecureKey string `db:"secure_key"`
}

// start moves up to n QUEUED jobs of r whose device is online to
// INITIATED, under this owner's epoch (ErrNotOwner when it is no longer
// the table's): restarted ones (attempts > 0) when again is true, never
// started ones otherwise. Each row moves once: the statement's condition
// is its state, QUEUED, re-checked on the locked row.
func (s *Store) start(ctx context.Context, epoch int64, r Rollout, again bool, n int) ([]Start, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	tx, err := s.db.BeginTxx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("firmware: start: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // after Commit: a no-op
	var e int64
	// FOR SHARE: a Claim (an UPDATE of this row) waits for this start to
	// commit, and a start after the Claim sees the new epoch.
	if err := tx.GetContext(ctx, &e, `SELECT epoch FROM firmware_owner WHERE id = 1 FOR SHARE`); err != nil {
		return nil, fmt.Errorf("firmware: start: %w", err)
	}
	if e != epoch {
		return nil, ErrNotOwner
	}
	var out []Start
	err = tx.SelectContext(ctx, &out, startSQL, r.ID, again, n, r.TimeoutSeconds)
	if err != nil {
		return nil, fmt.Errorf("firmware: start: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("firmware: start: %w", err)
	}
	return out, nil
}

// ProgressReport is a device's report on firmware/progress.
type ProgressReport struct {
	DeviceID  string
	RolloutID string
	Version   string
	State     string
	Progress  int
	Reason    string
}

// Progress records a device's report on firmware/progress for rolloutID
// at version (ProgressBatch of one).
func (s *Store) Progress(ctx context.Context, deviceID, rolloutID, version, state string, progress int, reason string) (Change, bool, error) {
	cs, err := s.ProgressBatch(ctx, []ProgressReport{{DeviceID: deviceID, RolloutID: rolloutID, Version: version,
		State: state, Progress: progress, Reason: reason}})
	if err != nil || len(cs) == 0 {
		return Change{}, false, err
	}
	return cs[0], true, nil
}

// ProgressBatch records devices' reports on firmware/progress in one
// statement (all or none): a started job takes the reported state
// (UPDATED stays UPDATING: only the version report makes a job UPDATED;
// FAILED ends it with the reason). A report of another rollout or
// version, or of a job not started, changes nothing (no Change for it).
// The batch must hold at most one report per device and rollout (one
// statement changes a row once); the caller keeps a device's reports in
// order across batches.
func (s *Store) ProgressBatch(ctx context.Context, reps []ProgressReport) ([]Change, error) {
	if len(reps) == 0 {
		return nil, nil
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	n := len(reps)
	dev, roll, ver, st, reason := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	prog := make([]int64, n)
	for i, r := range reps {
		dev[i], roll[i], ver[i], st[i], prog[i], reason[i] = r.DeviceID, r.RolloutID, r.Version, r.State, int64(r.Progress), r.Reason
	}
	var rows []struct {
		changeRow
		Progress int `db:"progress"`
	}
	err := s.db.SelectContext(ctx, &rows, `UPDATE firmware_devices j SET
		state = CASE b.state WHEN 'UPDATED' THEN 'UPDATING' ELSE b.state END,
		reported = b.state, progress = CASE WHEN b.state = 'DOWNLOADING' THEN b.progress
			WHEN b.state IN ('DOWNLOADED', 'VERIFIED', 'UPDATING', 'UPDATED') THEN 100 ELSE j.progress END,
		reason = b.reason, deadline = CASE WHEN b.state = 'FAILED' THEN NULL ELSE j.deadline END, update_time = now()
		FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::int[], $6::text[])
			AS b(device_id, rollout_id, version, state, progress, reason), firmware_rollouts r
		WHERE j.rollout_id = b.rollout_id AND j.device_id = b.device_id AND r.id = b.rollout_id AND r.version = b.version
			AND j.state = ANY($7)
		RETURNING j.rollout_id, r.product_id, j.device_id, j.state, j.reason, r.version, j.attempts, b.progress`,
		pq.Array(dev), pq.Array(roll), pq.Array(ver), pq.Array(st), pq.Array(prog), pq.Array(reason), pq.Array(inFlight))
	if err != nil {
		return nil, fmt.Errorf("firmware: progress: %w", err)
	}
	out := make([]Change, len(rows))
	for i, r := range rows {
		out[i] = changes([]changeRow{r.changeRow})[0]
		out[i].Progress = r.Progress
	}
	return out, nil
}

// VersionReport is a device's report on firmware/version.
type VersionReport struct {
	DeviceID string
	Version  string
}

// Version records the version a device reports on firmware/version
// (VersionBatch of one).
func (s *Store) Version(ctx context.Context, deviceID, version string) ([]Change, error) {
	return s.VersionBatch(ctx, []VersionReport{{DeviceID: deviceID, Version: version}})
}

// VersionBatch records the versions devices report on firmware/version
// and applies them to their jobs in running or paused rollouts, in one
// transaction of two statements (all or none): a job at its target
// version is UPDATED; a job that the device had begun (it answered the
// upgrade) or finished, reported on another version, was not installed
// or rolled back: QUEUED again (the pace starts it again) while attempts
// are left, else FAILED. A job INITIATED is left to its timeout: a
// version report sent at connect may cross the upgrade. The batch must
// hold at most one report per device (one statement changes a row once;
// of several, the last is kept); the caller keeps a device's reports in
// order across batches.
func (s *Store) VersionBatch(ctx context.Context, reps []VersionReport) ([]Change, error) {
	if len(reps) == 0 {
		return nil, nil
	}
	last := make(map[string]string, len(reps))
	for _, r := range reps {
		last[r.DeviceID] = r.Version
	}
	dev, ver := make([]string, 0, len(last)), make([]string, 0, len(last))
	for d := range last {
		dev = append(dev, d)
	}
	sort.Strings(dev) // rows locked in one order by every batch
	for _, d := range dev {
		ver = append(ver, last[d])
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	tx, err := s.db.BeginTxx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("firmware: version: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // after Commit: a no-op
	_, err = tx.ExecContext(ctx, `INSERT INTO device_firmware (device_id, version, report_time)
		SELECT b.device_id, b.version, now() FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS b(device_id, version, n)
		WHERE EXISTS (SELECT 1 FROM devices WHERE id = b.device_id) ORDER BY b.n
		ON CONFLICT (device_id) DO UPDATE SET version = EXCLUDED.version, report_time = EXCLUDED.report_time`,
		pq.Array(dev), pq.Array(ver))
	if err != nil {
		return nil, fmt.Errorf("firmware: version: %w", err)
	}
	var rows []changeRow
	err = tx.SelectContext(ctx, &rows, `UPDATE firmware_devices j SET
		state = CASE WHEN r.version = b.version THEN 'UPDATED' WHEN j.attempts <= r.retries THEN 'QUEUED' ELSE 'FAILED' END,
		reason = CASE WHEN r.version = b.version THEN '' ELSE 'reported version ' || b.version || ' after attempt ' || j.attempts END,
		deadline = NULL, update_time = now()
		FROM unnest($1::text[], $2::text[]) AS b(device_id, version), firmware_rollouts r
		WHERE j.device_id = b.device_id AND r.id = j.rollout_id
			AND ((r.version = b.version AND j.state = ANY($3))
				OR (r.version <> b.version AND r.state IN ('running', 'paused') AND j.state = ANY($4)))
		RETURNING j.rollout_id, r.product_id, j.device_id, j.state, j.reason, r.version, j.attempts`,
		pq.Array(dev), pq.Array(ver), pq.Array(append([]string{StateQueued}, inFlight...)),
		pq.Array([]string{StateDownloading, StateDownloaded, StateVerified, StateUpdating, StateUpdated}))
	if err != nil {
		return nil, fmt.Errorf("firmware: version: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("firmware: version: %w", err)
	}
	return changes(rows), nil
}

// PackageFile is what a download sends of a package.
type PackageFile struct {
	FileName string `db:"file_name"`
	Size     int64  `db:"size"`
	SHA256   string `db:"sha256"`
	Found    bool   `db:"-"`
}

// PackageFile reads a package's file, size and SHA-256 (Found false when
// the package is gone).
func (s *Store) PackageFile(ctx context.Context, packageID string) (PackageFile, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	var p PackageFile
	err := s.db.GetContext(ctx, &p, `SELECT file_name, size, sha256 FROM firmware_packages WHERE id = $1`, packageID)
	if errors.Is(err, sql.ErrNoRows) {
		return p, nil
	}
	if err != nil {
		return p, fmt.Errorf("firmware: package file: %w", err)
	}
	p.Found = true
	return p, nil
}

// SecureIDOwner is the device whose configuration.secureId is secureID,
// with its key ("" when none).
func (s *Store) SecureIDOwner(ctx context.Context, secureID string) (id, key string, err error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	var row struct {
		ID  string `db:"id"`
		Key string `db:"secure_key"`
	}
	err = s.db.GetContext(ctx, &row, `SELECT id, secure_key FROM devices WHERE secure_id = $1 AND secure_id <> '' LIMIT 1`, secureID)
	if errors.Is(err, sql.ErrNoRows) {
		return "", "", nil
	}
	if err != nil {
		return "", "", fmt.Errorf("firmware: credentials: %w", err)
	}
	return row.ID, row.Key, nil
}
