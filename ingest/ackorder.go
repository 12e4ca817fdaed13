package ingest

import (
	"sync"

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
type ackOrder struct {
	ack func(mqtt.Message) // sends one PUBACK; called in order

	mu    sync.Mutex
	ring  []ackSlot // circular, oldest at head
	head  int
	n     int
	first uint64 // sequence number of ring[head]

	sendMu sync.Mutex // held while releasing, so releases stay in order
	out    []mqtt.Message
}

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
	return &ackOrder{ack: ack, ring: make([]ackSlot, 1024)}
}

// add appends m and returns its sequence number for settle.
func (o *ackOrder) add(m mqtt.Message) uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.n == len(o.ring) {
		grown := make([]ackSlot, 2*len(o.ring))
		k := copy(grown, o.ring[o.head:])
		copy(grown[k:], o.ring[:o.head])
		o.ring, o.head = grown, 0
	}
	o.ring[(o.head+o.n)%len(o.ring)] = ackSlot{m: m}
	o.n++
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
			out = append(out, s.m)
		}
		*s = ackSlot{}
		o.head = (o.head + 1) % len(o.ring)
		o.n--
		o.first++
	}
	o.mu.Unlock()
	for k, m := range out {
		o.ack(m)
		out[k] = nil
	}
	o.out = out
	o.sendMu.Unlock()
}

// pending returns how many messages are added and not yet released.
func (o *ackOrder) pending() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.n
}
