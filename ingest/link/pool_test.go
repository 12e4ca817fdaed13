package link

import (
	"context"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"devicehub/bench/testkit"
	"devicehub/ingest/mqtttest"
	"devicehub/meta/metatest"
)

// recorder is a client subscribed to a filter, noting the topics it gets.
type recorder struct {
	mu     sync.Mutex
	topics []string
}

func (r *recorder) has(topic string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Contains(r.topics, topic)
}

func record(t *testing.T, url, filter string) *recorder {
	t.Helper()
	r := &recorder{}
	gw := mqtttest.Gateway(t, url)
	c := mqtttest.ConnectDevice(t, url, randID("rec-"), gw)
	tok := c.Subscribe(filter, 1, func(_ mqtt.Client, m mqtt.Message) {
		r.mu.Lock()
		r.topics = append(r.topics, m.Topic())
		r.mu.Unlock()
	})
	if !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	return r
}

// TestPresencePool: one Presence over two brokers. A device that moves
// from A to B stays online when A publishes its will after the birth on
// B; a command goes to the broker of the device's last birth only, and to
// both for a device known only from the stored state; a will from any
// broker takes such a device offline; Connected covers both brokers.
func TestPresencePool(t *testing.T) {
	a, b := mqtttest.StartBroker(t), mqtttest.StartBroker(t)
	// Gateway logins, and the service login its rights at each broker.
	gwA, gwB := mqtttest.Gateway(t, a.URL()), mqtttest.Gateway(t, b.URL())
	product := randID("pp")
	opt := DefaultPresenceOptions()
	opt.BrokerURL, opt.ClientID, opt.ProductIDs = a.URL()+","+b.URL(), randID("presence-pool-"), []string{product}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	p, err := NewPresence(ctx, opt, staticLister{"seeded"})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if !p.Connected() || !p.ConnectedTo(0) || !p.ConnectedTo(1) || !slices.Equal(p.Brokers(), []string{a.URL(), b.URL()}) {
		t.Fatalf("connected %v, brokers %v", p.Connected(), p.Brokers())
	}
	topic := func(dev, level string) string { return "/" + product + "/" + dev + "/" + level }
	withWill := func(gw func(*mqtt.ClientOptions), dev string) func(*mqtt.ClientOptions) {
		return func(o *mqtt.ClientOptions) {
			gw(o)
			o.SetWill(topic(dev, "offline"), "{}", 1, false)
		}
	}
	onA := mqtttest.ConnectDevice(t, a.URL(), randID("m-a-"), withWill(gwA, "mover"))
	onA.MustPublish(t, topic("mover", "online"), 1, "{}")
	testkit.Eventually(t, 5*time.Second, "the mover online at A", func() bool { return p.IsOnline("mover") })
	onB := mqtttest.ConnectDevice(t, b.URL(), randID("m-b-"), withWill(gwB, "mover"))
	onB.MustPublish(t, topic("mover", "online"), 1, "{}")
	recA, recB := record(t, a.URL(), "/"+product+"/+/properties/read"), record(t, b.URL(), "/"+product+"/+/properties/read")
	// The birth on B is taken once a command to the mover reaches B.
	testkit.Eventually(t, 5*time.Second, "a command to the mover at B", func() bool {
		if err := p.Publish(ctx, topic("mover", "properties/read"), 1, []byte("{}")); err != nil {
			t.Fatal(err)
		}
		return recB.has(topic("mover", "properties/read"))
	})
	onA.Cut() // A publishes the mover's will, after its birth on B
	// A sentinel behind the will on A: another device's birth there.
	sentinel := mqtttest.ConnectDevice(t, a.URL(), randID("s-"), gwA)
	sentinel.MustPublish(t, topic("sentinel", "online"), 1, "{}")
	testkit.Eventually(t, 15*time.Second, "the sentinel online", func() bool { return p.IsOnline("sentinel") })
	if !p.IsOnline("mover") {
		t.Fatal("the mover went offline with the will of the broker it left")
	}
	// Commands to the sentinel go to A only; the mover's earlier ones,
	// which went to B, would have reached A's recorder before.
	if err := p.Publish(ctx, topic("sentinel", "properties/read"), 1, []byte("{}")); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 5*time.Second, "the sentinel's command at A", func() bool { return recA.has(topic("sentinel", "properties/read")) })
	if recA.has(topic("mover", "properties/read")) || recB.has(topic("sentinel", "properties/read")) {
		t.Fatalf("a command went to a broker its device is not at: A %v, B %v", recA.topics, recB.topics)
	}
	// A device known from the stored state only: its command goes to both.
	if !p.IsOnline("seeded") {
		t.Fatal("the seeded device is not online")
	}
	if err := p.Publish(ctx, topic("seeded", "properties/read"), 1, []byte("{}")); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 5*time.Second, "the seeded device's command at both brokers", func() bool {
		return recA.has(topic("seeded", "properties/read")) && recB.has(topic("seeded", "properties/read"))
	})
	// Its will, from either broker, counts.
	onB.MustPublish(t, topic("seeded", "offline"), 1, "{}")
	testkit.Eventually(t, 5*time.Second, "the seeded device offline", func() bool { return !p.IsOnline("seeded") })
	// The mover's will on B, the broker it is at, counts.
	onB.Cut()
	testkit.Eventually(t, 15*time.Second, "the mover offline through B's will", func() bool { return !p.IsOnline("mover") })

	b.Stop(syscall.SIGTERM)
	testkit.Eventually(t, 10*time.Second, "B's client down", func() bool { return !p.ConnectedTo(1) })
	if p.Connected() || !p.ConnectedTo(0) {
		t.Fatalf("with B down: connected %v, to A %v", p.Connected(), p.ConnectedTo(0))
	}
	b.Start()
	testkit.Eventually(t, 10*time.Second, "both clients connected with B back", p.Connected)
}

// TestPresencePoolAtOnce: NewPresence connects to every broker of a pool
// at once, so a broker that hangs up fails it at once with its own error,
// not after the connect timeout of a silent broker listed before it.
func TestPresencePoolAtOnce(t *testing.T) {
	a := mqtttest.StartBroker(t)
	silent := mqtttest.Proxy(t, a.URL(), func(int) metatest.Fate { return metatest.Stall })
	refusing := mqtttest.Proxy(t, a.URL(), func(int) metatest.Fate { return metatest.HangUp })
	opt := DefaultPresenceOptions()
	opt.BrokerURL, opt.ClientID, opt.ProductIDs = "tcp://"+silent.Addr()+",tcp://"+refusing.Addr(), randID("presence-once-"), []string{randID("pp")}
	opt.ConnectTimeout = 5 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p, err := NewPresence(ctx, opt, staticLister{"seeded"})
	if err == nil {
		p.Close()
		t.Fatal("connected to a pool whose second broker hangs up")
	}
	if !strings.Contains(err.Error(), refusing.Addr()) {
		t.Errorf("NewPresence: %v, want the refusing broker's error", err)
	}
}
