package devauth_test

// Tests of devicehub's Mosquitto plugin (ingest/devauth/mosquitto) from
// outside: a private broker per test with the project's configuration
// (.ci/mosquitto-setup builds and loads the plugin before the
// dynamic-security plugin), raw paho clients, the control protocol of
// doc.go by hand.

import (
	"crypto/md5"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"devicehub/bench/testkit"
	"devicehub/ingest/mqtttest"
)

const (
	plugControl  = "$CONTROL/devicehub-auth/v1"
	plugResponse = plugControl + "/response"
)

// plugResp is one response of the plugin.
type plugResp struct {
	Command         string          `json:"command"`
	Error           string          `json:"error"`
	CorrelationData string          `json:"correlationData"`
	Data            json.RawMessage `json:"data"`
}

// plugCtl is a control connection with the service login: one request at
// a time, each answered by the next response message.
type plugCtl struct {
	t       *testing.T
	c       mqtt.Client
	control string
	in      chan []byte
	seq     int
}

// plugDialCtl connects to the plugin's control topic.
func plugDialCtl(t *testing.T, b *mqtttest.Broker) *plugCtl {
	t.Helper()
	return plugDialControl(t, b, plugControl)
}

// plugDialDynsec connects to the dynamic-security plugin's control topic
// (the same protocol).
func plugDialDynsec(t *testing.T, b *mqtttest.Broker) *plugCtl {
	t.Helper()
	return plugDialControl(t, b, "$CONTROL/dynamic-security/v1")
}

func plugDialControl(t *testing.T, b *mqtttest.Broker, control string) *plugCtl {
	t.Helper()
	p := &plugCtl{t: t, control: control, in: make(chan []byte, 16)}
	o := mqtttest.ServiceOptions(b.URL(), fmt.Sprintf("ctl-%d", time.Now().UnixNano())).
		SetAutoReconnect(false).SetConnectTimeout(5 * time.Second)
	p.c = mqtt.NewClient(o)
	if tok := p.c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("control connection: %v", tok.Error())
	}
	response := control + "/response"
	tok := p.c.Subscribe(response, 1, func(_ mqtt.Client, m mqtt.Message) { p.in <- m.Payload() })
	if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe %s: %v", response, tok.Error())
	}
	if r := tok.(*mqtt.SubscribeToken).Result()[response]; r > 2 {
		t.Fatalf("subscribe %s refused (%#x)", response, r)
	}
	t.Cleanup(func() { p.c.Disconnect(0) })
	return p
}

// raw publishes payload on the control topic and returns the responses
// of the next response message.
func (p *plugCtl) raw(payload []byte) []plugResp {
	p.t.Helper()
	tok := p.c.Publish(p.control, 1, false, payload)
	if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		p.t.Fatalf("publish control: %v", tok.Error())
	}
	select {
	case m := <-p.in:
		var body struct {
			Responses []plugResp `json:"responses"`
		}
		if err := json.Unmarshal(m, &body); err != nil {
			p.t.Fatalf("response %q: %v", m, err)
		}
		return body.Responses
	case <-time.After(10 * time.Second):
		p.t.Fatal("no response from the plugin")
		return nil
	}
}

// do sends cmds (correlationData set) and checks one response per
// command, in order, each echoing command and correlation data.
func (p *plugCtl) do(cmds ...map[string]any) []plugResp {
	p.t.Helper()
	for _, c := range cmds {
		p.seq++
		c["correlationData"] = "c" + strconv.Itoa(p.seq)
	}
	payload, err := json.Marshal(map[string]any{"commands": cmds})
	if err != nil {
		p.t.Fatal(err)
	}
	rs := p.raw(payload)
	if len(rs) != len(cmds) {
		p.t.Fatalf("%d responses to %d commands: %+v", len(rs), len(cmds), rs)
	}
	for i, r := range rs {
		if r.Command != cmds[i]["command"] || r.CorrelationData != cmds[i]["correlationData"] {
			p.t.Fatalf("response %d %+v does not echo %v", i, r, cmds[i])
		}
	}
	return rs
}

// ok sends cmds and fails the test on any error response.
func (p *plugCtl) ok(cmds ...map[string]any) []plugResp {
	p.t.Helper()
	rs := p.do(cmds...)
	for i, r := range rs {
		if r.Error != "" {
			p.t.Fatalf("%v: %s", cmds[i], r.Error)
		}
	}
	return rs
}

// fails sends one command and returns its error, failing if there is none.
func (p *plugCtl) fails(cmd map[string]any) string {
	p.t.Helper()
	r := p.do(cmd)[0]
	if r.Error == "" {
		p.t.Fatalf("%v: no error", cmd)
	}
	return r.Error
}

func (p *plugCtl) stats() map[string]any {
	p.t.Helper()
	var s map[string]any
	if err := json.Unmarshal(p.ok(map[string]any{"command": "getStats"})[0].Data, &s); err != nil {
		p.t.Fatal(err)
	}
	return s
}

// plugDev is a device login.
type plugDev struct{ id, product, user, key string }

func (d plugDev) set() map[string]any {
	return map[string]any{"command": "setDevice", "id": d.id, "product": d.product, "username": d.user, "key": d.key}
}

func (d plugDev) prefix() string { return "/" + d.product + "/" + d.id + "/" }

// plugConnect connects once, without retry; lost, if not nil, is closed
// when the broker drops the connection.
func plugConnect(t *testing.T, b *mqtttest.Broker, clientID, user, pass string, lost chan struct{}) (mqtt.Client, error) {
	t.Helper()
	c, err := mqtttest.Dial(b.URL(), clientID, user, pass, lost)
	if err == nil {
		t.Cleanup(func() { c.Disconnect(0) })
	}
	return c, err
}

