package mqttconn

import (
	"slices"
	"testing"
)

func TestBrokers(t *testing.T) {
	got, err := Brokers(" tcp://a:1883 ,tcp://b:1883")
	if err != nil || !slices.Equal(got, []string{"tcp://a:1883", "tcp://b:1883"}) {
		t.Fatalf("Brokers: %v %v", got, err)
	}
	for _, bad := range []string{"", "tcp://a:1883,", "a:1883", "tcp://a:1883,tcp://a:1883", "tcp://x:pw@"} {
		if _, err := Brokers(bad); err == nil {
			t.Errorf("Brokers(%q) accepted", bad)
		}
	}
	if n := BrokerName("tcp://devicehub:secret@b1:1883"); n != "b1:1883" {
		t.Fatalf("BrokerName %q", n)
	}
}
