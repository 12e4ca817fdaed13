package bench

import (
	"testing"
	"time"

	"devicehub/ingest/mqtttest"
)

// A session kept for a client that is gone is counted from the broker's
// $SYS values (Mosquitto publishes them every 10 s, each only when it
// changed). A private broker holds no other session, so a count of one
// or more is ours, whether it comes in a fresh update or as the retained
// value of one published after the disconnect.
func TestReadBrokerStateCountsGoneSessions(t *testing.T) {
	t.Parallel()
	broker := mqtttest.StartBroker(t).URL()
	id := "bench-test-gone-" + randHex(4)
	c, err := mqttConnect(broker, id, false, serviceLogin())
	if err != nil {
		t.Fatal(err)
	}
	if tok := c.Subscribe("bench/test/"+id, 1, nil); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	c.Disconnect(100)

	var s BrokerState
	for end := time.Now().Add(45 * time.Second); time.Now().Before(end); {
		var ok bool
		s, ok, err = ReadBrokerState(broker, 15*time.Second)
		if err != nil {
			t.Fatalf("ReadBrokerState: %v", err)
		}
		t.Log(s)
		if ok && s.Disconnected >= 1 {
			return
		}
	}
	t.Fatalf("the gone client's session is not counted: %s", s)
}