func plugMustConnect(t *testing.T, b *mqtttest.Broker, d plugDev, lost chan struct{}) mqtt.Client {
	t.Helper()
	c, err := plugConnect(t, b, d.id, d.user, d.key, lost)
	if err != nil {
		t.Fatalf("device %s refused: %v", d.id, err)
	}
	return c
}

func plugRefused(t *testing.T, b *mqtttest.Broker, clientID, user, pass, why string) {
	t.Helper()
	if c, err := plugConnect(t, b, clientID, user, pass, nil); err == nil {
		c.Disconnect(0)
		t.Errorf("%s: admitted", why)
	}
}

// plugKicked waits for a live session's end after the response that
// changed its login arrived.
func plugKicked(t *testing.T, lost chan struct{}, what string) {
	t.Helper()
	select {
	case <-lost:
	case <-time.After(2 * time.Second):
		t.Errorf("%s: the device's session is still up 2 s after the response", what)
	}
}

func plugNotKicked(t *testing.T, lost chan struct{}, what string) {
	t.Helper()
	select {
	case <-lost:
		t.Errorf("%s: the device's session was cut", what)
	case <-time.After(300 * time.Millisecond):
	}
}

func signedLogin(user, key string, at time.Time) (username, password string) {
	ms := strconv.FormatInt(at.UnixMilli(), 10)
	sum := md5.Sum([]byte(user + "|" + ms + "|" + key))
	return user + "|" + ms, hex.EncodeToString(sum[:])
}

func TestPluginLogin(t *testing.T) {
	t.Parallel()
	b := mqtttest.StartBroker(t)
	ctl := plugDialCtl(t, b)
	d := plugDev{"dev-1", "prod", "secure-1", "0123456789abcdef0123456789abcdef"}
	ctl.ok(d.set())

	t.Run("own login", func(t *testing.T) { plugMustConnect(t, b, d, nil) })
	t.Run("wrong key", func(t *testing.T) { plugRefused(t, b, d.id, d.user, d.key+"x", "wrong key") })
	t.Run("key prefix", func(t *testing.T) { plugRefused(t, b, d.id, d.user, d.key[:31], "a prefix of the key") })
	t.Run("no password", func(t *testing.T) { plugRefused(t, b, d.id, d.user, "", "no password") })
	t.Run("wrong client id", func(t *testing.T) { plugRefused(t, b, "dev-2", d.user, d.key, "another client id") })
	t.Run("unknown username", func(t *testing.T) { plugRefused(t, b, d.id, "nobody", d.key, "unknown username") })
	t.Run("service login", func(t *testing.T) {
		// dynsec's logins still work: the plugin defers them.
		u, p := mqtttest.Service()
		if _, err := plugConnect(t, b, "svc-login", u, p, nil); err != nil {
			t.Fatalf("service login refused: %v", err)
		}
		plugRefused(t, b, "svc-login-2", u, p+"x", "service login with a wrong password")
	})
	t.Run("dynsec gateway login", func(t *testing.T) {
		// Any other dynsec login too, with dynsec's rights.
		gw := mqtt.NewClientOptions()
		mqtttest.Gateway(t, b.URL())(gw)
		c, err := plugConnect(t, b, "gw-1", gw.Username, gw.Password, nil)
		if err != nil {
			t.Fatalf("gateway login refused: %v", err)
		}
		tok := c.Publish("/prod/dev-9/properties/report", 1, false, "{}")
		if !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
			t.Fatalf("gateway publish: %v", tok.Error())
		}
	})
	t.Run("signed", func(t *testing.T) {
		u, p := signedLogin(d.user, d.key, time.Now())
		if _, err := plugConnect(t, b, d.id, u, p, nil); err != nil {
			t.Fatalf("signed login refused: %v", err)
		}
	})
	t.Run("signed uppercase", func(t *testing.T) {
		u, p := signedLogin(d.user, d.key, time.Now().Add(time.Second))
		if _, err := plugConnect(t, b, d.id, u, strings.ToUpper(p), nil); err != nil {
			t.Fatalf("signed login (uppercase hex) refused: %v", err)
		}
	})
	t.Run("signed outside the window", func(t *testing.T) {
		// The window is signed_skew, 60 s by default.
		u, p := signedLogin(d.user, d.key, time.Now().Add(-61*time.Second))
		plugRefused(t, b, d.id, u, p, "signed 61 s ago")
		u, p = signedLogin(d.user, d.key, time.Now().Add(61*time.Second))
		plugRefused(t, b, d.id, u, p, "signed 61 s ahead")
	})
	t.Run("signed replay", func(t *testing.T) {
		// A signature is used once: a time not newer than the last one
		// admitted for the device is refused, even within the window.
		r := plugDev{"dev-replay", "prod", "secure-replay", "replay-key-0123456789"}
		ctl.ok(r.set())
		at := time.Now().Add(5 * time.Second)
		u, p := signedLogin(r.user, r.key, at)
		if _, err := plugConnect(t, b, r.id, u, p, nil); err != nil {
			t.Fatalf("signed login refused: %v", err)
		}
		plugRefused(t, b, r.id, u, p, "the same signed login again")
		u, p = signedLogin(r.user, r.key, at.Add(-time.Second))
		plugRefused(t, b, r.id, u, p, "an older signed login after a newer one")
		u, p = signedLogin(r.user, r.key, at.Add(time.Millisecond))
		if _, err := plugConnect(t, b, r.id, u, p, nil); err != nil {
			t.Fatalf("a newer signed login refused: %v", err)
		}
	})
	t.Run("signed leading zero", func(t *testing.T) {
		// One time, one spelling: "0" + ms signs the same instant anew.
		ms := "0" + strconv.FormatInt(time.Now().Add(10*time.Second).UnixMilli(), 10)
		sum := md5.Sum([]byte(d.user + "|" + ms + "|" + d.key))
		plugRefused(t, b, d.id, d.user+"|"+ms, hex.EncodeToString(sum[:]), "signed with a leading zero")
		for _, sign := range []string{"+", "-", " "} {
			ms := sign + strconv.FormatInt(time.Now().Add(10*time.Second).UnixMilli(), 10)
			sum := md5.Sum([]byte(d.user + "|" + ms + "|" + d.key))
			plugRefused(t, b, d.id, d.user+"|"+ms, hex.EncodeToString(sum[:]), "signed with "+strconv.Quote(sign))
		}
	})
	t.Run("signed bad md5", func(t *testing.T) {
		u, p := signedLogin(d.user, d.key+"x", time.Now())
		plugRefused(t, b, d.id, u, p, "signed with another key")
		u, _ = signedLogin(d.user, d.key, time.Now())
		plugRefused(t, b, d.id, u, d.key, "signed form with the plain key")
	})
	t.Run("signed wrong client id", func(t *testing.T) {
		u, p := signedLogin(d.user, d.key, time.Now())
		plugRefused(t, b, "dev-2", u, p, "signed login with another client id")
	})
	t.Run("signed not digits", func(t *testing.T) {
		ms := strconv.FormatInt(time.Now().UnixMilli(), 10) + "x"
		sum := md5.Sum([]byte(d.user + "|" + ms + "|" + d.key))
		plugRefused(t, b, d.id, d.user+"|"+ms, hex.EncodeToString(sum[:]), "signed with a time that is not digits")
	})
}

