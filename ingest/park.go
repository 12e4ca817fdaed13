package ingest

import (
	"sync"
	"time"

	"devicehub/ingest/wire"
	"devicehub/schema/backoff"
)

// parking holds messages whose device could not be looked up because
// PostgreSQL did not answer. They are set aside, so that the worker goes on
// with other devices' messages, and detached from their connection's ack
// order, so that later messages' acknowledgements are not held behind
// them: each is acknowledged on its own once stored, or left for the
// broker to deliver again if devicehub stops first. A lookup that
// PostgreSQL answers decides as usual (stored or dropped).
//
// Mosquitto looks a PUBACK up by walking its in-flight list from the
// oldest (ackorder.go), so a detached message costs each later ack one
// step until it is settled: cheap while few are parked, and maxParked
// bounds them. Past it a worker waits for PostgreSQL in place, holding its
// queue: backpressure, as before parking existed.
type parking struct {
	mu    sync.Mutex
	items []item
}

// maxParked bounds the parked messages, and the paho messages they hold.
const maxParked = 10000

// park sets it aside, detached from its ack order; false when the parking
// is full.
func (in *Ingester) park(it item) bool {
	in.parking.mu.Lock()
	defer in.parking.mu.Unlock()
	if len(in.parking.items) >= maxParked {
		return false
	}
	detach(&it)
	in.parking.items = append(in.parking.items, it)
	return true
}

// detach takes it out of its connection's ack order: it no longer holds
// later messages' acknowledgements, and settle acknowledges it on its own
// (ackOrder.ackDetached: once no other message with its packet id is
// unacknowledged).
func detach(it *item) {
	if it.order != nil && !it.detached {
		it.order.settle(it.seq, false) // releases its slot without an ack
		it.detached = true
	}
}

// parked returns how many messages are parked.
func (in *Ingester) parked() int {
	in.parking.mu.Lock()
	defer in.parking.mu.Unlock()
	return len(in.parking.items)
}

// runParking retries the parked messages, every 100 ms and backing off to
// 2 s while PostgreSQL stays away, until intake stops; what is left then
// is given back to the broker (not acknowledged).
func (in *Ingester) runParking() {
	defer in.workers.Done()
	var rows wire.Rows
	retry := backoff.Backoff{Min: 100 * time.Millisecond, Max: 2 * time.Second}
	t := time.NewTimer(retry.Next())
	defer t.Stop()
	for {
		select {
		case <-in.drained:
			in.parking.mu.Lock()
			left := in.parking.items
			in.parking.items = nil
			in.parking.mu.Unlock()
			for _, it := range left {
				in.settle(it, false)
			}
			return
		case <-t.C:
		}
		in.parking.mu.Lock()
		items := in.parking.items
		in.parking.items = nil
		in.parking.mu.Unlock()
		for i, it := range items {
			in.process(&rows, it, in.writerFor(it, i))
		}
		if in.parked() == 0 {
			retry.Reset()
		}
		t.Reset(retry.Next())
	}
}
