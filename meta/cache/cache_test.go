package cache

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
	"unsafe"
)

// counter is a load that counts its calls and answers key@call.
type counter struct{ n atomic.Int32 }

func (l *counter) load(_ context.Context, key string) (string, error) {
	return fmt.Sprintf("%s@%d", key, l.n.Add(1)), nil
}

func opts() Options[string, string] {
	o := DefaultOptions[string, string]()
	o.TTL = time.Second
	return o
}

// TestServed: what Get serves as time passes and generations move, step
// by step on synctest's clock.
func TestServed(t *testing.T) {
	type step struct {
		after time.Duration // sleep before the step
		do    func(c *Cache[string, string])
		key   string
		want  string // "" for a step that only acts
	}
	tagged := opts()
	tagged.Tag = func(k string) string { return k[:1] }
	stale := opts()
	stale.Stale = time.Second
	expiring := opts()
	expiring.Expiry = func(v string) time.Time {
		if strings.HasPrefix(v, "short") {
			return time.Now().Add(100 * time.Millisecond)
		}
		return time.Time{}
	}
	off := opts()
	off.TTL = 0
	for _, tc := range []struct {
		name  string
		o     Options[string, string]
		steps []step
	}{
		{"ttl", opts(), []step{
			{key: "a", want: "a@1"},
			{after: 999 * time.Millisecond, key: "a", want: "a@1"},
			{key: "b", want: "b@2"},
			{after: time.Millisecond, key: "a", want: "a@3"}, // a TTL since a@1's load started
			{key: "b", want: "b@2"},
		}},
		{"invalidate all", opts(), []step{
			{key: "a", want: "a@1"},
			{do: func(c *Cache[string, string]) { c.Invalidate() }},
			{key: "a", want: "a@2"},
			{key: "a", want: "a@2"},
		}},
		{"invalidate by tag", tagged, []step{
			{key: "x1", want: "x1@1"},
			{key: "y1", want: "y1@2"},
			{do: func(c *Cache[string, string]) { c.Invalidate("y", "z") }},
			{key: "x1", want: "x1@1"},
			{key: "y1", want: "y1@3"},
			{do: func(c *Cache[string, string]) { c.Invalidate() }},
			{key: "x1", want: "x1@4"},
		}},
		{"delete", opts(), []step{
			{key: "a", want: "a@1"},
			{key: "b", want: "b@2"},
			{do: func(c *Cache[string, string]) { c.Delete("a") }},
			{key: "a", want: "a@3"},
			{key: "b", want: "b@2"},
		}},
		{"stale while refreshed", stale, []step{
			{key: "a", want: "a@1"},
			{after: time.Second, key: "a", want: "a@1"}, // stale: served, refreshed meanwhile
			{key: "a", want: "a@2"},
			{after: 1999 * time.Millisecond, key: "a", want: "a@2"}, // stale again
			{after: 2 * time.Second, key: "a", want: "a@4"},         // past TTL+Stale: waited for
		}},
		{"expiry", expiring, []step{
			{key: "short", want: "short@1"},
			{after: 99 * time.Millisecond, key: "short", want: "short@1"},
			{after: time.Millisecond, key: "short", want: "short@2"},
		}},
		{"off", off, []step{
			{key: "a", want: "a@1"},
			{key: "a", want: "a@2"},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c := New(tc.o)
				var l counter
				for i, s := range tc.steps {
					time.Sleep(s.after)
					if s.do != nil {
						s.do(c)
						continue
					}
					got, err := c.Get(context.Background(), s.key, l.load)
					if err != nil || got != s.want {
						t.Fatalf("step %d: Get(%q) = %q, %v; want %q", i, s.key, got, err, s.want)
					}
					synctest.Wait() // background refreshes
				}
			})
		})
	}
}

