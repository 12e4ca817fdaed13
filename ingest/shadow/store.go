package shadow

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"devicehub/meta"
)

// Limits of a shadow's desired state (REFERENCE.md "Desired state").
const (
	// MaxFields is the most properties desired may hold.
	MaxFields = 64
	// MaxBytes bounds desired's JSON text: values, times and authors.
	MaxBytes = 16 << 10
)

var (
	// ErrVersionConflict: a conditional change named a version that is
	// not the shadow's; nothing was changed.
	ErrVersionConflict = errors.New("shadow version conflict")
	// ErrTooLarge: the change would take desired past MaxFields or
	// MaxBytes; nothing was changed.
	ErrTooLarge = errors.New("desired state over its limits")
)

// Field is one property of desired: its value, when it was set (epoch
// ms) and by whom (a user id).
type Field struct {
	Value json.RawMessage `json:"value"`
	Time  int64           `json:"time"`
	By    string          `json:"by,omitempty"`
}

// State is a shadow as stored: a device without a row has version 0 and
// no desired state.
type State struct {
	DeviceID   string
	Version    int64
	Desired    map[string]Field
	UpdateTime time.Time // of the last change; zero for version 0
}

// Change is a change of desired: Set merges properties in (each with its
// value's JSON), Remove takes properties out. IfVersion, when not nil,
// makes it conditional on the shadow's version.
type Change struct {
	Set       map[string]json.RawMessage
	Remove    []string
	By        string
	At        time.Time
	IfVersion *int64
}

// Store keeps shadows in PostgreSQL (table device_shadows, 00021).
type Store struct {
	db      *sqlx.DB
	meta    *meta.Store // device references
	timeout time.Duration
}

// NewStore is a store on ms's database; devices are read through ms;
// each call takes at most timeout (<= 0: 10 s).
func NewStore(ms *meta.Store, timeout time.Duration) *Store {
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	return &Store{db: ms.DB(), meta: ms, timeout: timeout}
}

type row struct {
	DeviceID   string    `db:"device_id"`
	Version    int64     `db:"version"`
	Desired    []byte    `db:"desired"`
	UpdateTime time.Time `db:"update_time"`
}

func (r row) state() (State, error) {
	st := State{DeviceID: r.DeviceID, Version: r.Version, UpdateTime: r.UpdateTime, Desired: map[string]Field{}}
	if err := json.Unmarshal(r.Desired, &st.Desired); err != nil {
		return State{}, fmt.Errorf("shadow: desired of %q: %w", r.DeviceID, err)
	}
	return st, nil
}

// Get returns a device's shadow (version 0 and nothing desired when it
// has none).
func (s *Store) Get(ctx context.Context, deviceID string) (State, error) {
	m, err := s.GetMany(ctx, []string{deviceID})
	if err != nil {
		return State{}, err
	}
	if st, ok := m[deviceID]; ok {
		return st, nil
	}
	return State{DeviceID: deviceID, Desired: map[string]Field{}}, nil
}

// GetMany returns the shadows of the devices that have one, in one query.
func (s *Store) GetMany(ctx context.Context, deviceIDs []string) (map[string]State, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	var rows []row
	if err := s.db.SelectContext(ctx, &rows, `SELECT device_id, version, desired, update_time
		FROM device_shadows WHERE device_id = ANY($1)`, pq.Array(deviceIDs)); err != nil {
		return nil, fmt.Errorf("shadow: read: %w", err)
	}
	out := make(map[string]State, len(rows))
	for _, r := range rows {
		st, err := r.state()
		if err != nil {
			return nil, err
		}
		out[r.DeviceID] = st
	}
	return out, nil
}

