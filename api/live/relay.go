package live

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Bus carries short messages between the instances that share it; PGBus
// (a PostgreSQL database's LISTEN/NOTIFY) is one.
type Bus interface {
	// MaxPayload is the largest payload, in bytes, Send carries.
	MaxPayload() int
	// Send delivers payloads, in order, to the listeners of channel.
	Send(ctx context.Context, channel string, payloads []string) error
	// Listen calls h with each payload sent on channels, one at a time,
	// from its return until stop is called. After a lost connection is
	// restored it calls reconnected: payloads sent meanwhile are lost.
	Listen(ctx context.Context, channels []string, h func(channel, payload string), reconnected func()) (stop func(), err error)
}

// The relay's channels: every instance listens on watchChannel, where
// instances announce the devices their subscribers watch, and on its own
// valuesChannel, where the others forward it values.
const watchChannel = "devicehub_live_watch"

func valuesChannel(instance string) string { return "devicehub_live_" + instance }

// message is one payload on the bus.
type message struct {
	From string `json:"from"`
	Type string `json:"type"` // msgHello, msgSet, msgBye or msgValues
	Seq  uint64 `json:"seq,omitempty"`
	// A set: part Part (0-based) of Parts of the devices watched.
	Part    int      `json:"part,omitempty"`
	Parts   int      `json:"parts,omitempty"`
	Devices []string `json:"devices,omitempty"`
	// Values: property events, as subscribers receive them, and counts of
	// values of a device dropped on the way.
	Events  []json.RawMessage `json:"events,omitempty"`
	Skipped map[string]uint64 `json:"skipped,omitempty"`
}

const (
	msgHello  = "hello"  // a new or reconnected instance: announce your sets
	msgSet    = "set"    // part of an instance's watched devices, replacing its previous set
	msgBye    = "bye"    // the instance stops: forget its set
	msgValues = "values" // values for the listening instance's subscribers
)

// relay connects a hub to the other instances' hubs through a Bus.
type relay struct {
	hub *Hub
	bus Bus
	id  string // this instance's, random per start
	log *slog.Logger
	opt Options

	// targets maps each device watched elsewhere to the outboxes of the
	// instances watching it; never modified once published.
	targetsIx atomic.Pointer[map[string][]*outbox]

	mu       sync.Mutex
	remote   map[string]*remoteSet // by instance
	outboxes map[string]*outbox    // by instance

	seq        atomic.Uint64
	announce   chan struct{} // the local set changed, or an instance said hello
	kick       chan struct{} // values wait in outboxes
	stop       chan struct{}
	wg         sync.WaitGroup
	stopListen func()
	lastErr    atomic.Int64 // unix ns of the last logged send failure
}

// remoteSet is what an instance announced, and the announcement being
// assembled from its parts.
type remoteSet struct {
	devices map[string]struct{}
	seen    time.Time // of the last complete announcement
	seq     uint64    // of the announcement being assembled
	parts   map[int][]string
}

// outbox holds values waiting to be sent to one instance.
type outbox struct {
	instance string
	mu       sync.Mutex
	events   []forwarded
	skipped  map[string]uint64 // by device: values dropped on the way
}

type forwarded struct {
	device string
	data   []byte
}

func startRelay(ctx context.Context, h *Hub, bus Bus) (*relay, error) {
	var b [8]byte
	_, _ = rand.Read(b[:])
	r := &relay{hub: h, bus: bus, id: hex.EncodeToString(b[:]), opt: h.opt,
		remote: make(map[string]*remoteSet), outboxes: make(map[string]*outbox),
		announce: make(chan struct{}, 1), kick: make(chan struct{}, 1), stop: make(chan struct{})}
	r.log = h.log.With("instance", r.id)
	r.targetsIx.Store(&map[string][]*outbox{})
	stop, err := bus.Listen(ctx, []string{watchChannel, valuesChannel(r.id)}, r.receive, func() {
		r.log.Warn("live relay reconnected; asking the other instances for their sets")
		r.sayHello()
		r.signal(r.announce)
	})
	if err != nil {
		return nil, fmt.Errorf("live: relay listen: %w", err)
	}
	r.stopListen = stop
	r.wg.Add(2)
	go r.runAnnouncer()
	go r.runForwarder()
	r.sayHello() // the others announce their sets: this instance may store values they want
	return r, nil
}

func (r *relay) signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// localChanged is called when this instance's subscribers change.
func (r *relay) localChanged() { r.signal(r.announce) }

func (r *relay) watching(deviceID string) bool {
	_, ok := (*r.targetsIx.Load())[deviceID]
	return ok
}

func (r *relay) targets(deviceID string) []*outbox { return (*r.targetsIx.Load())[deviceID] }

// forward queues a value's event for an instance without blocking; past
// Options.ForwardQueue it is dropped and counted for that instance's
// subscribers.
func (r *relay) forward(o *outbox, deviceID string, data []byte) {
	o.mu.Lock()
	if len(o.events) >= r.opt.ForwardQueue {
		o.skip(deviceID, 1)
		o.mu.Unlock()
		r.hub.m.forwardSkipped.Inc()
		return
	}
	o.events = append(o.events, forwarded{deviceID, data})
	o.mu.Unlock()
	r.signal(r.kick)
}

