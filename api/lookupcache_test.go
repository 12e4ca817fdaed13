package api

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
	"unsafe"

	"devicehub/meta"
	"devicehub/meta/cache"
)

func TestLookupCache(t *testing.T) {
	var lookups atomic.Int32
	var until atomic.Int64 // unix ns the lookup gives its answer; 0: none
	gone := map[string]bool{"gone": true}
	var goneMu sync.Mutex
	lookup := func(_ context.Context, key string) (string, time.Time, error) {
		lookups.Add(1)
		goneMu.Lock()
		g := gone[key]
		goneMu.Unlock()
		if g {
			return "", time.Time{}, meta.ErrNotFound
		}
		var u time.Time
		if n := until.Load(); n != 0 {
			u = time.Unix(0, n)
		}
		return "v-" + strings.Clone(key), u, nil // as PostgreSQL: fresh strings
	}
	ctx := context.Background()
	t0 := time.Unix(1000, 0)
	var clock atomic.Int64 // the cache's clock, unix ns
	withClock := func(ttl time.Duration, max int) *lookupCache[string, string] {
		o := lookupOptions[string](ttl, max)
		o.Now = func() time.Time { return time.Unix(0, clock.Load()) }
		return &lookupCache[string, string]{c: cache.New(o)}
	}
	c := withClock(time.Second, 3)
	// settle waits for the lookups a call is expected to have caused,
	// background refreshes included, to finish.
	settle := func(want int32) {
		for deadline := time.Now().Add(time.Second); lookups.Load() < want && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond) // polling the lookup counter
		}
		for c.c.Loads() != 0 { // a refresh starts within the call: a load started later is not missed
			time.Sleep(time.Millisecond)
		}
	}
	f := func(key string, now time.Time, wantLookups int32, wantErr error) {
		t.Helper()
		clock.Store(now.UnixNano())
		v, err := c.get(ctx, key, lookup)
		settle(wantLookups)
		if !errors.Is(err, wantErr) || (err == nil && v != "v-"+key) || lookups.Load() != wantLookups {
			t.Fatalf("get(%q, +%v) = %q, %v after %d lookups; want err %v after %d", key, now.Sub(t0), v, err, lookups.Load(), wantErr, wantLookups)
		}
	}
	f("a", t0, 1, nil)
	f("a", t0.Add(999*time.Millisecond), 1, nil)  // fresh
	f("a", t0.Add(time.Second), 2, nil)           // stale: served, refreshed in the background
	f("a", t0.Add(1999*time.Millisecond), 2, nil) // fresh again from the refresh at +1s
	f("a", t0.Add(5*time.Second), 3, nil)         // past twice the TTL: looked up while the request waits
	f("gone", t0, 4, meta.ErrNotFound)            // failures are not kept
	f("gone", t0, 5, meta.ErrNotFound)
	c.clear()
	f("a", t0.Add(5*time.Second), 6, nil)
	c.evict("a")
	f("a", t0.Add(5*time.Second), 7, nil)

	// A background refresh that fails drops the entry: a device deleted
	// through another instance is not found on the next request.
	goneMu.Lock()
	gone["a"] = true
	goneMu.Unlock()
	clock.Store(t0.Add(6 * time.Second).UnixNano())
	if v, err := c.get(ctx, "a", lookup); err != nil || v != "v-a" {
		t.Fatalf("stale answer: %q, %v", v, err) // served stale once, refresh fails
	}
	settle(8)
	f("a", t0.Add(6*time.Second), 9, meta.ErrNotFound)
	goneMu.Lock()
	delete(gone, "a")
	goneMu.Unlock()

	// An answer valid for less than the TTL (a token about to expire) is
	// kept only that long, stale included.
	until.Store(t0.Add(100 * time.Millisecond).UnixNano())
	f("short", t0, 10, nil)
	f("short", t0.Add(99*time.Millisecond), 10, nil)
	f("short", t0.Add(100*time.Millisecond), 11, nil)
	until.Store(0)

	// Keys are copied: Fiber's parameters and headers point into reused buffers.
	c.clear()
	buf := []byte("dev1")
	f(unsafe.String(&buf[0], len(buf)), t0, 12, nil)
	copy(buf, "XXXX")
	f("dev1", t0, 12, nil)

	// Bounded: a full map is emptied rather than grown.
	f("b", t0, 13, nil)
	f("c", t0, 14, nil)
	f("d", t0, 15, nil) // 3 entries: dev1, b, c -> cleared before d
	f("b", t0, 16, nil)

	// TTL 0 looks up every time.
	c = withClock(0, 3)
	f("a", t0, 17, nil)
	f("a", t0, 18, nil)
}

