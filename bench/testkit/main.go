package testkit

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// Main is a package's TestMain: it runs the tests, removes what
// [Devicehub] built and exits with their code.
func Main(m *testing.M) {
	code := m.Run()
	RemoveBuilt()
	os.Exit(code)
}

// leakGrace is how long MainNoLeaks waits for goroutines to end.
const leakGrace = 35 * time.Second

// MainNoLeaks is Main that also fails a run whose tests all passed but
// left goroutines running (goleak, with opts to ignore the ones a
// dependency keeps for the process).
func MainNoLeaks(m *testing.M, opts ...goleak.Option) {
	code := m.Run()
	RemoveBuilt()
	if code == 0 {
		// A goroutine that ends by itself within leakGrace is not a leak:
		// paho's Subscribe, called from a client's OnConnect while the
		// broker drops that connection (a dynamic-security client whose
		// own user's roles it changed), waits up to its write timeout, 30
		// s, for a connection that is gone. A leak is what outlives that.
		deadline := time.Now().Add(leakGrace)
		for {
			err := goleak.Find(opts...)
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				fmt.Fprintln(os.Stderr, "goleak:", err)
				code = 1
				break
			}
			time.Sleep(time.Second)
		}
	}
	os.Exit(code)
}

// RandID is prefix and 10 random hex digits: ids, client ids and database
// names private to one test, so that tests sharing a service do not see
// each other.
func RandID(prefix string) string {
	var b [5]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}