// TestSharedLoad: concurrent Gets of one key share one load; the caller
// that started it leaving does not cancel it; the last one leaving does,
// and its answer is not kept; LoadTimeout bounds it.
func TestSharedLoad(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := New(opts())
		var loads atomic.Int32
		release := make(chan struct{})
		loadErr := make(chan error, 8)
		load := func(ctx context.Context, key string) (string, error) {
			loads.Add(1)
			select {
			case <-release:
				return "v", nil
			case <-ctx.Done():
				loadErr <- ctx.Err()
				return "", ctx.Err()
			}
		}
		// The first caller leaves; the others still get the answer.
		first, leave := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		wg.Go(func() {
			if _, err := c.Get(first, "k", load); !errors.Is(err, context.Canceled) {
				t.Errorf("the caller that left: %v", err)
			}
		})
		synctest.Wait()
		got := make([]string, 8)
		for i := range got {
			wg.Go(func() { got[i], _ = c.Get(context.Background(), "k", load) })
		}
		synctest.Wait()
		leave()
		synctest.Wait()
		close(release)
		wg.Wait()
		for i, v := range got {
			if v != "v" {
				t.Fatalf("caller %d got %q", i, v)
			}
		}
		if n := loads.Load(); n != 1 {
			t.Fatalf("%d loads for 9 callers, want 1", n)
		}
		if v, ok := c.Peek("k"); !ok || v != "v" {
			t.Fatal("the shared answer was not kept")
		}

		// Every caller leaves: the load is cancelled and not kept.
		release = make(chan struct{})
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		for range 3 {
			wg.Go(func() {
				if _, err := c.Get(ctx, "gone", load); !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("waiter past its deadline: %v", err)
				}
			})
		}
		wg.Wait()
		cancel()
		synctest.Wait()
		if err := <-loadErr; !errors.Is(err, context.Canceled) {
			t.Fatalf("the load nobody waits for: %v, want cancelled", err)
		}
		if _, ok := c.Peek("gone"); ok || c.Loads() != 0 {
			t.Fatalf("kept %v, %d loads under way", ok, c.Loads())
		}

		// LoadTimeout bounds a shared load whatever its callers' deadlines.
		start := time.Now()
		if _, err := c.Get(context.Background(), "stuck", load); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("stuck load: %v", err)
		}
		if d := time.Since(start); d != DefaultOptions[string, string]().LoadTimeout {
			t.Fatalf("a stuck load failed after %v", d)
		}
	})
}

// TestInvalidateDuringLoad: an Invalidate while a load runs: the callers
// waiting get its answer, a Get after it does not join it, and it is not
// kept.
func TestInvalidateDuringLoad(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := New(opts())
		release := make(chan struct{})
		var loads atomic.Int32
		load := func(context.Context, string) (string, error) {
			n := loads.Add(1)
			if n == 1 {
				<-release
			}
			return fmt.Sprint("v", n), nil
		}
		var wg sync.WaitGroup
		wg.Go(func() {
			if v, _ := c.Get(context.Background(), "k", load); v != "v1" {
				t.Errorf("waiter: %q", v)
			}
		})
		synctest.Wait()
		c.Invalidate()
		if v, _ := c.Get(context.Background(), "k", load); v != "v2" {
			t.Fatalf("after Invalidate: %q, want a load of its own", v)
		}
		close(release)
		wg.Wait()
		if v, _ := c.Get(context.Background(), "k", load); v != "v2" {
			t.Fatalf("the load overtaken by Invalidate replaced a newer answer: %q", v)
		}
		// Delete during a load: not kept.
		release = make(chan struct{})
		loads.Store(0)
		wg.Go(func() { _, _ = c.Get(context.Background(), "d", load) })
		synctest.Wait()
		c.Delete("d")
		close(release)
		wg.Wait()
		if _, ok := c.Peek("d"); ok {
			t.Fatal("a load overtaken by Delete was kept")
		}
	})
}

// TestFailures: a failed load reaches every caller sharing it and is not
// kept; a failed refresh drops the value; a panicking load is an error.
func TestFailures(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		o := opts()
		o.Stale = time.Second
		c := New(o)
		boom := errors.New("boom")
		release := make(chan struct{})
		var loads atomic.Int32
		fail := func(context.Context, string) (string, error) { loads.Add(1); <-release; return "", boom }
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				if _, err := c.Get(context.Background(), "k", fail); !errors.Is(err, boom) {
					t.Errorf("shared failure: %v", err)
				}
			})
		}
		synctest.Wait()
		close(release)
		wg.Wait()
		if loads.Load() != 1 || c.Len() != 0 {
			t.Fatalf("%d loads, %d kept", loads.Load(), c.Len())
		}

		var l counter
		if v, _ := c.Get(context.Background(), "r", l.load); v != "r@1" {
			t.Fatal(v)
		}
		time.Sleep(time.Second)
		if v, _ := c.Get(context.Background(), "r", fail); v != "r@1" {
			t.Fatalf("stale: %q", v)
		}
		synctest.Wait()
		if _, ok := c.Peek("r"); ok || c.Len() != 0 {
			t.Fatal("a failed refresh left its value")
		}

		for range 2 {
			_, err := c.Get(context.Background(), "p", func(context.Context, string) (string, error) { panic("bug") })
			if !errors.Is(err, ErrPanicked) || !strings.Contains(err.Error(), "bug") {
				t.Fatalf("panicking load: %v", err)
			}
		}
		if v, err := c.Get(context.Background(), "p", l.load); err != nil || v != "p@2" {
			t.Fatalf("after a panic: %q, %v", v, err)
		}
	})
}

