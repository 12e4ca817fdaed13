package tsdb

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"devicehub/schema"
)

// fakeInserter records what it stores; fail(n) makes the next n calls fail
// and block() holds calls until release().
type fakeInserter struct {
	mu      sync.Mutex
	calls   int
	fails   int
	failAll bool
	gate    chan struct{} // nil: do not block
	msgs    []Message
	props   []PropertyValue
}

func (f *fakeInserter) InsertBatch(ctx context.Context, b *Batch) error {
	f.mu.Lock()
	gate := f.gate
	f.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.failAll || f.fails > 0 {
		f.fails--
		return errors.New("clickhouse down")
	}
	f.msgs = append(f.msgs, b.Messages()...)
	f.props = append(f.props, b.Properties()...)
	return nil
}

func (f *fakeInserter) stored() (msgs, props int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.msgs), len(f.props)
}

func (f *fakeInserter) block() {
	f.mu.Lock()
	f.gate = make(chan struct{})
	f.mu.Unlock()
}

func (f *fakeInserter) release() {
	f.mu.Lock()
	close(f.gate)
	f.gate = nil
	f.mu.Unlock()
}

func msgs(n int) []Message {
	out := make([]Message, n)
	for i := range out {
		out[i] = Message{Time: time.Unix(1709164800, 0), ProductID: "p", DeviceID: "d", Direction: "up", MessageType: "REPORT_PROPERTY"}
	}
	return out
}

func props(n int) []PropertyValue {
	out := make([]PropertyValue, n)
	for i := range out {
		out[i] = PropertyValue{Time: time.Unix(1709164800, 0), ProductID: "p", DeviceID: "d", Property: "temp", ValueType: "number", Num: float64(i)}
	}
	return out
}

func closeW(t *testing.T, w *Writer) {
	t.Helper()
	if err := w.Close(context.Background()); err != nil {
		t.Fatalf("Close: %v", err)
	}
}

func TestWriterFlushOnRows(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeInserter{}
		w := NewWriter(f, WriterOptions{MaxRows: 10, FlushInterval: time.Hour})
		var done atomic.Int32
		if err := w.Add(t.Context(), msgs(4), props(3), func() { done.Add(1) }); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if m, _ := f.stored(); m != 0 || done.Load() != 0 {
			t.Fatalf("flushed below MaxRows: %d stored, done %d", m, done.Load())
		}
		if err := w.Add(t.Context(), msgs(3), nil, func() { done.Add(1) }); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if m, p := f.stored(); m != 7 || p != 3 || done.Load() != 2 {
			t.Fatalf("after MaxRows: stored %d/%d, done %d; want 7/3, 2", m, p, done.Load())
		}
		closeW(t, w)
	})
}

func TestWriterFlushOnInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeInserter{}
		w := NewWriter(f, WriterOptions{MaxRows: 1000, FlushInterval: 200 * time.Millisecond})
		start := time.Now()
		stored := make(chan time.Duration, 1)
		if err := w.Add(t.Context(), msgs(1), nil, func() { stored <- time.Since(start) }); err != nil {
			t.Fatal(err)
		}
		time.Sleep(150 * time.Millisecond)
		synctest.Wait()
		if m, _ := f.stored(); m != 0 {
			t.Fatalf("flushed after 150ms of a 200ms interval")
		}
		d := <-stored
		if d < 180*time.Millisecond || d > 200*time.Millisecond {
			t.Fatalf("flushed after %v, want ~200ms (10%% jitter)", d)
		}
		closeW(t, w)
	})
}

func TestWriterDoneAfterStorage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeInserter{}
		f.block()
		w := NewWriter(f, WriterOptions{MaxRows: 1, FlushInterval: time.Hour})
		var done atomic.Bool
		if err := w.Add(t.Context(), msgs(1), props(1), func() {
			if m, p := f.stored(); m != 1 || p != 1 {
				t.Errorf("done called with %d/%d rows stored", m, p)
			}
			done.Store(true)
		}); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if done.Load() {
			t.Fatal("done called while the insert is blocked")
		}
		f.release()
		synctest.Wait()
		if !done.Load() {
			t.Fatal("done not called after storage")
		}
		closeW(t, w)
	})
}