// plugSub collects what a service-login subscriber receives on filter.
type plugSub struct {
	mu  sync.Mutex
	got []string // topics, in order
	ch  chan string
}

func plugSubscribe(t *testing.T, b *mqtttest.Broker, filter string) *plugSub {
	t.Helper()
	s := &plugSub{ch: make(chan string, 100)}
	c := mqtt.NewClient(mqtttest.ServiceOptions(b.URL(), fmt.Sprintf("sub-%d", time.Now().UnixNano())).
		SetAutoReconnect(false))
	if tok := c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("subscriber: %v", tok.Error())
	}
	t.Cleanup(func() { c.Disconnect(0) })
	tok := c.Subscribe(filter, 1, func(_ mqtt.Client, m mqtt.Message) {
		s.mu.Lock()
		s.got = append(s.got, m.Topic())
		s.mu.Unlock()
		s.ch <- m.Topic()
	})
	if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	return s
}

// until waits for topic and returns everything received up to it.
func (s *plugSub) until(t *testing.T, topic string) []string {
	t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		select {
		case got := <-s.ch:
			if got == topic {
				s.mu.Lock()
				defer s.mu.Unlock()
				out := s.got
				s.got = nil
				return out
			}
		case <-deadline:
			t.Fatalf("%s never arrived", topic)
		}
	}
}

func plugPublish(t *testing.T, c mqtt.Client, topic string, retained bool) {
	t.Helper()
	tok := c.Publish(topic, 1, retained, `{"properties":{}}`)
	if !tok.WaitTimeout(5 * time.Second) {
		t.Fatalf("publish %s timed out", topic)
	}
}

func plugSubResult(t *testing.T, c mqtt.Client, filter string) byte {
	t.Helper()
	tok := c.Subscribe(filter, 1, func(mqtt.Client, mqtt.Message) {})
	if !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe %s: %v", filter, tok.Error())
	}
	// paho keys a shared subscription's result by the filter without its
	// $share/<group>/ prefix: take the one result there is.
	for _, r := range tok.(*mqtt.SubscribeToken).Result() {
		return r
	}
	t.Fatalf("subscribe %s: no result", filter)
	return 0
}

