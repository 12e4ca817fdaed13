package api

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"
)

// lookupCache keeps the answers of a slow lookup (PostgreSQL) for a short
// TTL, bounded in size. Past the TTL an answer is still served for one more
// TTL while a single lookup refreshes it in the background, so a busy key
// never makes its requests wait for the database; past that, or for a key
// not cached, concurrent misses share one lookup. Only successful answers
// are kept, never past the time the lookup gives (a token's expiry), and an
// answer whose lookup started before an evict or clear is returned but not
// kept, so a write through this instance is seen at once.
type lookupCache[V any] struct {
	ttl time.Duration
	max int

	mu      sync.Mutex
	m       map[string]cached[V]
	loading map[string]*lookupCall[V]
	gen     uint64 // bumped by evict and clear
}

type cached[V any] struct {
	v     V
	fresh time.Time // refreshed after this
	hard  time.Time // never served after this
}

type lookupCall[V any] struct {
	done chan struct{}
	v    V
	err  error
}

// lookupFunc answers a miss, with the time after which the answer must not
// be used (zero: only the TTL bounds it).
type lookupFunc[V any] func(ctx context.Context, key string) (V, time.Time, error)

func newLookupCache[V any](ttl time.Duration, max int) *lookupCache[V] {
	return &lookupCache[V]{ttl: ttl, max: max, m: make(map[string]cached[V]), loading: make(map[string]*lookupCall[V])}
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
	if c.ttl <= 0 {
		return
	}
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
	if cachedOK && now.Before(e.fresh) {
		c.mu.Unlock()
		return e.v, nil
	}
	call, inFlight := c.loading[key]
	if cachedOK && now.Before(e.hard) {
		// Stale but servable: answer now, refresh once in the background.
		if !inFlight {
			key = strings.Clone(key)
			call = c.startLocked(key)
			gen := c.gen
			go func() {
				// No request waits for it: a panic is the next request's
				// to meet, through a lookup of its own.
				defer func() { _ = recover() }()
				ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), refreshTimeout)
				defer cancel()
				c.finish(ctx, key, call, gen, now, lookup)
			}()
		}
		c.mu.Unlock()
		return e.v, nil
	}
	if inFlight {
		c.mu.Unlock()
		select {
		case <-call.done:
			if call.err != nil && ctx.Err() == nil &&
				(errors.Is(call.err, context.Canceled) || errors.Is(call.err, context.DeadlineExceeded)) {
				v, _, err := lookup(ctx, key) // the other request gave up, not the database
				return v, err
			}
			return call.v, call.err
		case <-ctx.Done():
			var zero V
			return zero, ctx.Err()
		}
	}
	key = strings.Clone(key)
	call = c.startLocked(key)
	gen := c.gen
	c.mu.Unlock()
	c.finish(ctx, key, call, gen, now, lookup)
	return call.v, call.err
}

// refreshTimeout bounds a background refresh, which no request waits for.
const refreshTimeout = 10 * time.Second

// startLocked registers a lookup of key in flight; called with mu held.
func (c *lookupCache[V]) startLocked(key string) *lookupCall[V] {
	call := &lookupCall[V]{done: make(chan struct{})}
	c.loading[key] = call
	return call
}

// finish runs the lookup of call, keeps its answer unless an evict or clear
// came after gen, and wakes the requests waiting for it. A failed lookup
// drops what was cached (a device deleted, a token revoked through another
// instance): the next request asks again and sees the failure itself.
//
// A lookup that panics fails its waiters with errLookupPanicked, and the
// panic goes on up the calling request (the server's recover middleware
// answers it): the key is not left in flight for every later request.
func (c *lookupCache[V]) finish(ctx context.Context, key string, call *lookupCall[V], gen uint64, now time.Time, lookup lookupFunc[V]) {
	var (
		v     V
		until time.Time
		err   = errLookupPanicked
	)
	defer func() {
		call.v, call.err = v, err
		c.mu.Lock()
		delete(c.loading, key)
		switch {
		case err != nil:
			delete(c.m, key)
		case gen == c.gen:
			c.putLocked(key, v, until, now)
		}
		c.mu.Unlock()
		close(call.done)
	}()
	v, until, err = lookup(ctx, key)
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
