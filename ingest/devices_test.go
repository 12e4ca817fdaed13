package ingest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"devicehub/bench/testkit"
	"devicehub/meta"
)

// countedDevices passes lookups to the real store, counting queries, and
// fails them while fail is set (PostgreSQL down).
type countedDevices struct {
	Devices
	queries atomic.Int32
	fail    atomic.Bool
}

func (c *countedDevices) DeviceStatuses(ctx context.Context, ids []string) (map[string]meta.DeviceStatus, error) {
	c.queries.Add(1)
	if c.fail.Load() {
		return nil, errors.New("connection refused")
	}
	return c.Devices.DeviceStatuses(ctx, ids)
}

// TestDeviceCache runs the cache over PostgreSQL: one query per device
// first seen, then one query per refresh for every device in use; changes
// in PostgreSQL show after a refresh; unused devices are forgotten; known
// statuses survive a failed refresh.
func TestDeviceCache(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t, 30*time.Second)
	p := randID("p")
	e.product(p)
	e.devices(p, 10)
	src := &countedDevices{Devices: e.store}
	c := newDeviceCache(src, 0, 0, slog.Default()) // refreshed by hand below; forgets at once
	dev := func(i int) string { return fmt.Sprintf("%s-d%d", p, i) }
	want := func(id string, wantFound bool, wantState string) {
		t.Helper()
		st, found, err := c.get(ctx, id)
		if err != nil || found != wantFound || (found && (st.State != wantState || st.ProductID != p)) {
			t.Fatalf("get %s: %+v found=%v err=%v; want found=%v state %q", id, st, found, err, wantFound, wantState)
		}
	}
	queries := func(want int32) {
		t.Helper()
		if n := src.queries.Swap(0); n != want {
			t.Fatalf("%d PostgreSQL queries, want %d", n, want)
		}
	}

	for range 3 {
		for i := range 10 {
			want(dev(i), true, "offline")
		}
		want("nope-"+p, false, "")
	}
	queries(11) // one per id, misses included

	// Concurrent first lookups of one id share one query.
	e.device(dev(10), p, "online")
	var wg sync.WaitGroup
	for range 50 {
		wg.Add(1)
		go func() { defer wg.Done(); want(dev(10), true, "online") }()
	}
	wg.Wait()
	queries(1)

	// Changes in PostgreSQL show after the next refresh, in one query.
	e.exec(`UPDATE devices SET state = 'notActive' WHERE id = $1`, dev(1))
	e.exec(`DELETE FROM devices WHERE id = $1`, dev(2))
	e.device("nope-"+p, p, "online")
	want(dev(1), true, "offline") // cached until then
	if err := c.refresh(ctx); err != nil {
		t.Fatal(err)
	}
	queries(1)
	want(dev(1), true, "notActive")
	want(dev(2), false, "")
	want("nope-"+p, true, "online")
	queries(0)

	// A refresh forgets what was not used since the one before.
	if err := c.refresh(ctx); err != nil { // re-reads the three used above
		t.Fatal(err)
	}
	queries(1)
	if n := c.len(); n != 3 {
		t.Fatalf("%d devices cached, want the 3 used", n)
	}
	want(dev(1), true, "notActive")
	if err := c.refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if n := c.len(); n != 1 {
		t.Fatalf("%d devices cached, want 1", n)
	}
	queries(1)

	// PostgreSQL down: the refresh fails, known statuses stay, a device
	// not seen before is an error, not an answer (and is not cached).
	src.fail.Store(true)
	want(dev(1), true, "notActive")
	if err := c.refresh(ctx); err == nil {
		t.Fatal("refresh succeeded with PostgreSQL down")
	}
	want(dev(1), true, "notActive")
	if _, _, err := c.get(ctx, dev(3)); err == nil {
		t.Fatal("a device not seen before was answered with PostgreSQL down")
	}
	src.fail.Store(false)
	want(dev(3), true, "offline")
}

