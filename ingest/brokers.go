package ingest

import "sync"

// A broker pool (Options.BrokerURL with several URLs) feeds one pipeline:
// the subscriber connections of every broker hand their messages to the
// same workers, batchers and state writer. A device's messages come from
// the broker it is connected to, so they stay in order; when it moves to
// another broker (its connection lost, reconnected through a load
// balancer elsewhere), its birth on the new broker can arrive before the
// old broker publishes its will, which the old broker does only once the
// lost connection's keep-alive expires. bornAt keeps, per online device,
// the broker its last birth came from, and a will counts only from that
// broker: a stale will is stored as a message and changes no state.
//
// What it cannot know is a birth taken before this process started: a
// device whose birth on the new broker was stored by the previous run and
// whose old broker's will arrives after this start is marked offline,
// until its next birth. Presence (ingest/link) applies the same rule to
// its view.
type bornAt struct {
	mu sync.Mutex
	at map[string]int8 // online device -> broker of its last birth
}

func newBornAt() *bornAt { return &bornAt{at: make(map[string]int8)} }

// keep records a birth (online) or will of device id from broker b, and
// reports whether it changes the device's state: a will from another
// broker than its last birth's does not. Only online devices are held.
func (w *bornAt) keep(id string, b int8, online bool) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if online {
		w.at[id] = b
		return true
	}
	last, ok := w.at[id]
	if ok && last != b {
		return false
	}
	delete(w.at, id)
	return true
}

// BornAt is the will rule for other readers of a pool's presence
// (ingest/alarm's evaluator): Keep records a birth or will of a device
// from broker b and reports whether it changes the device's state, the
// same rule the pipeline applies.
type BornAt struct{ w *bornAt }

// NewBornAt returns an empty BornAt.
func NewBornAt() *BornAt { return &BornAt{w: newBornAt()} }

// Keep is bornAt.keep.
func (b *BornAt) Keep(id string, broker int8, online bool) bool { return b.w.keep(id, broker, online) }
