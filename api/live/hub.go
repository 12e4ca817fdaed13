package live

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"devicehub/tsdb"
)

// Errors of Subscribe.
var (
	// ErrTooMany: the instance serves Options.MaxSubscribers already.
	ErrTooMany = errors.New("live: too many subscribers")
	// ErrClosed: the hub is closed.
	ErrClosed = errors.New("live: hub closed")
)

// Options configure a Hub. Zero fields take DefaultOptions' values.
type Options struct {
	// Queue bounds the events waiting for one subscriber. Default 1024.
	Queue int
	// QueueBytes bounds their bytes. Default 64 KiB (about 430 events of
	// 150 bytes). A stalled client holds its queue plus what its writer
	// took from it last (api/live.go), so MaxSubscribers stalled clients
	// hold at most 2 x 500 x 64 KiB = 64 MiB; frames are shared by the
	// subscribers they go to, so that is the worst case, of subscribers
	// watching different devices.
	QueueBytes int
	// MaxSubscribers bounds the subscriptions of this instance; past it
	// Subscribe returns ErrTooMany. Default 500.
	MaxSubscribers int
	// Bus carries values between instances (relay.go); nil: this
	// instance's subscribers see only the values this instance stores.
	Bus Bus
	// Heartbeat is how often an instance announces the devices its
	// subscribers watch; an announcement not renewed within three
	// heartbeats expires (a crashed instance's). Default 10s.
	Heartbeat time.Duration
	// ForwardDelay is how long values for another instance are gathered
	// before they are sent, one message per instance. Default 10ms.
	ForwardDelay time.Duration
	// ForwardQueue bounds the values waiting to be sent to one other
	// instance; more are dropped and counted, and that instance's
	// subscribers are told. Default 10000.
	ForwardQueue int
	// Registerer receives the metrics; nil registers nothing.
	Registerer prometheus.Registerer
	// Logger; default slog.Default().
	Logger *slog.Logger
}

// DefaultOptions returns the defaults of every field.
func DefaultOptions() Options {
	return Options{
		Queue:          1024,                  // QueueBytes is the bound for typical events
		QueueBytes:     64 << 10,              // 4 s of 100 devices at 1 value/s
		MaxSubscribers: 500,                   // browser tabs of one instance
		Heartbeat:      10 * time.Second,      // a dead instance forgotten within 30 s
		ForwardDelay:   10 * time.Millisecond, // well within the 200 ms budget
		ForwardQueue:   10000,                 // about 1.5 MB per instance
		Logger:         slog.Default(),
	}
}

func (o Options) withDefaults() Options {
	d := DefaultOptions()
	positiveOr(&o.Queue, d.Queue)
	positiveOr(&o.QueueBytes, d.QueueBytes)
	positiveOr(&o.MaxSubscribers, d.MaxSubscribers)
	positiveOr(&o.Heartbeat, d.Heartbeat)
	positiveOr(&o.ForwardDelay, d.ForwardDelay)
	positiveOr(&o.ForwardQueue, d.ForwardQueue)
	if o.Logger == nil {
		o.Logger = d.Logger
	}
	return o
}

// positiveOr sets *v to def when it is not positive (zero or negative: the
// default).
func positiveOr[T int | time.Duration](v *T, def T) {
	if *v <= 0 {
		*v = def
	}
}

// index maps a device to the subscriptions watching it. It is never
// modified once published: Subscribe and Close publish a new one.
type index map[string][]*Subscription

// Hub fans events out to subscriptions. Its feeding methods (Watching,
// Decoded, Stored, PresenceChanged) never block and may be called
// concurrently.
type Hub struct {
	opt   Options
	log   *slog.Logger
	m     *metrics
	relay *relay // nil without Options.Bus

	local atomic.Pointer[index]

	mu     sync.Mutex // subscription changes
	subs   map[*Subscription]struct{}
	closed bool
}

