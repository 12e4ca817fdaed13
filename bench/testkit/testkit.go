// Package testkit is the test plumbing every devicehub package shares:
// polling until a condition holds ([Eventually]), serving an HTTP handler
// on a free port for the length of a test ([Serve]), JSON calls to the API
// with a token and the decoding of its envelope ([API]), building the
// devicehub binary once per test binary ([Devicehub]), the check for
// the local ClickHouse cluster ([NeedCluster]) and a log's output read
// while it is written ([LogBuffer]).
//
// It lives below bench because the bench is the part of the repository
// that already builds devicehub and runs it as a child, beside the other
// tooling that drives the server from outside (simulated devices, load
// generators); the server itself imports nothing below bench. It imports
// the standard library and goleak only, nothing of devicehub, so that the
// tests of meta, tsdb, ingest and api, internal ones included, can use it
// without an import cycle. The per-service helpers stay beside their service:
// meta/metatest (a fresh PostgreSQL database), tsdb/tsdbtest (ClickHouse)
// and ingest/mqtttest (brokers and devices).
//
// No helper here sleeps to prove that something did not happen: a test
// that must show an absence waits for a sentinel that follows what must
// be dropped, or for a counter, and then asserts.
package testkit

import (
	"testing"
	"time"
)

// Eventually polls cond until it holds and fails t (Fatal) if it still
// does not after timeout, naming what was awaited. It checks cond at once,
// then at growing intervals from 5 ms up to 100 ms, so that a quick
// condition is seen quickly and a slow one (a query to a database) is not
// hammered.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Within(timeout, cond) {
		t.Fatalf("timed out after %s waiting for %s", timeout, what)
	}
}

// Within polls cond as Eventually does and reports whether it held within
// timeout, for a test that reports the failure itself.
func Within(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for pause := 5 * time.Millisecond; ; pause = min(2*pause, 100*time.Millisecond) {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return cond()
		}
		time.Sleep(pause) // polling interval, not an assertion
	}
}