// TestBounds: entries and bytes stay within their bounds; a full cache
// first drops what cannot be served, then trims; Trim 0 empties it; a
// value above MaxBytes is not kept.
func TestBounds(t *testing.T) {
	type want struct{ entries, bytes int }
	for _, tc := range []struct {
		name       string
		maxEntries int
		maxBytes   int
		trim       float64
		sizes      []int // one key each, in turn
		expireAt   int   // before this key, a TTL passes (-1: never)
		want       want
	}{
		{"entries trimmed to 3/4", 8, 0, 0.75, []int{1, 1, 1, 1, 1, 1, 1, 1, 1}, -1, want{7, 7}},
		{"bytes", 0, 100, 0.75, []int{40, 40, 40}, -1, want{1, 40}}, // 80+40 > 100: down to 75 before adding 40
		{"empties at Trim 0", 3, 0, 0, []int{1, 1, 1, 1}, -1, want{1, 1}},
		{"expired go first", 3, 0, 0.5, []int{1, 1, 1, 1, 1}, 2, want{3, 3}},
		{"too big", 0, 100, 0.75, []int{10, 101}, -1, want{1, 10}},
		{"unbounded", 0, 0, 0.75, []int{1, 1, 1, 1, 1}, -1, want{5, 5}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				o := DefaultOptions[string, int]()
				o.MaxEntries, o.MaxBytes, o.Trim = tc.maxEntries, tc.maxBytes, tc.trim
				o.Size = func(_ string, v int) int { return v }
				c := New(o)
				for i, n := range tc.sizes {
					if i == tc.expireAt {
						time.Sleep(o.TTL)
					}
					if _, err := c.Get(context.Background(), fmt.Sprint(i), func(context.Context, string) (int, error) { return n, nil }); err != nil {
						t.Fatal(err)
					}
					if (o.MaxEntries > 0 && c.Len() > o.MaxEntries) || (o.MaxBytes > 0 && c.Bytes() > o.MaxBytes) {
						t.Fatalf("after key %d: %d entries, %d bytes", i, c.Len(), c.Bytes())
					}
				}
				if got := (want{c.Len(), c.Bytes()}); got != tc.want {
					t.Fatalf("%+v, want %+v", got, tc.want)
				}
				if tc.expireAt >= 0 { // the keys loaded after the TTL are all kept
					for i := tc.expireAt; i < len(tc.sizes); i++ {
						if _, ok := c.Peek(fmt.Sprint(i)); !ok {
							t.Errorf("key %d dropped while expired ones were kept", i)
						}
					}
				}
			})
		})
	}
}

// TestPutPeekDeleteFunc: Put keeps, Peek finds within the TTL only,
// DeleteFunc drops what it selects.
func TestPutPeekDeleteFunc(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := New(DefaultOptions[string, int]())
		for i := range 5 {
			c.Put(fmt.Sprint(i), i)
		}
		if v, ok := c.Peek("3"); !ok || v != 3 {
			t.Fatalf("Peek 3: %d %v", v, ok)
		}
		c.DeleteFunc(func(_ string, v int) bool { return v%2 == 1 })
		if c.Len() != 3 {
			t.Fatalf("%d kept after DeleteFunc, want 3", c.Len())
		}
		if _, ok := c.Peek("3"); ok {
			t.Fatal("3 survived DeleteFunc")
		}
		time.Sleep(time.Second)
		if _, ok := c.Peek("2"); ok {
			t.Fatal("Peek past the TTL")
		}
		forever := DefaultOptions[string, int]()
		forever.TTL = Forever
		forever.Stale = time.Second
		f := New(forever)
		f.Put("k", 1)
		time.Sleep(1000 * time.Hour)
		if _, ok := f.Peek("k"); !ok {
			t.Fatal("a Forever value went")
		}
		off := DefaultOptions[string, int]()
		off.TTL = -1
		o := New(off)
		o.Put("k", 1)
		if _, ok := o.Peek("k"); ok {
			t.Fatal("a cache with no TTL kept")
		}
	})
}

