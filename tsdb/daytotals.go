package tsdb

import (
	"context"
	"sync"
	"time"
)

// The totals of daycounts.go are kept here rather than in a meta/cache
// Cache, for two things it does not do: an insert through this DB adds
// its messages to the kept totals instead of dropping them, and the
// totals are read again in the background once half their TTL has
// passed. So with ingest running, a question waits for ClickHouse only
// when the totals could not be renewed in time (a load slower than half
// the TTL, or loads overlapping inserts the whole time), not after every
// insert.
//
// Why the kept totals stay exact under the result cache's rule:
//
//   - Served: totals whose query started less than the TTL ago
//     (started), of the question's window (key), holding every insert
//     through this DB that ended since.
//   - Installed: a load becomes the kept totals only if no insert was
//     under way when its query started (clean), none began (begun) or
//     ended (epoch) while it ran, and nothing was dropped: an insert that ended meanwhile patched the
//     totals before, and the load may lack its rows; one that began
//     meanwhile may or may not have had rows committed before the query
//     took its parts. (Its callers still get it.) So every insert that
//     ends while the totals are kept began after their query had returned:
//     they hold none of its rows, in either table.
//   - Patched: an insert that ends adds its messages to the kept totals
//     (it started after their query, as above; the check of its start
//     against theirs stays as a guard, dropping them otherwise). A failed
//     insert (some rows may be stored) drops them. A patch is applied once
//     the insert has ended, when both of its views are written, so it
//     does not depend on their order.
//   - Waited for: a question without servable totals shares a load only
//     if no insert ended since that load started (the load then saw every
//     insert that ended before the question), else starts its own.
//   - Exclusive holders (the property partials': their inserts are
//     under way most of the time under ingest, so few loads would start
//     clean): a load waits until no insert is under way, and holds new
//     inserts back (begin waits) until it has returned, so every load is
//     clean and installed; a question shares a load still waiting (it
//     starts after every insert that ended before the question). An
//     insert waits at most for one load: for the inserts under way (a
//     Writer sends one insert of property values at a time, so its next
//     one waits for them anyway), then at most hold (maxInsertHold) for
//     the query; a query still running then (ClickHouse slow) lets the
//     held inserts go, and its totals are given to the questions waiting
//     for them but not kept (an insert began), so ingest never waits for
//     a slow dashboard read longer than that.
type totalsHolder[V any] struct {
	ttl       time.Duration
	cells     *cells[V]
	exclusive bool
	hold      time.Duration // exclusive: the longest an insert is held back

	mu        sync.Mutex
	cur       *totals[V]       // nil: none kept
	flight    *totalsFlight[V] // the newest load under way, if any
	epoch     uint64           // bumped when an insert ends and by drops
	begun     uint64           // inserts begun
	inserting int              // inserts under way (begin, not yet stored)
	holds     int              // exclusive loads waiting or running: begin waits
	cond      sync.Cond        // on mu: inserting reached 0, or a hold ended
}

// maxInsertHold bounds how long an exclusive holder's query holds inserts
// back (see above): a few renewals of tens of milliseconds a second under
// questions, never more than this each.
const maxInsertHold = 500 * time.Millisecond

// totalsFlight is one load of the totals.
type totalsFlight[V any] struct {
	key     totalsKey
	started time.Time
	epoch   uint64 // the holder's when it started
	begun   uint64 // the holder's when it started
	clean   bool   // no insert was under way when it started
	waiting bool   // exclusive: waits for the inserts under way to end
	holding bool   // exclusive: holds inserts back (until it returns or hold passes)
	done    chan struct{}
	t       *totals[V]
	err     error
}

