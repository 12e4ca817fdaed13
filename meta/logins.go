package meta

import (
	"context"
	"database/sql/driver"
	"fmt"
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
}

// A device without a secureId or key (only SQL written by hand makes one)
// has no login: it counts as not deployed.
const (
	deviceLoginColumns = `id, product_id, secure_id, secure_key, ` + hasLogin + ` AS deployed`
	hasLogin           = `(state <> 'notActive' AND secure_id <> '' AND secure_key <> '')`
)

// DeviceLogins returns the logins of the devices of ids that exist.
func (s *Store) DeviceLogins(ctx context.Context, ids []string) ([]DeviceLogin, error) {
	ctx, cancel := s.timeout(ctx)
	defer cancel()
	var out []DeviceLogin
	if err := s.db.SelectContext(ctx, &out, `SELECT `+deviceLoginColumns+` FROM devices WHERE id = ANY($1)`,
		pq.StringArray(ids)); err != nil {
		return nil, fmt.Errorf("meta: device logins: %w", err)
	}
	return out, nil
}

// DeployedDeviceLogins returns the login of every deployed device.
func (s *Store) DeployedDeviceLogins(ctx context.Context) ([]DeviceLogin, error) {
	// Not s.timeout: a large fleet takes longer than one API call.
	ctx, cancel := context.WithTimeout(ctx, 10*s.opts.QueryTimeout)
	defer cancel()
	var out []DeviceLogin
	if err := s.db.SelectContext(ctx, &out, `SELECT `+deviceLoginColumns+` FROM devices WHERE `+hasLogin); err != nil {
		return nil, fmt.Errorf("meta: deployed device logins: %w", err)
	}
	return out, nil
}

// deviceChannel is where PostgreSQL announces device login changes
// (schema/postgres/00004_device_logins.sql).
const deviceChannel = "devicehub_device"

// WatchDevices calls changed with the id of each device whose login
// changed (created deployed, deployed, undeployed, deleted, new secureId
// or key), as PostgreSQL commits it, whoever wrote it. It calls changed
// with no id when anything may have changed: once listening, and after a
// reconnection (announcements made meanwhile are lost). It returns when
// ctx ends, also while PostgreSQL cannot be reached (the listener waits
// for its first connection until it is closed).
func (s *Store) WatchDevices(ctx context.Context, changed func(ids ...string)) error {
	l := pq.NewListener(s.opts.DSN, 100*time.Millisecond, 5*time.Second, nil)
	defer l.Close()
	defer context.AfterFunc(ctx, func() { _ = l.Close() })()
	if err := l.Listen(deviceChannel); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("meta: watch devices: %w", err)
	}
	changed()
	ping := time.NewTicker(30 * time.Second)
	defer ping.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case n := <-l.Notify:
			if n == nil { // reconnected
				changed()
				continue
			}
			changed(n.Extra)
		case <-ping.C:
			go func() { _ = l.Ping() }() // notices a dead connection, which then reconnects
		}
	}
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
		t := time.NewTicker(2 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				pctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				err := conn.PingContext(pctx)
				cancel()
				if err != nil {
					close(lostc)
					return
				}
			}
		}
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
	res, err := s.db.ExecContext(ctx, `UPDATE devices SET secure_key = $2, modify_time = `+nextModifyTime+`, modifier_id = $3,
		modifier_name = $4 WHERE id = $1`, id, key, modifier.ID, userName(modifier))
	if err != nil {
		return DeviceDetail{}, fmt.Errorf("meta: rotate device secret: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return DeviceDetail{}, fmt.Errorf("device %q: %w", truncate(id, 80), ErrNotFound)
	}
	d, err := s.getDeviceDetail(ctx, s.db, id, false)
	if err != nil {
		return DeviceDetail{}, err
	}
	d.Configuration.SecureKey = key
	return d, nil
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