func TestPluginTopicRights(t *testing.T) {
	t.Parallel()
	b := mqtttest.StartBroker(t)
	ctl := plugDialCtl(t, b)
	d := plugDev{"dev-a", "prod", "user-a", "key-a"}
	other := plugDev{"dev-b", "prod", "user-b", "key-b"}
	ctl.ok(d.set(), other.set())
	// dynsec holds a login with the device's username and every right (as
	// while devices move over from dynsec): the plugin refuses what is not
	// the device's rather than defer, so these rights never apply.
	plugDialDynsec(t, b).ok(
		map[string]any{"command": "createRole", "rolename": "wide", "acls": []map[string]any{
			{"acltype": "publishClientSend", "topic": "#", "allow": true},
			{"acltype": "publishClientReceive", "topic": "#", "allow": true},
			{"acltype": "subscribePattern", "topic": "#", "allow": true}}},
		map[string]any{"command": "createClient", "username": d.user, "password": "dynsec-password",
			"roles": []map[string]any{{"rolename": "wide"}}})
	plugRefused(t, b, d.id, d.user, "dynsec-password", "the dynsec password of a device's username")
	sub := plugSubscribe(t, b, "/prod/#")

	t.Run("own uplinks", func(t *testing.T) {
		c := plugMustConnect(t, b, d, nil)
		var want []string
		for _, s := range []string{"properties/report", "online", "offline", "properties/read/reply",
			"function/invoke/reply", "properties/write/reply", "shadow/get", "firmware/progress", "firmware/version", "event/alarm"} {
			plugPublish(t, c, d.prefix()+s, false)
			want = append(want, d.prefix()+s)
		}
		if got := sub.until(t, d.prefix()+"event/alarm"); strings.Join(got, " ") != strings.Join(want, " ") {
			t.Errorf("delivered %v, want %v", got, want)
		}
	})
	// A refused publish is not delivered (and Mosquitto 2.0.11 drops an
	// MQTT 3.1.1 client that sends one). The device then publishes a
	// marker: the subscriber gets what the broker took from the device
	// in order, so the marker alone means the refused one was dropped.
	refused := func(t *testing.T, topic string, retained bool) {
		t.Helper()
		lost := make(chan struct{})
		c := plugMustConnect(t, b, d, lost)
		plugPublish(t, c, topic, retained)
		select {
		case <-lost:
		case <-time.After(200 * time.Millisecond):
		}
		c = plugMustConnect(t, b, d, nil)
		marker := d.prefix() + "event/marker"
		plugPublish(t, c, marker, false)
		if got := sub.until(t, marker); len(got) != 1 {
			t.Errorf("%s (retained %t) was delivered: %v", topic, retained, got)
		}
	}
	t.Run("another device's topic", func(t *testing.T) { refused(t, other.prefix()+"properties/report", false) })
	t.Run("another product", func(t *testing.T) { refused(t, "/other/dev-a/properties/report", false) })
	t.Run("retained", func(t *testing.T) { refused(t, d.prefix()+"properties/report", true) })
	t.Run("event depth", func(t *testing.T) {
		refused(t, d.prefix()+"event/alarm/deeper", false)
		refused(t, d.prefix()+"event/", false)
	})
	t.Run("not an uplink", func(t *testing.T) {
		refused(t, d.prefix()+"properties/read", false) // a downlink
		refused(t, d.prefix()+"anything", false)
		refused(t, "/prod/dev-a", false)
	})
	c := plugMustConnect(t, b, d, nil)
	t.Run("subscribe", func(t *testing.T) {
		for _, f := range []string{other.prefix() + "#", "/prod/+/properties/read", "#", "/prod/#",
			"$share/g/" + other.prefix() + "#", "$share/g/#", plugResponse} {
			if r := plugSubResult(t, c, f); r != 0x80 {
				t.Errorf("subscription to %s granted (%#x)", f, r)
			}
		}
		if r := plugSubResult(t, c, d.prefix()+"#"); r > 2 {
			t.Errorf("subscription to its own prefix refused (%#x)", r)
		}
		// Its own uplinks: a device that took them could fill the
		// broker's queues with its own messages.
		for _, up := range []string{"properties/report", "online", "offline", "properties/read/reply",
			"function/invoke/reply", "event/alarm"} {
			if r := plugSubResult(t, c, d.prefix()+up); r != 0x80 {
				t.Errorf("subscription to its own uplink %s granted (%#x)", up, r)
			}
		}
		for _, down := range []string{"properties/read", "properties/write", "function/invoke"} {
			if r := plugSubResult(t, c, d.prefix()+down); r > 2 {
				t.Errorf("subscription to its downlink %s refused (%#x)", down, r)
			}
		}
	})
	t.Run("downlink delivered", func(t *testing.T) {
		got := make(chan string, 10)
		tok := c.Subscribe(d.prefix()+"properties/read", 1, func(_ mqtt.Client, m mqtt.Message) { got <- m.Topic() })
		if !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
			t.Fatal(tok.Error())
		}
		svc := mqtt.NewClient(mqtttest.ServiceOptions(b.URL(), "svc-down").SetAutoReconnect(false))
		if tok := svc.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
			t.Fatal(tok.Error())
		}
		defer svc.Disconnect(0)
		plugPublish(t, svc, d.prefix()+"properties/read", false)
		select {
		case <-got:
		case <-time.After(5 * time.Second):
			t.Error("the device did not get its downlink")
		}
	})
	t.Run("own uplinks not delivered", func(t *testing.T) {
		// Subscribed to its whole prefix, a device receives its downlinks
		// and never its own uplinks (each delivery is checked).
		got := make(chan string, 100)
		dc := plugMustConnect(t, b, d, nil)
		tok := dc.Subscribe(d.prefix()+"#", 1, func(_ mqtt.Client, m mqtt.Message) { got <- m.Topic() })
		if !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
			t.Fatal(tok.Error())
		}
		plugPublish(t, dc, d.prefix()+"properties/report", false)
		plugPublish(t, dc, d.prefix()+"event/alarm", false)
		svc := mqtt.NewClient(mqtttest.ServiceOptions(b.URL(), "svc-down-2").SetAutoReconnect(false))
		if tok := svc.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
			t.Fatal(tok.Error())
		}
		defer svc.Disconnect(0)
		plugPublish(t, svc, d.prefix()+"function/invoke", false)
		select {
		case topic := <-got:
			if topic != d.prefix()+"function/invoke" {
				t.Errorf("the device received %s, its own uplink", topic)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("the device did not get its downlink")
		}
	})
	t.Run("control topic", func(t *testing.T) {
		// A device's command to the plugin is not carried out. The broker
		// handles a client's packets in order: once it has dropped the
		// device for the refused publish (Mosquitto 2.0.11 drops an MQTT
		// 3.1.1 client that sends one), or the marker the device publishes
		// behind the command has reached the subscriber, the command has
		// been dealt with.
		lost := make(chan struct{})
		dc := plugMustConnect(t, b, d, lost)
		dc.Publish(plugControl, 1, false, `{"commands":[{"command":"deleteDevice","id":"dev-b"}]}`)
		marker := d.prefix() + "event/control-marker"
		dc.Publish(marker, 1, false, `{"properties":{}}`)
		deadline := time.After(5 * time.Second)
	wait:
		for {
			select {
			case <-lost:
				break wait
			case got := <-sub.ch:
				if got == marker {
					break wait
				}
			case <-deadline:
				t.Fatal("the device was neither dropped nor did its marker arrive")
			}
		}
		if r := ctl.do(map[string]any{"command": "getDevice", "id": "dev-b"})[0]; r.Error != "" {
			t.Errorf("dev-b after a device's deleteDevice: %s", r.Error)
		}
	})
}