// skip counts n values of a device dropped; o.mu is held.
func (o *outbox) skip(deviceID string, n uint64) {
	if o.skipped == nil {
		o.skipped = make(map[string]uint64)
	}
	o.skipped[deviceID] += n
}

func (r *relay) send(channel string, payloads []string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := r.bus.Send(ctx, channel, payloads)
	if err != nil {
		// At most one line per heartbeat while the bus is down.
		now := time.Now().UnixNano()
		if last := r.lastErr.Load(); now-last > int64(r.opt.Heartbeat) && r.lastErr.CompareAndSwap(last, now) {
			r.log.Warn("live relay send failed", "channel", channel, "err", err)
		}
	}
	return err
}

func (r *relay) sayHello() {
	b, _ := json.Marshal(message{From: r.id, Type: msgHello})
	_ = r.send(watchChannel, []string{string(b)})
}

// runAnnouncer announces this instance's watched devices when they
// change, when another instance says hello and every heartbeat (so that
// a set lost on the way is replaced), and forgets the sets of instances
// that stopped announcing.
func (r *relay) runAnnouncer() {
	defer r.wg.Done()
	t := time.NewTicker(r.opt.Heartbeat)
	defer t.Stop()
	announcedEmpty := true // at start, the others know of no set of ours
	for {
		select {
		case <-r.stop:
			return
		case <-r.announce:
		case <-t.C:
			r.expire(time.Now())
		}
		devices := r.hub.watchedHere()
		if len(devices) == 0 && announcedEmpty {
			continue
		}
		slices.Sort(devices)
		if r.send(watchChannel, r.setPayloads(devices)) == nil {
			announcedEmpty = len(devices) == 0
		}
	}
}

// setPayloads splits an announcement of devices into parts that fit the
// bus.
func (r *relay) setPayloads(devices []string) []string {
	seq := r.seq.Add(1)
	limit := r.bus.MaxPayload() - 150 // the message's other fields
	var parts [][]string
	var cur []string
	size := 0
	for _, d := range devices {
		n := len(d) + 3 // quotes and comma; ids hold no character JSON escapes
		if size+n > limit && len(cur) > 0 {
			parts, cur, size = append(parts, cur), nil, 0
		}
		cur = append(cur, d)
		size += n
	}
	parts = append(parts, cur)
	out := make([]string, len(parts))
	for i, p := range parts {
		b, _ := json.Marshal(message{From: r.id, Type: msgSet, Seq: seq, Part: i, Parts: len(parts), Devices: p})
		out[i] = string(b)
	}
	return out
}

// expire forgets the sets not renewed within three heartbeats.
func (r *relay) expire(now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	changed := false
	for id, s := range r.remote {
		if now.Sub(s.seen) > 3*r.opt.Heartbeat {
			delete(r.remote, id)
			changed = true
		}
	}
	if changed {
		r.reindex()
	}
}

// reindex publishes the device -> outboxes index from the remote sets,
// and drops the outboxes of instances that watch nothing; r.mu is held.
func (r *relay) reindex() {
	ix := make(map[string][]*outbox)
	for id, s := range r.remote {
		if len(s.devices) == 0 {
			continue
		}
		o := r.outboxes[id]
		if o == nil {
			o = &outbox{instance: id}
			r.outboxes[id] = o
		}
		for d := range s.devices {
			ix[d] = append(ix[d], o)
		}
	}
	for id := range r.outboxes {
		if s := r.remote[id]; s == nil || len(s.devices) == 0 {
			delete(r.outboxes, id)
		}
	}
	r.targetsIx.Store(&ix)
}

// receive handles one payload from the bus, on the bus's goroutine.
func (r *relay) receive(channel, payload string) {
	var m message
	if err := json.Unmarshal([]byte(payload), &m); err != nil || m.From == r.id {
		return
	}
	if channel != watchChannel {
		if m.Type == msgValues {
			r.deliver(&m)
		}
		return
	}
	switch m.Type {
	case msgHello:
		r.signal(r.announce)
	case msgBye:
		r.mu.Lock()
		delete(r.remote, m.From)
		r.reindex()
		r.mu.Unlock()
	case msgSet:
		r.setPart(&m, time.Now())
	}
}

