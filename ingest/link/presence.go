package link

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"devicehub/ingest/mqttconn"
	"devicehub/ingest/wire"
)

// OnlineLister lists the devices stored as online; *meta.Store is one.
type OnlineLister interface {
	OnlineDeviceIDs(ctx context.Context) ([]string, error)
}

// Handler receives messages of a Presence subscription. It runs on the
// client's single delivery goroutine, so it must not block.
type Handler func(topic string, payload []byte)

// PresenceOptions configure NewPresence. Zero fields take
// DefaultPresenceOptions' values.
type PresenceOptions struct {
	// BrokerURL of the MQTT broker, or of several (a broker pool), comma-
	// separated (Brokers): one client connects to each. Default
	// "tcp://127.0.0.1:1884".
	BrokerURL string
	// Login is devicehub's login at the broker.
	Login mqttconn.Login
	// ClientID of this instance's client; it must be unique per instance.
	// Default "devicehub-presence-<hostname>-<random>".
	ClientID string
	// ProductIDs narrows the subscription to these products; empty means
	// every product. Meant for tests.
	ProductIDs []string
	// KeepAlive of the connection. Default 30s.
	KeepAlive time.Duration
	// ConnectTimeout bounds connecting, subscribing and seeding. Default 10s.
	ConnectTimeout time.Duration
	// Registerer receives devicehub_devices_online; nil registers nothing.
	Registerer prometheus.Registerer
	// Logger; default slog.Default().
	Logger *slog.Logger
}

// DefaultPresenceOptions returns options that work with `make run`.
func DefaultPresenceOptions() PresenceOptions {
	host, _ := os.Hostname()
	var b [4]byte
	_, _ = rand.Read(b[:])
	return PresenceOptions{
		BrokerURL:      mqttconn.DefaultBrokerURL,
		Login:          mqttconn.DefaultLogin,
		ClientID:       "devicehub-presence-" + host + "-" + hex.EncodeToString(b[:]), // unique: plain subscription per instance
		KeepAlive:      30 * time.Second,                                              // paho's default
		ConnectTimeout: 10 * time.Second,                                              // a local broker answers in ms
		Logger:         slog.Default(),
	}
}

// Presence keeps an in-memory view of which devices are online, from the
// birth and last-will messages every instance receives on a plain (not
// shared) subscription, seeded from the stored state at start and after
// every reconnect. Its client is the instance's downlink client too:
// Publish sends, Subscribe adds filters (e.g. command replies) that are
// renewed on reconnect.
//
// With a broker pool it holds one client per broker and one view: each
// online device is noted with the broker its last birth came from. A
// will counts only from that broker: a device that moved from broker A
// to broker B (its connection to A lost, its birth published on B) stays
// online when A publishes its will later, which A does only once its
// keep-alive expires. A device seeded from the stored state has no broker
// until its next birth; a will from any broker takes it offline. Publish
// sends a command to the device's broker (unknown: to every broker).
type Presence struct {
	opt     PresenceOptions
	log     *slog.Logger
	lister  OnlineLister
	brokers []string
	clients []mqtt.Client // one per broker, in Brokers' order

	mu      sync.RWMutex
	online  Births          // device -> broker of its last birth; UnknownBroker when seeded
	touched map[string]int8 // ids changed by messages while seeding, with the broker of the message; nil otherwise
	subs    map[string]sub  // filter -> subscription, renewed on reconnect
	closed  bool
	seeded  bool
	conns   int // connections so far: a later one ends an earlier one's reseeding

	// hooks run after the view changes (commands fail waiters at once).
	onChange []func(deviceID string, online bool)
	onLost   []func()

	seedCtx    context.Context
	seedCancel context.CancelFunc
	seedWG     sync.WaitGroup

	onlineGauge prometheus.Collector // devicehub_devices_online, when registered
}

type sub struct {
	qos byte
	h   func(broker int, topic string, payload []byte)
}

// maxBrokers bounds a pool (a broker's index is an int8 in the view).
const maxBrokers = 127

