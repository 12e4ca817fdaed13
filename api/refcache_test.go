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

func TestRefCache(t *testing.T) {
	lookups := 0
	lookup := func(_ context.Context, id string) (meta.DeviceRef, error) {
		lookups++
		if id == "gone" {
			return meta.DeviceRef{}, meta.ErrNotFound
		}
		return meta.DeviceRef{ID: strings.Clone(id), Name: "n" + id}, nil // as PostgreSQL: fresh strings
	}
	ctx := context.Background()
	t0 := time.Unix(1000, 0)
	c := newRefCache(time.Second, 3)
	f := func(id string, now time.Time, wantLookups int, wantErr error) {
		t.Helper()
		r, err := c.get(ctx, id, now, lookup)
		if !errors.Is(err, wantErr) || (err == nil && r.ID != id) || lookups != wantLookups {
			t.Fatalf("get(%q, +%v) = %+v, %v after %d lookups; want err %v after %d", id, now.Sub(t0), r, err, lookups, wantErr, wantLookups)
		}
	}
	f("a", t0, 1, nil)
	f("a", t0.Add(999*time.Millisecond), 1, nil) // within the TTL
	f("a", t0.Add(time.Second), 2, nil)          // expired
	f("gone", t0, 3, meta.ErrNotFound)           // not found is not kept
	f("gone", t0, 4, meta.ErrNotFound)
	c.clear()
	f("a", t0.Add(time.Second), 5, nil)

	// The key is copied: Fiber's route parameters point into reused buffers.
	buf := []byte("dev1")
	f(unsafe.String(&buf[0], len(buf)), t0, 6, nil)
	copy(buf, "XXXX")
	f("dev1", t0, 6, nil)

	// Bounded: a full map is emptied rather than grown.
	f("b", t0, 7, nil)
	f("c", t0, 8, nil) // 3 entries: a, dev1, b -> cleared before c
	f("a", t0, 9, nil)

	// TTL 0 looks up every time.
	c = newRefCache(0, 3)
	f("a", t0, 10, nil)
	f("a", t0, 11, nil)
}

// Concurrent misses of one device share one lookup; a lookup that a write
// overtook is answered but not kept.
func TestRefCacheSharedMiss(t *testing.T) {
	c := newRefCache(time.Minute, 100)
	var calls atomic.Int32
	release := make(chan struct{})
	lookup := func(_ context.Context, id string) (meta.DeviceRef, error) {
		calls.Add(1)
		<-release
		return meta.DeviceRef{ID: strings.Clone(id)}, nil
	}
	now := time.Now()
	var wg sync.WaitGroup
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if r, err := c.get(context.Background(), "d", now, lookup); err != nil || r.ID != "d" {
				t.Errorf("get: %+v, %v", r, err)
			}
		}()
	}
	for {
		c.mu.Lock()
		_, inFlight := c.loading["d"]
		c.mu.Unlock()
		if inFlight {
			break
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond) // let the others queue behind it
	c.clear()                         // a write lands while the lookup runs
	close(release)
	wg.Wait()
	if n := calls.Load(); n < 1 || n > 20 {
		t.Fatalf("%d lookups", n)
	}
	c.mu.Lock()
	_, kept := c.m["d"]
	c.mu.Unlock()
	if kept {
		t.Fatal("a lookup started before a write was kept")
	}
	// Without a write in between, 20 concurrent misses make one lookup.
	calls.Store(0)
	release = make(chan struct{})
	for range 20 {
		wg.Add(1)
		go func() { defer wg.Done(); _, _ = c.get(context.Background(), "e", now, lookup) }()
	}
	time.Sleep(50 * time.Millisecond)
	close(release)
	wg.Wait()
	if n := calls.Load(); n != 1 {
		t.Fatalf("20 concurrent misses made %d lookups", n)
	}
}
