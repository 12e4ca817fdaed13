package link

import (
	"context"
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
