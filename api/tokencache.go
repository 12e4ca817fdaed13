package api

import (
	"context"
	"errors"
	"sync"
	"time"

	"devicehub/meta"
)

// tokenCache remembers successful token checks for a short TTL, so that a
// busy client costs one PostgreSQL read per TTL rather than one per
// request. Logout through this instance evicts at once; a logout through
// another instance takes effect here within the TTL.
type tokenCache struct {
	ttl time.Duration
	max int

	mu      sync.Mutex
	m       map[string]cachedToken
	loading map[string]*tokenCall // checks in flight: concurrent misses share one
	gen     uint64                // bumped by evict: a check older than that is not kept
}

type tokenCall struct {
	done    chan struct{}
	user    meta.User
	expires time.Time
	err     error
}

type cachedToken struct {
	user    meta.User
	checked time.Time
	expires time.Time
}

func newTokenCache(ttl time.Duration, max int) *tokenCache {
	return &tokenCache{ttl: ttl, max: max, m: make(map[string]cachedToken), loading: make(map[string]*tokenCall)}
}

// get returns the user of a token checked less than ttl ago and not expired.
func (c *tokenCache) get(token string, now time.Time) (meta.User, bool) {
	if c.ttl <= 0 {
		return meta.User{}, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[token]
	if !ok {
		return meta.User{}, false
	}
	if now.Sub(e.checked) >= c.ttl || !now.Before(e.expires) {
		delete(c.m, token)
		return meta.User{}, false
	}
	return e.user, true
}

func (c *tokenCache) put(token string, u meta.User, expires, now time.Time) {
	if c.ttl <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.putLocked(token, u, expires, now)
}

func (c *tokenCache) putLocked(token string, u meta.User, expires, now time.Time) {
	if len(c.m) >= c.max {
		clear(c.m) // bounded memory; the next requests re-check
	}
	c.m[token] = cachedToken{user: u, checked: now, expires: expires}
}

func (c *tokenCache) evict(token string) {
	c.mu.Lock()
	delete(c.m, token)
	c.gen++
	c.mu.Unlock()
}

// check returns the token's user from the cache or from authenticate.
// When a cached check expires under load, every request of that client
// misses at once: they wait for one authenticate instead of each taking a
// database connection. token must not alias a reused buffer.
func (c *tokenCache) check(ctx context.Context, token string, now time.Time,
	authenticate func(context.Context, string) (meta.User, time.Time, error)) (meta.User, error) {
	if u, ok := c.get(token, now); ok {
		return u, nil
	}
	if c.ttl <= 0 {
		u, _, err := authenticate(ctx, token)
		return u, err
	}
	c.mu.Lock()
	if call, ok := c.loading[token]; ok {
		c.mu.Unlock()
		select {
		case <-call.done:
			if call.err != nil && ctx.Err() == nil &&
				(errors.Is(call.err, context.Canceled) || errors.Is(call.err, context.DeadlineExceeded)) {
				u, _, err := authenticate(ctx, token) // the other request gave up, not the database
				return u, err
			}
			return call.user, call.err
		case <-ctx.Done():
			return meta.User{}, ctx.Err()
		}
	}
	call := &tokenCall{done: make(chan struct{})}
	c.loading[token] = call
	gen := c.gen
	c.mu.Unlock()

	call.user, call.expires, call.err = authenticate(ctx, token)
	c.mu.Lock()
	delete(c.loading, token)
	if call.err == nil && gen == c.gen { // a logout meanwhile wins
		c.putLocked(token, call.user, call.expires, now)
	}
	c.mu.Unlock()
	close(call.done)
	return call.user, call.err
}
