package ingest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"devicehub/bench/testkit"
	"devicehub/meta"
)

// flakyStates fails every write until ok is set.
type flakyStates struct {
	ok       atomic.Bool
	written  atomic.Int64
	attempts atomic.Int64
}

func (f *flakyStates) ApplyStateChanges(_ context.Context, c []meta.StateChange) (int, error) {
	f.attempts.Add(1)
	if !f.ok.Load() {
		return 0, errors.New("connection refused")
	}
	f.written.Add(int64(len(c)))
	return len(c), nil
}

// TestStateBatcherBounded: while PostgreSQL refuses the writes, at most
// maxBuf changes wait besides the batch being retried, and add waits for
// room; once PostgreSQL answers every change is written and done.
func TestStateBatcherBounded(t *testing.T) {
	src := &flakyStates{}
	b := newStateBatcher(src, 5*time.Millisecond, 2, slog.New(slog.NewTextHandler(io.Discard, nil)), newMetrics(func() float64 { return 0 }, func() float64 { return 0 }))
	b.maxBuf = 4
	var done atomic.Int64
	added := make(chan struct{})
	go func() {
		defer close(added)
		for i := range 10 {
			b.add(meta.StateChange{DeviceID: fmt.Sprintf("d%d", i), Online: i%2 == 0, At: time.Now()}, func() { done.Add(1) })
		}
	}()
	// Once a write is being retried nothing more is taken: the buffer
	// fills to its bound and stays there. (Before the first write, the
	// buffer may hold 4, all taken at once as a backlog.)
	testkit.Eventually(t, 10*time.Second, "a write retried and 4 changes pending", func() bool {
		return src.attempts.Load() > 0 && b.pending() >= 4
	})
	// 2 or 4 taken (retried), 4 buffered: the next add waits for room.
	select {
	case <-added:
		t.Fatal("all 10 added while PostgreSQL refused every write")
	default:
	}
	if n := b.pending(); n != 4 {
		t.Fatalf("%d pending, want at most 4", n)
	}
	src.ok.Store(true)
	<-added
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.close(ctx); err != nil {
		t.Fatal(err)
	}
	if done.Load() != 10 || src.written.Load() != 10 {
		t.Fatalf("done %d, written %d, want 10", done.Load(), src.written.Load())
	}
}

// gatedStates holds its first write until release is closed, and records
// the size of every write.
type gatedStates struct {
	release chan struct{}
	first   atomic.Bool
	sizes   chan int
}

func (g *gatedStates) ApplyStateChanges(_ context.Context, c []meta.StateChange) (int, error) {
	if !g.first.Swap(true) {
		select {
		case <-g.release:
		case <-time.After(20 * time.Second): // the test failed
		}
	}
	g.sizes <- len(c)
	return len(c), nil
}

// TestStateBatcherBacklog: with a backlog (more than a batch buffered
// behind a write), the next write takes up to backlogBatches batches.
func TestStateBatcherBacklog(t *testing.T) {
	g := &gatedStates{release: make(chan struct{}), sizes: make(chan int, 100)}
	b := newStateBatcher(g, time.Millisecond, 2, slog.New(slog.NewTextHandler(io.Discard, nil)), newMetrics(func() float64 { return 0 }, func() float64 { return 0 }))
	b.add(meta.StateChange{DeviceID: "d0", Online: true, At: time.Now()}, func() {})
	deadline := time.Now().Add(10 * time.Second)
	for b.pending() > 0 { // the first write has taken d0 and waits
		if time.Now().After(deadline) {
			t.Fatal("the first change not taken")
		}
		time.Sleep(time.Millisecond)
	}
	const n = 3 * backlogBatches * 2
	for i := range n {
		b.add(meta.StateChange{DeviceID: fmt.Sprintf("d%d", i), Online: true, At: time.Now()}, func() {})
	}
	close(g.release)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.close(ctx); err != nil {
		t.Fatal(err)
	}
	close(g.sizes)
	var sizes []int
	for s := range g.sizes {
		sizes = append(sizes, s)
	}
	want := []int{1, 2 * backlogBatches, 2 * backlogBatches, 2 * backlogBatches}
	if len(sizes) != len(want) {
		t.Fatalf("writes of %v, want %v", sizes, want)
	}
	for i := range want {
		if sizes[i] != want[i] {
			t.Fatalf("writes of %v, want %v", sizes, want)
		}
	}
}

// slowDeviceStates holds every write holding device "slow" until release
// is closed, and records each device's changes in the order written.
type slowDeviceStates struct {
	release chan struct{}
	mu      sync.Mutex
	order   map[string][]meta.StateChange // device -> each change written
}

