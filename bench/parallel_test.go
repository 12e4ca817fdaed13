package bench

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

func TestForEach(t *testing.T) {
	// Every index once, at most conc at a time.
	var seen [1000]atomic.Int32
	var running, most atomic.Int32
	err := forEach(context.Background(), len(seen), 8, func(_ context.Context, i int) error {
		r := running.Add(1)
		for m := most.Load(); r > m && !most.CompareAndSwap(m, r); m = most.Load() {
		}
		seen[i].Add(1)
		running.Add(-1)
		return nil
	})
	if err != nil || most.Load() > 8 {
		t.Fatalf("err %v, %d at once", err, most.Load())
	}
	for i := range seen {
		if n := seen[i].Load(); n != 1 {
			t.Fatalf("index %d done %d times", i, n)
		}
	}
	// The first error stops the others and is returned: a call after
	// index 10 waits for the ctx the error cancels, so each of the other
	// three workers takes at most one index after it (whatever the
	// scheduler does), and none takes another once cancelled.
	boom := errors.New("boom")
	var after atomic.Int32
	err = forEach(context.Background(), 100000, 4, func(ctx context.Context, i int) error {
		switch {
		case i == 10:
			return boom
		case i > 10:
			after.Add(1)
			select {
			case <-ctx.Done():
			case <-time.After(10 * time.Second):
				t.Error("the error did not cancel the others' ctx")
			}
		}
		return nil
	})
	if !errors.Is(err, boom) || after.Load() > 3 {
		t.Fatalf("err %v, %d ran on", err, after.Load())
	}
	// An ended ctx stops it with ctx's error; n = 0 calls nothing.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := forEach(ctx, 10, 2, func(context.Context, int) error { t.Error("called"); return nil }); !errors.Is(err, context.Canceled) {
		t.Fatalf("ended ctx: %v", err)
	}
	if err := forEach(context.Background(), 0, 2, func(context.Context, int) error { t.Error("called"); return nil }); err != nil {
		t.Fatalf("n = 0: %v", err)
	}
}