func TestPluginKicks(t *testing.T) {
	t.Parallel()
	b := mqtttest.StartBroker(t)
	ctl := plugDialCtl(t, b)

	live := func(t *testing.T, d plugDev) chan struct{} {
		t.Helper()
		ctl.ok(d.set())
		lost := make(chan struct{})
		plugMustConnect(t, b, d, lost)
		return lost
	}
	t.Run("unchanged", func(t *testing.T) {
		d := plugDev{"k-same", "prod", "u-same", "key"}
		lost := live(t, d)
		ctl.ok(d.set())
		plugNotKicked(t, lost, "setDevice with the same login")
	})
	t.Run("deleteDevice", func(t *testing.T) {
		d := plugDev{"k-del", "prod", "u-del", "key"}
		lost := live(t, d)
		ctl.ok(map[string]any{"command": "deleteDevice", "id": d.id})
		plugKicked(t, lost, "deleteDevice")
		plugRefused(t, b, d.id, d.user, d.key, "deleted device")
		ctl.ok(map[string]any{"command": "deleteDevice", "id": d.id}) // unknown: success
	})
	t.Run("key", func(t *testing.T) {
		d := plugDev{"k-key", "prod", "u-key", "key"}
		lost := live(t, d)
		d.key = "new-key"
		ctl.ok(d.set())
		plugKicked(t, lost, "key change")
		plugRefused(t, b, d.id, d.user, "key", "the old key")
		plugMustConnect(t, b, d, nil)
	})
	t.Run("username", func(t *testing.T) {
		d := plugDev{"k-user", "prod", "u-user", "key"}
		lost := live(t, d)
		old := d.user
		d.user = "u-user-2"
		ctl.ok(d.set())
		plugKicked(t, lost, "username change")
		plugRefused(t, b, d.id, old, d.key, "the old username")
		plugMustConnect(t, b, d, nil)
		// The old username is free for another device.
		ctl.ok(plugDev{"k-user-b", "prod", old, "key"}.set())
	})
	t.Run("username taken over", func(t *testing.T) {
		// devicehub's database keeps usernames unique: a device that
		// holds another's username here has a stale login (its own
		// change is on its way), which goes at once.
		holder := plugDev{"k-holder", "prod", "u-taken", "key"}
		lost := live(t, holder)
		d := plugDev{"k-taker", "prod", "u-taken", "key2"}
		ctl.ok(d.set())
		plugKicked(t, lost, "username given to another device")
		plugRefused(t, b, holder.id, holder.user, holder.key, "the stale holder")
		if e := ctl.fails(map[string]any{"command": "getDevice", "id": holder.id}); e == "" {
			t.Error("the stale holder is still held")
		}
		plugMustConnect(t, b, d, nil)
	})
	t.Run("product", func(t *testing.T) {
		d := plugDev{"k-prod", "prod", "u-prod", "key"}
		lost := live(t, d)
		d.product = "prod2"
		ctl.ok(d.set())
		plugKicked(t, lost, "product change")
		c := plugMustConnect(t, b, d, nil)
		if r := plugSubResult(t, c, "/prod/k-prod/#"); r != 0x80 {
			t.Errorf("subscription below the old product granted (%#x)", r)
		}
		if r := plugSubResult(t, c, "/prod2/k-prod/#"); r > 2 {
			t.Errorf("subscription below the new product refused (%#x)", r)
		}
	})
	t.Run("endSync", func(t *testing.T) {
		stale := plugDev{"k-stale", "prod", "u-stale", "key"}
		kept := plugDev{"k-kept", "prod", "u-kept", "key"}
		staleLost, keptLost := live(t, stale), live(t, kept)
		gen := time.Now().UnixMilli()
		ctl.ok(map[string]any{"command": "beginSync", "generation": gen}, kept.set())
		if e := ctl.fails(map[string]any{"command": "endSync", "generation": gen - 1}); !strings.Contains(e, "current") {
			t.Errorf("endSync of another generation: %q", e)
		}
		rs := ctl.ok(map[string]any{"command": "endSync", "generation": gen})
		var data struct{ Removed int }
		if err := json.Unmarshal(rs[0].Data, &data); err != nil {
			t.Fatal(err)
		}
		// Every device the other subtests set is gone too, kept is not.
		if st := ctl.stats(); data.Removed < 1 || st["devices"] != 1.0 || st["generation"] != float64(gen) {
			t.Errorf("endSync removed %d, stats %v", data.Removed, st)
		}
		plugKicked(t, staleLost, "endSync of an unstamped device")
		plugNotKicked(t, keptLost, "endSync of a stamped device")
		plugRefused(t, b, stale.id, stale.user, stale.key, "device removed by endSync")
		if r := ctl.do(map[string]any{"command": "getDevice", "id": kept.id})[0]; r.Error != "" ||
			!strings.Contains(string(r.Data), `"generation":`+strconv.FormatInt(gen, 10)) || strings.Contains(string(r.Data), "key") {
			t.Errorf("getDevice %s: %+v", kept.id, r)
		}
	})
}