// get returns totals of key servable at now: the kept ones, or those of a
// load it starts or shares. Kept totals past half the TTL start a load in
// the background.
func (h *totalsHolder[V]) get(ctx context.Context, key totalsKey, now time.Time, load func(context.Context, totalsKey) (*totals[V], error)) (*totals[V], error) {
	h.mu.Lock()
	if t := h.cur; t != nil && t.key == key && now.Sub(t.started) < h.ttl {
		if now.Sub(t.started) >= h.renewAfter() && (h.flight == nil || h.flight.key != key) {
			h.startLocked(key, load)
		}
		h.mu.Unlock()
		return t, nil
	}
	f := h.flight
	if f == nil || f.key != key || f.epoch != h.epoch && !f.waiting {
		f = h.startLocked(key, load)
	}
	h.mu.Unlock()
	select {
	case <-f.done:
		return f.t, f.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// startLocked starts a load of key, detached from any caller (the load's
// own timeout bounds it), and makes it the holder's flight.
func (h *totalsHolder[V]) startLocked(key totalsKey, load func(context.Context, totalsKey) (*totals[V], error)) *totalsFlight[V] {
	f := &totalsFlight[V]{key: key, started: time.Now(), epoch: h.epoch, begun: h.begun, clean: h.inserting == 0, done: make(chan struct{})}
	if h.exclusive {
		h.holds++
		f.waiting, f.holding = true, true
	}
	h.flight = f
	go func() {
		if h.exclusive {
			h.mu.Lock()
			for h.inserting > 0 {
				h.wait()
			}
			f.started, f.epoch, f.begun, f.clean, f.waiting = time.Now(), h.epoch, h.begun, true, false
			h.mu.Unlock()
			bound := time.AfterFunc(h.hold, func() {
				h.mu.Lock()
				h.unholdLocked(f)
				h.mu.Unlock()
			})
			defer bound.Stop()
		}
		t, err := load(context.Background(), key)
		if err == nil {
			t.key, t.started = key, f.started
		}
		h.mu.Lock()
		f.t, f.err = t, err
		if h.flight == f {
			h.flight = nil
		}
		if err == nil && f.clean && f.epoch == h.epoch && f.begun == h.begun && (h.cur == nil || h.cur.started.Before(f.started)) {
			h.cur = t
		}
		h.unholdLocked(f)
		h.mu.Unlock()
		close(f.done)
	}()
	return f
}

// unholdLocked (h.mu held) ends f's hold on inserts, if it holds them.
func (h *totalsHolder[V]) unholdLocked(f *totalsFlight[V]) {
	if f.holding {
		f.holding = false
		h.holds--
		h.cond.Broadcast()
	}
}

// begin tells the holder an insert starts (an exclusive holder's waits
// for the load under way); stored, that it ended.
func (h *totalsHolder[V]) begin() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for h.holds > 0 {
		h.wait()
	}
	h.inserting++
	h.begun++
}

// stored tells the holder an insert that started at start (after begin)
// ended: stored, with add its cells per product ("" included: message
// counts) and slot; or failed (some rows may be stored).
func (h *totalsHolder[V]) stored(add map[string]map[uint32]V, start time.Time, stored bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.inserting--
	h.epoch++
	if h.inserting == 0 && h.exclusive {
		h.cond.Broadcast()
	}
	if h.cur == nil {
		return
	}
	if !stored || !h.cur.started.Before(start) {
		h.cur = nil
		return
	}
	h.cur = h.cur.plus(add, h.cells)
}

// drop forgets the kept totals and every load under way.
func (h *totalsHolder[V]) drop() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.epoch++
	h.cur = nil
}

// plus returns t with the cells of add (per product, "" included, and
// slot) counted: in their closed month, or merged into their open day and
// slot. Rows before the window's first month are not counted by the
// totals' query either.
func (t *totals[V]) plus(add map[string]map[uint32]V, c *cells[V]) *totals[V] {
	out := &totals[V]{key: t.key, started: t.started, closed: make(map[chunkKey]uint64, len(t.closed)), open: make(map[string]*chunk[V], len(t.open))}
	for k, n := range t.closed {
		out.closed[k] = n
	}
	for p, o := range t.open {
		out.open[p] = o
	}
	first := dayMonth(t.key.from)
	for p, qs := range add {
		var days map[uint32]uint64
		var slots map[uint32]V
		for q, v := range qs {
			day := c.slotDay(q)
			if day < t.key.cut {
				if m := dayMonth(day); m >= first {
					out.closed[chunkKey{p, m}] += c.count(v)
				}
				continue
			}
			if days == nil {
				days, slots = map[uint32]uint64{}, map[uint32]V{}
			}
			days[day] += c.count(v)
			if old, ok := slots[q]; ok {
				v = c.merge(old, v)
			}
			slots[q] = v
		}
		if days != nil {
			o := out.open[p]
			if o == nil {
				o = &chunk[V]{}
			}
			out.open[p] = &chunk[V]{days: o.days.plus(days, addCounts), slots: o.slots.plus(slots, c.merge)}
		}
	}
	return out
}

// batchQuarters counts the messages of b per product ("" for all) and
// quarter-hour.
func (b *Batch) batchQuarters() map[string]map[uint32]uint64 {
	out := map[string]map[uint32]uint64{}
	for i := range b.msgs {
		r := &b.msgs[i]
		q := uint32(floorSec(r.ms) / quarterSec)
		p := b.str(r.product)
		m := out[p]
		if m == nil {
			m = map[uint32]uint64{}
			out[string([]byte(p))] = m // the arena is reused
		}
		m[q]++
		if out[""] == nil {
			out[""] = map[uint32]uint64{}
		}
		out[""][q]++
	}
	return out
}

// floorSec is the epoch second holding epoch ms ms.
func floorSec(ms int64) int64 {
	sec := ms / 1000
	if ms < 0 && ms%1000 != 0 {
		sec--
	}
	return sec
}

// wait waits (h.mu held) for a change of inserting or holds.
func (h *totalsHolder[V]) wait() {
	h.cond.L = &h.mu
	h.cond.Wait()
}

// renewAfter is the age of kept totals at which a question starts a load
// renewing them: half the TTL, a quarter for an exclusive holder (whose
// load first waits for the insert under way to end).
func (h *totalsHolder[V]) renewAfter() time.Duration {
	if h.exclusive {
		return h.ttl / 4
	}
	return h.ttl / 2
}
