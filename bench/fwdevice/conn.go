package fwdevice

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"devicehub/bench/mqttc"
)

// connTimeout bounds an adapter's wait for an acknowledgement.
const connTimeout = 10 * time.Second

// Paho adapts a connected paho client: Publish waits (up to 10 s) for
// the PUBACK, Subscribe for the SUBACK. Call it again with the new client
// after a reconnect that makes one.
func Paho(c mqtt.Client) Conn { return pahoConn{c} }

type pahoConn struct{ c mqtt.Client }

func (p pahoConn) Publish(topic string, payload []byte) error {
	return waitToken(p.c.Publish(topic, 1, false, payload), "publish "+topic)
}

func (p pahoConn) Subscribe(topic string, handler func([]byte)) error {
	return waitToken(p.c.Subscribe(topic, 1, func(_ mqtt.Client, m mqtt.Message) { handler(m.Payload()) }), "subscribe "+topic)
}

func waitToken(t mqtt.Token, what string) error {
	if !t.WaitTimeout(connTimeout) {
		return fmt.Errorf("%s: timed out", what)
	}
	return t.Error()
}

// MQTTC adapts bench/mqttc connections, which take one message callback
// per connection: set Handle as the Options.OnMessage of every Dial of the
// device and SetClient to each new connection before Connected. Publish
// waits for the PUBACK and Subscribe for the SUBACK (neither may be called
// on the connection's reader goroutine, the updater never does): a device
// that reboots right after a report must not close its socket with the
// report unread by the broker, which a close with unread acknowledgements
// in the socket (a TCP reset) can discard.
type MQTTC struct {
	mu       sync.Mutex
	c        *mqttc.Client
	handlers map[string]func([]byte)
}

// SetClient makes c the connection Publish and Subscribe use.
func (m *MQTTC) SetClient(c *mqttc.Client) {
	m.mu.Lock()
	m.c = c
	m.mu.Unlock()
}

// Handle dispatches a received PUBLISH to the handler subscribed to its
// topic (exact topics only: the updater subscribes to no filter).
func (m *MQTTC) Handle(p mqttc.Packet) {
	m.mu.Lock()
	h := m.handlers[p.Topic]
	m.mu.Unlock()
	if h != nil {
		h(p.Payload)
	}
}

func (m *MQTTC) client() (*mqttc.Client, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.c == nil {
		return nil, errors.New("fwdevice: MQTTC: no connection")
	}
	return m.c, nil
}

// Publish sends at QoS 1 and waits (up to 10 s) for the PUBACK.
func (m *MQTTC) Publish(topic string, payload []byte) error {
	c, err := m.client()
	if err != nil {
		return err
	}
	acked := make(chan error, 1)
	if err := c.Publish(topic, payload, 1, false, func(err error) { acked <- err }); err != nil {
		return err
	}
	select {
	case err := <-acked:
		return err
	case <-time.After(connTimeout):
		return fmt.Errorf("fwdevice: publish %s: no PUBACK in %s", topic, connTimeout)
	}
}

// Subscribe subscribes at QoS 1 and waits for the SUBACK.
func (m *MQTTC) Subscribe(topic string, handler func([]byte)) error {
	c, err := m.client()
	if err != nil {
		return err
	}
	m.mu.Lock()
	if m.handlers == nil {
		m.handlers = map[string]func([]byte){}
	}
	m.handlers[topic] = handler
	m.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), connTimeout)
	defer cancel()
	g, err := c.Subscribe(ctx, topic, 1)
	if err != nil {
		return err
	}
	if g == 0x80 {
		return fmt.Errorf("fwdevice: subscribe %s: refused by the broker", topic)
	}
	return nil
}
