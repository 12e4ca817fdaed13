package meta

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"devicehub/bench/testkit"
)

// livePageCache is a page cache whose watcher listens on the test server.
func livePageCache(t *testing.T, ttl time.Duration) *pageCache {
	t.Helper()
	dsn := "postgres://postgres@127.0.0.1:5432"
	if v := os.Getenv("DEVICEHUB_TEST_POSTGRES"); v != "" {
		dsn = v
	}
	c := newPageCache(dsn+"/postgres?sslmode=disable", ttl)
	t.Cleanup(c.close)
	c.start.Do(c.watch)
	testkit.Eventually(t, 5*time.Second, "the watcher listening", c.live.Load)
	return c
}

// TestPageCacheFlights: identical queries at once share one load; its
// failure reaches them all and is not kept; a panicking load fails its
// waiters, not the process.
func TestPageCacheFlights(t *testing.T) {
	t.Parallel()
	c := livePageCache(t, time.Hour) // its watcher outside the bubble: it waits on the network
	synctest.Test(t, func(t *testing.T) { pageCacheFlights(t, c) })
}

func pageCacheFlights(t *testing.T, c *pageCache) {
	ctx := context.Background()
	var loads atomic.Int32
	release := make(chan struct{})
	load := func(context.Context, bool) (any, int, error) {
		loads.Add(1)
		<-release
		return "page", 1, nil
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if v, err := c.get(ctx, "device", "device\x00k", load); v != "page" || err != nil {
				t.Errorf("get: %v, %v", v, err)
			}
		}()
	}
	synctest.Wait() // all 8 blocked: one in the load, 7 waiting for it
	if n := c.pages.Loads(); n != 1 {
		t.Fatalf("%d loads under way for 8 identical queries, want 1", n)
	}
	close(release)
	wg.Wait()
	if n := loads.Load(); n != 1 {
		t.Fatalf("%d loads for 8 identical queries at once, want 1", n)
	}
	// Kept until its list changes; another list's change leaves it.
	c.changed("product_device_counts")
	if v, _ := c.get(ctx, "device", "device\x00k", load); v != "page" || loads.Load() != 1 {
		t.Fatalf("after another list's change: %v, %d loads", v, loads.Load())
	}
	c.changed("products")
	if v, _ := c.get(ctx, "device", "device\x00k", load); v != "page" || loads.Load() != 2 {
		t.Fatalf("after its own list's change: %v, %d loads, want a second load", v, loads.Load())
	}

	failed := errors.New("down")
	fails := 0
	fail := func(context.Context, bool) (any, int, error) { fails++; return nil, 0, failed }
	for range 2 {
		if _, err := c.get(ctx, "product", "product\x00f", fail); !errors.Is(err, failed) {
			t.Fatalf("failed load: %v", err)
		}
	}
	if fails != 2 {
		t.Fatalf("a failed page was kept: %d loads for 2 gets", fails)
	}

	func() {
		defer func() { _ = recover() }()
		_, _ = c.get(ctx, "product", "product\x00p", func(context.Context, bool) (any, int, error) { panic("bug") })
	}()
	if v, err := c.get(ctx, "product", "product\x00p", func(context.Context, bool) (any, int, error) { return "ok", 1, nil }); v != "ok" || err != nil {
		t.Fatalf("after a panicking load: %v, %v", v, err)
	}
}

// TestPageCacheBounds: the entries, their keys and the items kept stay
// within their bounds, and an expired page is loaded again.
func TestPageCacheBounds(t *testing.T) {
	t.Parallel()
	c := livePageCache(t, time.Hour)
	ctx := context.Background()
	big := func(context.Context, bool) (any, int, error) { return "big", maxPageBytes / 8, nil }
	for i := range 20 {
		if _, err := c.get(ctx, "device", fmt.Sprintf("device\x00big%d", i), big); err != nil {
			t.Fatal(err)
		}
		if held := c.pages.Bytes(); held > maxPageBytes {
			t.Fatalf("%d bytes kept, bound %d", held, maxPageBytes)
		}
	}
	small := func(context.Context, bool) (any, int, error) { return "small", 1, nil }
	for i := range maxPageEntries + 100 {
		if _, err := c.get(ctx, "product", fmt.Sprintf("product\x00%d", i), small); err != nil {
			t.Fatal(err)
		}
	}
	if n := c.pages.Len(); n > maxPageEntries {
		t.Fatalf("%d entries, bound %d", n, maxPageEntries)
	}
	long := string(make([]byte, maxPageKey+1))
	loads := 0
	for range 2 {
		_, _ = c.get(ctx, "product", long, func(context.Context, bool) (any, int, error) { loads++; return "x", 1, nil })
	}
	if loads != 2 {
		t.Fatalf("a key past the bound was kept (%d loads)", loads)
	}

	// Time is the bubble's: the page is kept until the TTL has passed to
	// the nanosecond, whatever the machine's load.
	short := livePageCache(t, 20*time.Millisecond)
	synctest.Test(t, func(t *testing.T) {
		loads := 0
		count := func(context.Context, bool) (any, int, error) { loads++; return "x", 1, nil }
		_, _ = short.get(ctx, "device", "device\x00t", count)
		time.Sleep(20*time.Millisecond - 1)
		_, _ = short.get(ctx, "device", "device\x00t", count)
		if loads != 1 {
			t.Fatalf("%d loads within the TTL, want 1", loads)
		}
		time.Sleep(time.Nanosecond) // the bubble's clock: to the TTL exactly
		_, _ = short.get(ctx, "device", "device\x00t", count)
		if loads != 2 {
			t.Fatalf("%d loads, want 2: loaded again once the TTL has passed", loads)
		}
	})
}