// TestClockAndKeys: Options.Now is the clock; CopyKey copies a key before
// it is kept, and the load gets the copy.
func TestClockAndKeys(t *testing.T) {
	now := time.Unix(1000, 0)
	o := opts()
	o.Now = func() time.Time { return now }
	o.CopyKey = strings.Clone
	c := New(o)
	var l counter
	buf := []byte("dev1")
	key := unsafe.String(&buf[0], len(buf))
	if v, _ := c.Get(context.Background(), key, l.load); v != "dev1@1" {
		t.Fatal(v)
	}
	copy(buf, "XXXX")
	if v, _ := c.Get(context.Background(), "dev1", l.load); v != "dev1@1" {
		t.Fatalf("kept under an aliased key: %q", v)
	}
	now = now.Add(time.Second)
	if v, _ := c.Get(context.Background(), "dev1", l.load); v != "dev1@2" {
		t.Fatalf("the injected clock is not used: %q", v)
	}
}

// BenchmarkGetHit is the cost of a Get served from the cache, from
// GOMAXPROCS goroutines over 1024 keys.
func BenchmarkGetHit(b *testing.B) {
	o := DefaultOptions[string, int]()
	o.TTL = time.Hour
	c := New(o)
	keys := make([]string, 1024)
	for i := range keys {
		keys[i] = fmt.Sprint("key-", i)
		c.Put(keys[i], i)
	}
	var misses atomic.Int64
	load := func(context.Context, string) (int, error) { misses.Add(1); return 0, nil }
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		i := 0
		for pb.Next() {
			if _, err := c.Get(ctx, keys[i&1023], load); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
	b.ReportMetric(float64(misses.Load())/float64(b.N), "misses/op")
}

// BenchmarkPeekContended is ingest's use of its device cache: a Peek per
// message from 16 goroutines (its brokers' callbacks and its workers)
// on GOMAXPROCS cores, while a writer Puts a new key every 100 µs (the
// first messages of devices connecting).
func BenchmarkPeekContended(b *testing.B) {
	o := DefaultOptions[string, int]()
	o.TTL, o.MaxEntries = Forever, 0 // ingest bounds its own (maxCachedDevices)
	c := New(o)
	keys := make([]string, 100000)
	for i := range keys {
		keys[i] = fmt.Sprint("dev-", i)
		c.Put(keys[i], i)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(100 * time.Microsecond)
		defer t.Stop()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-t.C:
				c.Put(fmt.Sprint("new-", i), i)
			}
		}
	}()
	b.SetParallelism(max(1, 16/runtime.GOMAXPROCS(0)))
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			if _, ok := c.Peek(keys[i%len(keys)]); !ok {
				b.Fatal("a kept key not found")
			}
			i += 7
		}
	})
	b.StopTimer()
	close(stop)
	wg.Wait()
}

// TestWalksLetOthersIn: DeleteFunc and Range let the lock go between
// batches of values, so that a Put waiting for it gets in before the walk
// over 10,000 values ends. Holding the lock for the whole walk (as
// DeleteFunc did) the Put waits for its end and the walk sees it not done.
func TestWalksLetOthersIn(t *testing.T) {
	for _, walk := range []string{"DeleteFunc", "Range"} {
		t.Run(walk, func(t *testing.T) {
			o := DefaultOptions[string, int]()
			o.TTL, o.MaxEntries = Forever, 0
			c := New(o)
			const n = 10 * lockBatch
			for i := range n {
				c.Put(fmt.Sprint("k", i), i)
			}
			put := make(chan struct{})
			calls, doneBefore := 0, false
			visit := func(string, int) {
				calls++
				switch {
				case calls == 1:
					go func() { c.Put("new", -1); close(put) }()
				case calls <= lockBatch:
					time.Sleep(5 * time.Microsecond) // the Put waits past a millisecond: handed the lock next
				case calls == n-1:
					select {
					case <-put:
						doneBefore = true
					case <-time.After(5 * time.Second):
					}
				}
			}
			if walk == "DeleteFunc" {
				c.DeleteFunc(func(k string, v int) bool { visit(k, v); return false })
			} else {
				c.Range(func(k string, v int) bool { visit(k, v); return true })
			}
			<-put
			if !doneBefore {
				t.Fatalf("the Put waited for the whole %s over %d values", walk, n)
			}
			if c.Len() != n+1 {
				t.Fatalf("%d values after the walk, want %d", c.Len(), n+1)
			}
		})
	}
}
