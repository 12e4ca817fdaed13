package meta

import (
	"context"
	"database/sql"
	"devicehub/schema"
	"errors"
	"fmt"
	"time"

	"github.com/lib/pq"
)

// Device state for ingest: statuses and references read on messages, and
// the batched online/offline changes.

// noTrigramEquality keeps a transaction's lookups of devices by id off the
// trigram index devices_id_trgm: a GIN index is read only through bitmap
// scans, the primary key through index scans too. The planner costs an
// equality through the trigram index below one through the primary key,
// and with ids sharing a prefix its posting lists are the whole table: 36
// ms a device at 100,000 devices (bench fleet-connect).
const noTrigramEquality = `SET LOCAL enable_bitmapscan = off`

// DeviceStatus is what ingest checks on every message of a device.
type DeviceStatus struct {
	ProductID, State string
	OwnModel         bool // a thing model of its own, not its product's
}

// DeviceStatuses returns, in one query, the status of each of ids that
// exists within ctx's products (LimitProducts); others are absent from
// the map.
func (s *Store) DeviceStatuses(ctx context.Context, ids []string) (map[string]DeviceStatus, error) {
	ctx, cancel := s.timeout(ctx)
	defer cancel()
	// A join with the ids, not id = ANY($1), and no bitmap scans
	// (noTrigramEquality): else the planner takes the trigram index
	// devices_id_trgm (pg_trgm supports equality), whose posting lists are
	// the whole table when ids share a prefix: 3.4 s for 500 ids of 2,000
	// devices named fleet...-d<n> with = ANY, 26 s for 707 ids of 100,000
	// joined, against 3 and 33 ms through the primary key.
	tx, err := s.db.BeginTxx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return nil, fmt.Errorf("meta: device statuses: %w", err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, noTrigramEquality); err != nil {
		return nil, fmt.Errorf("meta: device statuses: %w", err)
	}
	rows, err := tx.QueryContext(ctx, `SELECT d.id, d.product_id, d.state, d.metadata IS NOT NULL FROM devices d
		JOIN (SELECT DISTINCT unnest($1::text[]) AS id) u ON u.id = d.id`, pq.StringArray(ids))
	if err != nil {
		return nil, fmt.Errorf("meta: device statuses: %w", err)
	}
	defer rows.Close()
	out := make(map[string]DeviceStatus, len(ids))
	for rows.Next() {
		var id string
		var st DeviceStatus
		if err := rows.Scan(&id, &st.ProductID, &st.State, &st.OwnModel); err != nil {
			return nil, fmt.Errorf("meta: device statuses: %w", err)
		}
		if ProductAllowed(ctx, st.ProductID) { // outside ctx's products: as if it did not exist
			out[id] = st
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("meta: device statuses: %w", err)
	}
	return out, nil
}

// DeviceRef is what ingest and commands need to know about a device.
type DeviceRef struct {
	ID, ProductID, State string
	Regulator            bool   // the product is a controller
	Metadata             string // the thing model in force
	Name, ProductName    string
	CreatorID            string
}

// GetDeviceRef returns a device's reference, or ErrNotFound.
func (s *Store) GetDeviceRef(ctx context.Context, id string) (DeviceRef, error) {
	ctx, cancel := s.timeout(ctx)
	defer cancel()
	var r deviceRefRow
	err := s.db.GetContext(ctx, &r, deviceRefQuery+` WHERE d.id = $1`, id)
	if errors.Is(err, sql.ErrNoRows) {
		return DeviceRef{}, fmt.Errorf("device %q: %w", schema.Truncate(id, 80), ErrNotFound)
	}
	if err != nil {
		return DeviceRef{}, fmt.Errorf("meta: device ref: %w", err)
	}
	return DeviceRef(r), nil
}

// GetDeviceRefs reads the references of many devices in one query (what
// GetDeviceRef reads of one): those of ids, or with ids nil the devices
// of productID in id order, at most limit. Devices that do not exist are
// left out.
func (s *Store) GetDeviceRefs(ctx context.Context, ids []string, productID string, limit int) ([]DeviceRef, error) {
	ctx, cancel := s.timeout(ctx)
	defer cancel()
	var rows []deviceRefRow
	var err error
	if ids != nil {
		err = s.db.SelectContext(ctx, &rows, deviceRefQuery+` WHERE d.id = ANY($1)`, pq.Array(ids))
	} else {
		err = s.db.SelectContext(ctx, &rows, deviceRefQuery+` WHERE d.product_id = $1 ORDER BY d.id LIMIT $2`, productID, limit)
	}
	if err != nil {
		return nil, fmt.Errorf("meta: device refs: %w", err)
	}
	out := make([]DeviceRef, len(rows))
	for i, r := range rows {
		out[i] = DeviceRef(r)
	}
	return out, nil
}

// deviceRefQuery reads DeviceRefs: a device with its product's name,
// regulator flag and, without a model of its own, its product's model.
const deviceRefQuery = `SELECT d.id, d.product_id, d.state, p.regulator,
		COALESCE(d.metadata, p.metadata) AS metadata, d.name, p.name AS product_name, d.creator_id
		FROM devices d JOIN products p ON p.id = d.product_id`

// deviceRefRow is a DeviceRef as deviceRefQuery reads it.
type deviceRefRow struct {
	ID          string `db:"id"`
	ProductID   string `db:"product_id"`
	State       string `db:"state"`
	Regulator   bool   `db:"regulator"`
	Metadata    string `db:"metadata"`
	Name        string `db:"name"`
	ProductName string `db:"product_name"`
	CreatorID   string `db:"creator_id"`
}

// StateChange is one connection event of a device, from ingest, or
// several of one device folded into one (Fold).
type StateChange struct {
	DeviceID string
	Online   bool
	At       time.Time
	// Address is the remote address of the device's connection: of an
	// online change, or of one folded into it or into a later offline
	// change; "" keeps the stored one.
	Address string
	// OtherAt is the latest time of the changes of the other kind folded
	// into this one (a will's, for an online change; a birth's, for an
	// offline one), zero if none: it is stored as that kind's time as a
	// change of its own at that time would be.
	OtherAt time.Time
}

// Fold returns the one change that stores what c and then next, changes
// of the same device, store when written one by one in the order of
// their times: the later of the two (next on equal times, as in a batch),
// with OtherAt the latest time of the other kind among them and, if it
// has none, the address of the earlier (an address folded from a change
// older than the stored state is stored all the same). ingest folds a
// device's queued change into the one behind it, so that a storm of wills
// and births writes one change per device.
func (c StateChange) Fold(next StateChange) StateChange {
	early, late := c, next
	if next.At.Before(c.At) {
		early, late = next, c
	}
	other := early.OtherAt // of the kind that is not late's
	if early.Online != late.Online {
		other = early.At
	}
	if other.After(late.OtherAt) {
		late.OtherAt = other
	}
	if late.Address == "" {
		late.Address = early.Address
	}
	return late
}

// ApplyStateChanges writes a batch of state changes in one transaction: online
// sets state online and online_time, offline sets state offline and
// offline_time, and either the address if it has one; a change's OtherAt
// (Fold) sets the other kind's time where it is not older than the stored
// times. Devices in state notActive are left alone, and so is a change
// older than the device's last online or offline time (out-of-order
// delivery). Of several changes of one device in the batch the latest
// wins (the later in the slice on equal times). It returns the number of
// devices changed.
func (s *Store) ApplyStateChanges(ctx context.Context, changes []StateChange) (int, error) {
	defer s.pages.changed("devices") // once committed: the next page read sees it
	if len(changes) == 0 {
		return 0, nil
	}
	args := stateChangeArgs(changes)
	ctx, cancel := s.timeout(ctx)
	defer cancel()
	tx, err := s.db.BeginTxx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("meta: apply state changes: %w", err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, noTrigramEquality); err != nil {
		return 0, fmt.Errorf("meta: apply state changes: %w", err)
	}
	if _, err := tx.ExecContext(ctx, stateLockSQL, args[0]); err != nil {
		return 0, fmt.Errorf("meta: apply state changes: %w", err)
	}
	res, err := tx.ExecContext(ctx, stateUpdateSQL, args...)
	if err != nil {
		return 0, fmt.Errorf("meta: apply state changes: %w", err)
	}
	n, _ := res.RowsAffected()
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("meta: apply state changes: %w", err)
	}
	return int(n), nil
}

