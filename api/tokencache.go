package api

import (
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

	mu sync.Mutex
	m  map[string]cachedToken
}

type cachedToken struct {
	user    meta.User
	checked time.Time
	expires time.Time
}

func newTokenCache(ttl time.Duration, max int) *tokenCache {
	return &tokenCache{ttl: ttl, max: max, m: make(map[string]cachedToken)}
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
	if len(c.m) >= c.max {
		clear(c.m) // bounded memory; the next requests re-check
	}
	c.m[token] = cachedToken{user: u, checked: now, expires: expires}
}

func (c *tokenCache) evict(token string) {
	c.mu.Lock()
	delete(c.m, token)
	c.mu.Unlock()
}
