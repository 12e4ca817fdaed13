package ingest

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"slices"
	"sync"
	"time"

	"devicehub/meta"
)

// stateBatcher writes online/offline changes to PostgreSQL in batches,
// every interval or at max changes, retrying failures with backoff; each
// change's done runs once it is written. At most maxPendingStates wait:
// past that add waits (the worker, and so the broker, hold the rest), so
// a storm of births while PostgreSQL is away does not grow the buffer
// without bound.
//
// A device has at most one change waiting: a change added while one of
// its device waits is folded into it (meta.StateChange.Fold), in its
// place, and both dones run once that is written. A broker restart sends
// each device's will (queued for ingest's presence session at the
// shutdown) and, once it is back, its birth: with the writes behind, the
// birth finds the will still waiting, and the storm writes one change per
// device instead of two. Nothing is lost or reordered: Fold stores what the two written
// in their order would (the birth, and the will's time as the offline
// time), and a device's changes already taken are written before the next
// batch is taken (one write at a time per batcher).
type stateBatcher struct {
	apply    StateApplier
	interval time.Duration
	max      int
	log      *slog.Logger
	m        *metrics

	mu      sync.Mutex
	room    *sync.Cond // signalled when buf shrinks or the batcher stops
	maxBuf  int        // maxPendingStates; tests lower it
	buf     []stateReq
	waiting map[string]int // device -> its change's place in buf, plus taken
	taken   int            // changes taken from the front of buf so far
	stopped bool
	kick    chan struct{}
	closing chan struct{}
	exited  chan struct{}
	ctx     context.Context
	abort   context.CancelFunc
	written func(n int)
	folded  func() // a change folded into the one waiting (add)
}

// backlogBatches: with more than max changes buffered (a storm of births
// or wills), one write takes up to this many batches' worth. A write costs
// PostgreSQL a few round trips whatever its size, and on a busy machine
// those round trips, not the rows, bound the rate: 100,000 births after a
// broker restart took 500-row writes at about 1,000 changes/s with two
// shared cores saturated (bench fleet-connect).
const backlogBatches = 10

// maxPendingStates bounds the changes buffered: 100,000 devices' births
// (about 80 bytes each, and the message each holds until written).
const maxPendingStates = 100000

type stateReq struct {
	change meta.StateChange
	done   func()    // of every change folded into it
	added  time.Time // when the latest change folded into it was handed to the batcher
}

// Stages of devicehub_ingest_state_delay_seconds (its label "stage"),
// which bench fleet-connect reads.
const (
	StageDelivery = "delivery" // the message's own timestamp to its arrival at ingest
	StageQueue    = "queue"    // arrival to the state writer
	StageWrite    = "write"    // the state writer to committed
)

func newStateBatcher(apply StateApplier, interval time.Duration, max int, log *slog.Logger, m *metrics) *stateBatcher {
	ctx, cancel := context.WithCancel(context.Background())
	b := &stateBatcher{apply: apply, interval: interval, max: max, log: log, m: m,
		kick: make(chan struct{}, 1), closing: make(chan struct{}), exited: make(chan struct{}), ctx: ctx, abort: cancel}
	b.room, b.maxBuf = sync.NewCond(&b.mu), maxPendingStates
	b.waiting = make(map[string]int)
	go b.run()
	return b
}

func (b *stateBatcher) add(c meta.StateChange, done func()) {
	b.mu.Lock()
	for {
		if i, ok := b.waiting[c.DeviceID]; ok {
			r := &b.buf[i-b.taken]
			first := r.done
			r.change, r.added = r.change.Fold(c), time.Now()
			r.done = func() { first(); done() }
			b.mu.Unlock()
			b.m.stateFolded.Inc()
			if b.folded != nil {
				b.folded()
			}
			return
		}
		if len(b.buf) < b.maxBuf || b.stopped {
			break
		}
		select {
		case b.kick <- struct{}{}:
		default:
		}
		b.room.Wait()
	}
	b.waiting[c.DeviceID] = b.taken + len(b.buf)
	b.buf = append(b.buf, stateReq{c, done, time.Now()})
	full := len(b.buf) >= b.max
	b.mu.Unlock()
	if full {
		select {
		case b.kick <- struct{}{}:
		default:
		}
	}
}

