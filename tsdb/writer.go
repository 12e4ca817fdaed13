package tsdb

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"
)

// Inserter stores rows; *DB is one. Insert must not keep or modify its
// arguments, so that a failed call can be retried with the same slices.
type Inserter interface {
	Insert(ctx context.Context, msgs []Message, props []PropertyValue) error
}

// MaxBatchRows caps WriterOptions.MaxRows: ClickHouse squashes the blocks
// of one INSERT into one part up to min_insert_block_size_rows (1048576 by
// default, on 18.16 as on current releases); past it an INSERT could be
// stored in part, and a retry would duplicate the part already written.
const MaxBatchRows = 1000000

// WriterOptions configure NewWriter.
type WriterOptions struct {
	// MaxRows flushes as soon as this many rows are buffered. Default
	// 100000: ClickHouse spends most of its insert CPU merging parts, and
	// fewer, larger parts halve that (see BENCHMARKS.md). Inserts are sent
	// in blocks, so the client holds one block's copy, not the batch's.
	// At most MaxBatchRows.
	MaxRows int
	// FlushInterval flushes what is buffered at least this often (jittered
	// by up to 10% so instances do not write in lockstep). Default 1s,
	// ClickHouse's advice of about one insert per second per table.
	FlushInterval time.Duration
	// RetryMin is the first wait after a failed insert; it doubles on every
	// failure. Default 100ms.
	RetryMin time.Duration
	// RetryMax caps the wait between retries. Default 10s.
	RetryMax time.Duration
	// QueueRows bounds rows buffered or being written; Add blocks above it.
	// Default 2*MaxRows: one batch being written while the next fills.
	QueueRows int
	// OnFlush, if set, is called after every insert attempt: rows in the
	// attempt, its duration, its error. The message and property inserts
	// of a flush run at once, so it may be called concurrently.
	OnFlush func(n int, dur time.Duration, err error)
}

// DefaultWriterOptions are the defaults a zero WriterOptions field takes.
func DefaultWriterOptions() WriterOptions {
	return WriterOptions{
		MaxRows:       100000,
		FlushInterval: time.Second,
		RetryMin:      100 * time.Millisecond,
		RetryMax:      10 * time.Second,
	}
}

func (o WriterOptions) withDefaults() WriterOptions {
	d := DefaultWriterOptions()
	if o.MaxRows <= 0 {
		o.MaxRows = d.MaxRows
	}
	o.MaxRows = min(o.MaxRows, MaxBatchRows)
	if o.FlushInterval <= 0 {
		o.FlushInterval = d.FlushInterval
	}
	if o.RetryMin <= 0 {
		o.RetryMin = d.RetryMin
	}
	if o.RetryMax < o.RetryMin {
		o.RetryMax = max(d.RetryMax, o.RetryMin)
	}
	if o.QueueRows <= 0 {
		o.QueueRows = 2 * o.MaxRows
	}
	return o
}

// batch is what one flush writes.
type batch struct {
	msgs  []Message
	props []PropertyValue
	dones []func()
}

func (b *batch) rows() int   { return len(b.msgs) + len(b.props) }
func (b *batch) empty() bool { return b.rows() == 0 && len(b.dones) == 0 }

// Writer batches rows for an Inserter: it flushes at MaxRows or every
// FlushInterval, whichever comes first, from one goroutine, retries failed
// inserts with exponential backoff (never dropping rows) and calls each
// Add's done once its rows are stored. Memory is bounded by QueueRows.
type Writer struct {
	db  Inserter
	opt WriterOptions

	mu      sync.Mutex
	buf     batch
	spare   batch         // the last written batch, emptied, reused as buf
	pending int           // rows buffered plus rows being written
	freed   chan struct{} // closed (and replaced) when pending drops
	closed  bool
	lastErr error

	kick    chan struct{} // buffer reached MaxRows
	closing chan struct{} // Close called: flush everything and exit
	abort   context.CancelFunc
	runCtx  context.Context // cancelled when Close's deadline passes
	exited  chan struct{}
}

// NewWriter starts a Writer; stop it with Close.
func NewWriter(db Inserter, opt WriterOptions) *Writer {
	ctx, cancel := context.WithCancel(context.Background())
	w := &Writer{
		db:      db,
		opt:     opt.withDefaults(),
		freed:   make(chan struct{}),
		kick:    make(chan struct{}, 1),
		closing: make(chan struct{}),
		abort:   cancel,
		runCtx:  ctx,
		exited:  make(chan struct{}),
	}
	go w.run()
	return w
}

