package tsdb

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"
)

// Inserter stores rows; *DB is one. InsertBatch must not keep or modify
// the batch, so that a failed call can be retried with it.
type Inserter interface {
	InsertBatch(ctx context.Context, b *Batch) error
}

// MaxBatchRows caps WriterOptions.MaxRows: ClickHouse squashes the blocks
// of one INSERT into one part up to min_insert_block_size_rows (1048576 by
// default, on 18.16 as on current releases); past it an INSERT could be
// stored in part, and a retry would duplicate the part already written.
const MaxBatchRows = 1000000

// MaxBatchBytes caps WriterOptions.MaxBytes, well within what a Batch
// addresses.
const MaxBatchBytes = 1 << 30

// WriterOptions configure NewWriter.
type WriterOptions struct {
	// MaxRows flushes as soon as this many rows are buffered. Default
	// 300000: ClickHouse spends most of its insert CPU merging parts, and
	// fewer, larger parts cut that (see BENCHMARKS.md); two batches of
	// this size, in a Batch's compact form, fit devicehub's 160 MiB
	// memory limit, where 500000 made its GC run too often. Inserts are
	// sent in blocks, so the client holds one block's copy, not the
	// batch's. At most MaxBatchRows.
	MaxRows int
	// MaxBytes flushes as soon as the buffered rows take this many bytes
	// (their Batch records and strings, payloads included, plus what
	// callers of AddHolding hold for them), so that large payloads cannot
	// make a batch of MaxRows rows too big. Default 32 MiB, a little
	// more than the ingest bench's batch of 300,000 rows takes at QoS 0;
	// raise it with MaxRows. At most MaxBatchBytes.
	MaxBytes int
	// FlushInterval flushes what is buffered at least this often (jittered
	// by up to 10% so instances do not write in lockstep). Default 1s,
	// ClickHouse's advice of about one insert per second per table.
	FlushInterval time.Duration
	// RetryMin is the first wait after a failed insert; it doubles on every
	// failure. Default 100ms.
	RetryMin time.Duration
	// RetryMax caps the wait between retries. Default 10s.
	RetryMax time.Duration
	// QueueRows and QueueBytes bound rows (and their bytes) buffered or
	// being written; Add blocks above either. Defaults 2*MaxRows and
	// 2*MaxBytes: one batch being written while the next fills.
	QueueRows  int
	QueueBytes int
	// OnFlush, if set, is called after every insert attempt: rows in the
	// attempt, its duration, its error. The message and property inserts
	// of a flush run at once, so it may be called concurrently.
	OnFlush func(n int, dur time.Duration, err error)
}

// DefaultWriterOptions are the defaults a zero WriterOptions field takes.
func DefaultWriterOptions() WriterOptions {
	return WriterOptions{
		MaxRows:       300000,
		MaxBytes:      32 << 20,
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
	if o.MaxBytes <= 0 {
		o.MaxBytes = d.MaxBytes
	}
	o.MaxBytes = min(o.MaxBytes, MaxBatchBytes)
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
	if o.QueueBytes <= 0 {
		o.QueueBytes = 2 * o.MaxBytes
	}
	o.QueueBytes = min(o.QueueBytes, maxArena/2)
	return o
}

// batch is what one flush writes: messages and property values apart,
// as they are inserted (and retried) apart.
type batch struct {
	msgs, props Batch
	bytes       int // rows' and held bytes, as counted by AddHolding
	dones       []func()
}

func (b *batch) rows() int   { return b.msgs.Len() + b.props.Len() }
func (b *batch) empty() bool { return b.rows() == 0 && len(b.dones) == 0 }

// Writer batches rows for an Inserter: it flushes at MaxRows, MaxBytes or
// every FlushInterval, whichever comes first, from one goroutine, retries failed
// inserts with exponential backoff (never dropping rows) and calls each
// Add's done once its rows are stored. Memory is bounded by QueueRows and
// QueueBytes.
type Writer struct {
	db  Inserter
	opt WriterOptions

	mu           sync.Mutex
	buf          batch
	spare        batch         // the last written batch, emptied, reused as buf
	pending      int           // rows buffered plus rows being written
	pendingBytes int           // their bytes, held bytes included
	freed        chan struct{} // closed (and replaced) when pending drops
	closed       bool
	lastErr      error

	kick    chan struct{} // buffer reached MaxRows or MaxBytes
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
// queued. Add blocks while more than QueueRows rows (or QueueBytes) are
// pending and returns ctx.Err() if ctx ends first, or ErrClosed once Close
// has been called. The rows are copied, payloads included: the caller may
// reuse them, and their memory, as soon as Add returns.
func (w *Writer) Add(ctx context.Context, msgs []Message, props []PropertyValue, done func()) error {
	return w.AddHolding(ctx, msgs, props, 0, done)
}

// AddHolding is Add for a caller that holds held bytes of its own until
// done is called, such as an MQTT message it may acknowledge only once its
// rows are stored: they count against MaxBytes and QueueBytes as the rows'
// own bytes do, so that memory stays bounded however long storage takes.
func (w *Writer) AddHolding(ctx context.Context, msgs []Message, props []PropertyValue, held int, done func()) error {
	if err := validate(msgs, props); err != nil {
		return err
	}
	n, rb := len(msgs)+len(props), rowBytes(msgs, props)
	nb := rb + max(held, 0)
	w.mu.Lock()
	for {
		if w.closed {
			w.mu.Unlock()
			return ErrClosed
		}
		// A call larger than the queue still goes through when it is empty.
		if w.pending == 0 || (w.pending+n <= w.opt.QueueRows && w.pendingBytes+nb <= w.opt.QueueBytes) {
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
	// Only a call too large for any batch fails here, before adding
	// anything: bytes pending stay below maxArena/2 otherwise.
	if err := w.buf.msgs.fits(rb); err != nil {
		w.mu.Unlock()
		return err
	}
	if err := w.buf.props.fits(rb); err != nil {
		w.mu.Unlock()
		return err
	}
	// Counted as taken, not as estimated: strings a row repeats from the
	// previous one take nothing.
	before := w.buf.msgs.Bytes() + w.buf.props.Bytes()
	w.buf.msgs.appendRows(msgs, nil)
	w.buf.props.appendRows(nil, props)
	nb = w.buf.msgs.Bytes() + w.buf.props.Bytes() - before + max(held, 0)
	if done != nil {
		w.buf.dones = append(w.buf.dones, done)
	}
	w.pending += n
	w.pendingBytes += nb
	w.buf.bytes += nb
	full := w.buf.rows() >= w.opt.MaxRows || w.buf.bytes >= w.opt.MaxBytes
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
	if b.msgs.Len() > 0 {
		go func() {
			msgsOK <- w.retry(b.msgs.Len(), func(ctx context.Context) error {
				return w.db.InsertBatch(ctx, &b.msgs)
			})
		}()
	} else {
		msgsOK <- true
	}
	propsOK := b.props.Len() == 0 || w.retry(b.props.Len(), func(ctx context.Context) error {
		return w.db.InsertBatch(ctx, &b.props)
	})
	if !<-msgsOK || !propsOK {
		return false
	}
	for _, done := range b.dones {
		done()
	}
	n, nb := b.rows(), b.bytes
	// Keep the memory for the next batch: buffers that grew once are not
	// grown (and copied) again on every flush.
	clear(b.dones)
	b.msgs.Reset()
	b.props.Reset()
	b.dones, b.bytes = b.dones[:0], 0
	w.mu.Lock()
	w.spare = *b
	w.pending -= n
	w.pendingBytes -= nb
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