func (b *stateBatcher) run() {
	defer close(b.exited)
	defer func() { // nothing takes from buf any more: adds stop waiting
		b.mu.Lock()
		b.stopped = true
		b.room.Broadcast()
		b.mu.Unlock()
	}()
	t := time.NewTicker(b.interval)
	defer t.Stop()
	for {
		closing := false
		select {
		case <-t.C:
		case <-b.kick:
		case <-b.closing:
			closing = true
		}
		for {
			b.mu.Lock()
			n := min(len(b.buf), b.max)
			if len(b.buf) > b.max {
				n = min(len(b.buf), backlogBatches*b.max)
			}
			batch := slices.Clone(b.buf[:n])
			b.buf = b.buf[n:]
			for _, r := range batch {
				delete(b.waiting, r.change.DeviceID)
			}
			b.taken += n
			more := len(b.buf) > 0
			if n > 0 {
				b.room.Broadcast()
			}
			b.mu.Unlock()
			if n > 0 && !b.write(batch) {
				return
			}
			if !more {
				break
			}
		}
		if closing {
			return
		}
	}
}

func (b *stateBatcher) write(batch []stateReq) bool {
	changes := make([]meta.StateChange, len(batch))
	for i, r := range batch {
		changes[i] = r.change
	}
	retry := storeRetry()
	for {
		_, err := b.apply.ApplyStateChanges(b.ctx, changes)
		if err == nil {
			break
		}
		b.m.stateErrors.Inc()
		b.log.Warn("device state write failed; retrying", "changes", len(changes), "err", err)
		if retry.Wait(b.ctx) != nil {
			b.mu.Lock()
			// Counted as not written by close. Nothing takes from buf
			// any more, and nothing is folded into these: a change of
			// theirs added now waits behind them.
			b.buf = append(batch, b.buf...)
			b.taken -= len(batch)
			b.mu.Unlock()
			return false
		}
	}
	b.m.stateChanges.Add(float64(len(batch)))
	now, write := time.Now(), b.m.stateDelay.WithLabelValues(StageWrite)
	for _, r := range batch {
		write.Observe(now.Sub(r.added).Seconds())
	}
	if b.written != nil {
		b.written(len(batch))
	}
	for _, r := range batch {
		r.done()
	}
	return true
}

// pending is the number of changes buffered, not yet taken for writing.
func (b *stateBatcher) pending() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.buf)
}

// close writes what is buffered, giving up when ctx ends.
func (b *stateBatcher) close(ctx context.Context) error {
	close(b.closing)
	select {
	case <-b.exited:
	case <-ctx.Done():
		b.abort()
		<-b.exited
	}
	b.abort()
	b.mu.Lock()
	defer b.mu.Unlock()
	if n := len(b.buf); n > 0 {
		return fmt.Errorf("ingest: %d device state changes not written: %w", n, ctx.Err())
	}
	return nil
}

// stateShards spreads state changes over several stateBatchers by device,
// so that several writes are in PostgreSQL at once. A storm's births
// waited in the one batcher's buffer while its write, a few round trips
// that a busy machine schedules slowly, was in flight: in a 10,000-device
// connect storm on two shared cores each change spent 0.87 s there on
// average (devicehub_ingest_state_delay_seconds{stage="write"}), against
// 0.18 s from arrival to the writer (BENCHMARKS.md, fleet-connect).
//
// A device's changes all go to one batcher, so they are written in their
// order; changes of different devices are independent. Concurrent writes
// do not deadlock (each locks its rows in id order, as two instances'
// writes must not either) and their commit order does not matter: a change
// older than the stored one is not applied (meta.Store.ApplyStateChanges).
type stateShards struct {
	seed   maphash.Seed
	shards []*stateBatcher
}

func newStateShards(apply StateApplier, n int, interval time.Duration, batch int, log *slog.Logger, m *metrics, written func(int), folded func()) *stateShards {
	s := &stateShards{seed: maphash.MakeSeed()}
	n = max(n, 1)
	for range n {
		b := newStateBatcher(apply, interval, batch, log, m)
		b.maxBuf = max(maxPendingStates/n, 1) // the bound is the whole's
		b.written, b.folded = written, folded
		s.shards = append(s.shards, b)
	}
	return s
}

func (s *stateShards) add(c meta.StateChange, done func()) {
	s.shards[maphash.String(s.seed, c.DeviceID)%uint64(len(s.shards))].add(c, done)
}

// close writes what every shard holds, giving up when ctx ends.
func (s *stateShards) close(ctx context.Context) error {
	errs := make([]error, len(s.shards))
	var wg sync.WaitGroup
	for i, b := range s.shards {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = b.close(ctx)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}
