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

// maxCachedDevices bounds the device cache: past it a device not cached
// yet is looked up on each of its messages instead of being kept (about
// 150 bytes an entry: 150 MB at the bound).
const maxCachedDevices = 1 << 20

// deviceCache keeps the status of the devices ingest hears from, so that a
// message costs no PostgreSQL query. A device's first message looks it up
// (concurrent misses of one id share the lookup: singleflight); then
// refresh, every TTL, re-reads in one query per 10,000 every device
// cached, and forgets those unused for keep refreshes in a row. A deploy,
// undeploy or delete thus takes effect within about one TTL, and
// PostgreSQL answers a few queries per TTL instead of one per device per
// TTL (500 queries/s at 1000 devices and 2s, about a tenth of the
// ingester's CPU). keep spares a quiet device a lookup per message: with
// keep 0 (forgotten when unused for one TTL), 5,000 devices reporting
// every 10 s cost PostgreSQL 1,000 single-device queries a second, one
// per report (bench fleet-connect). While PostgreSQL is down the statuses
// known stay in use; only devices not seen before wait for it.
type deviceCache struct {
	src    Devices
	ttl    time.Duration
	keep   int // refreshes an unused entry survives
	log    *slog.Logger
	flight singleflight.Group // first lookups, one per id at a time

	mu      sync.Mutex
	entries map[string]*cacheEntry
	failing bool // the last refresh failed (logged once)
	// Devices not cached whose messages are on their way to a worker
	// (hint) are looked up many to a query ahead of the workers
	// (runHints), and a worker that misses one of them waits for that
	// query instead of sending its own: a storm of new devices does not
	// cost a query each. hintNext gathers (at most refreshChunk ids),
	// hintOf maps each id gathered or in flight to its batch, hinted
	// signals the first id of a batch.
	hintNext *hintBatch
	hintOf   map[string]*hintBatch
	hinted   chan struct{}
}

type hintBatch struct {
	ids  []string
	done chan struct{} // closed once looked up (or failed)
}

type cacheEntry struct {
	status meta.DeviceStatus
	found  bool
	used   bool // since the last refresh
	idle   int  // refreshes in a row without a use
}

func newDeviceCache(src Devices, ttl time.Duration, keep int, log *slog.Logger) *deviceCache {
	return &deviceCache{src: src, ttl: ttl, keep: max(keep, 0), log: log, entries: make(map[string]*cacheEntry),
		hintOf: make(map[string]*hintBatch), hinted: make(chan struct{}, 1)}
}

// hint says a message of the device is queued for a worker: if it is not
// cached, runHints looks it up with others before the worker gets there
// (a worker that gets there first looks it up itself, as before).
func (c *deviceCache) hint(id string) {
	c.mu.Lock()
	first := false
	if c.entries[id] == nil && c.hintOf[id] == nil {
		b := c.hintNext
		if b == nil {
			b = &hintBatch{done: make(chan struct{})}
			c.hintNext = b
			first = true
		}
		if len(b.ids) < refreshChunk {
			b.ids = append(b.ids, id)
			c.hintOf[id] = b
		}
	}
	c.mu.Unlock()
	if first {
		select {
		case c.hinted <- struct{}{}:
		default:
		}
	}
}

// hintWindow is how long runHints gathers hints after the first.
const hintWindow = 5 * time.Millisecond

// runHints looks the hinted devices up, one query per batch, until ctx
// ends. A failed lookup is left to the workers.
func (c *deviceCache) runHints(ctx context.Context) {
	t := time.NewTimer(0)
	<-t.C
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.hinted:
		}
		t.Reset(hintWindow)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		c.mu.Lock()
		b := c.hintNext
		c.hintNext = nil
		c.mu.Unlock()
		if b == nil {
			continue
		}
		_, _ = c.prefetch(ctx, b.ids)
		c.mu.Lock()
		for _, id := range b.ids {
			delete(c.hintOf, id)
		}
		c.mu.Unlock()
		close(b.done)
	}
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
	b := c.hintOf[id]
	c.mu.Unlock()
	if b != nil { // looked up with others right now: wait for that
		select {
		case <-b.done:
		case <-ctx.Done():
			return meta.DeviceStatus{}, false, ctx.Err()
		}
		c.mu.Lock()
		if e := c.entries[id]; e != nil {
			e.used = true
			st, found := e.status, e.found
			c.mu.Unlock()
			return st, found, nil
		}
		c.mu.Unlock() // that lookup failed: on our own
	}
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
	if len(c.entries) < maxCachedDevices {
		c.entries[id] = &e
	}
	c.mu.Unlock()
	return v, nil
}

// prefetch reads the statuses of ids (the devices stored as online, at
// start) in chunks and caches them, so that a restarted instance does not
// send PostgreSQL one query per device as the fleet's messages come in.
// Entries that are never used go after keep refreshes.
func (c *deviceCache) prefetch(ctx context.Context, ids []string) (int, error) {
	n := 0
	for len(ids) > 0 {
		chunk := ids[:min(len(ids), refreshChunk)]
		ids = ids[len(chunk):]
		m, err := c.src.DeviceStatuses(ctx, chunk)
		if err != nil {
			return n, err
		}
		c.mu.Lock()
		for _, id := range chunk {
			if c.entries[id] != nil || len(c.entries) >= maxCachedDevices {
				continue
			}
			st, found := m[id]
			c.entries[id] = &cacheEntry{status: st, found: found}
			n++
		}
		c.mu.Unlock()
	}
	return n, nil
}

// refresh re-reads every device cached, in chunks of refreshChunk ids,
// after forgetting the devices unused for more than keep refreshes.
func (c *deviceCache) refresh(ctx context.Context) error {
	c.mu.Lock()
	ids := make([]string, 0, len(c.entries))
	for id, e := range c.entries {
		if e.used {
			e.idle = 0
		} else if e.idle++; e.idle > c.keep {
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

// run refreshes every TTL, and looks hinted devices up, until ctx ends.
func (c *deviceCache) run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		c.runHints(ctx)
	}()
	defer wg.Wait()
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
