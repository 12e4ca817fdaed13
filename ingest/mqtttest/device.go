package mqtttest

import (
	"errors"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
)

// Device is a simulated device: a clean-session paho client whose TCP
// connection can be cut without an MQTT DISCONNECT, so that the broker
// publishes its last will.
type Device struct {
	mqtt.Client
	mu   sync.Mutex
	conn net.Conn
}

// ConnectDevice connects a device as client id to brokerURL; configure,
// when not nil, adds to its options (a last will, say). It disconnects
// when the test ends.
func ConnectDevice(t testing.TB, brokerURL, id string, configure func(*mqtt.ClientOptions)) *Device {
	t.Helper()
	d := &Device{}
	o := mqtt.NewClientOptions().AddBroker(brokerURL).SetClientID(id).
		SetCleanSession(true).SetAutoReconnect(false).
		SetCustomOpenConnectionFn(func(uri *url.URL, _ mqtt.ClientOptions) (net.Conn, error) {
			c, err := net.DialTimeout("tcp", uri.Host, 5*time.Second)
			d.mu.Lock()
			d.conn = c
			d.mu.Unlock()
			return c, err
		})
	if configure != nil {
		configure(o)
	}
	d.Client = mqtt.NewClient(o)
	if tok := d.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("device %s connect: %v", id, tok.Error())
	}
	t.Cleanup(func() { d.Disconnect(0) })
	return d
}

// Cut closes the TCP connection under the client: no DISCONNECT is sent.
func (d *Device) Cut() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.conn.Close()
}

// MustPublish publishes payload to topic and waits (up to 10s) for it to
// be sent, or at QoS 1 acknowledged; it fails the test otherwise.
func (d *Device) MustPublish(t testing.TB, topic string, qos byte, payload string) {
	t.Helper()
	tok := d.Publish(topic, qos, false, payload)
	if !tok.WaitTimeout(10 * time.Second) {
		t.Fatalf("publish %s: timed out", topic)
	}
	if err := tok.Error(); err != nil {
		t.Fatalf("publish %s: %v", topic, err)
	}
}

// Dial connects once as clientID with a login: a clean session, no
// retry, no reconnect. The error is the broker's refusal, if any. lost, if
// not nil, is closed when the broker drops the connection. configure
// adjusts the options before the connect. The caller disconnects.
func Dial(brokerURL, clientID, username, password string, lost chan struct{}, configure ...func(*mqtt.ClientOptions)) (mqtt.Client, error) {
	o := mqtt.NewClientOptions().AddBroker(brokerURL).SetClientID(clientID).SetUsername(username).SetPassword(password).
		SetCleanSession(true).SetAutoReconnect(false).SetConnectTimeout(5 * time.Second).SetConnectRetry(false)
	if lost != nil {
		var once sync.Once
		o.SetConnectionLostHandler(func(mqtt.Client, error) { once.Do(func() { close(lost) }) })
	}
	for _, f := range configure {
		f(o)
	}
	c := mqtt.NewClient(o)
	tok := c.Connect()
	if !tok.WaitTimeout(10 * time.Second) {
		return nil, errors.New("connect timed out")
	}
	if err := tok.Error(); err != nil {
		return nil, err
	}
	return c, nil
}
