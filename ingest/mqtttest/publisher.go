package mqtttest

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
)

// Sent is one QoS 1 publish and its token.
type Sent struct {
	ID  string
	Tok mqtt.Token
}

// Publisher plays a device that keeps reporting at QoS 1 through faults:
// report i has messageId "m<i>" and goes to topic(i), about one a
// millisecond, without waiting for acknowledgements; every token is kept.
type Publisher struct {
	mu        sync.Mutex
	sent      []Sent
	published atomic.Int64
	stop      chan struct{}
	stopOnce  sync.Once
	done      chan struct{}
}

// StartPublisher starts publishing on c until Stop (or the test's end).
func StartPublisher(t testing.TB, c mqtt.Client, topic func(i int) string) *Publisher {
	p := &Publisher{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		for i := 0; ; i++ {
			select {
			case <-p.stop:
				return
			default:
			}
			id := fmt.Sprintf("m%d", i)
			tok := c.Publish(topic(i), 1, false, fmt.Sprintf(`{"messageId":%q,"properties":{"i":%d}}`, id, i))
			p.mu.Lock()
			p.sent = append(p.sent, Sent{ID: id, Tok: tok})
			p.mu.Unlock()
			p.published.Add(1)
			time.Sleep(time.Millisecond) // pacing
		}
	}()
	t.Cleanup(p.Stop)
	return p
}

// Published is the number of reports published so far.
func (p *Publisher) Published() int64 { return p.published.Load() }

// Stop stops publishing and waits for the publisher to end.
func (p *Publisher) Stop() {
	p.stopOnce.Do(func() { close(p.stop) })
	<-p.done
}

// Sent returns the publishes so far, in order.
func (p *Publisher) Sent() []Sent {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Sent(nil), p.sent...)
}

// WaitAcks waits, up to d in all, for the broker's answer to each publish:
// acked are the indexes of those it acknowledged, in order; failed ended
// with an error, pending had no answer in time.
func WaitAcks(sent []Sent, d time.Duration) (acked []int, failed, pending int) {
	deadline := time.Now().Add(d)
	for i, m := range sent {
		if !m.Tok.WaitTimeout(time.Until(deadline)) {
			pending++
			continue
		}
		if m.Tok.Error() != nil {
			failed++
			continue
		}
		acked = append(acked, i)
	}
	return acked, failed, pending
}
