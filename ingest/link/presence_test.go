package link

import (
	"context"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/prometheus/client_golang/prometheus"

	"devicehub/bench/testkit"
	"devicehub/ingest/mqtttest"
)

type staticLister []string

func (l staticLister) OnlineDeviceIDs(context.Context) ([]string, error) { return l, nil }

func TestTopicMatch(t *testing.T) {
	f := func(filter, topic string, want bool) {
		t.Helper()
		if got := topicMatch(filter, topic); got != want {
			t.Fatalf("topicMatch(%q, %q) = %v", filter, topic, got)
		}
	}
	f("/+/+/online", "/p/d/online", true)
	f("/+/+/online", "/p/d/offline", false)
	f("/+/+/online", "/p/d/online/x", false)
	f("/p/#", "/p/d/x/y", true)
	f("/p/#", "/p", true)
	f("/+/+/properties/read/reply", "/p/d/properties/read/reply", true)
	f("a/b", "a", false)
}

// TestPresenceView: the view is seeded from the lister, follows birth and
// will messages of a real device, and devicehub_devices_online follows
// the view; Close unregisters the gauge.
func TestPresenceView(t *testing.T) {
	product := randID("pv")
	reg := prometheus.NewRegistry()
	opt := DefaultPresenceOptions()
	opt.BrokerURL, opt.ClientID, opt.ProductIDs, opt.Registerer = brokerURL(), randID("presence-test-"), []string{product}, reg
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := NewPresence(ctx, opt, staticLister{"seeded"})
	if err != nil {
		t.Fatal(err)
	}
	online := func() float64 { return metricValue(t, reg, "devicehub_devices_online") }
	if !p.IsOnline("seeded") || p.OnlineCount() != 1 || online() != 1 {
		t.Fatalf("seeded view: online %v, count %d, gauge %v", p.IsOnline("seeded"), p.OnlineCount(), online())
	}

	gw := mqtttest.Gateway(t, brokerURL())
	dev := mqtttest.ConnectDevice(t, brokerURL(), randID("pd"), func(o *mqtt.ClientOptions) {
		gw(o)
		o.SetWill("/"+product+"/d1/offline", "{}", 1, false)
	})
	dev.MustPublish(t, "/"+product+"/d1/online", 1, "{}")
	testkit.Eventually(t, 5*time.Second, "d1 online", func() bool { return p.IsOnline("d1") })
	if got := online(); got != 2 {
		t.Fatalf("gauge %v with two devices online", got)
	}
	dev.Cut() // the broker publishes the will
	testkit.Eventually(t, 15*time.Second, "d1 offline through its will", func() bool { return !p.IsOnline("d1") })
	if got := online(); got != 1 {
		t.Fatalf("gauge %v after the will", got)
	}
	p.Close()
	if metricValue(t, reg, "devicehub_devices_online") != -1 {
		t.Fatalf("devicehub_devices_online still registered after Close")
	}
}

// laggingLister is the stored state catching up: what it lists is set by
// the test as it goes.
type laggingLister struct {
	mu  sync.Mutex
	ids []string
}

func (l *laggingLister) set(ids ...string) {
	l.mu.Lock()
	l.ids = ids
	l.mu.Unlock()
}

func (l *laggingLister) OnlineDeviceIDs(context.Context) ([]string, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.ids), nil
}

// TestPresenceReseedsUntilCaughtUp: after a broker restart the view is
// seeded again until reseedFor has passed, not only on the first waits: a
// birth the view missed (published before it resubscribed) and stored
// late, as a storm's are, reaches the view. Then the reseeding ends.
func TestPresenceReseedsUntilCaughtUp(t *testing.T) {
	after, every, bound := reseedAfter, reseedEvery, reseedFor
	reseedAfter, reseedEvery, reseedFor = []time.Duration{0, 50 * time.Millisecond}, 100*time.Millisecond, 3*time.Second
	t.Cleanup(func() { reseedAfter, reseedEvery, reseedFor = after, every, bound })
	broker := mqtttest.StartBroker(t)
	opt := DefaultPresenceOptions()
	opt.BrokerURL, opt.ClientID, opt.ProductIDs = broker.URL(), randID("presence-test-"), []string{randID("pr")}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stored := &laggingLister{}
	p, err := NewPresence(ctx, opt, stored)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	broker.Stop(syscall.SIGTERM)
	testkit.Eventually(t, 10*time.Second, "presence disconnected", func() bool { return !p.Connected() })
	broker.Start()
	testkit.Eventually(t, 20*time.Second, "presence reconnected", p.Connected)
	time.Sleep(500 * time.Millisecond) // past the first waits
	stored.set("missed")               // its birth stored only now
	testkit.Eventually(t, 2*time.Second, "the late-stored device in the view", func() bool { return p.IsOnline("missed") })
	testkit.Eventually(t, 10*time.Second, "the reseeding over", func() bool {
		p.mu.RLock()
		defer p.mu.RUnlock()
		return p.touched == nil
	})
	stored.set()
	time.Sleep(300 * time.Millisecond)
	if !p.IsOnline("missed") {
		t.Fatal("seeded again after reseedFor")
	}
}