// New starts a hub; with Options.Bus it joins the other instances
// (relay.go) before it returns.
func New(ctx context.Context, opt Options) (*Hub, error) {
	opt = opt.withDefaults()
	h := &Hub{opt: opt, log: opt.Logger.With("component", "live"), subs: make(map[*Subscription]struct{})}
	h.local.Store(&index{})
	h.m = newMetrics(func() float64 {
		h.mu.Lock()
		defer h.mu.Unlock()
		return float64(len(h.subs))
	})
	if opt.Registerer != nil {
		if err := h.m.register(opt.Registerer); err != nil {
			return nil, err
		}
	}
	if opt.Bus != nil {
		r, err := startRelay(ctx, h, opt.Bus)
		if err != nil {
			if opt.Registerer != nil {
				h.m.unregister(opt.Registerer)
			}
			return nil, err
		}
		h.relay = r
	}
	return h, nil
}

// Subscribe watches devices (distinct ids), and of their values only
// those of properties, if any are given.
func (h *Hub) Subscribe(devices, properties []string) (*Subscription, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case h.closed:
		return nil, ErrClosed
	case len(h.subs) >= h.opt.MaxSubscribers:
		return nil, ErrTooMany
	}
	s := newSubscription(h, devices, properties)
	h.subs[s] = struct{}{}
	old := *h.local.Load()
	ix := make(index, len(old)+len(devices))
	for d, ss := range old {
		ix[d] = ss
	}
	for _, d := range devices {
		ix[d] = append(ix[d][:len(ix[d]):len(ix[d])], s) // a new array: the old index is shared
	}
	h.local.Store(&ix)
	if h.relay != nil {
		h.relay.localChanged()
	}
	return s, nil
}

// remove takes a closed subscription out of the index.
func (h *Hub) remove(s *Subscription) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.subs[s]; !ok {
		return
	}
	delete(h.subs, s)
	old := *h.local.Load()
	ix := make(index, len(old))
	for d, ss := range old {
		ix[d] = ss
	}
	for _, d := range s.devices {
		var kept []*Subscription
		for _, x := range ix[d] {
			if x != s {
				kept = append(kept, x)
			}
		}
		if len(kept) == 0 {
			delete(ix, d)
		} else {
			ix[d] = kept
		}
	}
	h.local.Store(&ix)
	if h.relay != nil {
		h.relay.localChanged()
	}
}

// watchedHere returns the devices this instance's subscribers watch.
func (h *Hub) watchedHere() []string {
	ix := *h.local.Load()
	out := make([]string, 0, len(ix))
	for d := range ix {
		out = append(out, d)
	}
	return out
}

// Watching reports whether a subscriber, on this instance or (with a
// Bus) another, watches the device: only such devices' values need to
// reach Decoded. It is a map lookup, for the ingest hot path.
func (h *Hub) Watching(deviceID string) bool {
	if _, ok := (*h.local.Load())[deviceID]; ok {
		return true
	}
	return h.relay != nil && h.relay.watching(deviceID)
}

// Decoded hands the hub property values as ingest decoded them, before
// they are stored: their events say "stored": false. Each goes to the
// subscribers watching its device and property, here and, through the
// relay, on other instances. It never blocks and keeps nothing of values
// (their events are encoded before it returns), so the caller may pass
// strings that point into a message it lets go afterwards.
func (h *Hub) Decoded(values []tsdb.PropertyValue) { h.values(values, false) }

// Stored is Decoded for values already stored in the time-series
// database ("stored": true): for feeds that hand values over once their
// insert has committed.
func (h *Hub) Stored(values []tsdb.PropertyValue) { h.values(values, true) }

