package backoff

import (
	"context"
	"testing"
	"time"
)

func TestSchedule(t *testing.T) {
	b := Backoff{Min: 100 * time.Millisecond, Max: time.Second}
	want := []time.Duration{100, 200, 400, 800, 1000, 1000}
	for i, w := range want {
		if d := b.Next(); d != w*time.Millisecond {
			t.Fatalf("attempt %d: %v, want %v", i, d, w*time.Millisecond)
		}
	}
	b.Reset()
	if d := b.Next(); d != 100*time.Millisecond {
		t.Fatalf("after Reset: %v", d)
	}
	for range 1000 { // the count stops growing; no overflow past Max
		b.Next()
	}
	if d := b.Next(); d != time.Second {
		t.Fatalf("after many attempts: %v", d)
	}
}

func TestJitter(t *testing.T) {
	for _, f := range []float64{0.5, 1} {
		b := Backoff{Min: time.Second, Max: 8 * time.Second, Jitter: f}
		lo, hi := time.Duration(1<<62), time.Duration(0)
		for range 2000 {
			d := b.Delay(2) // 4 s before jitter
			lo, hi = min(lo, d), max(hi, d)
		}
		floor := time.Duration(float64(4*time.Second) * (1 - f))
		if lo < floor || hi > 4*time.Second {
			t.Fatalf("jitter %v: delays in [%v, %v], want within [%v, 4s]", f, lo, hi, floor)
		}
		if hi-lo < time.Duration(float64(4*time.Second)*f)/2 {
			t.Fatalf("jitter %v: delays in [%v, %v] barely spread", f, lo, hi)
		}
	}
}

func TestWaitEndsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	b := Backoff{Min: time.Hour, Max: time.Hour}
	if err := b.Wait(ctx); err != context.Canceled {
		t.Fatalf("Wait: %v", err)
	}
	b = Backoff{Min: time.Millisecond, Max: time.Millisecond}
	if err := b.Wait(context.Background()); err != nil {
		t.Fatalf("Wait: %v", err)
	}
}

// TestEvery: fn runs once a period until it returns false, or until done
// is closed, and never after Every has returned.
func TestEvery(t *testing.T) {
	var calls int
	Every(make(chan struct{}), time.Millisecond, func(time.Time) bool {
		calls++
		return calls < 3
	})
	if calls != 3 {
		t.Fatalf("fn ran %d times, want 3 (it stops when fn returns false)", calls)
	}

	done := make(chan struct{})
	ran := make(chan struct{}, 1)
	returned := make(chan struct{})
	go func() {
		defer close(returned)
		Every(done, time.Millisecond, func(time.Time) bool {
			select {
			case ran <- struct{}{}:
			default:
			}
			return true
		})
	}()
	<-ran
	close(done)
	select {
	case <-returned:
	case <-time.After(5 * time.Second):
		t.Fatal("Every still running 5 s after done was closed")
	}
}
