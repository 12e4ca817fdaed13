package bench

import (
	"testing"

	"devicehub/bench/testkit"
)

func TestMain(m *testing.M) {
	MaybeRunFleetGen()   // a fleet-connect generator child of a test (fleetconnect_gen.go)
	MaybeRunFileServer() // the firmware bench's http.FileServer child (firmware_fileserver.go)
	testkit.Main(m)
}