// TestDeviceCacheKeepsQuietDevices: a device unused for up to keep
// refreshes stays cached (and refreshed: a change still shows within a
// TTL), then goes; prefetched devices cost one query per 10,000 and none
// on their first message.
func TestDeviceCacheKeepsQuietDevices(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t, 30*time.Second)
	p := randID("p")
	e.product(p)
	e.devices(p, 5)
	src := &countedDevices{Devices: e.store}
	c := newDeviceCache(src, 0, 2, slog.Default())
	dev := func(i int) string { return fmt.Sprintf("%s-d%d", p, i) }
	queries := func(want int32) {
		t.Helper()
		if n := src.queries.Swap(0); n != want {
			t.Fatalf("%d PostgreSQL queries, want %d", n, want)
		}
	}
	n, err := c.prefetch(ctx, []string{dev(0), dev(1), dev(2), "nope-" + p})
	if err != nil || n != 4 {
		t.Fatalf("prefetch: %d, %v", n, err)
	}
	queries(1)
	for i := range 3 {
		if st, found, err := c.get(ctx, dev(i)); err != nil || !found || st.State != "offline" {
			t.Fatalf("get %s: %+v %v %v", dev(i), st, found, err)
		}
	}
	if _, found, err := c.get(ctx, "nope-"+p); err != nil || found {
		t.Fatalf("unknown device: found %v, %v", found, err)
	}
	queries(0)
	// Unused for two refreshes: kept, and refreshed.
	e.exec(`UPDATE devices SET state = 'notActive' WHERE id = $1`, dev(0))
	for range 2 {
		if err := c.refresh(ctx); err != nil {
			t.Fatal(err)
		}
	}
	queries(2)
	if n := c.len(); n != 4 {
		t.Fatalf("%d cached after 2 quiet refreshes, want 4", n)
	}
	if st, _, _ := c.get(ctx, dev(0)); st.State != "notActive" {
		t.Fatalf("change not seen by a kept entry: %+v", st)
	}
	queries(0)
	// The others' third quiet refresh forgets them (the first refresh
	// above found them used).
	for range 2 {
		if err := c.refresh(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n := c.len(); n != 1 {
		t.Fatalf("%d cached after the others' third quiet refresh, want 1", n)
	}
}

// TestDeviceCacheHints: devices hinted together (their messages queued)
// are looked up in one query, before any worker asks.
func TestDeviceCacheHints(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t, 30*time.Second)
	p := randID("p")
	e.product(p)
	e.devices(p, 20)
	src := &countedDevices{Devices: e.store}
	c := newDeviceCache(src, time.Hour, 0, slog.Default())
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); c.run(rctx) }()
	defer func() { cancel(); <-done }()
	for i := range 20 {
		c.hint(fmt.Sprintf("%s-d%d", p, i))
	}
	testkit.Eventually(t, 10*time.Second, "the 20 hinted devices cached", func() bool { return c.len() >= 20 })
	for i := range 20 {
		if st, found, err := c.get(ctx, fmt.Sprintf("%s-d%d", p, i)); err != nil || !found || st.ProductID != p {
			t.Fatalf("get: %+v %v %v", st, found, err)
		}
	}
	if n := src.queries.Load(); n != 1 {
		t.Fatalf("%d queries for 20 hinted devices, want 1", n)
	}
}

// everyDevice knows every id, as a device of product "p", counting
// queries and the ids of the largest.
type everyDevice struct {
	queries, largest atomic.Int32
}

func (e *everyDevice) DeviceStatuses(_ context.Context, ids []string) (map[string]meta.DeviceStatus, error) {
	e.queries.Add(1)
	for n := int32(len(ids)); ; {
		l := e.largest.Load()
		if n <= l || e.largest.CompareAndSwap(l, n) {
			break
		}
	}
	m := make(map[string]meta.DeviceStatus, len(ids))
	for _, id := range ids {
		m[id] = meta.DeviceStatus{ProductID: "p", State: "online"}
	}
	return m, nil
}