func TestPluginControlErrors(t *testing.T) {
	t.Parallel()
	b := mqtttest.StartBroker(t)
	ctl := plugDialCtl(t, b)
	d := plugDev{"e-1", "prod", "u-1", "key"}
	ctl.ok(d.set())

	for _, payload := range []string{`{"commands":`, `not json`, `{"commands":{}}`, `[]`, `{}`} {
		rs := ctl.raw([]byte(payload))
		if len(rs) != 1 || rs[0].Error == "" {
			t.Errorf("%s: %+v", payload, rs)
		}
	}
	if rs := ctl.raw([]byte(`{"commands":[{"command":"setDevice","id":"e-1","product":"p\u0000x","username":"u-1","key":"k"}]}`)); len(rs) != 1 || rs[0].Error == "" {
		t.Errorf("an escaped NUL: %+v", rs)
	}
	if rs := ctl.raw([]byte(`{"commands":[5, {"correlationData":"x"}]}`)); len(rs) != 2 || rs[0].Error == "" || rs[1].Error == "" {
		t.Errorf("commands that are not commands: %+v", rs)
	}
	if e := ctl.fails(map[string]any{"command": "dropEverything"}); e == "" {
		t.Error("unknown command accepted")
	}
	svc, _ := mqtttest.Service()
	long := strings.Repeat("x", 257)
	for name, cmd := range map[string]map[string]any{
		"missing id":         {"command": "setDevice", "product": "p", "username": "u", "key": "k"},
		"missing key":        {"command": "setDevice", "id": "i", "product": "p", "username": "u"},
		"number id":          {"command": "setDevice", "id": 5, "product": "p", "username": "u", "key": "k"},
		"empty id":           {"command": "setDevice", "id": "", "product": "p", "username": "u", "key": "k"},
		"empty key":          {"command": "setDevice", "id": "i", "product": "p", "username": "u", "key": ""},
		"long username":      {"command": "setDevice", "id": "i", "product": "p", "username": long, "key": "k"},
		"long key":           {"command": "setDevice", "id": "i", "product": "p", "username": "u", "key": long},
		"control char":       {"command": "setDevice", "id": "i", "product": "p", "username": "u\n", "key": "k"},
		"tab in key":         {"command": "setDevice", "id": "i", "product": "p", "username": "u", "key": "a\tb"},
		"slash in id":        {"command": "setDevice", "id": "a/b", "product": "p", "username": "u", "key": "k"},
		"plus in id":         {"command": "setDevice", "id": "a+", "product": "p", "username": "u", "key": "k"},
		"hash in product":    {"command": "setDevice", "id": "i", "product": "#", "username": "u", "key": "k"},
		"slash in product":   {"command": "setDevice", "id": "i", "product": "a/b", "username": "u", "key": "k"},
		"service username":   {"command": "setDevice", "id": "i", "product": "p", "username": svc, "key": "k"},
		"bad generation":     {"command": "beginSync", "generation": "1"},
		"fraction":           {"command": "beginSync", "generation": 1.5},
		"negative":           {"command": "beginSync", "generation": -1},
		"getDevice unknown":  {"command": "getDevice", "id": "nope"},
		"deleteDevice no id": {"command": "deleteDevice"},
	} {
		if e := ctl.fails(cmd); e == "" {
			t.Errorf("%s accepted", name)
		}
	}
	// Nothing changed.
	if st := ctl.stats(); st["devices"] != 1.0 || st["generation"] != 0.0 {
		t.Errorf("stats after refused commands: %v", st)
	}
	plugMustConnect(t, b, d, nil)

	t.Run("10 MB", func(t *testing.T) {
		// Over max_packet_size: the broker drops the sender before it
		// allocates the packet, and goes on answering.
		lost := make(chan struct{})
		u, p := mqtttest.Service()
		c, err := plugConnect(t, b, "big-sender", u, p, lost)
		if err != nil {
			t.Fatal(err)
		}
		c.Publish(plugControl, 1, false, make([]byte, 10<<20))
		plugKicked(t, lost, "a 10 MB publish")
		if st := ctl.stats(); st["devices"] != 1.0 {
			t.Errorf("stats after a 10 MB message: %v", st)
		}
	})
}

// TestPluginOversizeControl: past a larger max_packet_size, the plugin's
// own limit (1 MiB) answers with an error and changes nothing.
func TestPluginOversizeControl(t *testing.T) {
	t.Parallel()
	b := mqtttest.StartBroker(t, "max_packet_size 20000000")
	ctl := plugDialCtl(t, b)
	big := `{"commands":[{"command":"setDevice","id":"big","product":"p","username":"u","key":"` +
		strings.Repeat("k", 10<<20) + `"}]}`
	rs := ctl.raw([]byte(big))
	if len(rs) != 1 || !strings.Contains(rs[0].Error, "1 MiB") {
		t.Errorf("a 10 MB control message: %+v", rs)
	}
	if st := ctl.stats(); st["devices"] != 0.0 {
		t.Errorf("stats after a 10 MB message: %v", st)
	}
}

