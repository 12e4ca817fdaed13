package ingest

import (
	"crypto/rand"
	"sync"

	mqtt "github.com/eclipse/paho.mqtt.golang"
)

// A handoff moves a broker's births and wills from a kept data session,
// which a run before the presence session existed subscribed to them, to
// a new presence session, with plain subscriptions (a share group gives
// each message to one member, so it needs none). Between the presence
// session's SUBSCRIBE and the data session's UNSUBSCRIBE the broker
// queues each birth and will for both; before the first, for the data
// session only; after the second, for the presence session only. Neither
// a copy stored twice nor one lost, and a device's births and wills
// applied in the order the broker took them:
//
//  1. The presence session subscribes (its SUBACK waited for), then
//     publishes the split marker to the online level and waits for its
//     PUBACK: the broker has queued it for both sessions, at the same
//     point of the stream of births and wills. Only then does the data
//     session unsubscribe.
//  2. The data session applies the births and wills ahead of the split
//     marker and drops (DropHandedOver) those behind it: the presence
//     session has each of them.
//  3. The presence session holds those ahead of the marker (the data
//     session has each of them too) and, at the marker, waits until the
//     data session has reached it, so that everything ahead of it is in
//     the workers' queues: a device's later birth or will cannot overtake
//     an earlier one (one worker per device, in queue order). Then the
//     held ones are dropped, and the presence session goes on.
//  4. If the data session held no presence filters (an earlier handoff
//     finished, then the presence session alone was removed from the
//     broker) the split marker never reaches it. The presence session
//     also publishes the after marker, behind the split marker, to the
//     report level, which every data session holds: a data session that
//     reaches it without having seen the split marker had no copies, and
//     the presence session applies what it held instead of dropping it.
//
// The held messages are acknowledged (or dropped) only then, so a stop in
// the middle leaves them, and the split marker, for the next start, which
// finds the presence session kept and does no handoff; the data session's
// copies still unacknowledged are delivered again too. A data session
// repeats its unsubscription on each reconnect once the handoff is
// decided, so one lost with its connection does not leave it holding
// births and wills into the next start. Only a stop, a failure or a lost
// connection between steps 1 and 2 can then apply a device's birth or will
// twice, or one ahead of its predecessor; it takes the first start after
// an upgrade to the presence session, and devices changing state within
// the few milliseconds around it.
type handoff struct {
	split, after string // the two markers' payloads

	decided chan struct{} // closed once the data session reached either marker
	held    bool          // set before decided is closed: it had the copies (passed the split marker)
	once    sync.Once

	// Only the presence session's callback touches these.
	presPast bool   // the presence session has passed the split marker
	early    []item // births and wills ahead of the split marker
}

func newHandoff(id string) *handoff {
	return &handoff{
		split:   id + " handoff " + rand.Text(),
		after:   id + " handoff-after " + rand.Text(),
		decided: make(chan struct{}),
	}
}

// isDecided reports whether the data session has reached either marker.
func (h *handoff) isDecided() bool {
	select {
	case <-h.decided:
		return true
	default:
		return false
	}
}

func (h *handoff) decide(held bool) {
	h.once.Do(func() {
		h.held = held
		close(h.decided)
	})
}

// handoffMarker takes a marker of session s while h runs at its broker;
// false when the presence session's wait was cut short by Close (the
// marker then stays unacknowledged).
func (in *Ingester) handoffMarker(h *handoff, s *session, m mqtt.Message) bool {
	payload := string(m.Payload())
	switch {
	case s.role == roleData && payload == h.split:
		h.decide(true)
	case s.role == roleData && payload == h.after:
		h.decide(false) // no-op after the split marker
	case s.role == rolePresence && payload == h.split && !h.presPast:
		h.presPast = true
		select {
		case <-h.decided:
		case <-in.stopping:
			return false
		}
		for _, it := range h.early {
			if h.held {
				in.drop(it, DropHandedOver)
			} else {
				in.enqueue(it)
			}
		}
		h.early = nil
		in.log.Info("ingest: births and wills handed over to the presence session",
			"broker", in.brokers[s.broker], "copies_dropped", h.held)
	}
	return true
}

// handedOver takes a birth or will of session s while h runs at its
// broker, and reports whether it did: dropped, as the other session's
// copy is the one stored, or held for the presence session's split
// marker.
func (in *Ingester) handedOver(h *handoff, s *session, it item) bool {
	switch {
	case s.role == roleData && h.isDecided() && h.held: // past the split marker
		in.drop(it, DropHandedOver)
		return true
	case s.role == rolePresence && !h.presPast:
		h.early = append(h.early, it)
		return true
	}
	return false
}
