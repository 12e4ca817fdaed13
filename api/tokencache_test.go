package api

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"devicehub/meta"
)

func TestTokenCache(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	c := newTokenCache(5*time.Second, 2)
	u := meta.User{ID: "u1"}
	c.put("a", u, now.Add(time.Minute), now)
	if got, ok := c.get("a", now.Add(4*time.Second)); !ok || got.ID != "u1" {
		t.Fatal("fresh entry missed")
	}
	if _, ok := c.get("a", now.Add(5*time.Second)); ok {
		t.Fatal("entry served past its TTL")
	}
	c.put("b", u, now.Add(2*time.Second), now)
	if _, ok := c.get("b", now.Add(2*time.Second)); ok {
		t.Fatal("entry served past the token's expiry")
	}
	c.put("c", u, now.Add(time.Minute), now)
	c.evict("c")
	if _, ok := c.get("c", now); ok {
		t.Fatal("evicted entry served")
	}
	for _, k := range []string{"x", "y", "z"} {
		c.put(k, u, now.Add(time.Minute), now)
	}
	if len(c.m) > 2 {
		t.Fatalf("cache grew past its bound: %d", len(c.m))
	}
	off := newTokenCache(0, 10)
	off.put("a", u, now.Add(time.Minute), now)
	if _, ok := off.get("a", now); ok {
		t.Fatal("disabled cache served an entry")
	}
}

// Concurrent misses of one token make one authentication; a logout while
// it runs keeps its answer out of the cache.
func TestTokenCacheSharedCheck(t *testing.T) {
	c := newTokenCache(5*time.Second, 100)
	var calls atomic.Int32
	release := make(chan struct{})
	auth := func(_ context.Context, token string) (meta.User, time.Time, error) {
		calls.Add(1)
		<-release
		if token == "bad" {
			return meta.User{}, time.Time{}, meta.ErrNotFound
		}
		return meta.User{ID: "u-" + token}, time.Now().Add(time.Hour), nil
	}
	now := time.Now()
	run := func(token string, n int) (errs int) {
		var wg sync.WaitGroup
		var failed atomic.Int32
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				u, err := c.check(context.Background(), token, now, auth)
				if err != nil {
					failed.Add(1)
				} else if u.ID != "u-"+token {
					t.Errorf("user %q for %q", u.ID, token)
				}
			}()
		}
		time.Sleep(50 * time.Millisecond)
		close(release)
		wg.Wait()
		release = make(chan struct{})
		return int(failed.Load())
	}
	if errs := run("a", 20); errs != 0 || calls.Load() != 1 {
		t.Fatalf("20 concurrent checks: %d errors, %d authentications; want 0 and 1", errs, calls.Load())
	}
	calls.Store(0)
	if errs := run("bad", 20); errs != 20 {
		t.Fatalf("20 concurrent bad tokens: %d errors", errs)
	}
	if _, ok := c.get("bad", now); ok {
		t.Fatal("a failed check was cached")
	}
	// Logout while the check runs.
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = c.check(context.Background(), "c", now, auth)
	}()
	for {
		c.mu.Lock()
		_, inFlight := c.loading["c"]
		c.mu.Unlock()
		if inFlight {
			break
		}
		time.Sleep(time.Millisecond)
	}
	c.evict("c")
	close(release)
	<-done
	if _, ok := c.get("c", now); ok {
		t.Fatal("a token logged out during its check was cached")
	}
}
