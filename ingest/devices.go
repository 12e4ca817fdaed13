package ingest

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"

	"devicehub/meta"
)

// Devices looks devices up; *meta.Store is one.
type Devices interface {
	// DeviceStatuses returns the status of each of ids that exists.
	DeviceStatuses(ctx context.Context, ids []string) (map[string]meta.DeviceStatus, error)
}

// StateApplier writes connection state; *meta.Store is one.
type StateApplier interface {
	ApplyStateChanges(ctx context.Context, changes []meta.StateChange) (int, error)
}

// refreshChunk bounds the ids of one refresh query.
const refreshChunk = 10000

// deviceCache keeps the status of the devices ingest hears from, so that a
// message costs no PostgreSQL query. A device's first message looks it up
// (concurrent misses of one id share the lookup: singleflight); then refresh, every TTL,
// re-reads in one query every device used since the last refresh and
// forgets the others. A deploy, undeploy or delete thus takes effect
// within about one TTL, and PostgreSQL answers one query per TTL instead
// of one per device per TTL (500 queries/s at 1000 devices and 2s, about a
// tenth of the ingester's CPU). While PostgreSQL is down the statuses
// known stay in use; only devices not seen before wait for it.
type deviceCache struct {
	src    Devices
	ttl    time.Duration
	log    *slog.Logger
	flight singleflight.Group // first lookups, one per id at a time

	mu      sync.Mutex
	entries map[string]*cacheEntry
	failing bool // the last refresh failed (logged once)
}

type cacheEntry struct {
	status meta.DeviceStatus
	found  bool
	used   bool // since the last refresh
}

func newDeviceCache(src Devices, ttl time.Duration, log *slog.Logger) *deviceCache {
	return &deviceCache{src: src, ttl: ttl, log: log, entries: make(map[string]*cacheEntry)}
}

// get returns the device's status and whether it exists; err is a lookup
// failure (database down), which is not cached.
func (c *deviceCache) get(ctx context.Context, id string) (meta.DeviceStatus, bool, error) {
	c.mu.Lock()
	if e := c.entries[id]; e != nil {
		e.used = true
		st, found := e.status, e.found
		c.mu.Unlock()
		return st, found, nil
	}
	c.mu.Unlock()
	done := c.flight.DoChan(id, func() (any, error) { return c.lookup(ctx, id) })
	select {
	case r := <-done:
		if r.Err != nil {
			return meta.DeviceStatus{}, false, r.Err
		}
		e := r.Val.(cacheEntry)
		return e.status, e.found, nil
	case <-ctx.Done():
		return meta.DeviceStatus{}, false, ctx.Err()
	}
}

// lookup reads a device not cached yet and keeps its status.
func (c *deviceCache) lookup(ctx context.Context, id string) (any, error) {
	m, err := c.src.DeviceStatuses(ctx, []string{id})
	if err != nil {
		return nil, err
	}
	var v cacheEntry
	v.status, v.found = m[id]
	e := v // once in the map, e is read and written under c.mu only
	e.used = true
	c.mu.Lock()
	c.entries[id] = &e
	c.mu.Unlock()
	return v, nil
}

// refresh re-reads every device used since the last refresh, in chunks of
// refreshChunk ids, and forgets the devices not used since.
func (c *deviceCache) refresh(ctx context.Context) error {
	c.mu.Lock()
	ids := make([]string, 0, len(c.entries))
	for id, e := range c.entries {
		if !e.used {
			delete(c.entries, id)
			continue
		}
		e.used = false
		ids = append(ids, id)
	}
	c.mu.Unlock()
	for len(ids) > 0 {
		chunk := ids[:min(len(ids), refreshChunk)]
		ids = ids[len(chunk):]
		m, err := c.src.DeviceStatuses(ctx, chunk)
		if err != nil {
			return err
		}
		c.mu.Lock()
		for _, id := range chunk {
			if e := c.entries[id]; e != nil {
				e.status, e.found = m[id]
			}
		}
		c.mu.Unlock()
	}
	return nil
}

// run refreshes every TTL until ctx ends.
func (c *deviceCache) run(ctx context.Context) {
	t := time.NewTicker(c.ttl)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		err := c.refresh(ctx)
		switch {
		case err != nil && ctx.Err() == nil && !c.failing:
			c.failing = true
			c.log.Warn("device status refresh failed; using the statuses known", "err", err)
		case err == nil && c.failing:
			c.failing = false
			c.log.Info("device status refresh recovered")
		}
	}
}

// len returns the devices cached.
func (c *deviceCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}
