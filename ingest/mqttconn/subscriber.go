package mqttconn

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"golang.org/x/sync/errgroup"
)

// SubscriberConfig is a Subscriber's setup: one role's sessions at every
// broker of a pool.
type SubscriberConfig struct {
	// Brokers is the pool (Brokers); the Subscriber keeps a session at each.
	Brokers []string
	// ClientID of the sessions, "-<i>" added at broker i of a pool of more
	// than one. Every owner of the role uses the same id, so that a new
	// owner resumes the sessions and what they queued.
	ClientID string
	// Login is the role's login at the brokers.
	Login Login
	// Filters are the topic filters (and their QoS) subscribed to at the
	// start; SetFilters changes them.
	Filters map[string]byte
	// Queue bounds the messages taken and not yet read from C.
	Queue int
	// KeepAlive, PingTimeout and ConnectTimeout as in Config.
	KeepAlive, PingTimeout, ConnectTimeout time.Duration
	// Name starts the Subscriber's log lines ("alarms"); Logger writes
	// them (nil: slog.Default()).
	Name   string
	Logger *slog.Logger
}

// Received is a message a Subscriber took.
type Received struct {
	Msg    mqtt.Message
	Broker int       // its broker's index in SubscriberConfig.Brokers
	At     time.Time // when it arrived
}

// Subscriber is a role's persistent, filtered subscription (the alarm
// runner's, the forwarder's): at each broker a Persistent, ManualAck,
// Resume session subscribed to the current filters. What it relies on:
//   - A new owner resumes the session (the same client id) and is given
//     what the previous owner did not acknowledge and what arrived
//     between owners: the broker keeps it (TestSubscriberRedelivers).
//   - Messages reach C in the order each broker sent them, from one
//     goroutine per connection; C full, the handler waits, which holds
//     the broker's flow (backpressure, nothing dropped).
//   - The role acknowledges each message (Msg.Ack) once what it made of
//     it is stored; Close stops taking messages without acknowledging the
//     ones not read, and keeps the sessions, so the broker delivers them
//     again, to the next owner.
//   - After a reconnect the current filters are subscribed again (a
//     broker that lost the session forgets its subscriptions;
//     TestSubscriberResubscribes); SetFilters changes them while the
//     sessions run. At the start only a new session's SUBACK is waited
//     for: a kept one is subscribed already, and its answer queues
//     behind the backlog it holds.
type Subscriber struct {
	cfg     SubscriberConfig
	log     *slog.Logger
	c       chan Received
	stop    chan struct{}
	stopped sync.Once
	filters atomic.Pointer[map[string]byte]
	clients []mqtt.Client
	present []bool // per broker: the session was kept
}

// Subscribe connects cfg's sessions, one per broker, and subscribes them
// to cfg.Filters. On an error (or ctx's end) the sessions opened are
// dropped, kept at the broker.
func Subscribe(ctx context.Context, cfg SubscriberConfig) (*Subscriber, error) {
	s := &Subscriber{cfg: cfg, log: cfg.Logger, c: make(chan Received, cfg.Queue), stop: make(chan struct{})}
	if s.log == nil {
		s.log = slog.Default()
	}
	f := cfg.Filters
	if f == nil {
		f = map[string]byte{}
	}
	s.filters.Store(&f)
	// Every broker at once: busy brokers answer late, and one after
	// another those waits would add up.
	s.clients = make([]mqtt.Client, len(cfg.Brokers))
	s.present = make([]bool, len(cfg.Brokers))
	g, gctx := errgroup.WithContext(ctx)
	for b := range cfg.Brokers {
		g.Go(func() (err error) {
			s.clients[b], err = s.connect(gctx, b)
			return err
		})
	}
	if err := g.Wait(); err != nil {
		s.clients = slices.DeleteFunc(s.clients, func(c mqtt.Client) bool { return c == nil })
		s.Close()
		return nil, err
	}
	return s, nil
}

// Present reports whether a broker kept the session from an earlier
// connection.
func (s *Subscriber) Present() bool { return slices.Contains(s.present, true) }

// C gives the messages taken, in each broker's order.
func (s *Subscriber) C() <-chan Received { return s.c }

// Clients are the sessions' clients, in Brokers' order.
func (s *Subscriber) Clients() []mqtt.Client { return s.clients }

// Filters are the current filters (not to be changed).
func (s *Subscriber) Filters() map[string]byte { return *s.filters.Load() }

// Close stops taking messages (a handler waiting on a full C lets go of
// its message, unacknowledged) and disconnects the sessions, which the
// brokers keep: what is not acknowledged goes to the next owner.
func (s *Subscriber) Close() { s.disconnect(0) }

