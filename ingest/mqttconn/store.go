package mqttconn

import (
	"strings"
	"sync/atomic"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/eclipse/paho.mqtt.golang/packets"
)

// leanStore, every connection's store unless Config.Store names another,
// is paho's MemoryStore without the inbound QoS 1 publishes that paho
// stores until their PUBACK: paho never reads them back (resume discards
// them, and the broker redelivers unacknowledged messages of a kept
// session itself), yet storing and deleting each one took a lock, a map
// insert and a map delete: 7% of the ingester's CPU at QoS 1, and as much
// of every other subscriber's (the alarm evaluator's, the forwarder's).
// Other packets (outbound ones, an inbound QoS 2 PUBREL) are stored as
// paho stores them.
type leanStore struct {
	*mqtt.MemoryStore
	inbound atomic.Bool // some inbound packet was stored
}

func newLeanStore() *leanStore { return &leanStore{MemoryStore: mqtt.NewMemoryStore()} }

func (s *leanStore) Put(key string, m packets.ControlPacket) {
	if strings.HasPrefix(key, inboundKeyPrefix) {
		if _, ok := m.(*packets.PublishPacket); ok {
			return
		}
		s.inbound.Store(true)
	}
	s.MemoryStore.Put(key, m)
}

func (s *leanStore) Del(key string) {
	if strings.HasPrefix(key, inboundKeyPrefix) && !s.inbound.Load() {
		return // a PUBACK sent: its publish was never stored
	}
	s.MemoryStore.Del(key)
}

// inboundKeyPrefix starts paho's store keys of inbound packets ("i.<id>").
const inboundKeyPrefix = "i."