// setPart adds a part of an announcement; the last one replaces the
// instance's set.
func (r *relay) setPart(m *message, now time.Time) {
	if m.Parts <= 0 || m.Part < 0 || m.Part >= m.Parts {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.remote[m.From]
	if s == nil {
		s = &remoteSet{seen: now}
		r.remote[m.From] = s
	}
	switch {
	case m.Seq > s.seq:
		s.seq, s.parts = m.Seq, make(map[int][]string, m.Parts)
	case m.Seq < s.seq || s.parts == nil:
		return // an older announcement's late part, or one complete already
	}
	s.parts[m.Part] = m.Devices
	if len(s.parts) < m.Parts {
		return
	}
	devices := make(map[string]struct{})
	for _, p := range s.parts {
		for _, d := range p {
			devices[d] = struct{}{}
		}
	}
	s.parts, s.seen = nil, now
	same := len(devices) == len(s.devices)
	for d := range devices {
		if _, ok := s.devices[d]; !ok {
			same = false
			break
		}
	}
	s.devices = devices
	if !same {
		r.reindex()
	}
}

// deliver hands values another instance decoded to this instance's
// subscribers, and the counts of values lost on the way.
func (r *relay) deliver(m *message) {
	ix := *r.hub.local.Load()
	for _, raw := range m.Events {
		var e struct {
			DeviceID string `json:"deviceId"`
			Property string `json:"property"`
		}
		if json.Unmarshal(raw, &e) != nil {
			continue
		}
		r.hub.m.received.Inc()
		r.hub.deliverProperty(ix[e.DeviceID], e.Property, raw)
	}
	for d, n := range m.Skipped {
		for _, s := range ix[d] {
			s.skip(n)
		}
	}
}

// runForwarder sends the outboxes, one message (or a few, to fit the bus)
// per instance, Options.ForwardDelay after values start waiting; after a
// failed send, a second later.
func (r *relay) runForwarder() {
	defer r.wg.Done()
	t := time.NewTimer(0)
	<-t.C
	ok := true
	for {
		select {
		case <-r.stop:
			return
		case <-r.kick:
		}
		if ok {
			t.Reset(r.opt.ForwardDelay)
		} else {
			t.Reset(time.Second)
		}
		select {
		case <-r.stop:
			t.Stop()
			return
		case <-t.C:
		}
		ok = r.flush()
	}
}

// flush sends what every outbox holds. What cannot be sent is counted as
// skipped, and the count sent with the next message to that instance.
// It reports whether every send succeeded.
func (r *relay) flush() bool {
	r.mu.Lock()
	boxes := make([]*outbox, 0, len(r.outboxes))
	for _, o := range r.outboxes {
		boxes = append(boxes, o)
	}
	r.mu.Unlock()
	ok := true
	for _, o := range boxes {
		o.mu.Lock()
		events, skipped := o.events, o.skipped
		o.events, o.skipped = nil, nil
		o.mu.Unlock()
		if len(events) == 0 && len(skipped) == 0 {
			continue
		}
		payloads, tooLarge := r.valuePayloads(events, skipped)
		lost := tooLarge // told to the instance with the next message
		newlyLost := uint64(0)
		if err := r.send(valuesChannel(o.instance), payloads); err != nil {
			ok = false
			lost = make(map[string]uint64, len(skipped)+1)
			for _, e := range events {
				lost[e.device]++
			}
			newlyLost = uint64(len(events))
			for d, n := range skipped {
				lost[d] += n
			}
		} else {
			for _, n := range tooLarge {
				newlyLost += n
			}
			r.hub.m.forwarded.Add(float64(uint64(len(events)) - newlyLost))
		}
		r.hub.m.forwardSkipped.Add(float64(newlyLost))
		if len(lost) > 0 {
			o.mu.Lock()
			for d, n := range lost {
				o.skip(d, n)
			}
			o.mu.Unlock()
			r.signal(r.kick) // try again: the counts, or what failed as counts
		}
	}
	return ok
}

// valuePayloads packs events and skipped counts into messages that fit
// the bus; an event too large for any is left out and returned counted.
func (r *relay) valuePayloads(events []forwarded, skipped map[string]uint64) (payloads []string, tooLarge map[string]uint64) {
	limit := r.bus.MaxPayload()
	base := len(`{"from":"","type":"values","seq":,"events":[],"skipped":{}}`) + len(r.id) + 20
	var cur message
	size := base
	emit := func() {
		if len(cur.Events) == 0 && len(cur.Skipped) == 0 {
			return
		}
		cur.From, cur.Type, cur.Seq = r.id, msgValues, r.seq.Add(1)
		b, _ := json.Marshal(cur)
		payloads = append(payloads, string(b))
		cur, size = message{}, base
	}
	for _, e := range events {
		n := len(e.data) + 1
		if base+n > limit {
			if tooLarge == nil {
				tooLarge = make(map[string]uint64)
			}
			tooLarge[e.device]++
			continue
		}
		if size+n > limit {
			emit()
		}
		cur.Events = append(cur.Events, e.data)
		size += n
	}
	for d, k := range skipped {
		n := len(d) + len(strconv.FormatUint(k, 10)) + 4
		if size+n > limit {
			emit()
		}
		if cur.Skipped == nil {
			cur.Skipped = make(map[string]uint64)
		}
		cur.Skipped[d] = k
		size += n
	}
	emit()
	return payloads, tooLarge
}

// close tells the other instances to forget this one's set and stops.
func (r *relay) close() {
	close(r.stop)
	r.wg.Wait()
	b, _ := json.Marshal(message{From: r.id, Type: msgBye})
	_ = r.send(watchChannel, []string{string(b)})
	r.stopListen()
}
