package api

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"
)

// lookupCache keeps the answers of a slow lookup (PostgreSQL) for a short
// TTL, bounded in size. Concurrent misses of one key share one lookup, so
// an entry expiring under load costs one database call, not one per
// request in flight. Only successful answers are kept, and an answer whose
// lookup started before an evict or clear is returned but not kept, so a
// write through this instance is seen at once.
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
	until time.Time
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

// peek returns a live entry.
func (c *lookupCache[V]) peek(key string, now time.Time) (V, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[key]
	if !ok || !now.Before(e.until) {
		var zero V
		return zero, false
	}
	return e.v, true
}

// put keeps v until now+ttl, or until, if that is sooner.
func (c *lookupCache[V]) put(key string, v V, until, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.putLocked(key, v, until, now)
}

func (c *lookupCache[V]) putLocked(key string, v V, until, now time.Time) {
	if c.ttl <= 0 {
		return
	}
	if u := now.Add(c.ttl); until.IsZero() || u.Before(until) {
		until = u
	}
	if len(c.m) >= c.max {
		clear(c.m) // bounded memory; the next requests look up again
	}
	c.m[key] = cached[V]{v: v, until: until}
}

// get answers from the cache or from lookup. key may alias a reused buffer
// (Fiber's route parameters and headers): what is kept is a copy.
func (c *lookupCache[V]) get(ctx context.Context, key string, now time.Time, lookup lookupFunc[V]) (V, error) {
	if c.ttl <= 0 {
		v, _, err := lookup(ctx, key)
		return v, err
	}
	if v, ok := c.peek(key, now); ok {
		return v, nil
	}
	c.mu.Lock()
	if call, ok := c.loading[key]; ok {
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
	call := &lookupCall[V]{done: make(chan struct{})}
	c.loading[key] = call
	gen := c.gen
	c.mu.Unlock()

	v, until, err := lookup(ctx, key)
	call.v, call.err = v, err
	c.mu.Lock()
	delete(c.loading, key)
	if err == nil && gen == c.gen {
		c.putLocked(key, v, until, now)
	}
	c.mu.Unlock()
	close(call.done)
	return v, err
}

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
