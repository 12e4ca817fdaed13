package live

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"devicehub/bench/testkit"
	"devicehub/meta/metatest"
	"devicehub/tsdb"
)

// newBusHubs starts n hubs sharing one PostgreSQL database as their bus,
// as n instances of one deployment.
func newBusHubs(t *testing.T, n int, opt Options) []*Hub {
	t.Helper()
	dsn := metatest.NewDatabase(t)
	hubs := make([]*Hub, n)
	for i := range hubs {
		bus, err := NewPGBus(dsn)
		if err != nil {
			t.Fatal(err)
		}
		o := opt
		o.Bus = bus
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		h, err := New(ctx, o)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { h.Close(); bus.Close() })
		hubs[i] = h
	}
	return hubs
}

// takeUntil takes events from s until it has n, or fails after d.
func takeUntil(t *testing.T, s *Subscription, n int, d time.Duration) (lines []string, skipped uint64) {
	t.Helper()
	deadline := time.After(d)
	for len(lines) < n {
		select {
		case <-s.Ready():
			l, k := events(s)
			lines, skipped = append(lines, l...), skipped+k
		case <-deadline:
			t.Fatalf("got %d of %d events in %s:\n%s", len(lines), n, d, strings.Join(lines, "\n"))
		}
	}
	return lines, skipped
}

// TestRelay: a value stored by instance a reaches a subscriber on
// instance b, and only the instances watching the device pay for it.
func TestRelay(t *testing.T) {
	hubs := newBusHubs(t, 3, Options{})
	a, b, c := hubs[0], hubs[1], hubs[2]
	sb := subscribe(t, b, []string{"d1"}, []string{"temp"})
	sc := subscribe(t, c, []string{"d2"}, nil)
	testkit.Eventually(t, 5*time.Second, "a to learn that b watches d1 and c d2", func() bool { return a.Watching("d1") && a.Watching("d2") })
	if got := len(a.relay.targets("d1")); got != 1 {
		t.Fatalf("d1 goes to %d instances, want b only", got)
	}

	start := time.Now()
	// Values as ingest decodes them, before storage (what it hands the
	// hub now): the relay carries them as it carried stored ones.
	a.Decoded([]tsdb.PropertyValue{num("d1", "temp", 21.5), num("d1", "hum", 40), num("d2", "x", 1), num("d3", "temp", 9)})
	got, skipped := takeUntil(t, sb, 1, 5*time.Second)
	latency := time.Since(start)
	want := `property {"deviceId":"d1","productId":"p1","property":"temp","value":21.5,"timestamp":1764000000000,"stored":false}`
	if len(got) != 1 || got[0] != want || skipped != 0 {
		t.Fatalf("b got %q (skipped %d), want [%s]", got, skipped, want)
	}
	if got, _ := takeUntil(t, sc, 1, 5*time.Second); !strings.Contains(got[0], `"deviceId":"d2"`) {
		t.Fatalf("c got %q", got)
	}
	t.Logf("decoded on a, taken on b after %s", latency)

	// b leaves: a stops forwarding d1 (b's bye), c still gets d2.
	sb.Close()
	testkit.Eventually(t, 5*time.Second, "a to forget d1", func() bool { return !a.Watching("d1") })
	if !a.Watching("d2") {
		t.Fatal("a forgot d2, which c still watches")
	}
}

// TestRelaySetParts: a watched set larger than one bus message arrives
// in parts and is replaced as a whole.
func TestRelaySetParts(t *testing.T) {
	hubs := newBusHubs(t, 2, Options{})
	a, b := hubs[0], hubs[1]
	var devices []string
	for i := range 600 { // 600 ids of 64 characters: about 40 KB, 6 parts
		devices = append(devices, fmt.Sprintf("%064d", i))
	}
	var subs []*Subscription
	for i := 0; i < len(devices); i += 100 {
		subs = append(subs, subscribe(t, b, devices[i:i+100], nil))
	}
	if n := len(b.relay.setPayloads(devices)); n < 5 {
		t.Fatalf("600 long ids in %d parts: the test needs several", n)
	}
	testkit.Eventually(t, 5*time.Second, "a to learn all 600 devices", func() bool {
		for _, d := range devices {
			if !a.Watching(d) {
				return false
			}
		}
		return true
	})

	for _, s := range subs[1:] {
		s.Close()
	}
	testkit.Eventually(t, 5*time.Second, "a to learn the smaller set", func() bool { return !a.Watching(devices[100]) })
	for _, d := range devices[:100] {
		if !a.Watching(d) {
			t.Fatalf("a forgot %s", d[60:])
		}
	}
}

// TestRelayLosses: what cannot reach another instance is told to its
// subscribers as skipped: a value too large for the bus, values past the
// forward queue.
func TestRelayLosses(t *testing.T) {
	hubs := newBusHubs(t, 2, Options{ForwardQueue: 10, ForwardDelay: 200 * time.Millisecond})
	a, b := hubs[0], hubs[1]
	s := subscribe(t, b, []string{"d1"}, nil)
	testkit.Eventually(t, 5*time.Second, "a to learn d1", func() bool { return a.Watching("d1") })

	big := tsdb.PropertyValue{Time: t0, ProductID: "p1", DeviceID: "d1", Property: "blob", ValueType: "string", Str: strings.Repeat("x", 9000)}
	a.Stored([]tsdb.PropertyValue{big, num("d1", "temp", 1)})
	got, skipped := takeUntil(t, s, 1, 5*time.Second)
	testkit.Eventually(t, 5*time.Second, "the skipped count", func() bool {
		_, k := s.Take(nil)
		skipped += k
		return skipped > 0
	})

	if len(got) != 1 || !strings.Contains(got[0], `"property":"temp"`) || skipped != 1 {
		t.Fatalf("after a value too large for the bus: %q, skipped %d; want temp, skipped 1", got, skipped)
	}

	// 25 values within the forward delay: 10 queued, 15 counted.
	for i := range 25 {
		a.Stored([]tsdb.PropertyValue{num("d1", "n", float64(i))})
	}
	got, skipped = nil, 0
	testkit.Eventually(t, 5*time.Second, "10 values and 15 skipped", func() bool {
		l, k := events(s)
		got, skipped = append(got, l...), skipped+k
		return len(got) >= 10 && skipped >= 15
	})

	if len(got) != 10 || skipped != 15 || !strings.Contains(got[0], `"value":0,`) {
		t.Fatalf("got %d events from %.60s, skipped %d; want the first 10, 15 skipped", len(got), got, skipped)
	}
}

// TestRelayExpiry: an instance that stops announcing without a bye (a
// crash) is forgotten after three heartbeats.
func TestRelayExpiry(t *testing.T) {
	hubs := newBusHubs(t, 2, Options{})
	a, b := hubs[0], hubs[1]
	subscribe(t, b, []string{"d1"}, nil)
	testkit.Eventually(t, 5*time.Second, "a to learn d1", func() bool { return a.Watching("d1") })
	now := time.Now()
	a.relay.expire(now.Add(2 * a.opt.Heartbeat))
	if !a.Watching("d1") {
		t.Fatal("forgotten within three heartbeats")
	}
	a.relay.expire(now.Add(3*a.opt.Heartbeat + time.Second))
	if a.Watching("d1") {
		t.Fatal("not forgotten after three heartbeats")
	}
	// A hello (a reconnecting instance's) makes b announce again.
	a.relay.sayHello()
	testkit.Eventually(t, 5*time.Second, "b to announce d1 again", func() bool { return a.Watching("d1") })
}
