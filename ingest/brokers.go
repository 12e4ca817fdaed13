package ingest

import (
	"sync"

	"devicehub/ingest/link"
)

// A broker pool (Options.BrokerURL with several URLs) feeds one pipeline:
// the subscriber connections of every broker hand their messages to the
// same workers, batchers and state writer. A device's messages come from
// the broker it is connected to, so they stay in order; when it moves to
// another broker its birth there can arrive before the old broker's will.
// BornAt applies the broker-of-last-birth rule (link.Births, the rule
// Presence's view applies too): a stale will is stored as a message and
// changes no state.
//
// What it cannot know is a birth taken before this process started: a
// device whose birth on the new broker was stored by the previous run and
// whose old broker's will arrives after this start is marked offline,
// until its next birth.
type BornAt struct {
	mu sync.Mutex
	at link.Births
}

// NewBornAt returns an empty BornAt.
func NewBornAt() *BornAt { return &BornAt{at: make(link.Births)} }

// Keep records a birth or will of device id from broker b and reports
// whether it changes the device's state (link.Births.Keep); safe for
// concurrent use. Other readers of a pool's presence (ingest/alarm's
// evaluator) apply the pipeline's rule with it.
func (w *BornAt) Keep(id string, b int8, online bool) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.at.Keep(id, b, online)
}