// Add queues rows; done (may be nil) is called from the writer's goroutine
// once every row of this call is stored, never if they are not. Rows are
// validated first: an invalid row fails the whole call and nothing is
// queued. Add blocks while more than QueueRows rows are pending and returns
// ctx.Err() if ctx ends first, or ErrClosed once Close has been called.
// The slices are copied, the payload bytes are not.
func (w *Writer) Add(ctx context.Context, msgs []Message, props []PropertyValue, done func()) error {
	if err := validate(msgs, props); err != nil {
		return err
	}
	n := len(msgs) + len(props)
	w.mu.Lock()
	for {
		if w.closed {
			w.mu.Unlock()
			return ErrClosed
		}
		// A call larger than the queue still goes through when it is empty.
		if w.pending == 0 || w.pending+n <= w.opt.QueueRows {
			break
		}
		freed := w.freed
		w.mu.Unlock()
		select {
		case <-freed:
		case <-w.closing:
		case <-ctx.Done():
			return ctx.Err()
		}
		w.mu.Lock()
	}
	w.buf.msgs = append(w.buf.msgs, msgs...)
	w.buf.props = append(w.buf.props, props...)
	if done != nil {
		w.buf.dones = append(w.buf.dones, done)
	}
	w.pending += n
	full := w.buf.rows() >= w.opt.MaxRows
	w.mu.Unlock()
	if full {
		select {
		case w.kick <- struct{}{}:
		default:
		}
	}
	return nil
}

// Pending returns the rows buffered or being written.
func (w *Writer) Pending() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.pending
}

// Close stops taking rows, flushes what is left and waits for it, retrying
// until ctx ends. It then reports the rows that could not be stored (their
// done was not called).
func (w *Writer) Close(ctx context.Context) error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		<-w.exited
		return ErrClosed
	}
	w.closed = true
	w.mu.Unlock()
	close(w.closing)
	select {
	case <-w.exited:
	case <-ctx.Done():
		w.abort()
		<-w.exited
	}
	w.abort()
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.pending > 0 {
		return fmt.Errorf("tsdb: writer closed with %d rows not stored: %w", w.pending, errors.Join(ctx.Err(), w.lastErr))
	}
	return nil
}

func (w *Writer) jitter() time.Duration {
	d := w.opt.FlushInterval
	return d - time.Duration(rand.Int64N(int64(d)/10+1))
}

func (w *Writer) run() {
	defer close(w.exited)
	timer := time.NewTimer(w.jitter())
	defer timer.Stop()
	for {
		closing := false
		select {
		case <-w.kick:
		case <-timer.C:
			timer.Reset(w.jitter())
		case <-w.closing:
			closing = true
		}
		for {
			w.mu.Lock()
			b := w.buf
			w.buf, w.spare = w.spare, batch{}
			w.mu.Unlock()
			if b.empty() {
				w.mu.Lock()
				w.spare = b
				w.mu.Unlock()
				break
			}
			if !w.write(&b) {
				return // Close's deadline passed; the rows stay pending
			}
			if !closing {
				break
			}
		}
		if closing {
			return
		}
	}
}

// write stores b: messages and properties are two inserts, run at once
// (a flush takes as long as the larger, not the sum) and each retried
// until it succeeds, so a stored part is never written twice; false if
// aborted.
func (w *Writer) write(b *batch) bool {
	msgsOK := make(chan bool, 1)
	if len(b.msgs) > 0 {
		go func() {
			msgsOK <- w.retry(len(b.msgs), func(ctx context.Context) error {
				return w.db.Insert(ctx, b.msgs, nil)
			})
		}()
	} else {
		msgsOK <- true
	}
	propsOK := len(b.props) == 0 || w.retry(len(b.props), func(ctx context.Context) error {
		return w.db.Insert(ctx, nil, b.props)
	})
	if !<-msgsOK || !propsOK {
		return false
	}
	for _, done := range b.dones {
		done()
	}
	n := b.rows()
	// Keep the slices for the next batch: buffers that grew once are not
	// grown (and copied) again on every flush. Cleared, so that payloads
	// and strings of stored rows can be collected.
	clear(b.msgs)
	clear(b.props)
	clear(b.dones)
	b.msgs, b.props, b.dones = b.msgs[:0], b.props[:0], b.dones[:0]
	w.mu.Lock()
	w.spare = *b
	w.pending -= n
	close(w.freed)
	w.freed = make(chan struct{})
	w.mu.Unlock()
	return true
}

func (w *Writer) retry(n int, insert func(context.Context) error) bool {
	wait := w.opt.RetryMin
	for {
		if w.runCtx.Err() != nil {
			return false
		}
		start := time.Now()
		err := insert(w.runCtx)
		if w.opt.OnFlush != nil {
			w.opt.OnFlush(n, time.Since(start), err)
		}
		if err == nil {
			return true
		}
		w.mu.Lock()
		w.lastErr = err
		w.mu.Unlock()
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-w.runCtx.Done():
			t.Stop()
			return false
		}
		wait = min(2*wait, w.opt.RetryMax)
	}
}