// disconnect stops taking messages and disconnects the sessions, waiting
// up to quiesce ms for each.
func (s *Subscriber) disconnect(quiesce uint) {
	s.stopped.Do(func() { close(s.stop) })
	for _, c := range s.clients {
		c.Disconnect(quiesce)
	}
}

// End closes s and ends its sessions at every broker (a clean-session
// connect with their ids): what they hold is dropped, and they take no
// more messages.
func (s *Subscriber) End(ctx context.Context) error {
	// Disconnect(0) returns before the connection is closed: the clean
	// connect below would then take over a live one, whose reconnect
	// would bring the session back.
	s.disconnect(250)
	var errs []error
	for b, broker := range s.cfg.Brokers {
		c, _, err := Dial(ctx, Config{Broker: broker, ClientID: s.clientID(b), Login: s.cfg.Login, ConnectTimeout: s.cfg.ConnectTimeout})
		if err != nil {
			errs = append(errs, fmt.Errorf("end the session %s at %s: %w", s.clientID(b), BrokerName(broker), err))
			continue
		}
		c.Disconnect(250)
	}
	return errors.Join(errs...)
}

// clientID is the session's client id at broker b.
func (s *Subscriber) clientID(b int) string {
	if len(s.cfg.Brokers) > 1 {
		return s.cfg.ClientID + "-" + strconv.Itoa(b)
	}
	return s.cfg.ClientID
}

// SetFilters subscribes the sessions to the filters of next they lack
// and unsubscribes those of the current ones next lacks. The broker
// answers behind the backlog it holds: nothing waits for it (a failure is
// logged).
func (s *Subscriber) SetFilters(next map[string]byte) {
	prev := *s.filters.Load()
	add := map[string]byte{}
	var drop []string
	for f, q := range next {
		if _, ok := prev[f]; !ok {
			add[f] = q
		}
	}
	for f := range prev {
		if _, ok := next[f]; !ok {
			drop = append(drop, f)
		}
	}
	slices.Sort(drop)
	s.filters.Store(&next)
	for _, c := range s.clients {
		if len(add) > 0 {
			go s.logFailure("subscribe", c.SubscribeMultiple(add, nil))
		}
		if len(drop) > 0 {
			go s.logFailure("unsubscribe", c.Unsubscribe(drop...))
		}
	}
}

func (s *Subscriber) logFailure(what string, t mqtt.Token) {
	<-t.Done()
	if err := t.Error(); err != nil {
		s.log.Warn(s.cfg.Name+": "+what+" failed", "err", err)
	}
}

// connect opens the session at broker b.
func (s *Subscriber) connect(ctx context.Context, b int) (mqtt.Client, error) {
	broker := s.cfg.Brokers[b]
	id := s.clientID(b)
	var first atomic.Bool
	first.Store(true)
	c := New(Config{
		Broker: broker, ClientID: id, Login: s.cfg.Login,
		Persistent: true, // a new owner resumes the session and what it queued
		ManualAck:  true,
		Resume:     true,
		KeepAlive:  s.cfg.KeepAlive, PingTimeout: s.cfg.PingTimeout, ConnectTimeout: s.cfg.ConnectTimeout,
		// In order; a full queue holds the broker's flow.
		OnMessage: func(_ mqtt.Client, m mqtt.Message) {
			select {
			case s.c <- Received{Msg: m, Broker: b, At: time.Now()}:
			case <-s.stop: // not acknowledged: the broker delivers it again
			}
		},
		OnConnect: func(c mqtt.Client) {
			if first.Swap(false) {
				return // subscribed below
			}
			if f := *s.filters.Load(); len(f) > 0 {
				go func() { _ = WaitToken(c.SubscribeMultiple(f, nil), 30*time.Second) }()
			}
		},
		OnLost: func(_ mqtt.Client, err error) {
			s.log.Warn(s.cfg.Name+": broker connection lost; reconnecting", "broker", BrokerName(broker), "err", err)
		},
	})
	present, err := Connect(ctx, c)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("connect %s as %s: %w", BrokerName(broker), id, err)
	}
	s.present[b] = present
	// A kept session is subscribed already and answers behind its
	// backlog; a new one is waited for.
	filters := *s.filters.Load()
	if len(filters) == 0 {
		return c, nil
	}
	st := c.SubscribeMultiple(filters, nil)
	if !present {
		if err := WaitToken(st, 10*time.Second); err != nil {
			c.Disconnect(0)
			return nil, fmt.Errorf("subscribe as %s: %w", id, err)
		}
	}
	return c, nil
}
