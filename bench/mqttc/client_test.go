package mqttc

import (
	"context"
	"errors"
	"net"
	"net/url"
	"testing"
	"time"

	"devicehub/bench/testkit"
	"devicehub/ingest/mqtttest"
)

// sharedBroker is the tests' Mosquitto (make services) as host:port, with
// the service login; the test fails when nothing listens there.
func sharedBroker(t *testing.T) (addr, user, pass string) {
	t.Helper()
	u, err := url.Parse(mqtttest.SharedURL())
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.DialTimeout("tcp", u.Host, time.Second)
	if err != nil {
		t.Fatalf("no broker at %s (.ci/services starts it; make test runs it): %v", u.Host, err)
	}
	c.Close()
	user, pass = mqtttest.Service()
	return u.Host, user, pass
}

func randID(prefix string) string { return testkit.RandID(prefix) }

// TestAgainstMosquitto: a subscriber and a publisher of this package on
// the real broker: QoS 0 and 1 both ways, PUBACKs, a ping, a refused
// login, the last will on an abrupt close and none on DISCONNECT, and a
// second source address.
func TestAgainstMosquitto(t *testing.T) {
	addr, user, pass := sharedBroker(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The service login may publish what devicehub sends devices (downlinks).
	topic := "/" + randID("mqttcp") + "/d"
	got := make(chan Packet, 16)
	sub, err := Dial(ctx, Options{Addr: addr, Connect: Connect{ClientID: randID("mqttc-sub-"), Username: user, Password: pass, KeepAlive: 30, CleanSession: true},
		OnMessage: func(p Packet) {
			p.Payload = append([]byte(nil), p.Payload...)
			got <- p
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	if g, err := sub.Subscribe(ctx, topic+"/#", 1); err != nil || g != 1 {
		t.Fatalf("subscribe: granted %d, %v", g, err)
	}
	will := &Will{Topic: topic + "/function/invoke", Payload: []byte("gone"), QoS: 1}
	pub, err := Dial(ctx, Options{Addr: addr, LocalIP: net.IPv4(127, 0, 0, 2),
		Connect: Connect{ClientID: randID("mqttc-pub-"), Username: user, Password: pass, KeepAlive: 30, CleanSession: true, Will: will}})
	if err != nil {
		t.Fatal(err)
	}
	if ip := pub.LocalAddr().(*net.TCPAddr).IP; !ip.Equal(net.IPv4(127, 0, 0, 2)) {
		t.Errorf("source address %s, want 127.0.0.2", ip)
	}
	acked := make(chan error, 1)
	if err := pub.Publish(topic+"/properties/read", []byte("one"), 1, false, func(err error) { acked <- err }); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-acked:
		if err != nil {
			t.Fatalf("PUBACK: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("no PUBACK")
	}
	if err := pub.Publish(topic+"/properties/read", []byte("two"), 0, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := pub.Ping(); err != nil {
		t.Fatal(err)
	}
	expect := func(topic, payload string, qos byte) {
		t.Helper()
		select {
		case p := <-got:
			if p.Topic != topic || string(p.Payload) != payload || p.QoS() != qos {
				t.Errorf("received %s %q QoS %d, want %s %q QoS %d", p.Topic, p.Payload, p.QoS(), topic, payload, qos)
			}
		case <-ctx.Done():
			t.Fatalf("nothing received on %s", topic)
		}
	}
	expect(topic+"/properties/read", "one", 1)
	expect(topic+"/properties/read", "two", 0)
	// An abrupt close: the broker publishes the will.
	pub.Close()
	if err := pub.Publish(topic+"/properties/read", nil, 1, false, nil); !errors.Is(err, ErrClosed) {
		t.Errorf("publish after close: %v", err)
	}
	expect(topic+"/function/invoke", "gone", 1)
	// DISCONNECT: no will.
	pub2, err := Dial(ctx, Options{Addr: addr, Connect: Connect{ClientID: randID("mqttc-pub-"), Username: user, Password: pass, CleanSession: true, Will: will}})
	if err != nil {
		t.Fatal(err)
	}
	if err := pub2.Publish(topic+"/properties/read", []byte("three"), 1, false, nil); err != nil {
		t.Fatal(err)
	}
	expect(topic+"/properties/read", "three", 1)
	if err := pub2.Disconnect(); err != nil {
		t.Fatal(err)
	}
	// The subscriber's ping and a marker: no will came in between.
	if err := sub.Publish(topic+"/properties/read", []byte("m"), 1, false, nil); err != nil {
		t.Fatal(err)
	}
	expect(topic+"/properties/read", "m", 1)
	// A wrong password is refused at CONNECT.
	_, err = Dial(ctx, Options{Addr: addr, Connect: Connect{ClientID: randID("mqttc-bad-"), Username: user, Password: pass + "x", CleanSession: true}})
	var refused ConnackError
	if !errors.As(err, &refused) || (refused != 4 && refused != 5) {
		t.Errorf("wrong password: %v", err)
	}
}

// TestOutstandingFailOnClose: acknowledgements outstanding when the
// connection goes fail with its error, once each.
func TestOutstandingFailOnClose(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() { // a broker that accepts and never acknowledges
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, 1024)
		_, _ = c.Read(buf)
		_, _ = c.Write([]byte{0x20, 2, 0, 0})
		for {
			if _, err := c.Read(buf); err != nil {
				return
			}
		}
	}()
	c, err := Dial(context.Background(), Options{Addr: l.Addr().String(), Connect: Connect{ClientID: "x", CleanSession: true}})
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 3)
	for range 3 {
		if err := c.Publish("t", []byte("x"), 1, false, func(err error) { errs <- err }); err != nil {
			t.Fatal(err)
		}
	}
	if n := c.Pending(); n != 3 {
		t.Errorf("pending %d, want 3", n)
	}
	c.Close()
	for range 3 {
		if err := <-errs; !errors.Is(err, ErrClosed) {
			t.Errorf("outstanding ack: %v", err)
		}
	}
	if c.Pending() != 0 || !errors.Is(c.Err(), ErrClosed) {
		t.Errorf("after close: pending %d, err %v", c.Pending(), c.Err())
	}
}