// NewPresence connects, subscribes to every device's online and offline
// topics and seeds the view from lister.
func NewPresence(ctx context.Context, opt PresenceOptions, lister OnlineLister) (*Presence, error) {
	d := DefaultPresenceOptions()
	if opt.BrokerURL == "" {
		opt.BrokerURL = d.BrokerURL
	}
	if opt.ClientID == "" {
		opt.ClientID = d.ClientID
	}
	if opt.Login == (mqttconn.Login{}) {
		opt.Login = d.Login
	}
	if opt.KeepAlive <= 0 {
		opt.KeepAlive = d.KeepAlive
	}
	if opt.ConnectTimeout <= 0 {
		opt.ConnectTimeout = d.ConnectTimeout
	}
	if opt.Logger == nil {
		opt.Logger = d.Logger
	}
	brokers, err := mqttconn.Brokers(opt.BrokerURL)
	if err != nil {
		return nil, fmt.Errorf("link: %w", err)
	}
	if len(brokers) > maxBrokers {
		return nil, fmt.Errorf("link: %d brokers, at most %d", len(brokers), maxBrokers)
	}
	p := &Presence{
		opt:     opt,
		log:     opt.Logger.With("component", "presence"),
		lister:  lister,
		brokers: brokers,
		online:  make(Births),
		subs:    make(map[string]sub),
	}
	p.seedCtx, p.seedCancel = context.WithCancel(context.Background())
	products := opt.ProductIDs
	if len(products) == 0 {
		products = []string{"+"}
	}
	for _, pr := range products {
		p.subs[wire.DeviceTopic(pr, "+", wire.LevelOnline)] = sub{1, p.onPresence}
		p.subs[wire.DeviceTopic(pr, "+", wire.LevelOffline)] = sub{1, p.onPresence}
	}
	p.mu.Lock()
	p.touched = make(map[string]int8) // track from the first subscription on
	p.mu.Unlock()
	for i, broker := range brokers {
		p.clients = append(p.clients, p.newClient(i, broker))
	}
	// Every broker at once: busy brokers (a restart during a storm) answer
	// late, and one after another those waits would add up.
	g, gctx := errgroup.WithContext(ctx)
	for i, c := range p.clients {
		g.Go(func() error {
			if _, err := mqttconn.Connect(gctx, c); err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				return fmt.Errorf("link: presence connect %s: %w", brokers[i], err)
			}
			return p.resubscribe(i)
		})
	}
	if err := g.Wait(); err != nil {
		p.Close()
		return nil, err
	}
	// The first seed runs here, synchronously, so the view is ready on return.
	if err := p.seed(ctx, true); err != nil {
		p.Close()
		return nil, err
	}
	if opt.Registerer != nil {
		g := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "devicehub_devices_online",
			Help: "Devices connected to the broker, as this instance's presence view sees them."},
			func() float64 { return float64(p.OnlineCount()) })
		if err := opt.Registerer.Register(g); err != nil {
			p.Close()
			return nil, fmt.Errorf("link: presence metrics: %w", err)
		}
		p.onlineGauge = g
	}
	return p, nil
}

// newClient is the (unconnected) client of broker i. Every command is a
// publish out and a reply in on this connection: mqttconn's buffered
// connection makes a read one system call per batch of packets instead of
// several per packet, and acks and publishes leave together.
func (p *Presence) newClient(i int, broker string) mqtt.Client {
	return mqttconn.New(mqttconn.Config{
		Broker: broker, ClientID: p.opt.ClientID, Login: p.opt.Login,
		Resume:         true,
		KeepAlive:      p.opt.KeepAlive,
		ConnectTimeout: p.opt.ConnectTimeout,
		OnConnect:      func(mqtt.Client) { p.onConnect(i) },
		OnLost: func(_ mqtt.Client, err error) {
			p.log.Warn("presence connection lost; reconnecting", "broker", mqttconn.BrokerName(broker), "err", err)
			p.mu.RLock()
			hooks := p.onLost
			p.mu.RUnlock()
			for _, h := range hooks {
				h()
			}
		},
	})
}