// TestDeviceCacheHintStorm: more new devices hinted at once than one
// query takes (a storm of births) are all looked up ahead of the workers,
// a query per refreshChunk of them, none left to a query of its own.
func TestDeviceCacheHintStorm(t *testing.T) {
	src := &everyDevice{}
	c := newDeviceCache(src, time.Hour, 0, slog.Default())
	const n = 2*refreshChunk + refreshChunk/2
	for i := range n {
		c.hint(fmt.Sprintf("d%d", i))
	}
	ctx, cancel := context.WithCancel(ctxT(t, 30*time.Second))
	done := make(chan struct{})
	go func() { defer close(done); c.run(ctx) }()
	defer func() { cancel(); <-done }()
	for i := range n {
		if _, found, err := c.get(ctx, fmt.Sprintf("d%d", i)); err != nil || !found {
			t.Fatalf("get d%d: %v %v", i, found, err)
		}
	}
	if q, l := src.queries.Load(), src.largest.Load(); q != 3 || l != refreshChunk {
		t.Fatalf("%d queries, the largest of %d ids; want 3 of at most %d", q, l, refreshChunk)
	}
}

// watchedDevices is countedDevices with the store's announcements
// (DeviceWatcher): PostgreSQL's LISTEN, as ingest runs it.
type watchedDevices struct {
	*countedDevices
	store *meta.Store
}

func (w watchedDevices) WatchDevices(ctx context.Context, changed func(ids ...string)) error {
	return w.store.WatchDevices(ctx, changed)
}

// TestDeviceCacheFollowsAnnouncements: with PostgreSQL's announcements
// heard, a TTL re-reads nothing (without the rule every TTL re-reads
// every device cached: 100,000 devices cost a quarter of devicehub's
// CPU); an undeploy, a delete and a device's own model show within
// moments, by their announcements (the safety net's full re-read is off).
func TestDeviceCacheFollowsAnnouncements(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t, 30*time.Second)
	p := randID("p")
	e.product(p)
	e.devices(p, 10)
	src := watchedDevices{&countedDevices{Devices: e.store}, e.store}
	const ttl = 50 * time.Millisecond
	c := newDeviceCache(src, ttl, 1000, slog.Default())
	c.full = 1 << 30 // no safety net's full re-read: what changes shows by its announcement or not at all
	rctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); c.run(rctx) }()
	defer func() { stop(); <-done }()
	dev := func(i int) string { return fmt.Sprintf("%s-d%d", p, i) }
	for i := range 10 {
		if _, found, err := c.get(ctx, dev(i)); err != nil || !found {
			t.Fatalf("get %s: found %v, %v", dev(i), found, err)
		}
	}
	testkit.Eventually(t, 10*time.Second, "the announcements heard", c.watched.Load)

	// Quiet: TTLs pass, nothing is read. The first full re-read of the
	// watch's start may still be under way: counted from the next TTL.
	time.Sleep(2 * ttl)
	src.queries.Store(0)
	time.Sleep(10 * ttl)
	if n := src.queries.Load(); n != 0 {
		t.Fatalf("%d PostgreSQL queries in 10 TTLs without a change, want 0", n)
	}

	// Changes: each shows within moments.
	e.exec(`UPDATE devices SET state = 'notActive' WHERE id = $1`, dev(1))
	e.exec(`DELETE FROM devices WHERE id = $1`, dev(2))
	e.exec(`UPDATE devices SET metadata = '{"properties":[]}' WHERE id = $1`, dev(3))
	e.exec(`UPDATE devices SET state = 'online' WHERE id = $1`, dev(4)) // presence: not announced, not needed
	testkit.Eventually(t, 10*time.Second, "the changes in the cache", func() bool {
		st1, found1, _ := c.get(ctx, dev(1))
		_, found2, _ := c.get(ctx, dev(2))
		st3, _, _ := c.get(ctx, dev(3))
		return found1 && st1.State == "notActive" && !found2 && st3.OwnModel
	})
	if n := src.queries.Load(); n > 3 {
		t.Errorf("%d PostgreSQL queries for 3 announced devices", n)
	}
}
