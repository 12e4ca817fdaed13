package bench

import (
	"testing"
	"time"

	"devicehub/ingest/mqtttest"
)

// A session kept for a client that is gone is counted, from a fresh $SYS
// update (Mosquitto sends one every 10 s).
func TestReadBrokerStateCountsGoneSessions(t *testing.T) {
	t.Parallel()
	broker := mqtttest.SharedURL()
	prefix := "bench-test-gone-" + randHex(4)
	id := prefix + "-0" // as purgeSessions names them
	c, err := mqttConnect(broker, id, false, serviceLogin())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { purgeSessions(broker, prefix, 1) })
	if tok := c.Subscribe("bench/test/"+id, 1, nil); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	c.Disconnect(100)

	s, ok, err := ReadBrokerState(broker, 15*time.Second)
	if err != nil || !ok {
		t.Fatalf("ReadBrokerState: ok %v, %v", ok, err)
	}
	t.Log(s)
	if !s.Fresh {
		t.Fatal("no fresh $SYS update within 15 s")
	}
	if s.Disconnected < 1 {
		t.Fatalf("the gone client's session is not counted: %s", s)
	}
}