func TestPluginSnapshot(t *testing.T) {
	t.Parallel()
	t.Run("shutdown", func(t *testing.T) {
		t.Parallel()
		b := mqtttest.StartBroker(t)
		ctl := plugDialCtl(t, b)
		d := plugDev{"s-1", "prod", "u-1", "key-1"}
		gone := plugDev{"s-2", "prod", "u-2", "key-2"}
		ctl.ok(map[string]any{"command": "beginSync", "generation": 7}, d.set(), gone.set(),
			map[string]any{"command": "deleteDevice", "id": gone.id})
		// A signed login made before the restart, not replayable after it
		// (the device's last signed login is not in the snapshot).
		su, sp := signedLogin(d.user, d.key, time.Now())
		if _, err := plugConnect(t, b, d.id, su, sp, nil); err != nil {
			t.Fatalf("signed login refused: %v", err)
		}
		b.Stop(syscall.SIGTERM)
		if fi, err := os.Stat(b.AuthSnapshot()); err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("snapshot after shutdown: %v %v", fi, err)
		}
		b.Start()
		plugMustConnect(t, b, d, nil)
		plugRefused(t, b, d.id, su, sp, "a signed login replayed after a restart")
		fu, fp := signedLogin(d.user, d.key, time.Now().Add(time.Second))
		if _, err := plugConnect(t, b, d.id, fu, fp, nil); err != nil {
			t.Errorf("a fresh signed login refused after a restart: %v", err)
		}
		plugRefused(t, b, d.id, d.user, "wrong", "wrong key after a restart")
		plugRefused(t, b, gone.id, gone.user, gone.key, "deleted device after a restart")
		if st := plugDialCtl(t, b).stats(); st["devices"] != 1.0 || st["generation"] != 7.0 {
			t.Errorf("stats after a restart: %v", st)
		}
	})
	t.Run("periodic", func(t *testing.T) {
		t.Parallel()
		b := mqtttest.StartBroker(t)
		b.Stop(syscall.SIGTERM)
		b.AuthOption("snapshot_interval", "1")
		b.Start()
		ctl := plugDialCtl(t, b)
		d := plugDev{"s-1", "prod", "u-1", "key-1"}
		ctl.ok(d.set())
		var snap map[string]any
		if !testkit.Within(5*time.Second, func() bool {
			snap, _ = ctl.stats()["snapshot"].(map[string]any)
			return snap["dirty"] == false && snap["saving"] == false && snap["lastSaveDevices"] == 1.0
		}) {
			t.Fatalf("no snapshot within 5 s: %v", snap)
		}
		if !strings.Contains(b.Log(), "snapshot saved in the background") {
			t.Error("the snapshot was not written by the background writer")
		}
		b.Stop(syscall.SIGKILL)
		// What a writer killed mid-save leaves is removed at the start.
		stale := b.AuthSnapshot() + ".tmp.99999"
		if err := os.WriteFile(stale, []byte("half a snapshot"), 0o600); err != nil {
			t.Fatal(err)
		}
		b.Start()
		plugMustConnect(t, b, d, nil)
		if _, err := os.Stat(stale); !os.IsNotExist(err) {
			t.Errorf("%s is still there: %v", stale, err)
		}
	})
	t.Run("installations", func(t *testing.T) {
		// Each login keeps its installation and each installation its
		// generation, count and digest across a restart.
		t.Parallel()
		b := mqtttest.StartBroker(t)
		ctl := plugDialCtl(t, b)
		d := plugDev{"s-1", "prod", "u-1", "key-1"}
		set := d.set()
		set["installation"] = "inst-a"
		ctl.ok(map[string]any{"command": "beginSync", "generation": 9, "installation": "inst-a"}, set,
			plugDev{"s-2", "prod", "u-2", "key-2"}.set())
		before, _ := json.Marshal(ctl.stats()["installations"])
		b.Stop(syscall.SIGTERM)
		b.Start()
		ctl = plugDialCtl(t, b)
		after, _ := json.Marshal(ctl.stats()["installations"])
		if string(before) != string(after) || !strings.Contains(string(after), `"inst-a":{"devices":1,`) || !strings.Contains(string(after), `"generation":9}`) {
			t.Errorf("installations before a restart %s, after %s", before, after)
		}
		if r := ctl.ok(map[string]any{"command": "getDevice", "id": d.id})[0]; !strings.Contains(string(r.Data), `"installation":"inst-a"`) {
			t.Errorf("getDevice after a restart: %s", r.Data)
		}
		plugMustConnect(t, b, d, nil)
	})
	t.Run("version 1", func(t *testing.T) {
		// A snapshot of the plugin before installations: its logins are
		// nobody's (installation "").
		t.Parallel()
		b := mqtttest.StartBroker(t)
		b.Stop(syscall.SIGKILL)
		d := plugDev{"s-1", "prod", "u-1", "key-1"}
		v1 := "devicehub-auth snapshot 1\ngeneration 7\ncount 1\n7\ts-1\tprod\tu-1\tkey-1\nend\n"
		if err := os.WriteFile(b.AuthSnapshot(), []byte(v1), 0o600); err != nil {
			t.Fatal(err)
		}
		b.Start()
		plugMustConnect(t, b, d, nil)
		if st := plugDialCtl(t, b).stats(); st["devices"] != 1.0 || st["generation"] != 7.0 {
			t.Errorf("stats after a version 1 snapshot: %v", st)
		}
	})
	t.Run("corrupt", func(t *testing.T) {
		t.Parallel()
		b := mqtttest.StartBroker(t)
		ctl := plugDialCtl(t, b)
		d := plugDev{"s-1", "prod", "u-1", "key-1"}
		ctl.ok(d.set(), plugDev{"s-2", "prod", "u-2", "key-2"}.set())
		b.Stop(syscall.SIGTERM)
		src, err := os.ReadFile(b.AuthSnapshot())
		if err != nil {
			t.Fatal(err)
		}
		whole := string(src)
		body := strings.TrimSuffix(whole, "end\n")
		for name, corrupt := range map[string]string{
			"no end line":   body,
			"half a line":   body[:strings.LastIndex(body, "\t")],
			"a line short":  body[:strings.LastIndex(strings.TrimSuffix(body, "\n"), "\n")+1] + "end\n",
			"bad field":     strings.Replace(whole, "\tprod\t", "\tp/d\t", 1),
			"other version": strings.Replace(whole, "snapshot 2", "snapshot 9", 1),
			"garbage":       "\x00\x01garbage",
		} {
			if err := os.WriteFile(b.AuthSnapshot(), []byte(corrupt), 0o600); err != nil {
				t.Fatal(err)
			}
			b.Start()
			plugRefused(t, b, d.id, d.user, d.key, name+": device of a corrupt snapshot")
			if st := plugDialCtl(t, b).stats(); st["devices"] != 0.0 {
				t.Errorf("%s: stats after a corrupt snapshot: %v", name, st)
			}
			b.Stop(syscall.SIGKILL)
		}
		if n := strings.Count(b.Log(), "snapshot not loaded"); n != 6 {
			t.Errorf("%d words of a corrupt snapshot in the log, want 6", n)
		}
		// And the whole file loads.
		if err := os.WriteFile(b.AuthSnapshot(), src, 0o600); err != nil {
			t.Fatal(err)
		}
		b.Start()
		plugMustConnect(t, b, d, nil)
	})
}

