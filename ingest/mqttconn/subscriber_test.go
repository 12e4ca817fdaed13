package mqttconn_test

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"devicehub/bench/testkit"
	"devicehub/ingest/mqttconn"
	"devicehub/ingest/mqtttest"
	"devicehub/meta/metatest"
)

func subscribe(t *testing.T, cfg mqttconn.SubscriberConfig) *mqttconn.Subscriber {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := mqttconn.Subscribe(ctx, cfg)
	if err != nil {
		t.Fatalf("subscribe %s: %v", cfg.ClientID, err)
	}
	return s
}

func take(t *testing.T, s *mqttconn.Subscriber, what string) mqttconn.Received {
	t.Helper()
	select {
	case m := <-s.C():
		return m
	case <-time.After(10 * time.Second):
		t.Fatalf("no message: %s", what)
		return mqttconn.Received{}
	}
}

func subscriberConfig(b *mqtttest.Broker, id string, filters map[string]byte, queue int) mqttconn.SubscriberConfig {
	svc := mqtttest.ServiceConfig(b.URL(), id)
	return mqttconn.SubscriberConfig{Brokers: []string{b.URL()}, ClientID: id, Login: svc.Login,
		Filters: filters, Queue: queue, Name: "test"}
}

// TestSubscriberRedelivers: what the alarm runner and the forwarder rely
// on when an owner hands over. Messages come in order; the one
// acknowledged is not delivered again, while those taken and not
// acknowledged, the one waiting in the queue and the one its handler
// held on the full queue when Close came, are delivered to the next
// Subscriber with the same client id, in order, followed by what arrived
// between the two (the session is resumed, not subscribed anew).
func TestSubscriberRedelivers(t *testing.T) {
	b := mqtttest.StartBroker(t)
	dev := mqtttest.ConnectDevice(t, b.URL(), testkit.RandID("dev-"), mqtttest.Gateway(t, b.URL()))
	topic := "/" + testkit.RandID("p") + "/d1/properties/report"
	cfg := subscriberConfig(b, testkit.RandID("owner-"), map[string]byte{topic: 1}, 1)

	s := subscribe(t, cfg)
	for _, p := range []string{"one", "two", "three", "four"} {
		dev.MustPublish(t, topic, 1, p)
	}
	m := take(t, s, "one")
	if string(m.Msg.Payload()) != "one" || m.Broker != 0 || m.At.IsZero() {
		t.Fatalf("got %q from broker %d at %v", m.Msg.Payload(), m.Broker, m.At)
	}
	m.Msg.Ack()
	if m := take(t, s, "two"); string(m.Msg.Payload()) != "two" {
		t.Fatalf("got %q, want two (in order)", m.Msg.Payload())
	}
	// "two" taken, not acknowledged; "three" in the queue of 1, "four"
	// at its handler, waiting for room: Close lets go of them all.
	testkit.Eventually(t, 10*time.Second, "three queued", func() bool { return len(s.C()) == 1 })
	s.Close()
	dev.MustPublish(t, topic, 1, "five") // between owners

	next := subscribe(t, cfg)
	defer next.Close()
	for _, want := range []string{"two", "three", "four", "five"} {
		m := take(t, next, want)
		if string(m.Msg.Payload()) != want {
			t.Fatalf("the next owner got %q, want %s (all but the acknowledged one, in order)", m.Msg.Payload(), want)
		}
		m.Msg.Ack()
	}
}

// TestSubscriberResubscribes: a broker that comes back without the
// session (restarted without persistence) has the current filters
// subscribed again, those SetFilters gave included; a filter SetFilters
// dropped is not.
func TestSubscriberResubscribes(t *testing.T) {
	b := mqtttest.StartBroker(t)
	p := testkit.RandID("p")
	first, added, dropped := "/"+p+"/d1/properties/report", "/"+p+"/d1/event/alarm", "/"+p+"/d1/online"
	s := subscribe(t, subscriberConfig(b, testkit.RandID("owner-"), map[string]byte{first: 1, dropped: 1}, 16))
	defer s.Close()
	s.SetFilters(map[string]byte{first: 1, added: 1})
	if f := s.Filters(); len(f) != 2 || f[added] != 1 {
		t.Fatalf("Filters %v", f)
	}

	b.Stop(syscall.SIGKILL)
	b.Start()
	gw := mqtttest.Gateway(t, b.URL())
	dev := mqtttest.ConnectDevice(t, b.URL(), testkit.RandID("dev-"), gw)
	// The subscription is back when a message sent after it arrives;
	// until then, send again.
	testkit.Eventually(t, 20*time.Second, "the report after the restart", func() bool {
		dev.MustPublish(t, first, 1, "probe")
		select {
		case m := <-s.C():
			m.Msg.Ack()
			return true
		case <-time.After(200 * time.Millisecond):
			return false
		}
	})
	dev.MustPublish(t, dropped, 1, "dropped")
	dev.MustPublish(t, added, 1, "added")
	dev.MustPublish(t, first, 1, "end")
	for _, want := range []string{"added", "end"} {
		m := take(t, s, want)
		for string(m.Msg.Payload()) == "probe" { // a late one
			m.Msg.Ack()
			m = take(t, s, want)
		}
		if string(m.Msg.Payload()) != want {
			t.Fatalf("got %q on %s, want %s (the dropped filter is not subscribed again)", m.Msg.Payload(), m.Msg.Topic(), want)
		}
		m.Msg.Ack()
	}
}

// TestSubscribePoolAtOnce: Subscribe connects to every broker of a pool
// at once, so a broker that hangs up fails it at once with its own error,
// not after the connect timeout of a silent broker listed before it.
func TestSubscribePoolAtOnce(t *testing.T) {
	b := mqtttest.StartBroker(t)
	silent := mqtttest.Proxy(t, b.URL(), func(int) metatest.Fate { return metatest.Stall })
	refusing := mqtttest.Proxy(t, b.URL(), func(int) metatest.Fate { return metatest.HangUp })
	cfg := subscriberConfig(b, testkit.RandID("owner-"), map[string]byte{"/p/+/properties/report": 1}, 1)
	cfg.Brokers = []string{"tcp://" + silent.Addr(), "tcp://" + refusing.Addr()}
	cfg.ConnectTimeout = 5 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := mqttconn.Subscribe(ctx, cfg)
	if err == nil {
		s.Close()
		t.Fatal("subscribed to a pool whose second broker hangs up")
	}
	if !strings.Contains(err.Error(), refusing.Addr()) {
		t.Errorf("Subscribe: %v, want the refusing broker's error", err)
	}
}
