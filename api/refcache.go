package api

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"devicehub/meta"
)

// refCache remembers device references (device, product, thing model) for
// a short TTL so that a command costs no PostgreSQL read per request. Only
// found devices are kept. Product and device writes through this instance
// clear it at once; writes through another instance show here within the
// TTL.
type refCache struct {
	ttl time.Duration
	max int

	mu      sync.Mutex
	m       map[string]cachedRef
	loading map[string]*refCall // lookups in flight: concurrent misses share one
	gen     uint64              // bumped by clear: a lookup older than that is not kept
}

type refCall struct {
	done chan struct{}
	ref  meta.DeviceRef
	err  error
}

type cachedRef struct {
	ref     meta.DeviceRef
	checked time.Time
}

func newRefCache(ttl time.Duration, max int) *refCache {
	return &refCache{ttl: ttl, max: max, m: make(map[string]cachedRef), loading: make(map[string]*refCall)}
}

// get returns the device through the cache, asking lookup on a miss; the
// requests that miss the same device meanwhile wait for that one lookup.
func (c *refCache) get(ctx context.Context, id string, now time.Time, lookup func(context.Context, string) (meta.DeviceRef, error)) (meta.DeviceRef, error) {
	if c.ttl <= 0 {
		return lookup(ctx, id)
	}
	c.mu.Lock()
	if e, ok := c.m[id]; ok && now.Sub(e.checked) < c.ttl {
		c.mu.Unlock()
		return e.ref, nil
	}
	if call, ok := c.loading[id]; ok {
		c.mu.Unlock()
		select {
		case <-call.done:
			if call.err != nil && ctx.Err() == nil &&
				(errors.Is(call.err, context.Canceled) || errors.Is(call.err, context.DeadlineExceeded)) {
				return lookup(ctx, id) // the other request gave up, not the database
			}
			return call.ref, call.err
		case <-ctx.Done():
			return meta.DeviceRef{}, ctx.Err()
		}
	}
	// Route parameters live in fasthttp's reused buffers: keep a copy.
	id = strings.Clone(id)
	call := &refCall{done: make(chan struct{})}
	c.loading[id] = call
	gen := c.gen
	c.mu.Unlock()

	call.ref, call.err = lookup(ctx, id)
	c.mu.Lock()
	delete(c.loading, id)
	if call.err == nil && gen == c.gen {
		if len(c.m) >= c.max {
			clear(c.m) // bounded memory; the next requests look up again
		}
		c.m[id] = cachedRef{ref: call.ref, checked: now}
	}
	c.mu.Unlock()
	close(call.done)
	return call.ref, call.err
}

// clear forgets every device, after a write that may change any of them.
func (c *refCache) clear() {
	c.mu.Lock()
	clear(c.m)
	c.gen++
	c.mu.Unlock()
}
