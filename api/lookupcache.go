package api

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/singleflight"
)

// lookupCache keeps the answers of a slow lookup (PostgreSQL) for a short
// TTL, bounded in size. Past the TTL an answer is still served for one more
// TTL while a single lookup refreshes it in the background, so a busy key
// never makes its requests wait for the database; past that, or for a key
// not cached, concurrent misses share one lookup (singleflight). Only
// successful answers are kept, never past the time the lookup gives (a
// token's expiry), and an answer whose lookup started before an evict or
// clear is returned but not kept, so a write through this instance is seen
// at once.
type lookupCache[V any] struct {
	ttl      time.Duration
	max      int
	flight   singleflight.Group
	inflight atomic.Int32 // lookups running

	mu  sync.Mutex
	m   map[string]cached[V]
	gen uint64 // bumped by evict and clear
}

type cached[V any] struct {
	v     V
	fresh time.Time // refreshed after this
	hard  time.Time // never served after this
}

// lookupFunc answers a miss, with the time after which the answer must not
// be used (zero: only the TTL bounds it).
type lookupFunc[V any] func(ctx context.Context, key string) (V, time.Time, error)

// sharedLookupTimeout bounds a lookup that several requests, or none (a
// background refresh), wait for: it runs on its own deadline, so the
// request that started it giving up does not fail the others.
const sharedLookupTimeout = 10 * time.Second

func newLookupCache[V any](ttl time.Duration, max int) *lookupCache[V] {
	return &lookupCache[V]{ttl: ttl, max: max, m: make(map[string]cached[V])}
}

// peek returns a fresh entry.
func (c *lookupCache[V]) peek(key string, now time.Time) (V, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[key]
	if !ok || !now.Before(e.fresh) {
		var zero V
		return zero, false
	}
	return e.v, true
}

// putLocked keeps v fresh until now+ttl and servable until now+2*ttl,
// neither past until when it is set; c.mu is held.
func (c *lookupCache[V]) putLocked(key string, v V, until, now time.Time) {
	bound := func(t time.Time) time.Time {
		if !until.IsZero() && until.Before(t) {
			return until
		}
		return t
	}
	if len(c.m) >= c.max {
		clear(c.m) // bounded memory; the next requests look up again
	}
	c.m[key] = cached[V]{v: v, fresh: bound(now.Add(c.ttl)), hard: bound(now.Add(2 * c.ttl))}
}

// get answers from the cache or from lookup. key may alias a reused buffer
// (Fiber's route parameters and headers): what is kept is a copy.
func (c *lookupCache[V]) get(ctx context.Context, key string, now time.Time, lookup lookupFunc[V]) (V, error) {
	if c.ttl <= 0 {
		v, _, err := lookup(ctx, key)
		return v, err
	}
	c.mu.Lock()
	e, cachedOK := c.m[key]
	c.mu.Unlock()
	if cachedOK && now.Before(e.fresh) {
		return e.v, nil
	}
	key = strings.Clone(key)
	done := c.flight.DoChan(key, func() (any, error) { return c.load(ctx, key, now, lookup) })
	if cachedOK && now.Before(e.hard) {
		return e.v, nil // stale but servable; done is buffered, nobody need read it
	}
	select {
	case r := <-done:
		if r.Err != nil {
			var zero V
			return zero, r.Err
		}
		return r.Val.(V), nil
	case <-ctx.Done():
		var zero V
		return zero, ctx.Err()
	}
}

// load runs one shared lookup and keeps its answer unless an evict or clear
// came after it started. A failed lookup drops what was cached (a device
// deleted, a token revoked through another instance): the next request asks
// again and sees the failure itself. A lookup that panics is a failure of
// every request sharing it, not of the process: singleflight's DoChan would
// re-panic on a goroutine of its own, where nothing can recover.
func (c *lookupCache[V]) load(ctx context.Context, key string, now time.Time, lookup lookupFunc[V]) (v V, err error) {
	c.inflight.Add(1)
	defer c.inflight.Add(-1)
	c.mu.Lock()
	gen := c.gen
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), sharedLookupTimeout)
	defer cancel()
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %v", errLookupPanicked, r)
		}
	}()
	v, until, err := lookup(ctx, key)
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case err != nil:
		delete(c.m, key)
	case gen == c.gen:
		c.putLocked(key, v, until, now)
	}
	return v, err
}

// errLookupPanicked is what the requests sharing a lookup that panicked get.
var errLookupPanicked = errors.New("api: lookup panicked")

// evict forgets key; a lookup of it in flight is not kept.
func (c *lookupCache[V]) evict(key string) {
	c.mu.Lock()
	delete(c.m, key)
	c.gen++
	c.mu.Unlock()
}

// clear forgets everything; lookups in flight are not kept.
func (c *lookupCache[V]) clear() {
	c.mu.Lock()
	clear(c.m)
	c.gen++
	c.mu.Unlock()
}
