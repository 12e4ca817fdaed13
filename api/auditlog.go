package api

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"devicehub/meta"
)

// auditLog writes audit entries to the store in batches, off the
// request's path: record only appends to a bounded buffer; one goroutine
// writes it out when it holds AuditBatch entries or every
// AuditFlushInterval, whichever comes first, swapping the buffer under
// the lock and writing outside it. A batch the store refuses stays
// buffered and is written again at the next flush. When the buffer holds
// AuditQueue entries, further ones are dropped: each is counted in
// devicehub_audit_dropped_total and the drops are logged (a warning per
// flush interval with drops). close writes out what is left.
type auditLog struct {
	store        AuditStore
	log          *slog.Logger
	batch, limit int
	every        time.Duration

	mu      sync.Mutex
	buf     []meta.AuditEntry
	repeats map[meta.AuditRepeatKey]int // where in buf each repeated entry is; nil after buf is swapped

	kick chan struct{} // a batch is full
	stop chan struct{}
	done chan struct{}

	unlogged atomic.Int64 // drops not yet logged
	dropped  prometheus.Counter
	written  prometheus.Counter
}

func newAuditLog(store AuditStore, opts Options, log *slog.Logger, reg prometheus.Registerer) *auditLog {
	a := &auditLog{store: store, log: log, batch: opts.AuditBatch, limit: opts.AuditQueue, every: opts.AuditFlushInterval,
		kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "devicehub_audit_dropped_total",
			Help: "Audit entries dropped: the buffer was full (the database slower than the writes, or down), or the last flush at shutdown failed.",
		}),
		written: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "devicehub_audit_written_total",
			Help: "Audit entries stored.",
		}),
	}
	if a.batch <= 0 {
		a.batch = DefaultOptions().AuditBatch
	}
	if a.limit < a.batch {
		a.limit = a.batch
	}
	if a.every <= 0 {
		a.every = DefaultOptions().AuditFlushInterval
	}
	if reg != nil {
		reg.MustRegister(a.dropped, a.written)
	}
	go a.run()
	return a
}

// record buffers e, or drops it (counted) if the buffer is full. A
// repeat (meta.AuditEntry.Repeat: a failed login) of an entry already
// buffered is counted in it and takes no room: a flood of them cannot
// fill the buffer and push out other entries.
func (a *auditLog) record(e meta.AuditEntry) {
	var key meta.AuditRepeatKey
	a.mu.Lock()
	if e.Repeat {
		key = e.RepeatKey()
		if i, ok := a.repeats[key]; ok {
			a.buf[i].AddRepeat(e)
			a.mu.Unlock()
			return
		}
	}
	if len(a.buf) >= a.limit {
		a.mu.Unlock()
		a.drop(1)
		return
	}
	if e.Repeat {
		if a.repeats == nil {
			a.repeats = map[meta.AuditRepeatKey]int{}
		}
		a.repeats[key] = len(a.buf)
	}
	a.buf = append(a.buf, e)
	full := len(a.buf) >= a.batch
	a.mu.Unlock()
	if full {
		select {
		case a.kick <- struct{}{}:
		default:
		}
	}
}

func (a *auditLog) drop(n int) {
	a.dropped.Add(float64(n))
	a.unlogged.Add(int64(n))
}

// logDrops logs the drops since it last did.
func (a *auditLog) logDrops() {
	if n := a.unlogged.Swap(0); n > 0 {
		a.log.Warn("audit: entries dropped: the audit buffer is full", "dropped", n, "buffer", a.limit)
	}
}

func (a *auditLog) run() {
	defer close(a.done)
	t := time.NewTicker(a.every)
	defer t.Stop()
	kick := a.kick
	for {
		select {
		case <-a.stop:
			return
		case <-t.C:
		case <-kick:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := a.flush(ctx)
		cancel()
		a.logDrops()
		// After a failure, the next attempt waits for the interval, not
		// for the next full batch.
		kick = a.kick
		if err != nil {
			kick = nil
		}
	}
}

// flush writes out the buffer, a batch at a time. A batch the store
// refuses goes back to the buffer's front, with those after it, as far as
// they fit; the rest are dropped.
func (a *auditLog) flush(ctx context.Context) error {
	a.mu.Lock()
	pending := a.buf
	a.buf, a.repeats = nil, nil
	a.mu.Unlock()
	for len(pending) > 0 {
		n := min(len(pending), a.batch)
		if err := a.store.InsertAudit(ctx, pending[:n]); err != nil {
			a.log.Error("audit: store entries", "entries", len(pending), "err", err)
			a.mu.Lock()
			pending = append(pending, a.buf...)
			if over := len(pending) - a.limit; over > 0 {
				pending = pending[:a.limit]
				a.drop(over)
			}
			a.buf, a.repeats = pending, nil // the store merges the repeats left apart
			a.mu.Unlock()
			return err
		}
		a.written.Add(float64(n))
		pending = pending[n:]
	}
	return nil
}

// close stops the writer and writes out what is left before ctx ends;
// what it cannot write is dropped, counted and logged.
func (a *auditLog) close(ctx context.Context) {
	if a == nil {
		return
	}
	close(a.stop)
	<-a.done
	if err := a.flush(ctx); err != nil {
		a.mu.Lock()
		n := len(a.buf)
		a.buf, a.repeats = nil, nil
		a.mu.Unlock()
		a.drop(n)
	}
	a.logDrops()
}
