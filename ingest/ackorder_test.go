package ingest

import (
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
)

// seqMsg is an MQTT message that only knows its id.
type seqMsg struct{ id uint16 }

func (m seqMsg) Duplicate() bool   { return false }
func (m seqMsg) Qos() byte         { return 1 }
func (m seqMsg) Retained() bool    { return false }
func (m seqMsg) Topic() string     { return "" }
func (m seqMsg) MessageID() uint16 { return m.id }
func (m seqMsg) Payload() []byte   { return nil }
func (m seqMsg) Ack()              {}

// ackRecorder is an ackOrder whose acks are recorded as ids.
func ackRecorder() (*ackOrder, func() []int) {
	var mu sync.Mutex
	var acked []int
	o := newAckOrder(func(m mqtt.Message) {
		mu.Lock()
		acked = append(acked, int(m.MessageID()))
		mu.Unlock()
	})
	return o, func() []int {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(acked)
	}
}

func TestAckOrder(t *testing.T) {
	type step struct {
		seq  int
		ack  bool
		want []int // every ack so far
	}
	f := func(name string, n int, steps []step) {
		t.Helper()
		o, acked := ackRecorder()
		for i := range n {
			if got := o.add(seqMsg{uint16(i)}); got != uint64(i) {
				t.Fatalf("%s: add %d returned %d", name, i, got)
			}
		}
		for _, s := range steps {
			o.settle(uint64(s.seq), s.ack)
			if got := acked(); !slices.Equal(got, s.want) {
				t.Fatalf("%s: after settle(%d, %v) acked %v, want %v", name, s.seq, s.ack, got, s.want)
			}
		}
		if o.pending() != 0 {
			t.Fatalf("%s: %d left pending", name, o.pending())
		}
	}
	f("in order", 3, []step{{0, true, []int{0}}, {1, true, []int{0, 1}}, {2, true, []int{0, 1, 2}}})
	f("newer first waits", 3, []step{{2, true, nil}, {1, true, nil}, {0, true, []int{0, 1, 2}}})
	f("gap", 5, []step{
		{1, true, nil}, {3, true, nil}, {0, true, []int{0, 1}}, {4, true, []int{0, 1}}, {2, true, []int{0, 1, 2, 3, 4}},
	})
	f("skipped are not acked but release", 4, []step{
		{1, true, nil}, {0, false, []int{1}}, {3, true, []int{1}}, {2, false, []int{1, 3}},
	})
}

// TestAckOrderGrowsAndWraps settles newest first across ring growth, then
// wraps the ring with a window smaller than it.
func TestAckOrderGrowsAndWraps(t *testing.T) {
	o, acked := ackRecorder()
	const n = 5000 // several growths of the initial 1024 slots
	for i := range n {
		o.add(seqMsg{uint16(i)})
	}
	for i := n - 1; i >= 0; i-- {
		o.settle(uint64(i), true)
	}
	want := make([]int, 0, 3*n)
	for i := range n {
		want = append(want, i)
	}
	// A sliding window of 300 over 10000 more: head and tail wrap.
	next := uint64(n)
	for i := range 300 {
		o.add(seqMsg{uint16(n + i)})
	}
	for k := range 2 * n {
		o.settle(next, true)
		want = append(want, n+k)
		next++
		o.add(seqMsg{uint16(n + 300 + k)})
	}
	got := acked()
	for i := range want {
		want[i] = int(uint16(want[i]))
	}
	if !slices.Equal(got, want) {
		t.Fatalf("acked %d ids, want %d in order; first difference at %d", len(got), len(want), firstDiff(got, want))
	}
	if o.pending() != 300 {
		t.Fatalf("pending %d, want 300", o.pending())
	}
}

// TestAckOrderConcurrent settles from many goroutines in random order, as
// writers and workers do, while the callback keeps adding: every stored
// message is acked exactly once, in arrival order.
func TestAckOrderConcurrent(t *testing.T) {
	o, acked := ackRecorder()
	const n, settlers = 20000, 8
	ch := make([]chan uint64, settlers)
	for i := range ch {
		ch[i] = make(chan uint64, 64)
	}
	var wg sync.WaitGroup
	for i := range settlers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var held []uint64
			for seq := range ch[i] {
				held = append(held, seq)
				if len(held) >= 1+rand.IntN(50) { // a batch, settled in shuffled order
					rand.Shuffle(len(held), func(a, b int) { held[a], held[b] = held[b], held[a] })
					for _, s := range held {
						o.settle(s, s%97 != 0) // every 97th given up
					}
					held = held[:0]
				}
			}
			for _, s := range held {
				o.settle(s, s%97 != 0)
			}
		}()
	}
	for i := range n {
		seq := o.add(seqMsg{uint16(i)})
		ch[rand.IntN(settlers)] <- seq
	}
	for i := range ch {
		close(ch[i])
	}
	wg.Wait()
	var want []int
	for i := range n {
		if i%97 != 0 {
			want = append(want, int(uint16(i)))
		}
	}
	if got := acked(); !slices.Equal(got, want) {
		t.Fatalf("acked %d, want %d in order; first difference at %d", len(got), len(want), firstDiff(got, want))
	}
	if o.pending() != 0 {
		t.Fatalf("%d left pending", o.pending())
	}
}

