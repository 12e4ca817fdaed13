package bench

import (
	"testing"

	"devicehub/bench/testkit"
)

func TestMain(m *testing.M) {
	MaybeRunFleetGen() // a fleet-connect generator child of a test (fleetconnect_gen.go)
	testkit.Main(m)
}
