package ingest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"devicehub/bench/testkit"
	"devicehub/meta"
)

// flakyStates fails every write until ok is set.
type flakyStates struct {
	ok      atomic.Bool
	written atomic.Int64
}

func (f *flakyStates) ApplyStateChanges(_ context.Context, c []meta.StateChange) (int, error) {
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
			b.add(meta.StateChange{DeviceID: "d", Online: i%2 == 0, At: time.Now()}, func() { done.Add(1) })
		}
	}()
	testkit.Eventually(t, 10*time.Second, "4 changes pending", func() bool { return b.pending() >= 4 })
	// 2 taken (retried), 4 buffered: 6 added, the 7th waits for room.
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
		<-g.release
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
		b.add(meta.StateChange{DeviceID: "d" + string(rune('a'+i%26)), Online: true, At: time.Now()}, func() {})
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
	order   map[string][]bool // device -> Online of each change written
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
		s.order[ch.DeviceID] = append(s.order[ch.DeviceID], ch.Online)
	}
	return len(c), nil
}

// TestStateShards: while one write waits for PostgreSQL, other devices'
// changes are written by the other writers (with one writer they would
// wait behind it, as a storm's births did); each device's changes are
// written in the order added, all of them once the write is let go.
func TestStateShards(t *testing.T) {
	src := &slowDeviceStates{release: make(chan struct{}), order: map[string][]bool{}}
	var written atomic.Int64
	s := newStateShards(src, 4, time.Millisecond, 2, slog.New(slog.NewTextHandler(io.Discard, nil)),
		newMetrics(func() float64 { return 0 }, func() float64 { return 0 }), func(n int) { written.Add(int64(n)) })
	var done atomic.Int64
	s.add(meta.StateChange{DeviceID: "slow", Online: true, At: time.Now()}, func() { done.Add(1) })
	const devices, changes = 40, 6
	for i := range changes {
		for d := range devices {
			s.add(meta.StateChange{DeviceID: fmt.Sprintf("d%d", d), Online: i%2 == 0, At: time.Now()}, func() { done.Add(1) })
		}
	}
	// About a quarter of the devices share the slow device's writer: the others'
	// changes are all written while it waits.
	testkit.Eventually(t, 10*time.Second, "the other writers' changes written", func() bool { return written.Load() >= devices*changes/4 })
	close(src.release)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.close(ctx); err != nil {
		t.Fatal(err)
	}
	if n := done.Load(); n != devices*changes+1 {
		t.Fatalf("done %d, want %d", n, devices*changes+1)
	}
	for d := range devices {
		got := src.order[fmt.Sprintf("d%d", d)]
		if len(got) != changes {
			t.Fatalf("d%d: %d changes written, want %d", d, len(got), changes)
		}
		for i, on := range got {
			if on != (i%2 == 0) {
				t.Fatalf("d%d: changes written as %v, out of order", d, got)
			}
		}
	}
}
