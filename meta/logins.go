package meta

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"devicehub/schema"
	"devicehub/schema/backoff"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/lib/pq"
)

// DeviceLogin is what the broker must know of a device for it to connect:
// client id = ID, username = SecureID, password = SecureKey, and its
// topics below /ProductID/ID/. Only deployed devices may connect.
type DeviceLogin struct {
	ID        string `db:"id"`
	ProductID string `db:"product_id"`
	SecureID  string `db:"secure_id"`
	SecureKey string `db:"secure_key"`
	Deployed  bool   `db:"deployed"`
	// Version is the row's login_version: it grows with every change of
	// the fields above (schema/postgres/00009).
	Version int64 `db:"login_version"`
}

// LoginChange names a committed change of what the broker must hold for
// device ID: the row's login_version after it. The broker holds the change
// once the syncer has applied the device at Version or later.
type LoginChange struct {
	ID      string `db:"id"`
	Version int64  `db:"version"`
}

// A device without a secureId or key (only SQL written by hand makes one)
// has no login: it counts as not deployed.
const (
	deviceLoginColumns = `id, product_id, secure_id, secure_key, login_version, ` + hasLogin + ` AS deployed`
	hasLogin           = `(state <> 'notActive' AND secure_id <> '' AND secure_key <> '')`
)

// DeviceLogins returns the logins of the devices of ids that exist.
// (Joined with the ids, not id = ANY, and off the trigram index:
// noTrigramEquality in meta/device_state.go says why.)
func (s *Store) DeviceLogins(ctx context.Context, ids []string) ([]DeviceLogin, error) {
	ctx, cancel := s.timeout(ctx)
	defer cancel()
	tx, err := s.db.BeginTxx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return nil, fmt.Errorf("meta: device logins: %w", err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, noTrigramEquality); err != nil {
		return nil, fmt.Errorf("meta: device logins: %w", err)
	}
	var out []DeviceLogin
	if err := tx.SelectContext(ctx, &out, `SELECT `+deviceLoginColumns+` FROM devices JOIN (SELECT DISTINCT unnest($1::text[]) AS id) u USING (id)`,
		pq.StringArray(ids)); err != nil {
		return nil, fmt.Errorf("meta: device logins: %w", err)
	}
	return out, nil
}

// EachDeployedDeviceLogin calls fn with the login of every deployed
// device, streamed from one query (a fleet of a million is not held in
// memory); an error from fn stops it and is returned.
func (s *Store) EachDeployedDeviceLogin(ctx context.Context, fn func(DeviceLogin) error) error {
	// Not s.timeout: a large fleet takes longer than one API call.
	ctx, cancel := context.WithTimeout(ctx, 100*s.opts.QueryTimeout)
	defer cancel()
	rows, err := s.db.QueryxContext(ctx, `SELECT `+deviceLoginColumns+` FROM devices WHERE `+hasLogin)
	if err != nil {
		return fmt.Errorf("meta: deployed device logins: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var d DeviceLogin
		if err := rows.StructScan(&d); err != nil {
			return fmt.Errorf("meta: deployed device logins: %w", err)
		}
		if err := fn(d); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("meta: deployed device logins: %w", err)
	}
	return nil
}

// RecentLoginChanges returns the login version of every device written
// (modify_time) within the last window: a syncer that has just synced
// everything confirms them to their writers, who may be waiting for a
// change whose announcement reached no syncer.
func (s *Store) RecentLoginChanges(ctx context.Context, window time.Duration) ([]LoginChange, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*s.opts.QueryTimeout)
	defer cancel()
	var out []LoginChange
	if err := s.db.SelectContext(ctx, &out, `SELECT id AS "id", login_version AS "version" FROM devices
		WHERE modify_time > now() - make_interval(secs => $1)`, window.Seconds()); err != nil {
		return nil, fmt.Errorf("meta: recent login changes: %w", err)
	}
	return out, nil
}

// deviceChannel is where PostgreSQL announces device login and status
// changes (schema/postgres/00004_device_logins.sql, 00035).
const deviceChannel = "devicehub_device"

// WatchDevices calls changed with the id of each device whose login or
// status changed (created deployed, deployed, undeployed, deleted, new
// secureId or key, another product, a thing model of its own given or
// taken: 00004, 00035), as PostgreSQL commits it, whoever wrote it:
// ingest/devauth's login sync and ingest's device cache follow it. It calls changed
// with no id when anything may have changed: once listening, and after a
// reconnection (announcements made meanwhile are lost). It returns when
// ctx ends, also while PostgreSQL cannot be reached (the listener waits
// for its first connection until it is closed).
func (s *Store) WatchDevices(ctx context.Context, changed func(ids ...string)) error {
	err := s.listen(ctx, deviceChannel, func(id string) { changed(id) }, func() { changed() })
	if err != nil {
		return fmt.Errorf("meta: watch devices: %w", err)
	}
	return nil
}