func firstDiff(a, b []int) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// TestAckOrderPacketIDs: an acknowledgement waits while another message
// with its packet id is unacknowledged (Mosquitto takes a PUBACK for the
// oldest in flight with the id); a message given up holds its id's.
func TestAckOrderPacketIDs(t *testing.T) {
	o, acked := ackRecorder()
	check := func(what string, want ...int) {
		t.Helper()
		if got := acked(); !slices.Equal(got, want) {
			t.Fatalf("%s: acked %v, want %v", what, got, want)
		}
	}
	old := seqMsg{7}
	o.settle(o.add(old), false) // detached: parked
	o.settle(o.add(seqMsg{8}), true)
	check("another id", 8)
	o.settle(o.add(seqMsg{7}), true) // the broker's counter wrapped
	check("the parked one's id, newer", 8)
	o.ackDetached(old)
	check("the parked one stored", 8, 7, 7)
	o.settle(o.add(seqMsg{7}), true)
	check("the id free again", 8, 7, 7, 7)

	o.settle(o.add(seqMsg{9}), false) // given up: stays in flight at the broker
	o.settle(o.add(seqMsg{9}), true)
	o.settle(o.add(seqMsg{10}), true)
	check("an id given up", 8, 7, 7, 7, 10)
	if o.pending() != 0 {
		t.Fatalf("%d pending", o.pending())
	}
}

// TestAckOrderRoom: the callback waits while limit messages are
// unreleased, so a consumer that lags behind a fast producer never has
// two messages with one packet id pending, and every acknowledgement
// goes in the broker's order. Without the wait the producer runs 65,535
// messages ahead, the older of each pair of equal ids is held for the
// newer, and the pairs go out of order.
func TestAckOrderRoom(t *testing.T) {
	o, acked := ackRecorder()
	const n = 150_000
	stop := make(chan struct{})
	defer close(stop)
	added := make(chan uint64, n)
	go func() {
		id := uint16(0)
		for range n {
			id++
			if id == 0 { // the broker's ids skip 0
				id++
			}
			seq, ok, _ := o.addRoom(seqMsg{id}, stop)
			if !ok {
				return
			}
			added <- seq
		}
	}()
	// The consumer lags: it starts once 65,536 are added, or the
	// producer has waited a while for room.
	var seqs []uint64
	for len(seqs) <= 1<<16 {
		select {
		case s := <-added:
			seqs = append(seqs, s)
			continue
		case <-time.After(200 * time.Millisecond):
		}
		break
	}
	if p := o.pending(); p > maxUnreleased {
		t.Fatalf("%d pending, more than %d", p, maxUnreleased)
	}
	for i := 0; i < n; i++ {
		if i == len(seqs) {
			seqs = append(seqs, <-added)
		}
		o.settle(seqs[i], true)
	}
	got := acked()
	if len(got) != n {
		t.Fatalf("%d acked, want %d", len(got), n)
	}
	for i := 1; i < len(got); i++ {
		if want := got[i-1]%65535 + 1; got[i] != want {
			t.Fatalf("ack %d: id %d after %d, want %d (out of the broker's order)", i, got[i], got[i-1], want)
		}
	}

	// Full, it gives up when ingest stops (the message stays with the
	// broker).
	full, _ := ackRecorder()
	full.limit = 1
	seq := full.add(seqMsg{1})
	stopped := make(chan struct{})
	close(stopped)
	if _, ok, _ := full.addRoom(seqMsg{2}, stopped); ok {
		t.Fatal("addRoom found room in a full order")
	}
	// Room made while it waits: it says how long it waited.
	go func() {
		time.Sleep(20 * time.Millisecond)
		full.settle(seq, true)
	}()
	if _, ok, waited := full.addRoom(seqMsg{2}, stop); !ok || waited < 20*time.Millisecond {
		t.Fatalf("addRoom: %v after %s, want room after 20ms or more", ok, waited)
	}
}