// resubscribe renews every subscription on broker i's client.
func (p *Presence) resubscribe(i int) error {
	p.mu.RLock()
	filters := make(map[string]byte, len(p.subs))
	for f, s := range p.subs {
		filters[f] = s.qos
	}
	p.mu.RUnlock()
	route := func(_ mqtt.Client, m mqtt.Message) { p.route(i, m) }
	if err := mqttconn.WaitToken(p.clients[i].SubscribeMultiple(filters, route), p.opt.ConnectTimeout); err != nil {
		return fmt.Errorf("link: presence subscribe at %s: %w", mqttconn.BrokerName(p.brokers[i]), err)
	}
	return nil
}

// onConnect renews the subscriptions of broker i's client and, after a
// reconnect, reseeds the view (changes may have been missed while
// disconnected).
func (p *Presence) onConnect(i int) {
	p.mu.Lock()
	p.conns++
	conn := p.conns
	again := p.seeded && !p.closed
	if again {
		// What this broker's messages said may be out of date (a will
		// missed while away); what the other brokers said since tracking
		// began still wins over the seed.
		if p.touched == nil {
			p.touched = make(map[string]int8)
		}
		for id, b := range p.touched {
			if int(b) == i {
				delete(p.touched, id)
			}
		}
		p.seedWG.Add(1)
	}
	p.mu.Unlock()
	if !again {
		return // the first connection: NewPresence subscribes and seeds
	}
	go func() {
		defer p.seedWG.Done()
		// A storm can keep the broker from answering within
		// ConnectTimeout: tried again, or the view would be neither
		// subscribed nor seeded until the next reconnect.
		for {
			err := p.resubscribe(i)
			if err == nil {
				break
			}
			p.log.Warn("presence resubscribe failed; retrying", "err", err)
			select {
			case <-time.After(time.Second):
			case <-p.seedCtx.Done():
				return
			}
			if !p.clients[i].IsConnectionOpen() {
				return // its next connection subscribes again
			}
		}
		// The seed reads the stored state as of now; a device that came
		// back before this client resubscribed, and whose birth is not
		// stored yet, is in neither: after a broker restart 69 and 294 of
		// 5,000 reconnected devices stayed out of the view for good (bench
		// fleet-connect, two runs). So the view is seeded again as those
		// writes land, messages since the resubscription winning, until
		// reseedFor has passed: the stored state of a storm's devices can
		// take minutes to catch up (a 100,000-device broker restart: 185 s,
		// when seeds that ended at 77 s left devices out of the view).
		start := time.Now()
		for n := 0; ; n++ {
			wait := reseedEvery
			if n < len(reseedAfter) {
				wait = reseedAfter[n]
			}
			if n > 0 {
				select {
				case <-time.After(wait):
				case <-p.seedCtx.Done():
					return
				}
				p.mu.RLock()
				superseded := p.conns != conn
				p.mu.RUnlock()
				if superseded {
					return
				}
			}
			last := n >= len(reseedAfter)-1 && time.Since(start) >= reseedFor
			ctx, cancel := context.WithTimeout(p.seedCtx, p.opt.ConnectTimeout)
			err := p.seed(ctx, last)
			cancel()
			if err != nil {
				p.log.Warn("presence reseed failed", "err", err)
				if last {
					p.mu.Lock()
					p.touched = nil // the messages since the reconnect stand
					p.mu.Unlock()
				}
			}
			if last {
				return
			}
		}
	}()
}

// reseedAfter are the waits before the first seeds of the view after a
// reconnect: at once, then as the stored state catches up with the
// births that came in before the resubscription (ingest writes state
// every 200 ms; a storm of births takes PostgreSQL seconds to minutes);
// then one every reseedEvery, the last once reseedFor has passed since
// the resubscription. Each reads every online device (a query of 100,000
// ids takes PostgreSQL tens of ms), and only after a reconnect.
var (
	reseedAfter = []time.Duration{0, 2 * time.Second, 5 * time.Second, 10 * time.Second}
	reseedEvery = 10 * time.Second
	reseedFor   = 5 * time.Minute
)

