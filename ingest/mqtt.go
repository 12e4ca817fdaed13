package ingest

import (
	"strings"
	"sync/atomic"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/eclipse/paho.mqtt.golang/packets"
)

// ingestStore is paho's MemoryStore without the inbound QoS 1 publishes
// that paho stores until their PUBACK: paho never reads them back (resume
// discards them, and the broker redelivers unacknowledged messages of a
// kept session itself), yet storing and deleting each one took a lock, a
// map insert and a map delete: 7% of the ingester's CPU at QoS 1. Other
// packets (outbound ones, an inbound QoS 2 PUBREL) are stored as paho
// stores them.
type ingestStore struct {
	*mqtt.MemoryStore
	inbound atomic.Bool // some inbound packet was stored
}

func newIngestStore() *ingestStore { return &ingestStore{MemoryStore: mqtt.NewMemoryStore()} }

func (s *ingestStore) Put(key string, m packets.ControlPacket) {
	if strings.HasPrefix(key, inboundKeyPrefix) {
		if _, ok := m.(*packets.PublishPacket); ok {
			return
		}
		s.inbound.Store(true)
	}
	s.MemoryStore.Put(key, m)
}

func (s *ingestStore) Del(key string) {
	if strings.HasPrefix(key, inboundKeyPrefix) && !s.inbound.Load() {
		return // a PUBACK sent: its publish was never stored
	}
	s.MemoryStore.Del(key)
}

// inboundKeyPrefix starts paho's store keys of inbound packets ("i.<id>").
const inboundKeyPrefix = "i."