// Apply makes ch on each device's shadow in one statement, which bumps
// each changed shadow's version where it changes desired, and returns the
// shadows changed. A device is left out, unchanged, when the change would
// take its desired past the limits, when IfVersion is not its version, or
// when it has no shadow and ch only removes. With one device Apply says
// why: ErrVersionConflict, ErrTooLarge, or no error and no shadow for a
// removal from nothing.
func (s *Store) Apply(ctx context.Context, deviceIDs []string, ch Change) ([]State, error) {
	at := ch.At
	if at.IsZero() {
		at = time.Now()
	}
	set := make(map[string]Field, len(ch.Set))
	for id, v := range ch.Set {
		set[id] = Field{Value: v, Time: at.UnixMilli(), By: ch.By}
	}
	patch, err := json.Marshal(set)
	if err != nil {
		return nil, fmt.Errorf("shadow: encode change: %w", err)
	}
	if len(set) > MaxFields || len(patch) > MaxBytes {
		return nil, ErrTooLarge
	}
	remove := ch.Remove
	if remove == nil {
		remove = []string{}
	}
	var ifVersion sql.NullInt64
	if ch.IfVersion != nil {
		ifVersion = sql.NullInt64{Int64: *ch.IfVersion, Valid: true}
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	// A device with a shadow reaches ON CONFLICT, where the version and
	// the limits are checked against the row it locks; one without is
	// inserted at version 1 unless the change is conditional on another
	// version or only removes.
	var rows []row
	err = s.db.SelectContext(ctx, &rows, `WITH t AS (SELECT DISTINCT unnest($1::text[]) AS device_id)
		INSERT INTO device_shadows AS s (device_id, version, desired, update_time)
		SELECT t.device_id, 1, $2::jsonb, $7 FROM t
		WHERE EXISTS (SELECT 1 FROM device_shadows x WHERE x.device_id = t.device_id)
			OR (($4::bigint IS NULL OR $4 = 0) AND $2::jsonb <> '{}'::jsonb)
		ON CONFLICT (device_id) DO UPDATE
		SET desired = (s.desired - $3::text[]) || EXCLUDED.desired, version = s.version + 1, update_time = EXCLUDED.update_time
		WHERE ($4::bigint IS NULL OR s.version = $4)
			AND (SELECT count(*) FROM jsonb_object_keys((s.desired - $3::text[]) || EXCLUDED.desired)) <= $5
			AND octet_length(((s.desired - $3::text[]) || EXCLUDED.desired)::text) <= $6
		RETURNING device_id, version, desired, update_time`,
		pq.Array(deviceIDs), patch, pq.Array(remove), ifVersion, MaxFields, MaxBytes, at)
	if err != nil {
		return nil, fmt.Errorf("shadow: change: %w", err)
	}
	out := make([]State, 0, len(rows))
	for _, r := range rows {
		st, err := r.state()
		if err != nil {
			return nil, err
		}
		out = append(out, st)
	}
	if len(deviceIDs) == 1 && len(out) == 0 {
		cur, err := s.Get(ctx, deviceIDs[0])
		if err != nil {
			return nil, err
		}
		switch {
		case ch.IfVersion != nil && cur.Version != *ch.IfVersion:
			return nil, fmt.Errorf("%w: the shadow is at version %d", ErrVersionConflict, cur.Version)
		case cur.Version > 0 || len(set) > 0:
			return nil, fmt.Errorf("%w: at most %d properties and %d bytes", ErrTooLarge, MaxFields, MaxBytes)
		}
	}
	return out, nil
}

// MaxBulk is the most devices one bulk change reaches.
const MaxBulk = 10_000

// DeviceRefs reads the references of many devices in one query
// (meta.Store.GetDeviceRefs): those of ids, or with ids nil every device
// of productID, at most MaxBulk+1 (the caller refuses more). Devices that
// do not exist are left out.
func (s *Store) DeviceRefs(ctx context.Context, ids []string, productID string) ([]meta.DeviceRef, error) {
	return s.meta.GetDeviceRefs(ctx, ids, productID, MaxBulk+1)
}

// Settings are a product's shadow settings.
type Settings struct {
	// ClearReached: a desired property the device reports is taken out of
	// desired (a change: the version grows); otherwise it stays as the
	// target, out of the delta while the reported value equals it.
	ClearReached bool `json:"clearReached"`
}

// Settings reads a product's settings (the defaults when it has none).
func (s *Store) Settings(ctx context.Context, productID string) (Settings, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	var st Settings
	err := s.db.GetContext(ctx, &st.ClearReached, `SELECT clear_reached FROM product_shadow_settings WHERE product_id = $1`, productID)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return Settings{}, fmt.Errorf("shadow: settings: %w", err)
	}
	return st, nil
}

// SetSettings stores a product's settings.
func (s *Store) SetSettings(ctx context.Context, productID string, st Settings) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	_, err := s.db.ExecContext(ctx, `INSERT INTO product_shadow_settings (product_id, clear_reached) VALUES ($1, $2)
		ON CONFLICT (product_id) DO UPDATE SET clear_reached = EXCLUDED.clear_reached`, productID, st.ClearReached)
	var pqErr *pq.Error
	if errors.As(err, &pqErr) && pqErr.Code == "23503" { // foreign_key_violation
		return fmt.Errorf("product %q: %w", productID, meta.ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("shadow: settings: %w", err)
	}
	return nil
}

// ClearReached takes the reached properties out of a device's desired
// state if it is still at version: one change, one version. It returns
// the new state, or ok false when the shadow changed meanwhile (the next
// read clears them).
func (s *Store) ClearReached(ctx context.Context, deviceID string, version int64, props []string) (State, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	var rows []row
	err := s.db.SelectContext(ctx, &rows, `UPDATE device_shadows SET desired = desired - $3::text[], version = version + 1,
		update_time = now() WHERE device_id = $1 AND version = $2 RETURNING device_id, version, desired, update_time`,
		deviceID, version, pq.Array(props))
	if err != nil {
		return State{}, false, fmt.Errorf("shadow: clear reached: %w", err)
	}
	if len(rows) == 0 {
		return State{}, false, nil
	}
	st, err := rows[0].state()
	return st, err == nil, err
}
