package ingest

import (
	"context"
	"errors"
	"sync"
	"time"

	"devicehub/meta"
)

// Devices looks devices up; *meta.Store is one. A missing device is an
// error wrapping meta.ErrNotFound.
type Devices interface {
	GetDeviceRef(ctx context.Context, id string) (meta.DeviceRef, error)
}

// StateApplier writes connection state; *meta.Store is one.
type StateApplier interface {
	ApplyStateChanges(ctx context.Context, changes []meta.StateChange) (int, error)
}

// deviceCache is a TTL cache over Devices, negative answers included, so
// that ingest asks PostgreSQL about each device at most once per TTL.
// Concurrent misses of one id share one lookup.
type deviceCache struct {
	src Devices
	ttl time.Duration
	now func() time.Time

	mu      sync.Mutex
	entries map[string]*cacheEntry
	sweepAt time.Time
}

type cacheEntry struct {
	ref     meta.DeviceRef
	found   bool
	expires time.Time
	ready   chan struct{} // closed when the lookup finished
	err     error         // lookup failed (not cached)
}

func newDeviceCache(src Devices, ttl time.Duration) *deviceCache {
	return &deviceCache{src: src, ttl: ttl, now: time.Now, entries: make(map[string]*cacheEntry)}
}

// get returns the device and whether it exists; err is a lookup failure
// (database down), which is not cached.
func (c *deviceCache) get(ctx context.Context, id string) (meta.DeviceRef, bool, error) {
	now := c.now()
	c.mu.Lock()
	if now.After(c.sweepAt) {
		c.sweep(now)
	}
	e := c.entries[id]
	if e != nil {
		select {
		case <-e.ready:
			if e.err == nil && now.Before(e.expires) {
				c.mu.Unlock()
				return e.ref, e.found, nil
			}
			e = nil // expired or failed: look up again
		default:
		}
	}
	if e == nil {
		e = &cacheEntry{ready: make(chan struct{})}
		c.entries[id] = e
		c.mu.Unlock()
		ref, err := c.src.GetDeviceRef(ctx, id)
		switch {
		case err == nil:
			e.ref, e.found = ref, true
		case errors.Is(err, meta.ErrNotFound):
		default:
			e.err = err
		}
		e.expires = c.now().Add(c.ttl)
		c.mu.Lock()
		close(e.ready)
		if e.err != nil && c.entries[id] == e {
			delete(c.entries, id)
		}
		c.mu.Unlock()
		return e.ref, e.found, e.err
	}
	c.mu.Unlock()
	select {
	case <-e.ready:
		return e.ref, e.found, e.err
	case <-ctx.Done():
		return meta.DeviceRef{}, false, ctx.Err()
	}
}

// sweep drops expired entries so the map does not keep every id ever
// seen; called with mu held, at most once per TTL.
func (c *deviceCache) sweep(now time.Time) {
	for id, e := range c.entries {
		select {
		case <-e.ready:
			if now.After(e.expires) {
				delete(c.entries, id)
			}
		default:
		}
	}
	c.sweepAt = now.Add(c.ttl)
}