// TestBrokerSecretFiles: the broker's files that hold secrets (the
// dynamic-security plugin's password hashes, the TLS private keys, the
// device-login snapshot, the persistence file) are readable by the user
// the broker runs as only, also after the broker rewrote them.
func TestBrokerSecretFiles(t *testing.T) {
	t.Parallel()
	b := mqtttest.StartBrokerTLS(t)
	dir := filepath.Dir(b.AuthSnapshot())
	ctl := plugDialCtl(t, b)
	ctl.ok(plugDev{"f-1", "prod", "u-1", "key-1"}.set())
	// A change the dynamic-security plugin writes its file for.
	plugDialDynsec(t, b).ok(map[string]any{"command": "createClient", "username": "op-files", "password": "op-password"})
	pid, err := os.ReadFile(filepath.Join(dir, "mosquitto.pid"))
	if err != nil {
		t.Fatal(err)
	}
	status, err := os.ReadFile("/proc/" + strings.TrimSpace(string(pid)) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	var brokerUID uint32
	for _, l := range strings.Split(string(status), "\n") {
		if f := strings.Fields(l); len(f) > 2 && f[0] == "Uid:" {
			u, _ := strconv.ParseUint(f[2], 10, 32) // effective
			brokerUID = uint32(u)
		}
	}
	b.Stop(syscall.SIGTERM) // writes the snapshot and the persistence file
	for _, name := range []string{"dynsec.json", "tls/server.key", "tls/ca.key", "devicehub-auth.snapshot", "mosquitto.db"} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s has mode %v, want -rw-------", name, fi.Mode().Perm())
		}
		if uid := fi.Sys().(*syscall.Stat_t).Uid; uid != brokerUID {
			t.Errorf("%s is owned by uid %d, the broker runs as %d", name, uid, brokerUID)
		}
	}
}

// TestBrokerQueueBounds: the project's broker bounds what it keeps for a
// client that is away (a device could otherwise make it keep messages
// without end), above what devicehub's own sessions need across a
// restart (REFERENCE.md "Broker settings").
func TestBrokerQueueBounds(t *testing.T) {
	t.Parallel()
	b := mqtttest.StartBroker(t)
	src, err := os.ReadFile(filepath.Join(filepath.Dir(b.AuthSnapshot()), "mosquitto.conf"))
	if err != nil {
		t.Fatal(err)
	}
	// The last line of a setting is the one Mosquitto keeps.
	got := map[string]string{}
	for _, l := range strings.Split(string(src), "\n") {
		if f := strings.Fields(l); len(f) == 2 && !strings.HasPrefix(f[0], "#") {
			got[f[0]] = f[1]
		}
	}
	atLeast := func(name string, min int64) {
		t.Helper()
		n, err := strconv.ParseInt(got[name], 10, 64)
		if err != nil || n < min {
			t.Errorf("%s %q: want a bound of at least %d (0 is none)", name, got[name], min)
		}
	}
	atLeast("max_queued_messages", 100000)
	atLeast("max_queued_bytes", 64<<20)
	if v := got["persistent_client_expiration"]; v == "" {
		t.Error("no persistent_client_expiration: sessions of clients gone for good are kept forever")
	}
	// And the broker runs with them: a persistent session away keeps no
	// more than the bound (lowered here, so that the test is quick).
	b.Stop(syscall.SIGTERM)
	if err := os.WriteFile(filepath.Join(filepath.Dir(b.AuthSnapshot()), "mosquitto.conf"),
		[]byte(strings.Replace(string(src), "max_queued_messages "+got["max_queued_messages"], "max_queued_messages 50", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	b.Start()
	ctl := plugDialCtl(t, b)
	d := plugDev{"q-1", "prod", "u-q", "key-q"}
	ctl.ok(d.set())
	c, err := mqtttest.Dial(b.URL(), d.id, d.user, d.key, nil, func(o *mqtt.ClientOptions) { o.SetCleanSession(false) })
	if err != nil {
		t.Fatal(err)
	}
	if tok := c.Subscribe(d.prefix()+"function/invoke", 1, nil); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatal(tok.Error())
	}
	c.Disconnect(100)
	svc := mqtt.NewClient(mqtttest.ServiceOptions(b.URL(), "svc-queue").SetAutoReconnect(false))
	if tok := svc.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatal(tok.Error())
	}
	defer svc.Disconnect(0)
	for i := 0; i < 200; i++ {
		plugPublish(t, svc, d.prefix()+"function/invoke", false)
	}
	var mu sync.Mutex
	n := 0
	c, err = mqtttest.Dial(b.URL(), d.id, d.user, d.key, nil, func(o *mqtt.ClientOptions) {
		o.SetCleanSession(false).SetDefaultPublishHandler(func(mqtt.Client, mqtt.Message) { mu.Lock(); n++; mu.Unlock() })
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Disconnect(0)
	marker := d.prefix() + "properties/read"
	done := make(chan struct{})
	if tok := c.Subscribe(marker, 1, func(mqtt.Client, mqtt.Message) { close(done) }); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatal(tok.Error())
	}
	plugPublish(t, svc, marker, false)
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the marker never arrived")
	}
	mu.Lock()
	defer mu.Unlock()
	if n == 0 || n > 50 {
		t.Errorf("the session kept %d of 200 messages sent while away, want 1 to 50", n)
	}
}
