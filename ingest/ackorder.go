package ingest

import (
	"sync"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
)

// ackOrder acknowledges one connection's QoS 1 messages in the order the
// broker sent them, whatever order they are stored in. MQTT 3.1.1 (4.6)
// requires it, and Mosquitto depends on it: it looks a PUBACK's id up by
// walking the session's in-flight list from the oldest, so acks that skip
// ahead (two writers storing interleaved devices) cost it a walk over every
// older message still in flight, which at tens of thousands in flight made
// the broker, not storage, the QoS 1 bottleneck.
//
// The connection's callback adds each message in arrival order; a message
// is settled once stored (ack) or given up (skip: left unacknowledged for
// the broker to deliver again); the settled prefix is then released.
//
// A message may leave the order (detach: a parked message, a birth waiting
// for PostgreSQL) and be acknowledged on its own (ackDetached). Such an
// acknowledgement is out of order, and Mosquitto reuses packet ids: it
// numbers a session's outgoing messages with a counter that wraps after
// 65,535 and skips no id still in flight, and it takes a PUBACK for the
// oldest message in flight with that id. A message held while 65,535 later
// ones came would be taken off the broker by the acknowledgement of the
// later one with its id, and lost if devicehub stopped before storing it;
// or, acknowledged first, it would take the later one off. So every
// PUBACK waits until no message added with its packet id is unacknowledged
// (ids, held): the broker then takes them all, in whatever order they
// go. A message given up keeps its id's acknowledgements held until the
// connection ends (only when stopping); the broker delivers them all again.
//
// So that holding stays the exception (a message detached for long), the
// connection's callback waits for room (addRoom) while limit messages are
// added and not released: the ids of fewer than 65,535 consecutive
// messages are all different, and the acknowledgements go in order. A
// burst that ingest takes faster than it stores would otherwise hold the
// acknowledgement of every older message whose id a newer one took, and
// release each pair out of order: every later PUBACK would walk past the
// held ones at the head of the broker's in-flight list.
type ackOrder struct {
	ack   func(mqtt.Message) // sends one PUBACK; called in order
	limit int                // addRoom's bound on the messages added and not released

	mu    sync.Mutex
	ring  []ackSlot // circular, oldest at head
	head  int
	n     int
	first uint64 // sequence number of ring[head]

	// ids counts, per packet id, the messages added and not acknowledged
	// (detached ones included); held keeps the acknowledgements that
	// wait for an older or newer message with the same id.
	ids  *[1 << 16]uint32
	held map[uint16][]mqtt.Message

	sendMu sync.Mutex // held while releasing, so releases stay in order
	out    []mqtt.Message

	roomc chan struct{} // closed when messages are released, for addRoom; nil: no waiter
}

// maxUnreleased is an ackOrder's limit: below the 65,535 packet ids the
// broker numbers a session's messages with, with a margin for the few
// detached ones.
const maxUnreleased = 60_000

type ackSlot struct {
	m     mqtt.Message
	state uint8 // slotPending, slotAck or slotSkip
}

const (
	slotPending uint8 = iota
	slotAck
	slotSkip
)

func newAckOrder(ack func(mqtt.Message)) *ackOrder {
	return &ackOrder{ack: ack, limit: maxUnreleased, ring: make([]ackSlot, 1024), ids: new([1 << 16]uint32), held: map[uint16][]mqtt.Message{}}
}

// addRoom waits until fewer than o.limit messages are added and not
// released, then adds m as add does; false, m not added, when stop is
// closed first. It says how long it waited.
func (o *ackOrder) addRoom(m mqtt.Message, stop <-chan struct{}) (seq uint64, ok bool, waited time.Duration) {
	var since time.Time
	for {
		o.mu.Lock()
		if o.n < o.limit {
			seq = o.addLocked(m)
			o.mu.Unlock()
			if !since.IsZero() {
				waited = time.Since(since)
			}
			return seq, true, waited
		}
		if o.roomc == nil {
			o.roomc = make(chan struct{})
		}
		c := o.roomc
		o.mu.Unlock()
		if since.IsZero() {
			since = time.Now()
		}
		select {
		case <-c:
		case <-stop:
			return 0, false, time.Since(since)
		}
	}
}

// add appends m and returns its sequence number for settle.
func (o *ackOrder) add(m mqtt.Message) uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.addLocked(m)
}

func (o *ackOrder) addLocked(m mqtt.Message) uint64 {
	if o.n == len(o.ring) {
		grown := make([]ackSlot, 2*len(o.ring))
		k := copy(grown, o.ring[o.head:])
		copy(grown[k:], o.ring[:o.head])
		o.ring, o.head = grown, 0
	}
	o.ring[(o.head+o.n)%len(o.ring)] = ackSlot{m: m}
	o.n++
	o.ids[m.MessageID()]++
	return o.first + uint64(o.n) - 1
}

// settle marks message seq stored (ack true) or given up, then sends the
// acks of every settled message no unsettled one precedes.
func (o *ackOrder) settle(seq uint64, ack bool) {
	o.mu.Lock()
	i := int(seq - o.first)
	if seq < o.first || i >= o.n {
		o.mu.Unlock()
		panic("ingest: ackOrder.settle of an unknown message")
	}
	s := &o.ring[(o.head+i)%len(o.ring)]
	if s.state != slotPending {
		o.mu.Unlock()
		panic("ingest: ackOrder.settle twice")
	}
	s.state = slotSkip
	if ack {
		s.state = slotAck
	}
	if i != 0 {
		o.mu.Unlock()
		return // an older message is still pending
	}
	// Take the settled prefix, then send its acks outside mu (a PUBACK
	// may wait for the connection's writer) but under sendMu, taken before
	// mu is released, so that a later prefix cannot overtake this one.
	o.sendMu.Lock()
	out := o.out[:0]
	for o.n > 0 {
		s := &o.ring[o.head]
		if s.state == slotPending {
			break
		}
		if s.state == slotAck {
			out = o.release(out, s.m)
		}
		*s = ackSlot{}
		o.head = (o.head + 1) % len(o.ring)
		o.n--
		o.first++
	}
	if o.roomc != nil {
		close(o.roomc)
		o.roomc = nil
	}
	o.mu.Unlock()
	for k, m := range out {
		o.ack(m)
		out[k] = nil
	}
	o.out = out
	o.sendMu.Unlock()
}

// release appends to out the acknowledgements m's lets go: none while
// another message with its packet id is unacknowledged, else m's and
// those held for its id. Under mu.
func (o *ackOrder) release(out []mqtt.Message, m mqtt.Message) []mqtt.Message {
	id := m.MessageID()
	if o.ids[id] > 0 {
		o.ids[id]--
	}
	if o.ids[id] > 0 {
		o.held[id] = append(o.held[id], m)
		return out
	}
	if len(o.held) > 0 {
		if h, ok := o.held[id]; ok {
			out = append(out, h...)
			delete(o.held, id)
		}
	}
	return append(out, m)
}

// ackDetached acknowledges m, added and then detached (settle with ack
// false before it was stored), once no other message with its packet id
// is unacknowledged.
func (o *ackOrder) ackDetached(m mqtt.Message) {
	o.mu.Lock()
	out := o.release(nil, m)
	o.sendMu.Lock()
	o.mu.Unlock()
	for _, m := range out {
		o.ack(m)
	}
	o.sendMu.Unlock()
}

// pending returns how many messages are added and not yet released.
func (o *ackOrder) pending() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.n
}
