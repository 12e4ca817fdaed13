package devauth

import (
	"context"
	"sync"
	"time"

	"devicehub/meta"
)

// recentSpan is how long an applied version is remembered for a writer
// that starts waiting after the leader applied its change (it is fast:
// the write's answer races the leader's). Kept for one to two spans.
const recentSpan = 30 * time.Second

// waiters match the writers waiting for their login changes (Await) with
// what the leader announces it applied (applied), on one instance.
type waiters struct {
	mu     sync.Mutex
	byID   map[string][]waiter
	recent map[string]int64 // device id -> highest version applied, this span
	older  map[string]int64 // ... the span before
	since  time.Time        // start of recent's span
	now    func() time.Time
}

// waiter is one device's change a call waits for.
type waiter struct {
	version int64
	call    *call
}

// call is one Await: done is closed when remaining reaches 0.
type call struct {
	remaining int
	done      chan struct{}
}

func newWaiters() *waiters {
	return &waiters{byID: map[string][]waiter{}, recent: map[string]int64{}, older: map[string]int64{},
		since: time.Now(), now: time.Now}
}

// await returns once every change is applied (at its version or later),
// or ctx's error.
func (w *waiters) await(ctx context.Context, changes []meta.LoginChange) error {
	c := &call{done: make(chan struct{})}
	w.mu.Lock()
	for _, ch := range changes {
		if w.appliedAt(ch.ID) >= ch.Version {
			continue
		}
		c.remaining++
		w.byID[ch.ID] = append(w.byID[ch.ID], waiter{version: ch.Version, call: c})
	}
	waiting := c.remaining > 0
	w.mu.Unlock()
	if !waiting {
		return nil
	}
	select {
	case <-c.done:
		return nil
	case <-ctx.Done():
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if c.remaining == 0 { // done meanwhile
		return nil
	}
	for _, ch := range changes {
		ws := w.byID[ch.ID]
		kept := ws[:0]
		for _, x := range ws {
			if x.call != c {
				kept = append(kept, x)
			}
		}
		if len(kept) == 0 {
			delete(w.byID, ch.ID)
		} else {
			w.byID[ch.ID] = kept
		}
	}
	return ctx.Err()
}

// appliedAt is the highest version known applied for id; w.mu held.
func (w *waiters) appliedAt(id string) int64 {
	return max(w.recent[id], w.older[id])
}

// applied records versions the broker holds and releases their waiters.
func (w *waiters) applied(list []meta.LoginChange) {
	if len(list) == 0 {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if now := w.now(); now.Sub(w.since) >= recentSpan {
		w.older, w.recent, w.since = w.recent, make(map[string]int64, len(w.recent)), now
	}
	for _, a := range list {
		if a.Version > w.recent[a.ID] {
			w.recent[a.ID] = a.Version
		}
		ws, ok := w.byID[a.ID]
		if !ok {
			continue
		}
		kept := ws[:0]
		for _, x := range ws {
			if x.version > a.Version {
				kept = append(kept, x)
				continue
			}
			x.call.remaining--
			if x.call.remaining == 0 {
				close(x.call.done)
			}
		}
		if len(kept) == 0 {
			delete(w.byID, a.ID)
		} else {
			w.byID[a.ID] = kept
		}
	}
}