// stateChangeArgs are the parameters of stateLockSQL ($1) and
// stateUpdateSQL: the changes' device ids, online flags, times,
// addresses and other kind's times ("" for none), as arrays.
func stateChangeArgs(changes []StateChange) []any {
	ids := make([]string, len(changes))
	online := make([]bool, len(changes))
	at := make([]string, len(changes))
	addr := make([]string, len(changes))
	other := make([]string, len(changes)) // "": none
	for i, c := range changes {
		ids[i], online[i], addr[i] = c.DeviceID, c.Online, c.Address
		at[i] = c.At.UTC().Format(time.RFC3339Nano)
		if !c.OtherAt.IsZero() {
			other[i] = c.OtherAt.UTC().Format(time.RFC3339Nano)
		}
	}
	return []any{pq.StringArray(ids), pq.BoolArray(online), pq.StringArray(at), pq.StringArray(addr), pq.StringArray(other)}
}

// stateLockSQL locks a batch's rows in id order first: the UPDATE's join
// visits them in no set order, and two ingest instances updating
// overlapping batches would otherwise deadlock. (Joined, not id =
// ANY($1): see DeviceStatuses.)
const stateLockSQL = `SELECT 1 FROM devices d JOIN (SELECT DISTINCT unnest($1::text[]) AS id) u ON u.id = d.id
		ORDER BY d.id FOR NO KEY UPDATE OF d`

// stateUpdateSQL writes a batch's changes (ApplyStateChanges). It sets no
// indexed column, so that a row's new version is a HOT update wherever
// its page has room (schema 00015, 00033).
const stateUpdateSQL = `UPDATE devices d SET
			state = CASE WHEN c.online THEN 'online' ELSE 'offline' END,
			online_time = CASE WHEN c.online THEN c.at
				WHEN c.other >= COALESCE(GREATEST(d.online_time, d.offline_time), '-infinity'::timestamptz) THEN c.other
				ELSE d.online_time END,
			offline_time = CASE WHEN NOT c.online THEN c.at
				WHEN c.other >= COALESCE(GREATEST(d.online_time, d.offline_time), '-infinity'::timestamptz) THEN c.other
				ELSE d.offline_time END,
			address = CASE WHEN c.address <> '' THEN c.address ELSE d.address END
		FROM (SELECT DISTINCT ON (id) id, online, at, address, NULLIF(other, '')::timestamptz AS other
			FROM unnest($1::text[], $2::bool[], $3::timestamptz[], $4::text[], $5::text[]) WITH ORDINALITY AS u(id, online, at, address, other, n)
			ORDER BY id, at DESC, n DESC) c
		WHERE d.id = c.id AND d.state <> 'notActive'
			AND c.at >= COALESCE(GREATEST(d.online_time, d.offline_time), '-infinity'::timestamptz)`
