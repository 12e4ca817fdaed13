package bench

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
)

// BrokerState is what the broker holds before a run, from Mosquitto's $SYS
// topics. Disconnected persistent sessions (a stopped `make run`, say) make
// the broker queue every matching message for them and rewrite its store:
// they skew broker-bound figures, so a run records them and warns.
type BrokerState struct {
	Connected      int64 `json:"connected"`      // clients connected (this reader excluded)
	Disconnected   int64 `json:"disconnected"`   // sessions kept for clients that are gone
	StoredMessages int64 `json:"storedMessages"` // held in the broker's store
	StoredBytes    int64 `json:"storedBytes"`
	// Fresh: a periodic $SYS update arrived; else these are the retained
	// values, up to sys_interval old.
	Fresh bool `json:"fresh"`
}

func (s BrokerState) String() string {
	age := ""
	if !s.Fresh {
		age = " (retained $SYS values, up to 10 s old)"
	}
	return fmt.Sprintf("%d clients connected, %d disconnected sessions, %d stored messages (%d KiB)%s",
		s.Connected, s.Disconnected, s.StoredMessages, s.StoredBytes>>10, age)
}

// The counters read. Mosquitto republishes each one only when it changed,
// so a reading waits for one update of any of them, then a little longer.
// clients/disconnected alone is not enough: with two sessions of gone
// clients on Mosquitto 2.0.11, a reading got clients/total 2 and
// connected 0 but no clients/disconnected, and reported none; so total -
// connected counts too.
var brokerStateTopics = []string{
	"$SYS/broker/clients/disconnected",
	"$SYS/broker/clients/connected",
	"$SYS/broker/store/messages/count",
	"$SYS/broker/store/messages/bytes",
	"$SYS/broker/clients/total",
}

// ReadBrokerState subscribes to the broker's $SYS counters and waits, up to
// wait, for the broker's next periodic update of them (Mosquitto publishes
// every sys_interval, 10 s by default; what arrives on subscribing is the
// retained last one). ok is false when the broker publishes none (not
// Mosquitto, or $SYS off).
func ReadBrokerState(brokerURL string, wait time.Duration) (s BrokerState, ok bool, err error) {
	c := mqtt.NewClient(pahoOptions(serviceLogin(), brokerURL, "bench-sys-"+randHex(4)).SetCleanSession(true))
	if t := c.Connect(); !t.WaitTimeout(10*time.Second) || t.Error() != nil {
		return s, false, fmt.Errorf("bench: connect %s: %v", brokerURL, t.Error())
	}
	defer c.Disconnect(50)
	var total int64
	fields := []*int64{&s.Disconnected, &s.Connected, &s.StoredMessages, &s.StoredBytes, &total}
	var mu sync.Mutex
	seen := false
	fresh := make(chan struct{})
	for i, topic := range brokerStateTopics {
		if t := c.Subscribe(topic, 0, func(_ mqtt.Client, m mqtt.Message) {
			n, err := strconv.ParseInt(strings.TrimSpace(string(m.Payload())), 10, 64)
			if err != nil {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			*fields[i] = n
			seen = true
			if !m.Retained() && !s.Fresh {
				s.Fresh = true
				close(fresh)
			}
		}); !t.WaitTimeout(10*time.Second) || t.Error() != nil {
			return s, false, fmt.Errorf("bench: subscribe %s: %v", topic, t.Error())
		}
	}
	select {
	case <-fresh:
		time.Sleep(200 * time.Millisecond) // the rest of that update
	case <-time.After(wait):
	}
	mu.Lock()
	defer mu.Unlock()
	s.Disconnected = max(s.Disconnected, total-s.Connected)
	if s.Fresh {
		s.Connected = max(s.Connected-1, 0) // the reader itself
	}
	return s, seen, nil
}
