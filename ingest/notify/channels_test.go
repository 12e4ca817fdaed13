package notify_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"devicehub/bench/testkit"
	"devicehub/ingest/mqtttest"
	"devicehub/ingest/notify"
	"devicehub/schema"
)

// smtpServer is Debian's aiosmtpd (.ci/services installs it) on a free
// port; its debugging handler prints each message it accepts.
type smtpServer struct {
	port int
	mu   sync.Mutex
	msgs []string
}

func startSMTP(t *testing.T) *smtpServer {
	t.Helper()
	py := "/usr/bin/python3"
	if err := exec.Command(py, "-c", "import aiosmtpd").Run(); err != nil {
		t.Fatal("aiosmtpd is not installed: .ci/services installs python3-aiosmtpd (make test runs it)")
	}
	s := &smtpServer{port: mqtttest.FreePort(t)}
	cmd := exec.Command(py, "-u", "-m", "aiosmtpd", "-n", "-l", "127.0.0.1:"+strconv.Itoa(s.port))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(out)
		var cur []string
		in := false
		for sc.Scan() {
			switch line := sc.Text(); {
			case strings.HasPrefix(line, "---------- MESSAGE FOLLOWS"):
				in, cur = true, nil
			case strings.HasPrefix(line, "------------ END MESSAGE"):
				in = false
				s.mu.Lock()
				s.msgs = append(s.msgs, strings.Join(cur, "\n"))
				s.mu.Unlock()
			case in:
				cur = append(cur, line)
			}
		}
		_, _ = io.Copy(io.Discard, out)
	}()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-done; _ = cmd.Wait() })
	// Up once it answers a test message of our own.
	c := notify.Channel{Kind: notify.KindEmail, Email: &notify.Email{Host: "127.0.0.1", Port: s.port, From: "probe@devicehub.test", To: []string{"probe@devicehub.test"}}}
	testkit.Eventually(t, 10*time.Second, "aiosmtpd up", func() bool {
		_, err := notify.Send(context.Background(), c, notify.SampleNotification())
		return err == nil
	})
	return s
}

func (s *smtpServer) messages() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.msgs...)
}

// An alarm's notification by e-mail reaches a real SMTP server, with its
// idempotency key; a channel asking for STARTTLS from a server that does
// not offer it fails rather than sending in clear.
func TestEmailChannel(t *testing.T) {
	srv := startSMTP(t)
	g := newRig(t)
	ctx := context.Background()
	c, err := g.store.SaveChannel(ctx, notify.Channel{Name: "ops mail", Email: &notify.Email{Host: "127.0.0.1", Port: srv.port,
		From: "devicehub@example.test", To: []string{"ops@example.test", "Night Shift <night@example.test>"}}}, "test", true)
	if err != nil {
		t.Fatal(err)
	}
	g.subscribe(t, notify.Subscription{Products: []string{"p1"}, Channels: []string{c.ID}})
	g.run(t, fast())
	before := len(srv.messages())
	g.alarms.raise("overheat", "meter-9", "p1", "critical")
	testkit.Eventually(t, 10*time.Second, "the e-mail", func() bool {
		return len(srv.messages()) == before+1 && g.outboxCount(t, "state = 'delivered'") == 1
	})
	var key string
	if err := g.ms.DB().Get(&key, `SELECT id::text FROM notify_outbox WHERE state = 'delivered'`); err != nil {
		t.Fatal(err)
	}
	m := srv.messages()[before]
	for _, want := range []string{"Subject: [devicehub] critical overheat on meter-9: raised", "Idempotency-Key: " + key,
		"To: ops@example.test, Night Shift <night@example.test>", "idempotency key " + key, "device meter-9 of product p1"} {
		if !strings.Contains(m, want) {
			t.Fatalf("message lacks %q:\n%s", want, m)
		}
	}

	tls := c
	tls.Email = &notify.Email{Host: "127.0.0.1", Port: srv.port, StartTLS: true, From: "devicehub@example.test", To: []string{"ops@example.test"}}
	if _, err := notify.Send(ctx, tls, notify.SampleNotification()); err == nil || !strings.Contains(err.Error(), "STARTTLS") {
		t.Fatalf("STARTTLS to a server without it: %v", err)
	}
	if n := len(srv.messages()); n != before+1 {
		t.Fatalf("%d messages after the refused STARTTLS", n-before)
	}
}

