package fwdevice

import (
	"fmt"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
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