func (h *Hub) values(values []tsdb.PropertyValue, stored bool) {
	ix := *h.local.Load()
	for i := range values {
		v := &values[i]
		subs := ix[v.DeviceID]
		var remote []*outbox
		if h.relay != nil {
			remote = h.relay.targets(v.DeviceID)
		}
		if len(subs) == 0 && len(remote) == 0 {
			continue
		}
		data, ok := propertyData(v, stored)
		if !ok {
			continue
		}
		h.deliverProperty(subs, v.Property, data)
		if len(remote) > 0 {
			device := strings.Clone(v.DeviceID) // kept by the outboxes; values are the caller's
			for _, o := range remote {
				h.relay.forward(o, device, data)
			}
		}
	}
}

// deliverProperty offers a property event to those of subs that want its
// property; the frame is built once, if any does.
func (h *Hub) deliverProperty(subs []*Subscription, property string, data []byte) {
	var f []byte
	for _, s := range subs {
		if !s.wants(property) {
			continue
		}
		if f == nil {
			f = frame(EventProperty, data)
		}
		s.offer(f)
	}
}

// PresenceChanged hands the hub a device's birth (online) or last will
// (offline), as this instance's presence client saw it. Every instance
// sees every one, so it is delivered here only.
func (h *Hub) PresenceChanged(deviceID string, online bool) {
	subs := (*h.local.Load())[deviceID]
	if len(subs) == 0 {
		return
	}
	f := frame(EventState, stateData(deviceID, online, time.Now()))
	for _, s := range subs {
		s.offer(f)
	}
}

// Subscribers returns the number of subscriptions.
func (h *Hub) Subscribers() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.subs)
}

// Close ends every subscription (their Done is closed) and, with a Bus,
// tells the other instances this one watches nothing any more. Later
// Subscribe calls fail with ErrClosed.
func (h *Hub) Close() {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return
	}
	h.closed = true
	subs := make([]*Subscription, 0, len(h.subs))
	for s := range h.subs {
		subs = append(subs, s)
	}
	h.mu.Unlock()
	for _, s := range subs {
		s.Close()
	}
	if h.relay != nil {
		h.relay.close()
	}
	if h.opt.Registerer != nil {
		h.m.unregister(h.opt.Registerer)
	}
}

// metrics of a hub.
type metrics struct {
	subscribers                         prometheus.GaugeFunc
	events, skipped                     prometheus.Counter
	forwarded, received, forwardSkipped prometheus.Counter
}

func newMetrics(subscribers func() float64) *metrics {
	return &metrics{
		subscribers: prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "devicehub_live_subscribers",
			Help: "Live-update subscriptions of this instance."}, subscribers),
		events: prometheus.NewCounter(prometheus.CounterOpts{Name: "devicehub_live_events_total",
			Help: "Events queued for live-update subscribers (one per subscriber)."}),
		skipped: prometheus.NewCounter(prometheus.CounterOpts{Name: "devicehub_live_skipped_total",
			Help: "Events dropped for live-update subscribers that fell behind, or lost on the way from another instance."}),
		forwarded: prometheus.NewCounter(prometheus.CounterOpts{Name: "devicehub_live_relay_forwarded_total",
			Help: "Stored values sent to other instances' subscribers."}),
		received: prometheus.NewCounter(prometheus.CounterOpts{Name: "devicehub_live_relay_received_total",
			Help: "Values received from other instances for this instance's subscribers."}),
		forwardSkipped: prometheus.NewCounter(prometheus.CounterOpts{Name: "devicehub_live_relay_skipped_total",
			Help: "Values for other instances dropped: their queue was full, the value too large, or the bus failed."}),
	}
}

func (m *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.subscribers, m.events, m.skipped, m.forwarded, m.received, m.forwardSkipped}
}

func (m *metrics) register(r prometheus.Registerer) error {
	for i, c := range m.collectors() {
		if err := r.Register(c); err != nil {
			for _, done := range m.collectors()[:i] {
				r.Unregister(done)
			}
			return fmt.Errorf("live: register metrics: %w", err)
		}
	}
	return nil
}

func (m *metrics) unregister(r prometheus.Registerer) {
	for _, c := range m.collectors() {
		r.Unregister(c)
	}
}
