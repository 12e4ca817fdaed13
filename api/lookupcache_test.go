package api

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"devicehub/meta"
)

func TestLookupCache(t *testing.T) {
	lookups := 0
	var until time.Time // what the lookup says about its answer's life
	lookup := func(_ context.Context, key string) (string, time.Time, error) {
		lookups++
		if key == "gone" {
			return "", time.Time{}, meta.ErrNotFound
		}
		return "v-" + strings.Clone(key), until, nil // as PostgreSQL: fresh strings
	}
	ctx := context.Background()
	t0 := time.Unix(1000, 0)
	c := newLookupCache[string](time.Second, 3)
	f := func(key string, now time.Time, wantLookups int, wantErr error) {
		t.Helper()
		v, err := c.get(ctx, key, now, lookup)
		if !errors.Is(err, wantErr) || (err == nil && v != "v-"+key) || lookups != wantLookups {
			t.Fatalf("get(%q, +%v) = %q, %v after %d lookups; want err %v after %d", key, now.Sub(t0), v, err, lookups, wantErr, wantLookups)
		}
	}
	f("a", t0, 1, nil)
	f("a", t0.Add(999*time.Millisecond), 1, nil) // within the TTL
	f("a", t0.Add(time.Second), 2, nil)          // expired
	f("gone", t0, 3, meta.ErrNotFound)           // failures are not kept
	f("gone", t0, 4, meta.ErrNotFound)
	c.clear()
	f("a", t0.Add(time.Second), 5, nil)
	c.evict("a")
	f("a", t0.Add(time.Second), 6, nil)

	// An answer valid for less than the TTL (a token about to expire) is
	// kept only that long.
	until = t0.Add(100 * time.Millisecond)
	f("short", t0, 7, nil)
	f("short", t0.Add(99*time.Millisecond), 7, nil)
	f("short", t0.Add(100*time.Millisecond), 8, nil)
	until = time.Time{}

	// Keys are copied: Fiber's parameters and headers point into reused buffers.
	c.clear()
	buf := []byte("dev1")
	f(unsafe.String(&buf[0], len(buf)), t0, 9, nil)
	copy(buf, "XXXX")
	f("dev1", t0, 9, nil)

	// Bounded: a full map is emptied rather than grown.
	f("b", t0, 10, nil)
	f("c", t0, 11, nil)
	f("d", t0, 12, nil) // 3 entries: dev1, b, c -> cleared before d
	f("b", t0, 13, nil)

	// TTL 0 looks up every time.
	c = newLookupCache[string](0, 3)
	f("a", t0, 14, nil)
	f("a", t0, 15, nil)
}

// Concurrent misses of one key share one lookup; a lookup that an evict
// or clear overtook is answered but not kept.
func TestLookupCacheSharedMiss(t *testing.T) {
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
	now := time.Now()
	waitLoading := func(key string) {
		for {
			c.mu.Lock()
			_, inFlight := c.loading[key]
			c.mu.Unlock()
			if inFlight {
				return
			}
			time.Sleep(time.Millisecond)
		}
	}
	run := func(key string, n int, meanwhile func()) (failed int) {
		var wg sync.WaitGroup
		var errs atomic.Int32
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				v, err := c.get(context.Background(), key, now, lookup)
				if err != nil {
					errs.Add(1)
				} else if v != "v-"+key {
					t.Errorf("%q for %q", v, key)
				}
			}()
		}
		waitLoading(key)
		time.Sleep(50 * time.Millisecond) // let the others queue behind it
		meanwhile()
		close(release)
		wg.Wait()
		release = make(chan struct{})
		return int(errs.Load())
	}
	kept := func(key string) bool { _, ok := c.peek(key, now); return ok }

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
