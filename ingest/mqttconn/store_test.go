package mqttconn

import (
	"slices"
	"testing"

	"github.com/eclipse/paho.mqtt.golang/packets"
)

// The store keeps what paho reads back and skips inbound publishes, which
// it never does.
func TestLeanStore(t *testing.T) {
	s := newLeanStore()
	s.Open()
	defer s.Close()
	pub := func(qos byte, id uint16) *packets.PublishPacket {
		p := packets.NewControlPacket(packets.Publish).(*packets.PublishPacket)
		p.Qos, p.MessageID = qos, id
		return p
	}
	s.Put("i.1", pub(1, 1)) // a received QoS 1 message
	s.Del("i.1")            // its PUBACK sent
	s.Put("o.2", pub(1, 2)) // a sent QoS 1 message, kept until its PUBACK
	if got := s.All(); !slices.Equal(got, []string{"o.2"}) {
		t.Fatalf("keys %v, want [o.2]", got)
	}
	rel := packets.NewControlPacket(packets.Pubrel).(*packets.PubrelPacket)
	rel.MessageID = 3
	s.Put("i.3", rel) // inbound QoS 2 state is kept
	if s.Get("i.3") == nil {
		t.Fatal("inbound PUBREL not stored")
	}
	s.Del("i.3")
	s.Del("o.2")
	if got := s.All(); len(got) != 0 {
		t.Fatalf("keys %v after Del, want none", got)
	}
}
