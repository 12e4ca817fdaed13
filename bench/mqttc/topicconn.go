package mqttc

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// connTimeout bounds a TopicConn's wait for an acknowledgement.
const connTimeout = 10 * time.Second

// TopicConn gives a device played over Clients a Publish that waits for
// its PUBACK and a Subscribe with a handler per topic (what
// bench/fwdevice's Conn asks), though a Client takes one message
// callback per connection: set Handle as the Options.OnMessage of every Dial of the
// device and SetClient to each new connection before Connected. Publish
// waits for the PUBACK and Subscribe for the SUBACK (neither may be called
// on the connection's reader goroutine, the updater never does): a device
// that reboots right after a report must not close its socket with the
// report unread by the broker, which a close with unread acknowledgements
// in the socket (a TCP reset) can discard.
type TopicConn struct {
	mu       sync.Mutex
	c        *Client
	handlers map[string]func([]byte)
}

// SetClient makes c the connection Publish and Subscribe use.
func (m *TopicConn) SetClient(c *Client) {
	m.mu.Lock()
	m.c = c
	m.mu.Unlock()
}

// Handle dispatches a received PUBLISH to the handler subscribed to its
// topic (exact topics only: the updater subscribes to no filter).
func (m *TopicConn) Handle(p Packet) {
	m.mu.Lock()
	h := m.handlers[p.Topic]
	m.mu.Unlock()
	if h != nil {
		h(p.Payload)
	}
}

func (m *TopicConn) client() (*Client, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.c == nil {
		return nil, errors.New("mqttc: TopicConn: no connection")
	}
	return m.c, nil
}

// Publish sends at QoS 1 and waits (up to 10 s) for the PUBACK.
func (m *TopicConn) Publish(topic string, payload []byte) error {
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
		return fmt.Errorf("mqttc: publish %s: no PUBACK in %s", topic, connTimeout)
	}
}

// Subscribe subscribes at QoS 1 and waits for the SUBACK.
func (m *TopicConn) Subscribe(topic string, handler func([]byte)) error {
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
		return fmt.Errorf("mqttc: subscribe %s: refused by the broker", topic)
	}
	return nil
}