// Concurrent misses of one key share one lookup; a lookup that an evict
// or clear overtook is answered but not kept.
func TestLookupCacheSharedMiss(t *testing.T) {
	synctest.Test(t, func(t *testing.T) { testLookupCacheSharedMiss(t) })
}

func testLookupCacheSharedMiss(t *testing.T) {
	c := newLookupCache[string](time.Minute, 100)
	var calls atomic.Int32
	release := make(chan struct{})
	lookup := func(_ context.Context, key string) (string, time.Time, error) {
		calls.Add(1)
		<-release
		if key == "bad" {
			return "", time.Time{}, meta.ErrNotFound
		}
		return "v-" + strings.Clone(key), time.Time{}, nil
	}
	run := func(key string, n int, meanwhile func()) (failed int) {
		var wg sync.WaitGroup
		var errs atomic.Int32
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				v, err := c.get(context.Background(), key, lookup)
				if err != nil {
					errs.Add(1)
				} else if v != "v-"+key {
					t.Errorf("%q for %q", v, key)
				}
			}()
		}
		// Every caller blocked: the first in its lookup, the others
		// queued behind it.
		synctest.Wait()
		if c.c.Loads() != 1 {
			t.Fatalf("%d lookups under way for %q, want 1", c.c.Loads(), key)
		}
		meanwhile()
		close(release)
		wg.Wait()
		release = make(chan struct{})
		return int(errs.Load())
	}
	kept := func(key string) bool { _, ok := c.c.Peek(key); return ok }

	// Late arrivals find the answer cached, so one lookup whatever the timing.
	if errs := run("a", 20, func() {}); errs != 0 || calls.Load() != 1 || !kept("a") {
		t.Fatalf("20 concurrent misses: %d errors, %d lookups, kept %v; want 0, 1, true", errs, calls.Load(), kept("a"))
	}
	if errs := run("bad", 20, func() {}); errs != 20 || kept("bad") {
		t.Fatalf("20 concurrent failures: %d errors, kept %v", errs, kept("bad"))
	}
	if run("b", 5, func() { c.clear() }); kept("b") {
		t.Fatal("a lookup started before a clear was kept")
	}
	if run("c", 5, func() { c.evict("c") }); kept("c") {
		t.Fatal("a lookup started before an evict (logout) was kept")
	}
}

// TestLookupCachePanic: a lookup that panics fails the requests sharing it
// (with an error, not a panic that nothing could recover) instead of
// leaving its key in flight, and the next request looks up again.
func TestLookupCachePanic(t *testing.T) {
	c := newLookupCache[int](time.Minute, 10)
	release := make(chan struct{})
	started := make(chan struct{})
	first := make(chan error, 1)
	go func() {
		_, err := c.get(context.Background(), "k", func(context.Context, string) (int, time.Time, error) {
			close(started)
			<-release
			panic("lookup failed badly")
		})
		first <- err
	}()
	<-started
	waiter := make(chan error, 1)
	go func() {
		_, err := c.get(context.Background(), "k", func(context.Context, string) (int, time.Time, error) {
			return 0, time.Time{}, errors.New("the waiter should share the lookup in flight")
		})
		waiter <- err
	}()
	close(release)
	select {
	case err := <-waiter:
		if !errors.Is(err, errLookupPanicked) && (err == nil || !strings.Contains(err.Error(), "share")) {
			t.Fatalf("waiter: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the request waiting on a lookup that panicked never returned")
	}
	if err := <-first; !errors.Is(err, errLookupPanicked) {
		t.Fatalf("the request whose lookup panicked: %v", err)
	}
	v, err := c.get(context.Background(), "k", func(context.Context, string) (int, time.Time, error) { return 7, time.Time{}, nil })
	if err != nil || v != 7 {
		t.Fatalf("after the panic: %v %v", v, err)
	}
}
