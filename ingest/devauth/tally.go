package devauth

import (
	"sync"
	"time"

	"devicehub/meta"
)

// tally turns what each broker's plugin applied into what every broker's
// plugin holds: a device's change is confirmed to its writers at the
// lowest version all brokers hold. With one broker it passes everything
// through. A device is tracked from the first broker that applies a change
// of it until every broker holds the same version, or for at most
// tallyKeep (nobody waits longer; a broker away longer gets a full sync
// when it is back, which confirms the recent changes again).
type tally struct {
	n int

	mu     sync.Mutex
	seen   map[string]*held
	pruned time.Time
}

// held is what each broker holds of one device.
type held struct {
	version   []int64 // per broker; -1: none applied since tracking began
	confirmed int64   // highest version confirmed; -1: none
	at        time.Time
}

// tallyKeep is how long a device whose brokers differ is tracked.
const tallyKeep = 2 * recentSpan

func newTally(brokers int) *tally {
	return &tally{n: brokers, seen: map[string]*held{}}
}

// add records that broker b's plugin holds applied, and returns the
// changes every broker's plugin now holds that were not returned before.
func (t *tally) add(b int, applied []meta.LoginChange, now time.Time) []meta.LoginChange {
	if t.n == 1 || len(applied) == 0 {
		return applied
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if now.Sub(t.pruned) >= tallyKeep/2 {
		for id, h := range t.seen {
			if now.Sub(h.at) >= tallyKeep {
				delete(t.seen, id)
			}
		}
		t.pruned = now
	}
	var out []meta.LoginChange
	for _, c := range applied {
		h := t.seen[c.ID]
		if h == nil {
			h = &held{version: make([]int64, t.n), confirmed: -1}
			for i := range h.version {
				h.version[i] = -1
			}
			t.seen[c.ID] = h
		}
		h.version[b] = max(h.version[b], c.Version)
		h.at = now
		low, same := h.version[0], true
		for _, v := range h.version[1:] {
			low = min(low, v)
			same = same && v == h.version[0]
		}
		if low >= 0 && low > h.confirmed {
			h.confirmed = low
			out = append(out, meta.LoginChange{ID: c.ID, Version: low})
		}
		if same {
			delete(t.seen, c.ID)
		}
	}
	return out
}
