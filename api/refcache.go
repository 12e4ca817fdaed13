package api

import (
	"context"
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

	mu sync.Mutex
	m  map[string]cachedRef
}

type cachedRef struct {
	ref     meta.DeviceRef
	checked time.Time
}

func newRefCache(ttl time.Duration, max int) *refCache {
	return &refCache{ttl: ttl, max: max, m: make(map[string]cachedRef)}
}

// get returns the device through the cache, asking lookup on a miss.
func (c *refCache) get(ctx context.Context, id string, now time.Time, lookup func(context.Context, string) (meta.DeviceRef, error)) (meta.DeviceRef, error) {
	if c.ttl > 0 {
		c.mu.Lock()
		e, ok := c.m[id]
		c.mu.Unlock()
		if ok && now.Sub(e.checked) < c.ttl {
			return e.ref, nil
		}
	}
	ref, err := lookup(ctx, id)
	if err != nil || c.ttl <= 0 {
		return ref, err
	}
	c.mu.Lock()
	if len(c.m) >= c.max {
		clear(c.m) // bounded memory; the next requests look up again
	}
	// Route parameters live in fasthttp's reused buffers: keep a copy.
	c.m[strings.Clone(id)] = cachedRef{ref: ref, checked: now}
	c.mu.Unlock()
	return ref, nil
}

// clear forgets every device, after a write that may change any of them.
func (c *refCache) clear() {
	c.mu.Lock()
	clear(c.m)
	c.mu.Unlock()
}
