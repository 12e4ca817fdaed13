package link

import (
	"testing"

	"devicehub/bench/testkit"
	"devicehub/ingest/mqtttest"
)

// Integration tests use the project's Mosquitto (start it with
// .ci/services) at $DEVICEHUB_TEST_MQTT_URL (default
// tcp://127.0.0.1:1884), or a private one where they stop it. Every test
// has its own product ids and client ids, so tests do not see each
// other's traffic.

func TestMain(m *testing.M) { testkit.MainNoLeaks(m) }

func brokerURL() string { return mqtttest.SharedURL() }

func randID(prefix string) string { return testkit.RandID(prefix) }
