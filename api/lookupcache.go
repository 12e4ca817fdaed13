package api

import (
	"context"
	"strings"
	"time"

	"devicehub/meta/cache"
)

// lookupCache keeps the answers of a slow lookup (PostgreSQL) for a short
// TTL, bounded in size, in a meta/cache Cache. Past the TTL an answer is
// still served for one more TTL while a single lookup refreshes it in the
// background, so a busy key never makes its requests wait for the
// database; past that, or for a key not cached, concurrent misses share one
// lookup. Only successful answers are kept, never past the time the lookup
// gives (a token's expiry), and an answer whose lookup started before an
// evict of its key or a clear is returned but not kept, so a write through
// this instance is seen at once. A failed lookup drops what was cached (a
// device deleted, a token revoked through another instance): the next
// request asks again and sees the failure itself. A lookup that panics is
// a failure (errLookupPanicked) of every request sharing it, not of the
// process.
type lookupCache[K comparable, V any] struct {
	c *cache.Cache[K, looked[V]]
}

// looked is an answer and the time after which it must not be used.
type looked[V any] struct {
	v     V
	until time.Time
}

// lookupFunc answers a miss, with the time after which the answer must not
// be used (zero: only the TTL bounds it).
type lookupFunc[K comparable, V any] func(ctx context.Context, key K) (V, time.Time, error)

// sharedLookupTimeout bounds a lookup that several requests, or none (a
// background refresh), wait for: it runs on its own deadline, so the
// request that started it giving up does not fail the others.
const sharedLookupTimeout = 10 * time.Second

// errLookupPanicked is what the requests sharing a lookup that panicked get.
var errLookupPanicked = cache.ErrPanicked

// lookupOptions configure the cache of a lookup by string: answers fresh
// for ttl, served stale for one more while refreshed, at most max of them
// (a full cache is emptied: the next requests look up again). Keys are
// copied: Fiber's route parameters and headers alias reused buffers.
func lookupOptions[V any](ttl time.Duration, max int) cache.Options[string, looked[V]] {
	o := keyedLookupOptions[string, V](ttl, max)
	o.CopyKey = strings.Clone
	return o
}

// keyedLookupOptions are lookupOptions of keys the cache may keep as they
// are given.
func keyedLookupOptions[K comparable, V any](ttl time.Duration, max int) cache.Options[K, looked[V]] {
	o := cache.DefaultOptions[K, looked[V]]()
	o.TTL = ttl
	o.Stale = ttl
	o.MaxEntries = max
	o.Trim = 0
	o.Expiry = func(l looked[V]) time.Time { return l.until }
	o.LoadTimeout = sharedLookupTimeout
	return o
}

func newLookupCache[V any](ttl time.Duration, max int) *lookupCache[string, V] {
	return &lookupCache[string, V]{c: cache.New(lookupOptions[V](ttl, max))}
}

// peek is the answer kept for key if it is fresh (get without a lookup,
// which a caller need not build for a hit).
func (c *lookupCache[K, V]) peek(key K) (V, bool) {
	l, ok := c.c.Peek(key)
	return l.v, ok
}

// get answers from the cache or from lookup. key may alias a reused buffer.
func (c *lookupCache[K, V]) get(ctx context.Context, key K, lookup lookupFunc[K, V]) (V, error) {
	if l, ok := c.c.Peek(key); ok { // a fresh hit allocates no loader
		return l.v, nil
	}
	l, err := c.c.Get(ctx, key, func(ctx context.Context, key K) (looked[V], error) {
		v, until, err := lookup(ctx, key)
		return looked[V]{v, until}, err
	})
	return l.v, err
}

// evict forgets key; a lookup of it in flight is not kept.
func (c *lookupCache[K, V]) evict(key K) { c.c.Delete(key) }

// clear forgets everything; lookups in flight are not kept.
func (c *lookupCache[K, V]) clear() { c.c.Invalidate() }
