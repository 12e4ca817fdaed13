package bench

import (
	"context"
	"fmt"
	"io"
	"math/bits"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// Histogram records durations in log-linear buckets (HDR style): 64
// sub-buckets per power of two, so every percentile is within 1.6% of the
// true value, in constant memory, and Record is lock-free.
type Histogram struct {
	counts [histBuckets]atomic.Int64
	n, sum atomic.Int64
	max    atomic.Int64
}

const (
	histSubBits = 7 // values below 2^7 ns are exact
	histHalf    = 1 << (histSubBits - 1)
	histBuckets = 1<<histSubBits + 40*histHalf // up to 2^47 ns (~39 h)
)

func histIndex(v int64) int {
	if v < 1<<histSubBits {
		return int(max(v, 0))
	}
	shift := bits.Len64(uint64(v)) - histSubBits // >= 1
	i := 1<<histSubBits + (shift-1)*histHalf + int(v>>shift) - histHalf
	return min(i, histBuckets-1)
}

// histValue is the middle of bucket i (its lower bound for exact buckets).
func histValue(i int) int64 {
	if i < 1<<histSubBits {
		return int64(i)
	}
	j := i - 1<<histSubBits
	shift := j/histHalf + 1
	lo := int64(j%histHalf+histHalf) << shift
	return lo + int64(1)<<shift/2
}

// Record adds one duration.
func (h *Histogram) Record(d time.Duration) {
	v := int64(d)
	h.counts[histIndex(v)].Add(1)
	h.n.Add(1)
	h.sum.Add(v)
	for {
		m := h.max.Load()
		if v <= m || h.max.CompareAndSwap(m, v) {
			break
		}
	}
}

// Count is the number of durations recorded.
func (h *Histogram) Count() int64 { return h.n.Load() }

// Quantile returns the q-quantile (0..1), nearest rank; the maximum for q=1.
func (h *Histogram) Quantile(q float64) time.Duration {
	n := h.n.Load()
	if n == 0 {
		return 0
	}
	if q >= 1 {
		return time.Duration(h.max.Load())
	}
	rank := int64(q*float64(n) + 0.999999)
	rank = max(rank, 1)
	var seen int64
	for i := range h.counts {
		seen += h.counts[i].Load()
		if seen >= rank {
			return time.Duration(min(histValue(i), h.max.Load()))
		}
	}
	return time.Duration(h.max.Load())
}

// LatencySummary is a histogram's percentiles, in milliseconds.
type LatencySummary struct {
	N      int64   `json:"n"`
	P50Ms  float64 `json:"p50Ms"`
	P90Ms  float64 `json:"p90Ms"`
	P99Ms  float64 `json:"p99Ms"`
	MaxMs  float64 `json:"maxMs"`
	MeanMs float64 `json:"meanMs"`
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// Summary returns the percentiles.
func (h *Histogram) Summary() LatencySummary {
	n := h.n.Load()
	if n == 0 {
		return LatencySummary{}
	}
	return LatencySummary{
		N: n, P50Ms: ms(h.Quantile(0.50)), P90Ms: ms(h.Quantile(0.90)), P99Ms: ms(h.Quantile(0.99)),
		MaxMs: ms(h.Quantile(1)), MeanMs: ms(time.Duration(h.sum.Load() / n)),
	}
}

func (l LatencySummary) String() string {
	return fmt.Sprintf("p50=%.2fms p90=%.2fms p99=%.2fms max=%.2fms (n=%d)", l.P50Ms, l.P90Ms, l.P99Ms, l.MaxMs, l.N)
}

// Second is one second of a run's timeline.
type Second struct {
	T      int     `json:"t"` // seconds since the measured phase began
	OK     int64   `json:"ok"`
	Errors int64   `json:"errors"`
	P50Ms  float64 `json:"p50Ms"`
	P99Ms  float64 `json:"p99Ms"`
}

// timeline keeps a histogram per second of a run.
type timeline struct {
	start time.Time
	mu    sync.Mutex
	secs  []*secondStats
}

type secondStats struct {
	hist Histogram
	errs atomic.Int64
}

func (t *timeline) at(now time.Time) *secondStats {
	i := max(int(now.Sub(t.start)/time.Second), 0)
	t.mu.Lock()
	defer t.mu.Unlock()
	for len(t.secs) <= i {
		t.secs = append(t.secs, &secondStats{})
	}
	return t.secs[i]
}

func (t *timeline) seconds() []Second {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]Second, len(t.secs))
	for i, s := range t.secs {
		out[i] = Second{T: i, OK: s.hist.Count(), Errors: s.errs.Load(),
			P50Ms: ms(s.hist.Quantile(0.5)), P99Ms: ms(s.hist.Quantile(0.99))}
	}
	return out
}

// LoadResult is what one measured load phase gave.
type LoadResult struct {
	Concurrency int     `json:"concurrency"`
	Requests    int64   `json:"requests"` // completed without error
	Errors      int64   `json:"errors"`
	FirstError  string  `json:"firstError,omitempty"`
	Seconds     float64 `json:"seconds"`
	// RPS is Requests over the whole phase; SustainedRPS is the median of
	// the per-second rates, leaving out the first and last (partial) second.
	RPS          float64        `json:"rps"`
	SustainedRPS float64        `json:"sustainedRps"`
	Latency      LatencySummary `json:"latency"`
	Timeline     []Second       `json:"timeline"`
	// CPU, if taken, over the measured requests (FiberCeiling takes it).
	CPU *CPUBreakdown `json:"cpu,omitempty"`
}

