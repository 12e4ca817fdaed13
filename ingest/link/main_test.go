package link

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"devicehub/ingest/mqtttest"
)

// Integration tests use the project's Mosquitto (start it with
// .ci/services) at $DEVICEHUB_TEST_MQTT_URL (default
// tcp://127.0.0.1:1884), or a private one where they stop it. Every test
// has its own product ids and client ids, so tests do not see each
// other's traffic.

func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

func brokerURL() string { return mqtttest.SharedURL() }

func randID(prefix string) string {
	var b [5]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}
