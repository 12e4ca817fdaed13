package mqttconn_test

import (
	"context"
	"errors"
	"net"
	"syscall"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"devicehub/bench/testkit"
	"devicehub/ingest/mqttconn"
	"devicehub/ingest/mqtttest"
)

// The tests run against a private Mosquitto set up as the project's
// (.ci/mosquitto-setup: the plugin, the service login): they restart it,
// and a gateway login publishes the devices' messages.

func TestMain(m *testing.M) { testkit.MainNoLeaks(m) }

// receiver is a Config's OnMessage, handing the messages to a channel.
func receiver(cfg *mqttconn.Config) <-chan mqtt.Message {
	got := make(chan mqtt.Message, 16)
	cfg.OnMessage = func(_ mqtt.Client, m mqtt.Message) { got <- m }
	return got
}

func next(t *testing.T, got <-chan mqtt.Message, what string) mqtt.Message {
	t.Helper()
	select {
	case m := <-got:
		return m
	case <-time.After(10 * time.Second):
		t.Fatalf("no message: %s", what)
		return nil
	}
}

func dial(t *testing.T, cfg mqttconn.Config) (mqtt.Client, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, present, err := mqttconn.Dial(ctx, cfg)
	if err != nil {
		t.Fatalf("dial %s: %v", cfg.ClientID, err)
	}
	return c, present
}

// TestPersistentManualAck: a Persistent session keeps its subscription
// and what arrives while the client is away; with ManualAck a message not
// acknowledged is delivered again at the next connect, and one
// acknowledged is not. A clean session (Persistent false) is dropped. The
// ingest pipeline's and the alarm runner's at-least-once arguments stand
// on these.
func TestPersistentManualAck(t *testing.T) {
	b := mqtttest.StartBroker(t)
	dev := mqtttest.ConnectDevice(t, b.URL(), testkit.RandID("dev-"), mqtttest.Gateway(t, b.URL()))
	topic := "/" + testkit.RandID("p") + "/d1/properties/report"

	cfg := mqtttest.ServiceConfig(b.URL(), testkit.RandID("sub-"))
	cfg.Persistent, cfg.ManualAck, cfg.Resume = true, true, true
	got := receiver(&cfg)
	c, present := dial(t, cfg)
	if present {
		t.Fatal("a new client id has a session")
	}
	if err := mqttconn.WaitToken(c.Subscribe(topic, 1, nil), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	c.Disconnect(100)

	dev.MustPublish(t, topic, 1, "one") // while the subscriber is away
	c, present = dial(t, cfg)
	if !present {
		t.Fatal("the persistent session was not kept")
	}
	if m := next(t, got, "queued while away"); string(m.Payload()) != "one" {
		t.Fatalf("got %q", m.Payload())
	}
	c.Disconnect(100) // "one" not acknowledged

	c, _ = dial(t, cfg)
	m := next(t, got, "the unacknowledged message again")
	if string(m.Payload()) != "one" {
		t.Fatalf("got %q, want the unacknowledged one", m.Payload())
	}
	m.Ack()
	dev.MustPublish(t, topic, 1, "two")
	if m := next(t, got, "the next message"); string(m.Payload()) != "two" {
		t.Fatalf("got %q, want two", m.Payload())
	}
	c.Disconnect(100) // "two" not acknowledged

	// The next connection gets "two" again, and not "one", acknowledged.
	c, _ = dial(t, cfg)
	m = next(t, got, "the unacknowledged second message")
	if string(m.Payload()) != "two" {
		t.Fatalf("got %q after its ack, want two", m.Payload())
	}
	m.Ack()
	c.Disconnect(100)

	// A clean session ends the kept one: nothing is resumed after it.
	clean := cfg
	clean.Persistent = false
	c, present = dial(t, clean)
	if present {
		t.Fatal("a clean connect resumed the session")
	}
	c.Disconnect(100)
	c, present = dial(t, cfg)
	if present {
		t.Fatal("the session outlived a clean connect")
	}
	c.Disconnect(100)
}

// TestResume: a Resume client is back, and told (OnConnect), soon after
// the broker returns; one without Resume is told of the loss (OnLost) and
// stays disconnected.
func TestResume(t *testing.T) {
	b := mqtttest.StartBroker(t)
	connects, lost := make(chan struct{}, 4), make(chan struct{}, 4)
	res := mqtttest.ServiceConfig(b.URL(), testkit.RandID("res-"))
	res.Resume = true
	res.OnConnect = func(mqtt.Client) { connects <- struct{}{} }
	once := mqtttest.ServiceConfig(b.URL(), testkit.RandID("once-"))
	once.OnLost = func(mqtt.Client, error) { lost <- struct{}{} }
	r, _ := dial(t, res)
	defer r.Disconnect(0)
	o, _ := dial(t, once)
	defer o.Disconnect(0)
	<-connects

	b.Stop(syscall.SIGKILL)
	select {
	case <-lost:
	case <-time.After(10 * time.Second):
		t.Fatal("OnLost not called")
	}
	b.Start()
	select {
	case <-connects:
	case <-time.After(10 * time.Second):
		t.Fatal("the Resume client did not reconnect")
	}
	if !r.IsConnectionOpen() {
		t.Fatal("reconnected, yet not open")
	}
	if o.IsConnectionOpen() || o.IsConnected() {
		t.Fatal("the client without Resume reconnected")
	}
}

// TestLogin: the Config's login is the one the broker checks.
func TestLogin(t *testing.T) {
	b := mqtttest.StartBroker(t)
	cfg := mqtttest.ServiceConfig(b.URL(), testkit.RandID("login-"))
	c, _ := dial(t, cfg)
	c.Disconnect(0)
	cfg.Login.Password += "-wrong"
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, _, err := mqttconn.Dial(ctx, cfg); err == nil {
		t.Fatal("a wrong password was accepted")
	}
	cfg.Login = mqttconn.Login{}
	if _, _, err := mqttconn.Dial(ctx, cfg); err == nil {
		t.Fatal("an anonymous client was accepted")
	}
}

// TestConnectDeadlines: a broker that accepts the connection and never
// answers holds Connect only until the context ends, and Dial only for
// ConnectTimeout.
func TestConnectDeadlines(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held = append(held, c) // read nothing, answer nothing
		}
	}()
	url := "tcp://" + ln.Addr().String()

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, _, err = mqttconn.Dial(ctx, mqttconn.Config{Broker: url, ClientID: "mute-1", ConnectTimeout: time.Minute})
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 5*time.Second {
		t.Fatalf("Dial with an ending context: %v after %v", err, time.Since(start))
	}

	start = time.Now()
	_, _, err = mqttconn.Dial(context.Background(), mqttconn.Config{Broker: url, ClientID: "mute-2", ConnectTimeout: 300 * time.Millisecond})
	if err == nil || time.Since(start) > 5*time.Second {
		t.Fatalf("Dial with ConnectTimeout 300ms: %v after %v", err, time.Since(start))
	}
}
