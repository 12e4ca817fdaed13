package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Backoff is the delay schedule of one retry loop: Delay(n) is Min *
// 2^n, at most Max. With Jitter f in (0, 1] each delay is drawn uniformly
// from [d*(1-f), d], so that instances failing together do not retry
// together; f = 1 is "full jitter", 0 the exact schedule. Next and Wait
// count the attempts; Reset starts over. Not safe for concurrent use.
type Backoff struct {
	Min, Max time.Duration
	Jitter   float64

	n int // attempts since Reset
}

// Delay is the delay after attempt n (0 the first), jittered.
func (b *Backoff) Delay(n int) time.Duration {
	d := b.Min
	for i := 0; i < n && d < b.Max; i++ {
		d *= 2
	}
	d = min(d, b.Max)
	if b.Jitter > 0 && d > 0 {
		spread := time.Duration(float64(d) * min(b.Jitter, 1))
		d -= rand.N(spread + 1)
	}
	return d
}

// Next returns the delay after the current attempt and counts it.
func (b *Backoff) Next() time.Duration {
	d := b.Delay(b.n)
	if b.n < 62 { // Delay stops doubling at Max: a larger count changes nothing
		b.n++
	}
	return d
}

// Reset starts the schedule over at Min.
func (b *Backoff) Reset() { b.n = 0 }

// Wait waits Next's delay, or until ctx ends: then it returns ctx's
// error.
func (b *Backoff) Wait(ctx context.Context) error {
	t := time.NewTimer(b.Next())
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Every is a loop's other schedule, a fixed period: it calls fn with the
// tick's time every d until done is closed or fn returns false. A call
// that outlasts d delays the next (a ticker drops the ticks it missed),
// so calls never overlap. The first call comes after d, not at once.
func Every(done <-chan struct{}, d time.Duration, fn func(now time.Time) bool) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case now := <-t.C:
			if !fn(now) {
				return
			}
		}
	}
}