// An alarm's notification is published to a topic of another broker (a
// second Mosquitto) and arrives with its idempotency key.
func TestMQTTChannel(t *testing.T) {
	b := mqtttest.StartBroker(t)
	gw := mqtttest.Gateway(t, b.URL())
	login := mqtt.NewClientOptions()
	gw(login)
	const topic = "/notify-p/notify-d/event/alarm"
	sub, err := mqtttest.Dial(b.URL(), testkit.RandID("sub"), login.Username, login.Password, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Disconnect(0)
	got := make(chan []byte, 10)
	if tok := sub.Subscribe(topic, 1, func(_ mqtt.Client, m mqtt.Message) { got <- m.Payload() }); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	g := newRig(t)
	ctx := context.Background()
	c, err := g.store.SaveChannel(ctx, notify.Channel{Name: "other broker", Secret: login.Password,
		MQTT: &notify.MQTT{Broker: b.URL(), Topic: topic, QoS: 1, Username: login.Username}}, "test", true)
	if err != nil {
		t.Fatal(err)
	}
	g.subscribe(t, notify.Subscription{Products: []string{"p1"}, Channels: []string{c.ID}})
	g.run(t, fast())
	g.alarms.raise("r1", "d1", "p1", "warning")
	select {
	case p := <-got:
		var n notify.Notification
		if err := json.Unmarshal(p, &n); err != nil {
			t.Fatal(err)
		}
		var key string
		if err := g.ms.DB().Get(&key, `SELECT id::text FROM notify_outbox`); err != nil {
			t.Fatal(err)
		}
		if n.IdempotencyKey != key || n.Kind != "raised" || n.Alarm["deviceId"] != "d1" {
			t.Fatalf("published %s", p)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("nothing published")
	}
	// A wrong password is refused by that broker: the send fails.
	bad := c
	bad.Secret = "wrong"
	if _, err := notify.Send(ctx, bad, notify.SampleNotification()); err == nil {
		t.Fatal("published with a wrong password")
	}
}

// Channels and subscriptions that cannot work are refused when saved,
// the error naming the field.
func TestValidation(t *testing.T) {
	g := newRig(t)
	ctx := context.Background()
	hook := g.webhook(t, "http://127.0.0.1:9/x", "")
	ch := func(field string, c notify.Channel) {
		t.Helper()
		if c.Name == "" {
			c.Name = "c"
		}
		_, err := g.store.SaveChannel(ctx, c, "test", true)
		if !errors.Is(err, schema.ErrIllegalArgument) || !strings.HasPrefix(err.Error(), field+":") {
			t.Fatalf("%s: %v", field, err)
		}
	}
	ch("kind", notify.Channel{})
	ch("kind", notify.Channel{Webhook: &notify.Webhook{URL: "http://x"}, Email: &notify.Email{}})
	ch("webhook.url", notify.Channel{Webhook: &notify.Webhook{URL: "ftp://x"}})
	ch("webhook.method", notify.Channel{Webhook: &notify.Webhook{URL: "http://x", Method: "DELETE"}})
	ch("webhook.template", notify.Channel{Webhook: &notify.Webhook{URL: "http://x", Template: "{{.Alarm.nope}}"}})
	ch("webhook.template", notify.Channel{Webhook: &notify.Webhook{URL: "http://x", Template: "{{.Nope}}"}})
	ch("webhook.template", notify.Channel{Webhook: &notify.Webhook{URL: "http://x", Template: "{{"}})
	ch("webhook.headers", notify.Channel{Webhook: &notify.Webhook{URL: "http://x", Headers: map[string]string{"A": "b\r\nc: d"}}})
	ch("webhook.timeoutMs", notify.Channel{Webhook: &notify.Webhook{URL: "http://x", TimeoutMs: -1}})
	ch("email.host", notify.Channel{Email: &notify.Email{From: "a@b.c", To: []string{"a@b.c"}}})
	ch("email.from", notify.Channel{Email: &notify.Email{Host: "h", From: "nobody", To: []string{"a@b.c"}}})
	ch("email.to", notify.Channel{Email: &notify.Email{Host: "h", From: "a@b.c"}})
	ch("email.to[1]", notify.Channel{Email: &notify.Email{Host: "h", From: "a@b.c", To: []string{"a@b.c", "x"}}})
	ch("email.port", notify.Channel{Email: &notify.Email{Host: "h", Port: 70000, From: "a@b.c", To: []string{"a@b.c"}}})
	ch("mqtt.broker", notify.Channel{MQTT: &notify.MQTT{Broker: "http://x", Topic: "t"}})
	ch("mqtt.topic", notify.Channel{MQTT: &notify.MQTT{Broker: "tcp://x:1883", Topic: "a/#"}})
	ch("mqtt.qos", notify.Channel{MQTT: &notify.MQTT{Broker: "tcp://x:1883", Topic: "a", QoS: 3}})

	sub := func(field string, s notify.Subscription) {
		t.Helper()
		if s.Name == "" {
			s.Name = "s"
		}
		_, err := g.store.SaveSubscription(ctx, s, "test", true, nil)
		if !errors.Is(err, schema.ErrIllegalArgument) || !strings.HasPrefix(err.Error(), field+":") {
			t.Fatalf("%s: %v", field, err)
		}
	}
	ok := []string{hook.ID}
	sub("products", notify.Subscription{Channels: ok})
	sub("minSeverity", notify.Subscription{Products: []string{"p"}, Channels: ok, MinSeverity: "fatal"})
	sub("kinds[1]", notify.Subscription{Products: []string{"p"}, Channels: ok, Kinds: []string{"raised", "repeated"}})
	sub("channels", notify.Subscription{Products: []string{"p"}})
	sub("channels[0]", notify.Subscription{Products: []string{"p"}, Channels: []string{"missing"}})
	sub("escalateMs", notify.Subscription{Products: []string{"p"}, Channels: []string{hook.ID, hook.ID}})
	sub("escalateMs[1]", notify.Subscription{Products: []string{"p"}, Channels: []string{hook.ID, hook.ID, hook.ID}, EscalateMs: []int64{500, 500}})
	sub("remindMs", notify.Subscription{Products: []string{"p"}, Channels: ok, RemindMs: 10})
	sub("quietMs", notify.Subscription{Products: []string{"p"}, Channels: ok, QuietMs: -1})

	// A channel a subscription names is not deleted.
	g.subscribe(t, notify.Subscription{Products: []string{"p"}, Channels: ok})
	if err := g.store.DeleteChannel(ctx, hook.ID); !errors.Is(err, notify.ErrInUse) {
		t.Fatalf("delete a channel in use: %v", err)
	}
}
