package ingest

import (
	"context"
	"errors"
	"io"
	"log/slog"
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
