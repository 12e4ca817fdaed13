package leader

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"
)

// Locker is the PostgreSQL advisory lock (*meta.Store.Lock): it waits
// for the lock of key, or for ctx's end; lost is closed when the lock's
// database session is gone; release gives the lock back.
type Locker interface {
	Lock(ctx context.Context, key int64) (lost <-chan struct{}, release func(), err error)
}

// Gauge is told 1 while this instance leads, 0 otherwise (a
// prometheus.Gauge).
type Gauge interface{ Set(float64) }

// Loop is one role's election and its turns.
type Loop struct {
	Locker Locker
	// Key is the role's lock, one per role.
	Key int64
	// Retry is the wait after a failed lock or a turn that ended in an
	// error.
	Retry time.Duration
	// Log writes Waiting (a failed lock) and SteppedDown (a turn ended in
	// an error) with the error.
	Log                  *slog.Logger
	Waiting, SteppedDown string
	// Owner, if set, holds true while a turn runs; Gauge, if set, is 1
	// then.
	Owner *atomic.Bool
	Gauge Gauge
}

// Run waits for the lock and runs lead while it holds it, until ctx ends.
// lead returns when lost is closed (or earlier, with an error); the lock
// is then released and, after an error, Run waits Retry before it waits
// for the lock again.
func (l Loop) Run(ctx context.Context, lead func(ctx context.Context, lost <-chan struct{}) error) {
	for ctx.Err() == nil {
		lost, release, err := l.Locker.Lock(ctx, l.Key)
		if err != nil {
			if ctx.Err() == nil {
				l.Log.Warn(l.Waiting, "err", err)
				Sleep(ctx, l.Retry)
			}
			continue
		}
		l.owner(true)
		err = lead(ctx, lost)
		l.owner(false)
		release()
		if err != nil && ctx.Err() == nil {
			l.Log.Warn(l.SteppedDown, "err", err)
			Sleep(ctx, l.Retry)
		}
	}
}

func (l Loop) owner(on bool) {
	if l.Owner != nil {
		l.Owner.Store(on)
	}
	if l.Gauge != nil {
		v := 0.0
		if on {
			v = 1
		}
		l.Gauge.Set(v)
	}
}

// Sleep waits d or until ctx ends.
func Sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// Installation gives the installation's id (*meta.Store.InstallationID).
type Installation interface {
	InstallationID(ctx context.Context) (string, error)
}

// SessionID is the MQTT client id every owner of role shares, so that a
// new owner resumes the persistent session its predecessor left:
// "devicehub-<role>-<installation id>". It retries every retry (logged)
// until the id is read, or ctx ends ("" then).
func SessionID(ctx context.Context, inst Installation, role string, retry time.Duration, log *slog.Logger) string {
	for ctx.Err() == nil {
		id, err := inst.InstallationID(ctx)
		if err == nil {
			return "devicehub-" + role + "-" + id
		}
		log.Warn(role+": reading the installation id failed; retrying", "err", err)
		Sleep(ctx, retry)
	}
	return ""
}