func TestWriterBackpressure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeInserter{}
		f.block()
		w := NewWriter(f, WriterOptions{MaxRows: 5, QueueRows: 10, FlushInterval: time.Hour})
		if err := w.Add(t.Context(), msgs(10), nil, nil); err != nil {
			t.Fatal(err)
		}
		// Queue full: Add blocks, and gives up with its context.
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		start := time.Now()
		err := w.Add(ctx, msgs(1), nil, nil)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) != time.Second {
			t.Fatalf("Add on a full queue: %v after %v; want deadline after 1s", err, time.Since(start))
		}
		var added atomic.Bool
		go func() {
			if err := w.Add(t.Context(), msgs(1), nil, nil); err != nil {
				t.Error(err)
			}
			added.Store(true)
		}()
		synctest.Wait()
		if added.Load() {
			t.Fatal("Add did not block on a full queue")
		}
		if p := w.Pending(); p != 10 {
			t.Fatalf("pending %d, want 10", p)
		}
		f.release()
		synctest.Wait()
		if !added.Load() {
			t.Fatal("Add still blocked after the queue drained")
		}
		closeW(t, w)
		if m, _ := f.stored(); m != 11 {
			t.Fatalf("stored %d, want 11", m)
		}
	})
}

func TestWriterRetry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeInserter{fails: 3}
		var attempts, failures atomic.Int32
		w := NewWriter(f, WriterOptions{MaxRows: 1, FlushInterval: time.Hour, RetryMin: 100 * time.Millisecond, RetryMax: 300 * time.Millisecond,
			OnFlush: func(n int, _ time.Duration, err error) {
				attempts.Add(1)
				if err != nil {
					failures.Add(1)
				}
			}})
		start := time.Now()
		stored := make(chan time.Duration, 1)
		if err := w.Add(t.Context(), msgs(2), nil, func() { stored <- time.Since(start) }); err != nil {
			t.Fatal(err)
		}
		// Backoff 100ms, 200ms, then capped at 300ms.
		if d := <-stored; d != 600*time.Millisecond {
			t.Fatalf("stored after %v, want 600ms of backoff", d)
		}
		if attempts.Load() != 4 || failures.Load() != 3 {
			t.Fatalf("attempts %d failures %d, want 4, 3", attempts.Load(), failures.Load())
		}
		if m, _ := f.stored(); m != 2 {
			t.Fatalf("stored %d, want 2", m)
		}
		closeW(t, w)
	})
}

// A failure of the property insert must not store the messages twice.
func TestWriterRetriesPartsSeparately(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &failProps{}
		w := NewWriter(f, WriterOptions{MaxRows: 1, FlushInterval: time.Hour, RetryMin: time.Millisecond})
		if err := w.Add(t.Context(), msgs(3), props(2), nil); err != nil {
			t.Fatal(err)
		}
		closeW(t, w)
		if f.msgs != 3 || f.props != 2 {
			t.Fatalf("stored %d messages, %d props; want 3, 2", f.msgs, f.props)
		}
	})
}

type failProps struct {
	mu          sync.Mutex
	msgs, props int
	failed      bool
}

func (f *failProps) InsertBatch(_ context.Context, b *Batch) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(b.props) > 0 && !f.failed {
		f.failed = true
		return errors.New("props failed")
	}
	f.msgs += len(b.msgs)
	f.props += len(b.props)
	return nil
}

func TestWriterCloseFlushes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeInserter{}
		w := NewWriter(f, WriterOptions{MaxRows: 1000, FlushInterval: time.Hour})
		var done atomic.Int32
		for range 5 {
			if err := w.Add(t.Context(), msgs(3), props(1), func() { done.Add(1) }); err != nil {
				t.Fatal(err)
			}
		}
		closeW(t, w)
		if m, p := f.stored(); m != 15 || p != 5 || done.Load() != 5 {
			t.Fatalf("after Close: %d/%d stored, done %d; want 15/5, 5", m, p, done.Load())
		}
		if err := w.Add(t.Context(), msgs(1), nil, nil); !errors.Is(err, ErrClosed) {
			t.Fatalf("Add after Close: %v, want ErrClosed", err)
		}
	})
}

func TestWriterCloseDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeInserter{failAll: true}
		w := NewWriter(f, WriterOptions{MaxRows: 1000, FlushInterval: time.Hour, RetryMin: 10 * time.Millisecond})
		var done atomic.Bool
		if err := w.Add(t.Context(), msgs(7), nil, func() { done.Store(true) }); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		err := w.Close(ctx)
		if err == nil || !strings.Contains(err.Error(), "7 rows not stored") || !strings.Contains(err.Error(), "clickhouse down") ||
			!errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Close with ClickHouse down: %v", err)
		}
		if done.Load() {
			t.Fatal("done called for rows never stored")
		}
	})
}

func TestWriterRejectsInvalidRows(t *testing.T) {
	f := &fakeInserter{}
	w := NewWriter(f, WriterOptions{})
	defer closeW(t, w)
	bad := msgs(2)
	bad[1].Direction = "sideways"
	if err := w.Add(t.Context(), bad, nil, nil); !errors.Is(err, schema.ErrIllegalArgument) {
		t.Fatalf("bad direction: %v", err)
	}
	p := props(1)
	p[0].ValueType = ""
	if err := w.Add(t.Context(), nil, p, nil); !errors.Is(err, schema.ErrIllegalArgument) {
		t.Fatalf("bad value type: %v", err)
	}
	m := msgs(1)
	m[0].Time = time.Time{}
	if err := w.Add(t.Context(), m, nil, nil); !errors.Is(err, schema.ErrIllegalArgument) {
		t.Fatalf("zero time: %v", err)
	}
	if n := w.Pending(); n != 0 {
		t.Fatalf("pending %d after rejected rows", n)
	}
}

func bigMsgs(n, payload int) []Message {
	ms := msgs(n)
	for i := range ms {
		ms[i].Payload = make([]byte, payload)
	}
	return ms
}

// Large payloads flush a batch before MaxRows, and bound the queue.
func TestWriterBoundsBytes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeInserter{}
		w := NewWriter(f, WriterOptions{MaxRows: 1000, MaxBytes: 100 << 10, FlushInterval: time.Hour})
		if err := w.Add(t.Context(), bigMsgs(1, 60<<10), nil, nil); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if m, _ := f.stored(); m != 0 {
			t.Fatalf("flushed %d messages below MaxBytes", m)
		}
		if err := w.Add(t.Context(), bigMsgs(1, 60<<10), nil, nil); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if m, _ := f.stored(); m != 2 {
			t.Fatalf("stored %d messages past MaxBytes, want 2", m)
		}
		// What a caller holds until done counts as well.
		if err := w.AddHolding(t.Context(), msgs(1), nil, 60<<10, nil); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if m, _ := f.stored(); m != 2 {
			t.Fatalf("flushed below MaxBytes, held bytes included: %d stored", m)
		}
		if err := w.AddHolding(t.Context(), msgs(1), nil, 60<<10, nil); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if m, _ := f.stored(); m != 4 {
			t.Fatalf("stored %d messages past MaxBytes, held bytes included; want 4", m)
		}

		// Queue of 200 KiB: a blocked insert of 120 KiB leaves room for
		// one more 60 KiB message, not two.
		f.block()
		w2 := NewWriter(f, WriterOptions{MaxRows: 1000, MaxBytes: 100 << 10, QueueBytes: 200 << 10, FlushInterval: time.Hour})
		for range 3 {
			if err := w2.Add(t.Context(), bigMsgs(1, 60<<10), nil, nil); err != nil {
				t.Fatal(err)
			}
		}
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		err := w2.Add(ctx, bigMsgs(1, 60<<10), nil, nil)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Add past QueueBytes: %v, want it to block until its deadline", err)
		}
		// Small rows are held too: the bound is on bytes, not only rows.
		ctx, cancel = context.WithTimeout(t.Context(), time.Second)
		err = w2.Add(ctx, bigMsgs(1, 30<<10), nil, nil)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Add of 30 KiB past QueueBytes: %v, want it to block", err)
		}
		f.release()
		closeW(t, w2)
		closeW(t, w)
		if m, _ := f.stored(); m != 7 {
			t.Fatalf("stored %d messages, want 7", m)
		}
	})
}