// listen LISTENs on channel on a connection of its own until ctx ends,
// calling notify with each announcement's payload, and missed once
// listening and after every reconnection: announcements made while it was
// not listening are lost. It returns nil when ctx ends, also while
// PostgreSQL cannot be reached (the listener waits for its first
// connection until it is closed), and an error if it cannot listen.
func (s *Store) listen(ctx context.Context, channel string, notify func(payload string), missed func()) error {
	err := Listen(s.opts.DSN, []string{channel}, ListenHandler{
		Notify:    func(_, payload string) { notify(payload) },
		Listening: missed,
	}, ctx.Done())
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// Lock blocks until this process holds the PostgreSQL advisory lock key,
// on a connection of its own: one instance among all that share the
// database. lost is closed when that connection fails (the lock is gone
// with it); release unlocks and returns the connection.
func (s *Store) Lock(ctx context.Context, key int64) (lost <-chan struct{}, release func(), err error) {
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("meta: lock: %w", err)
	}
	if _, err := conn.ExecContext(ctx, `SELECT pg_advisory_lock($1)`, key); err != nil {
		_ = conn.Raw(func(any) error { return driver.ErrBadConn }) // a cancelled wait: drop the session
		conn.Close()
		return nil, nil, fmt.Errorf("meta: lock: %w", err)
	}
	lostc := make(chan struct{})
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		backoff.Every(stop, 2*time.Second, func(time.Time) bool {
			pctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			err := conn.PingContext(pctx)
			cancel()
			if err != nil {
				close(lostc)
				return false
			}
			return true
		})
	}()
	return lostc, func() {
		close(stop)
		<-done
		uctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := conn.ExecContext(uctx, `SELECT pg_advisory_unlock($1)`, key); err != nil {
			_ = conn.Raw(func(any) error { return driver.ErrBadConn }) // drop the session, and the lock with it
		}
		conn.Close()
	}, nil
}

// RotateDeviceSecret gives a device a new random secureKey and returns
// its detail with the new key shown: the only response but the creating
// one that holds it. The broker drops the device's sessions with the old
// key within moments (ingest/dynsec).
func (s *Store) RotateDeviceSecret(ctx context.Context, id string, modifier User) (DeviceDetail, error) {
	defer s.pages.changed("devices", "product_device_counts") // once committed: the next page read sees it
	key := newSecret()
	ctx, cancel := s.timeout(ctx)
	defer cancel()
	var before int64
	limit, limitArg := limitCond(ctx, "product_id", 5)
	err := s.db.GetContext(ctx, &before, `UPDATE devices d SET secure_key = $2, modify_time = `+nextModifyTime+`, modifier_id = $3,
		modifier_name = $4 FROM (SELECT id, login_version FROM devices WHERE id = $1 AND `+limit+` FOR UPDATE) o
		WHERE d.id = o.id RETURNING o.login_version`, id, key, modifier.ID, userName(modifier), limitArg)
	if errors.Is(err, sql.ErrNoRows) {
		return DeviceDetail{}, fmt.Errorf("device %q: %w", schema.Truncate(id, 80), ErrNotFound)
	}
	if err != nil {
		return DeviceDetail{}, fmt.Errorf("meta: rotate device secret: %w", err)
	}
	d, err := s.getDeviceDetail(ctx, s.db, id, false)
	if err != nil {
		return DeviceDetail{}, err
	}
	d.Configuration.SecureKey = key
	d.Login = loginChange(before, d)
	return d, nil
}

// loginsAppliedChannel is where the syncer announces the device logins
// the broker holds (NotifyLoginsApplied).
const loginsAppliedChannel = "devicehub_login_applied"

// maxNotifyPayload is below PostgreSQL's limit of 8000 bytes.
const maxNotifyPayload = 7900

// NotifyLoginsApplied tells every instance (WatchLoginsApplied) that the
// broker holds these devices' logins at these versions or later: one
// NOTIFY per 7,900 bytes of "version:id" lines.
func (s *Store) NotifyLoginsApplied(ctx context.Context, applied []LoginChange) error {
	ctx, cancel := s.timeout(ctx)
	defer cancel()
	var b strings.Builder
	flush := func() error {
		if b.Len() == 0 {
			return nil
		}
		_, err := s.db.ExecContext(ctx, `SELECT pg_notify($1, $2)`, loginsAppliedChannel, b.String())
		b.Reset()
		if err != nil {
			return fmt.Errorf("meta: notify logins applied: %w", err)
		}
		return nil
	}
	for _, a := range applied {
		line := strconv.FormatInt(a.Version, 10) + ":" + a.ID
		if b.Len()+len(line)+1 > maxNotifyPayload {
			if err := flush(); err != nil {
				return err
			}
		}
		if b.Len() > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(line)
	}
	return flush()
}

// WatchLoginsApplied calls applied with what NotifyLoginsApplied
// announces, on any instance, until ctx ends; it calls lost (when not
// nil) whenever announcements may have been missed (a reconnection), so
// that a waiter can look again. It returns when ctx ends.
func (s *Store) WatchLoginsApplied(ctx context.Context, applied func([]LoginChange), lost func()) error {
	missed := func() {}
	if lost != nil {
		missed = lost
	}
	err := s.listen(ctx, loginsAppliedChannel, func(payload string) { applied(parseLoginsApplied(payload)) }, missed)
	if err != nil {
		return fmt.Errorf("meta: watch logins applied: %w", err)
	}
	return nil
}

// parseLoginsApplied reads NotifyLoginsApplied's payload; a malformed
// line (not written by devicehub) is skipped.
func parseLoginsApplied(payload string) []LoginChange {
	var out []LoginChange
	for line := range strings.SplitSeq(payload, "\n") {
		v, id, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			continue
		}
		out = append(out, LoginChange{ID: id, Version: n})
	}
	return out
}

// InstallationID is this database's id (schema/postgres/00006): it marks
// what devicehub writes into a broker that other deployments may share.
func (s *Store) InstallationID(ctx context.Context) (string, error) {
	ctx, cancel := s.timeout(ctx)
	defer cancel()
	var id string
	if err := s.db.GetContext(ctx, &id, `SELECT id FROM installation`); err != nil {
		return "", fmt.Errorf("meta: installation id: %w", err)
	}
	return id, nil
}