// seed merges the stored online devices into the view: a device changed
// by a message since tracking began keeps what the message said. last
// ends the tracking.
func (p *Presence) seed(ctx context.Context, last bool) error {
	ids, err := p.lister.OnlineDeviceIDs(ctx)
	if err != nil {
		return fmt.Errorf("link: presence seed: %w", err)
	}
	listed := make(map[string]struct{}, len(ids))
	for _, id := range ids {
		listed[id] = struct{}{}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for id := range p.online {
		if _, ok := listed[id]; !ok {
			if _, ok := p.touched[id]; !ok {
				delete(p.online, id)
			}
		}
	}
	for id := range listed {
		if _, ok := p.touched[id]; !ok {
			if _, ok := p.online[id]; !ok {
				p.online[id] = UnknownBroker
			}
		}
	}
	if last {
		p.touched = nil
	}
	p.seeded = true
	return nil
}

// route dispatches a message to the handler of the filter it matches.
//
// A retained message is one the broker replays to each new subscription:
// an old birth, will or reply, not news; it is ignored.
func (p *Presence) route(broker int, m mqtt.Message) {
	if m.Retained() {
		return
	}
	p.mu.RLock()
	var h func(int, string, []byte)
	for f, s := range p.subs {
		if topicMatch(f, m.Topic()) {
			h = s.h
			break
		}
	}
	p.mu.RUnlock()
	if h != nil {
		h(broker, m.Topic(), m.Payload())
	}
}

// onPresence takes a birth or will that broker delivered. A will from
// another broker than the one the device's last birth came from is stale
// (the device has moved): it changes nothing.
func (p *Presence) onPresence(broker int, topic string, _ []byte) {
	deviceID, online, ok := wire.ParsePresenceTopic(topic)
	if !ok {
		return
	}
	p.mu.Lock()
	if !p.online.Keep(deviceID, int8(broker), online) {
		p.mu.Unlock()
		return
	}
	if p.touched != nil {
		p.touched[deviceID] = int8(broker)
	}
	hooks := p.onChange
	p.mu.Unlock()
	for _, h := range hooks {
		h(deviceID, online)
	}
}

// OnPresenceChange registers h to run after a device goes online or
// offline; h must not block.
func (p *Presence) OnPresenceChange(h func(deviceID string, online bool)) {
	p.mu.Lock()
	p.onChange = append(p.onChange, h)
	p.mu.Unlock()
}

// OnConnectionLost registers h to run when this client loses the broker.
func (p *Presence) OnConnectionLost(h func()) {
	p.mu.Lock()
	p.onLost = append(p.onLost, h)
	p.mu.Unlock()
}

// IsOnline reports whether the device is connected, as last seen.
func (p *Presence) IsOnline(deviceID string) bool {
	p.mu.RLock()
	defer p.mu.RUnlock()
	_, ok := p.online[deviceID]
	return ok
}

// OnlineCount is the number of devices online.
func (p *Presence) OnlineCount() int {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return len(p.online)
}

// Subscribe adds a plain subscription on this instance's client, renewed
// on every reconnect; h must not block.
func (p *Presence) Subscribe(filter string, qos byte, h Handler) error {
	p.mu.Lock()
	p.subs[filter] = sub{qos, func(_ int, topic string, payload []byte) { h(topic, payload) }}
	p.mu.Unlock()
	for i, c := range p.clients {
		route := func(_ mqtt.Client, m mqtt.Message) { p.route(i, m) }
		if err := mqttconn.WaitToken(c.Subscribe(filter, qos, route), p.opt.ConnectTimeout); err != nil {
			return fmt.Errorf("link: subscribe %s at %s: %w", filter, mqttconn.BrokerName(p.brokers[i]), err)
		}
	}
	return nil
}

// Publish sends a message on this instance's client and waits until it is
// sent (QoS 0) or acknowledged (QoS 1), or ctx ends. With a broker pool it
// goes to the broker the topic's device is online at, as the view has it
// (a device's topics are /{product}/{device}/...); when that is not known,
// to every broker, and the first to take it answers.
func (p *Presence) Publish(ctx context.Context, topic string, qos byte, payload []byte) error {
	if len(p.clients) == 1 {
		return p.publishOn(ctx, 0, topic, qos, payload)
	}
	p.mu.RLock()
	at, ok := p.online[topicDevice(topic)]
	p.mu.RUnlock()
	if ok && at != UnknownBroker {
		return p.publishOn(ctx, int(at), topic, qos, payload)
	}
	errc := make(chan error, len(p.clients))
	for i := range p.clients {
		go func() { errc <- p.publishOn(ctx, i, topic, qos, payload) }()
	}
	var errs []error
	for range p.clients {
		err := <-errc
		if err == nil {
			return nil
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// PublishEverywhere publishes to every broker of the pool and waits as
// Publish does; it fails if any broker did not take it. For messages that
// must reach a device whose broker the view may not know yet (a device
// that has just moved: ingest/shadow's deltas); a broker the device is not
// connected to drops it.
func (p *Presence) PublishEverywhere(ctx context.Context, topic string, qos byte, payload []byte) error {
	if len(p.clients) == 1 {
		return p.publishOn(ctx, 0, topic, qos, payload)
	}
	errc := make(chan error, len(p.clients))
	for i := range p.clients {
		go func() { errc <- p.publishOn(ctx, i, topic, qos, payload) }()
	}
	var errs []error
	for range p.clients {
		if err := <-errc; err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// publishOn publishes on broker i's client and waits, as Publish.
func (p *Presence) publishOn(ctx context.Context, i int, topic string, qos byte, payload []byte) error {
	t := p.clients[i].Publish(topic, qos, false, payload)
	select {
	case <-t.Done():
		if err := t.Error(); err != nil {
			if len(p.clients) > 1 {
				return fmt.Errorf("link: publish %s at %s: %w", topic, mqttconn.BrokerName(p.brokers[i]), err)
			}
			return fmt.Errorf("link: publish %s: %w", topic, err)
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// topicDevice is the device level of a device topic /{product}/{device}/...
func topicDevice(topic string) string {
	parts := strings.SplitN(topic, "/", 4)
	if len(parts) < 3 || parts[0] != "" {
		return ""
	}
	return parts[2]
}

// Connected reports whether the client of every broker is connected.
func (p *Presence) Connected() bool {
	for _, c := range p.clients {
		if !c.IsConnectionOpen() {
			return false
		}
	}
	return len(p.clients) > 0
}

// Brokers are the URLs of the brokers this Presence connects to, in the
// order of its setting.
func (p *Presence) Brokers() []string { return p.brokers }

// ConnectedTo reports whether the client of broker i (Brokers' index) is
// connected.
func (p *Presence) ConnectedTo(i int) bool { return p.clients[i].IsConnectionOpen() }

// Close disconnects and unregisters the metric.
func (p *Presence) Close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	if p.onlineGauge != nil {
		p.opt.Registerer.Unregister(p.onlineGauge)
	}
	p.seedCancel()
	for _, c := range p.clients {
		c.Disconnect(250)
	}
	p.seedWG.Wait()
}

// topicMatch reports whether topic matches the MQTT filter (+ and #).
func topicMatch(filter, topic string) bool {
	for {
		fi, ti := indexSlash(filter), indexSlash(topic)
		fl, tl := filter[:fi], topic[:ti]
		switch {
		case fl == "#":
			return true
		case fl != "+" && fl != tl:
			return false
		}
		fEnd, tEnd := fi == len(filter), ti == len(topic)
		if fEnd || tEnd {
			return fEnd && tEnd || (tEnd && filter[fi+1:] == "#")
		}
		filter, topic = filter[fi+1:], topic[ti+1:]
	}
}

func indexSlash(s string) int {
	for i := 0; i < len(s); i++ {
		if s[i] == '/' {
			return i
		}
	}
	return len(s)
}
