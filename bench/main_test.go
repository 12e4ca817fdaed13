package bench

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"
)

// testBin is cmd/devicehub built at most once per test binary run, for
// the tests that start it as a child process; TestMain removes it.
var testBin struct {
	dir  string
	once sync.Once
	path string
	err  error
}

func TestMain(m *testing.M) {
	MaybeRunFleetGen() // a fleet-connect generator child of a test (fleetconnect_gen.go)
	code := m.Run()
	if testBin.dir != "" {
		os.RemoveAll(testBin.dir)
	}
	os.Exit(code)
}

// testServerBinary returns the built cmd/devicehub, building it on first
// use.
func testServerBinary(t testing.TB) string {
	t.Helper()
	testBin.once.Do(func() {
		if testBin.dir, testBin.err = os.MkdirTemp("", "devicehub-bench-test-"); testBin.err != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		testBin.path, testBin.err = BuildServer(ctx, testBin.dir)
	})
	if testBin.err != nil {
		t.Fatal(testBin.err)
	}
	return testBin.path
}
