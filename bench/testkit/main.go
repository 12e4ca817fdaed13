package testkit

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// Main is a package's TestMain: it runs the tests, removes what
// [Devicehub] built and exits with their code.
func Main(m *testing.M) {
	code := m.Run()
	RemoveBuilt()
	os.Exit(code)
}

// MainNoLeaks is Main that also fails a run whose tests all passed but
// left goroutines running (goleak, with opts to ignore the ones a
// dependency keeps for the process).
func MainNoLeaks(m *testing.M, opts ...goleak.Option) {
	code := m.Run()
	RemoveBuilt()
	if code == 0 {
		if err := goleak.Find(opts...); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
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