func (s *slowDeviceStates) ApplyStateChanges(_ context.Context, c []meta.StateChange) (int, error) {
	for _, ch := range c {
		if ch.DeviceID == "slow" {
			<-s.release
			break
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ch := range c {
		s.order[ch.DeviceID] = append(s.order[ch.DeviceID], ch)
	}
	return len(c), nil
}

// TestStateShards: while one write waits for PostgreSQL, other devices'
// changes are written by the other writers (with one writer they would
// wait behind it, as a storm's births did); each device's changes are
// written in the order added (those folded into a later one written with
// it), all of them once the write is let go.
func TestStateShards(t *testing.T) {
	src := &slowDeviceStates{release: make(chan struct{}), order: map[string][]meta.StateChange{}}
	var written, folded atomic.Int64
	s := newStateShards(src, 4, time.Millisecond, 2, slog.New(slog.NewTextHandler(io.Discard, nil)),
		newMetrics(func() float64 { return 0 }, func() float64 { return 0 }),
		func(n int) { written.Add(int64(n)) }, func() { folded.Add(1) })
	var done atomic.Int64
	t0 := time.Now()
	at := func(i int) time.Time { return t0.Add(time.Duration(i) * time.Millisecond) }
	s.add(meta.StateChange{DeviceID: "slow", Online: true, At: t0}, func() { done.Add(1) })
	const devices, changes = 40, 6
	for i := range changes {
		for d := range devices {
			s.add(meta.StateChange{DeviceID: fmt.Sprintf("d%d", d), Online: i%2 == 0, At: at(i + 1)}, func() { done.Add(1) })
		}
	}
	// About a quarter of the devices share the slow device's writer: the others'
	// changes are all written while it waits.
	testkit.Eventually(t, 10*time.Second, "the other writers' changes written", func() bool {
		return written.Load()+folded.Load() >= devices*changes/4
	})
	close(src.release)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.close(ctx); err != nil {
		t.Fatal(err)
	}
	if n := done.Load(); n != devices*changes+1 {
		t.Fatalf("done %d, want %d", n, devices*changes+1)
	}
	if w, f := written.Load(), folded.Load(); w+f != devices*changes+1 {
		t.Fatalf("%d written and %d folded, want %d in all", w, f, devices*changes+1)
	}
	for d := range devices {
		got := src.order[fmt.Sprintf("d%d", d)]
		for i, c := range got {
			if i > 0 && !c.At.After(got[i-1].At) {
				t.Fatalf("d%d: changes written as %+v, out of order", d, got)
			}
			if c.Online != (c.At.Equal(at(1)) || c.At.Equal(at(3)) || c.At.Equal(at(5))) {
				t.Fatalf("d%d: change %+v is not the one of its time", d, c)
			}
		}
		if len(got) == 0 || !got[len(got)-1].At.Equal(at(changes)) {
			t.Fatalf("d%d: changes written %+v, the last not among them", d, got)
		}
	}
}

// TestStateBatcherFolds: a change added while one of its device waits is
// folded into it, in its place; a change added while its device's
// previous change is being written waits behind that write. Every
// change's done runs once what holds it is written.
func TestStateBatcherFolds(t *testing.T) {
	g := &gatedStates{release: make(chan struct{}), sizes: make(chan int, 100)}
	rec := &recordedStates{next: g}
	b := newStateBatcher(rec, time.Millisecond, 100, slog.New(slog.NewTextHandler(io.Discard, nil)), newMetrics(func() float64 { return 0 }, func() float64 { return 0 }))
	var folded, done atomic.Int64
	b.folded = func() { folded.Add(1) }
	t0 := time.Now()
	at := func(i int) time.Time { return t0.Add(time.Duration(i) * time.Millisecond) }
	add := func(id string, online bool, i int) {
		b.add(meta.StateChange{DeviceID: id, Online: online, At: at(i)}, func() { done.Add(1) })
	}
	add("x", true, 0)
	testkit.Eventually(t, 10*time.Second, "x's birth taken", func() bool { return b.pending() == 0 })
	add("x", false, 1) // x's birth is being written: not folded
	add("a", false, 2) // a will, then a newer birth: one change, the birth
	add("b", true, 3)  // a birth, then the will that is the latest: the will
	add("a", true, 4)
	add("b", false, 5)
	if n, f := b.pending(), folded.Load(); n != 3 || f != 2 {
		t.Fatalf("%d pending, %d folded; want 3 and 2", n, f)
	}
	if done.Load() != 0 {
		t.Fatal("a change done before it was written")
	}
	close(g.release)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.close(ctx); err != nil {
		t.Fatal(err)
	}
	if done.Load() != 6 {
		t.Fatalf("%d changes done, want 6", done.Load())
	}
	want := [][]meta.StateChange{
		{{DeviceID: "x", Online: true, At: at(0)}},
		{{DeviceID: "x", At: at(1)}, {DeviceID: "a", Online: true, At: at(4), OtherAt: at(2)}, {DeviceID: "b", At: at(5), OtherAt: at(3)}},
	}
	if len(rec.writes) != len(want) {
		t.Fatalf("writes %+v, want %+v", rec.writes, want)
	}
	for i := range want {
		if !slices.Equal(rec.writes[i], want[i]) {
			t.Fatalf("write %d: %+v, want %+v", i, rec.writes[i], want[i])
		}
	}
}

// recordedStates records every write before handing it to next.
type recordedStates struct {
	next   StateApplier
	mu     sync.Mutex
	writes [][]meta.StateChange
}

func (r *recordedStates) ApplyStateChanges(ctx context.Context, c []meta.StateChange) (int, error) {
	r.mu.Lock()
	r.writes = append(r.writes, slices.Clone(c))
	r.mu.Unlock()
	return r.next.ApplyStateChanges(ctx, c)
}

// heldStates holds PostgreSQL's writes (the real store's) while held is
// set, telling entered of the first one held, and records each device's
// changes as handed to PostgreSQL.
type heldStates struct {
	store   *meta.Store
	release chan struct{}
	entered chan struct{}
	first   atomic.Bool
	mu      sync.Mutex
	changes map[string][]meta.StateChange
}

func (h *heldStates) ApplyStateChanges(ctx context.Context, c []meta.StateChange) (int, error) {
	if !h.first.Swap(true) {
		close(h.entered)
		select {
		case <-h.release:
		case <-ctx.Done(): // the test failed: Close gives up
			return 0, ctx.Err()
		}
	}
	h.mu.Lock()
	for _, ch := range c {
		h.changes[ch.DeviceID] = append(h.changes[ch.DeviceID], ch)
	}
	h.mu.Unlock()
	return h.store.ApplyStateChanges(ctx, c)
}

// TestStormFoldsStateChanges, through the broker and PostgreSQL: while a
// write is slow, a device's will and the newer birth behind it are
// written as one change (online, the will's time as its offline time),
// and so are a birth and the will behind it (offline: the latest is
// written); every message is acknowledged only once written.
func TestStormFoldsStateChanges(t *testing.T) {
	e := newEnv(t)
	p := randID("p")
	e.product(p)
	held, a, b := p+"-held", p+"-a", p+"-b"
	for _, d := range []string{held, a, b} {
		e.device(d, p, "offline")
	}
	h := &heldStates{store: e.store, release: make(chan struct{}), entered: make(chan struct{}), changes: map[string][]meta.StateChange{}}
	opt := testOptions(p)
	opt.StateWriters = 1 // every device behind the held write
	in := e.startIngesterWith(opt, h)
	dev := newPublisher(t, nil)
	topic := func(d, level string) string { return "/" + p + "/" + d + "/" + level }
	dev.MustPublish(t, topic(held, "online"), 1, "{}")
	select {
	case <-h.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the first birth's write not begun")
	}
	dev.MustPublish(t, topic(a, "offline"), 1, "{}") // a will, then a newer birth
	dev.MustPublish(t, topic(b, "online"), 1, "{}")  // a birth, then a newer will
	dev.MustPublish(t, topic(a, "online"), 1, "{}")
	dev.MustPublish(t, topic(b, "offline"), 1, "{}")
	testkit.Eventually(t, 10*time.Second, "two changes folded", func() bool { return in.Stats().StateFolded == 2 })
	if s := in.Stats(); s.Acked != 0 || s.StateChanges != 0 {
		t.Fatalf("before any write: %+v", s)
	}
	close(h.release)
	testkit.Eventually(t, 10*time.Second, "every birth and will acknowledged", func() bool { return in.Stats().Acked == 5 })
	if s := in.Stats(); s.StateChanges != 3 {
		t.Fatalf("%d changes written, want 3 (held, a, b): %+v", s.StateChanges, s)
	}
	h.mu.Lock()
	na, nb := len(h.changes[a]), len(h.changes[b])
	h.mu.Unlock()
	if na != 1 || nb != 1 {
		t.Fatalf("PostgreSQL was handed %d changes of a and %d of b, want one each", na, nb)
	}
	state := func(d string) (s string, on, off time.Time) {
		var onT, offT *time.Time
		if err := e.store.DB().QueryRow(`SELECT state, online_time, offline_time FROM devices WHERE id = $1`, d).Scan(&s, &onT, &offT); err != nil {
			t.Fatal(err)
		}
		if onT == nil || offT == nil {
			t.Fatalf("%s: online time %v, offline time %v: one not stored", d, onT, offT)
		}
		return s, *onT, *offT
	}
	if s, on, off := state(a); s != "online" || !off.Before(on) {
		t.Fatalf("a: %s, online %v, offline %v; want online, its will before its birth", s, on, off)
	}
	if s, on, off := state(b); s != "offline" || !on.Before(off) {
		t.Fatalf("b: %s, online %v, offline %v; want offline, its birth before its will", s, on, off)
	}
	// Both messages of each device stored too.
	testkit.Eventually(t, 10*time.Second, "births and wills stored as messages", func() bool {
		return e.count("SELECT count() FROM device_message WHERE device_id IN (?, ?) AND message_type IN ('ONLINE','OFFLINE')", a, b) == 4
	})
}