func (r LoadResult) String() string {
	return fmt.Sprintf("%d ok, %d errors in %.1fs, %.0f req/s (sustained %.0f), %s",
		r.Requests, r.Errors, r.Seconds, r.RPS, r.SustainedRPS, r.Latency)
}

// loadSpec drives do from Concurrency goroutines: Warmup requests first
// (not measured), then Requests measured ones.
type loadSpec struct {
	Name        string
	Concurrency int
	Requests    int
	Warmup      int
	// Rate > 0 paces the measured requests (open loop, req/s); latency is
	// then counted from each request's scheduled start, so a stall is not
	// hidden by the requests it delays. 0 is closed loop: as fast as the
	// workers go.
	Rate float64
	// Do sends request i; it must be safe for concurrent use.
	Do func(ctx context.Context, i int) error
	// Progress, if set, gets a status line (with \r) every 500 ms.
	Progress io.Writer
	// Measured, if set, runs right before the measured phase (after the
	// warm-up) and the function it returns right after it, e.g. to take
	// the CPU time of the processes involved over the measured requests.
	Measured func() (end func())
}

// runLoad runs the warm-up and the measured phase.
func runLoad(ctx context.Context, s loadSpec) (LoadResult, error) {
	s.Concurrency = max(s.Concurrency, 1)
	if s.Warmup > 0 {
		// At the measured rate: a closed-loop burst before a paced run left
		// the server and broker digesting it during the first measured
		// second (p99 of that second 850 ms against 7-21 ms after it).
		if err := runPhase(ctx, s, s.Warmup, s.Rate, nil, nil, nil); err != nil {
			return LoadResult{}, fmt.Errorf("bench: %s warm-up: %w", s.Name, err)
		}
	}
	end := func() {}
	if s.Measured != nil {
		end = s.Measured()
	}
	var hist Histogram
	tl := &timeline{start: time.Now()}
	res := LoadResult{Concurrency: s.Concurrency}
	var errs atomic.Int64
	var first atomic.Value
	stop := make(chan struct{})
	var pw sync.WaitGroup
	if s.Progress != nil {
		pw.Add(1)
		go func() {
			defer pw.Done()
			t := time.NewTicker(500 * time.Millisecond)
			defer t.Stop()
			var prev int64
			prevAt := time.Now()
			for {
				select {
				case <-stop:
					fmt.Fprint(s.Progress, "\r\033[K")
					return
				case now := <-t.C:
					n := hist.Count()
					rate := float64(n-prev) / now.Sub(prevAt).Seconds()
					prev, prevAt = n, now
					fmt.Fprintf(s.Progress, "\r\033[K%s: %d/%d req, %.0f req/s, %d errors, p50 %.2fms, %s",
						s.Name, n, s.Requests, rate, errs.Load(), ms(hist.Quantile(0.5)), time.Since(tl.start).Round(100*time.Millisecond))
				}
			}
		}()
	}
	err := runPhase(ctx, s, s.Requests, s.Rate, &hist, tl, func(at time.Time, err error) {
		if err != nil {
			errs.Add(1)
			tl.at(at).errs.Add(1)
			first.CompareAndSwap(nil, err.Error())
		}
	})
	end()
	close(stop)
	pw.Wait()
	elapsed := time.Since(tl.start)
	res.Requests, res.Errors = hist.Count(), errs.Load()
	if f, ok := first.Load().(string); ok {
		res.FirstError = f
	}
	res.Seconds = elapsed.Seconds()
	res.RPS = float64(res.Requests) / elapsed.Seconds()
	res.Latency = hist.Summary()
	res.Timeline = tl.seconds()
	res.SustainedRPS = sustained(res.Timeline, res.RPS)
	return res, err
}

// sustained is the median per-second rate without the first and last
// seconds; short runs fall back to the overall rate.
func sustained(tl []Second, overall float64) float64 {
	if len(tl) < 3 {
		return overall
	}
	rates := make([]float64, 0, len(tl)-2)
	for _, s := range tl[1 : len(tl)-1] {
		rates = append(rates, float64(s.OK))
	}
	sort.Float64s(rates)
	return rates[len(rates)/2]
}

// runPhase sends n requests; hist, tl and done may be nil (warm-up). An error
// of ctx stops it; request errors are counted, not fatal.
func runPhase(ctx context.Context, s loadSpec, n int, rate float64, hist *Histogram, tl *timeline, done func(time.Time, error)) error {
	start := time.Now()
	return forEach(ctx, n, s.Concurrency, func(ctx context.Context, i int) error {
		t0 := time.Now()
		if rate > 0 {
			t0 = start.Add(time.Duration(float64(i) / rate * float64(time.Second)))
			if d := time.Until(t0); d > 0 {
				time.Sleep(d)
			}
		}
		err := s.Do(ctx, i)
		now := time.Now()
		if hist == nil {
			return nil
		}
		if err == nil {
			d := now.Sub(t0)
			hist.Record(d)
			if tl != nil {
				tl.at(now).hist.Record(d)
			}
		}
		if done != nil {
			done(now, err)
		}
		return nil
	})
}
