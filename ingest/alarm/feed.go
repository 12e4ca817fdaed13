package alarm

import (
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"devicehub/ingest"
	"devicehub/ingest/mqttconn"
)

// Feed hands the evaluator what ingest reads, where ingest's session is
// the installation's one (ingest.NoShareGroup): it is ingest's AlarmHook
// and the Runner's input (Options.Feed), in place of the runner's own
// session. Why that is exact is the package doc's "One session, or
// ingest's".
//
// It keeps every message handed to it until the evaluator's commit
// acknowledges it (Ack: ingest's done, which releases ingest's PUBACK
// once the message's rows are stored too), in the order ingest handed
// them. A turn reads them from the oldest not acknowledged: what a turn
// that ended read and did not commit is read again by the next, marked a
// redelivery (Duplicate), as the broker marks what a session gives again.
type Feed struct {
	slots chan struct{} // a token per message held; full: Take waits
	more  chan struct{} // a message was added (capacity 1)

	mu   sync.Mutex
	log  []*fedMsg // held, oldest first; acknowledged ones until they reach the head
	read int       // log's messages the current turn was given
	seq  uint64    // the latest message's number
	mark uint64    // the latest message's number when the turn started
	got  uint64    // the number of the latest message the turn was given

	awaiting map[string]struct{} // markers ingest has yet to pass (await)

	products atomic.Pointer[map[string]struct{}] // nil: every product
}

// DefaultFeedBound is how many messages a Feed holds, taken and not
// committed, before ingest waits: 10 s of 10,000 reports/s, about 60 MB
// (ingest holds their paho messages for their acknowledgement anyway).
// With one broker ingest's own bound comes first: a connection stops
// reading at 60,000 messages taken and not acknowledged (ingest's
// ackorder.go), and every message the feed holds is one of them.
const DefaultFeedBound = 100_000

// NewFeed returns a feed that holds at most bound messages (<= 0:
// DefaultFeedBound).
func NewFeed(bound int) *Feed {
	if bound <= 0 {
		bound = DefaultFeedBound
	}
	return &Feed{slots: make(chan struct{}, bound), more: make(chan struct{}, 1)}
}

var _ ingest.AlarmHook = (*Feed)(nil)

// Wants reports whether the evaluator reads productID's uplinks: those of
// the products with an enabled rule, as the owner last loaded them, and
// every product until an owner did.
func (f *Feed) Wants(productID string) bool {
	p := f.products.Load()
	if p == nil {
		return true
	}
	_, ok := (*p)[productID]
	return ok
}

// want sets the products Wants answers for.
func (f *Feed) want(products []string) {
	m := make(map[string]struct{}, len(products))
	for _, p := range products {
		m[p] = struct{}{}
	}
	f.products.Store(&m)
}

// Take adds m for the evaluator; done is called once what it made of m is
// committed. It waits while the feed is full, and returns false when stop
// closes first.
func (f *Feed) Take(m mqtt.Message, broker int, at time.Time, done func(), stop <-chan struct{}) bool {
	select {
	case f.slots <- struct{}{}:
	case <-stop:
		return false
	}
	fm := &fedMsg{Message: m, f: f, broker: broker, at: at, done: done}
	f.mu.Lock()
	fm.dup = len(f.awaiting) > 0
	f.seq++
	f.log = append(f.log, fm)
	f.mu.Unlock()
	select {
	case f.more <- struct{}{}:
	default:
	}
	return true
}

// Held is how many messages the feed holds, taken and not committed.
func (f *Feed) Held() int { return len(f.slots) }

// restart starts a turn's reading at the oldest message held: the ones
// an earlier turn was given are now redeliveries.
func (f *Feed) restart() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, m := range f.log[:f.read] {
		m.dup = true
	}
	f.read, f.mark, f.got = 0, f.seq, f.seq-uint64(len(f.log))
}

// await marks every message held, and every one taken until ingest
// passed all of markers (Marked), a possible redelivery: the session a
// run without the feed left holds, before its markers, what was
// published before them, and so may hold those too (Runner.lead). nil
// ends the wait.
func (f *Feed) await(markers []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.awaiting = make(map[string]struct{}, len(markers))
	for _, p := range markers {
		f.awaiting[p] = struct{}{}
	}
	for _, m := range f.log {
		m.dup = true
	}
}

// awaited reports whether ingest passed every marker await named.
func (f *Feed) awaited() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.awaiting) == 0
}

// Marked takes a marker ingest passed: every message published before it
// was handed to Take (ingest.AlarmHook).
func (f *Feed) Marked(payload string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.awaiting, payload)
}

// caughtUp reports whether the turn was given every message held when it
// started.
func (f *Feed) caughtUp() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.got >= f.mark
}

// next waits for the next message the turn was not given, until stop.
func (f *Feed) next(stop <-chan struct{}) (mqttconn.Received, bool) {
	for {
		f.mu.Lock()
		for f.read < len(f.log) {
			m := f.log[f.read]
			f.read++
			f.got = f.seq - uint64(len(f.log)-f.read)
			if !m.acked {
				f.mu.Unlock()
				return mqttconn.Received{Msg: m, Broker: m.broker, At: m.at}, true
			}
		}
		f.mu.Unlock()
		select {
		case <-f.more:
		case <-stop:
			return mqttconn.Received{}, false
		}
	}
}

// pump gives the turn the messages it was not given, in order, on out,
// until stop.
func (f *Feed) pump(out chan<- mqttconn.Received, stop <-chan struct{}) {
	for {
		m, ok := f.next(stop)
		if !ok {
			return
		}
		select {
		case out <- m:
		case <-stop:
			return // not given after all: the next turn reads it again
		}
	}
}

// ack lets go of m: committed. The head of acknowledged messages leaves
// the log.
func (f *Feed) ack(m *fedMsg) {
	f.mu.Lock()
	if m.acked {
		f.mu.Unlock()
		return
	}
	m.acked = true
	k := 0
	for k < len(f.log) && f.log[k].acked {
		f.log[k] = nil
		k++
	}
	if k > 0 {
		f.log = f.log[k:]
		f.read = max(f.read-k, 0)
	}
	f.mu.Unlock()
	<-f.slots
	m.done()
}

// fedMsg is a message as the feed holds it: ingest's paho message, whose
// Ack is the feed's and whose Duplicate also says whether a turn was given
// it before.
type fedMsg struct {
	mqtt.Message
	f      *Feed
	broker int
	at     time.Time
	done   func()
	dup    bool // under f.mu until given to a turn
	acked  bool // under f.mu
}

func (m *fedMsg) Ack()            { m.f.ack(m) }
func (m *fedMsg) Duplicate() bool { return m.dup || m.Message.Duplicate() }
