package live

import "sync"

// Subscription is one subscriber's view of the hub: the events of its
// devices (values of its properties only, when it names some), queued
// for it to take. The queue is bounded in events and bytes; when an event
// does not fit, the oldest ones are dropped and counted, so a subscriber
// that falls behind sees the newest events and how many it missed.
type Subscription struct {
	hub     *Hub
	devices []string            // distinct
	props   map[string]struct{} // nil: every property

	mu      sync.Mutex
	q       [][]byte // frames from q[head] on, shared with other subscribers: never modified
	head    int
	bytes   int // of the frames queued
	skipped uint64
	closed  bool

	ready chan struct{} // a token when there is something to take
	done  chan struct{} // closed by Close
}

func newSubscription(h *Hub, devices, props []string) *Subscription {
	s := &Subscription{hub: h, devices: devices, ready: make(chan struct{}, 1), done: make(chan struct{})}
	if len(props) > 0 {
		s.props = make(map[string]struct{}, len(props))
		for _, p := range props {
			s.props[p] = struct{}{}
		}
	}
	return s
}

// wants reports whether values of property are for this subscriber.
func (s *Subscription) wants(property string) bool {
	if s.props == nil {
		return true
	}
	_, ok := s.props[property]
	return ok
}

// offer queues an event frame without blocking. When the queue holds
// Options.Queue events, or the frame would take it past
// Options.QueueBytes, the oldest events are dropped (counted as skipped)
// to make room; a frame larger than QueueBytes on its own is queued
// alone. So a queue holds at most max(QueueBytes, one frame) bytes.
func (s *Subscription) offer(f []byte) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	dropped := uint64(0)
	for s.head < len(s.q) && (len(s.q)-s.head >= s.hub.opt.Queue || s.bytes+len(f) > s.hub.opt.QueueBytes) {
		s.bytes -= len(s.q[s.head])
		s.q[s.head] = nil
		s.head++
		dropped++
	}
	if s.head == len(s.q) {
		s.q, s.head = s.q[:0], 0
	} else if len(s.q) == cap(s.q) && s.head > 0 {
		// Move the queue to the front instead of growing the slice: its
		// capacity stays within about twice Options.Queue.
		n := copy(s.q, s.q[s.head:])
		clear(s.q[n:])
		s.q, s.head = s.q[:n], 0
	}
	s.q = append(s.q, f)
	s.bytes += len(f)
	s.skipped += dropped
	s.mu.Unlock()
	s.hub.m.events.Inc()
	if dropped > 0 {
		s.hub.m.skipped.Add(float64(dropped))
	}
	s.signal()
}

// skip counts n events lost before they reached this instance (relay.go).
func (s *Subscription) skip(n uint64) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.skipped += n
	s.mu.Unlock()
	s.hub.m.skipped.Add(float64(n))
	s.signal()
}

func (s *Subscription) signal() {
	select {
	case s.ready <- struct{}{}:
	default:
	}
}

// Ready receives a token whenever events or a skipped count wait to be
// taken; Take after each.
func (s *Subscription) Ready() <-chan struct{} { return s.ready }

// Done is closed when the subscription ends: Close, or the hub's Close.
func (s *Subscription) Done() <-chan struct{} { return s.done }

// Take appends the queued frames to dst, oldest first, and returns them
// with the number of events dropped since the last Take; both are then
// cleared. The dropped events are older than every frame returned.
func (s *Subscription) Take(dst [][]byte) ([][]byte, uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	dst = append(dst, s.q[s.head:]...)
	clear(s.q)
	s.q, s.head, s.bytes = s.q[:0], 0, 0
	skipped := s.skipped
	s.skipped = 0
	return dst, skipped
}

// Queued returns the events and bytes waiting to be taken.
func (s *Subscription) Queued() (events, bytes int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.q) - s.head, s.bytes
}

// Close ends the subscription: it leaves the hub and drops what is queued.
// It may be called more than once.
func (s *Subscription) Close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	s.q, s.head, s.bytes = nil, 0, 0
	s.mu.Unlock()
	close(s.done)
	s.hub.remove(s)
}
