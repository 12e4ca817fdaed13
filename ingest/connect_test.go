package ingest

import (
	"strings"
	"testing"
	"time"

	"devicehub/ingest/mqtttest"
	"devicehub/meta/metatest"
)

// TestConnectWaitsForASlowBroker: a broker that does not answer the
// first connects in time (ConnectTimeout) is asked again, and New
// succeeds once it answers; one that never answers fails New after
// connectAttempts; one that hangs up fails it at the first. Without the
// retry (connectAttempts 1) the first case fails as the instance
// restarted in bench fleet-connect's reconnect storm did.
func TestConnectWaitsForASlowBroker(t *testing.T) {
	for _, tc := range []struct {
		name   string
		stall  int  // connections the proxy leaves unanswered
		hangUp bool // the proxy closes every connection at once
		ok     bool
		tries  int // connections the proxy sees
	}{
		{name: "answers at the third connect", stall: 2, ok: true, tries: 3},
		{name: "never answers", stall: 1000, tries: connectAttempts},
		{name: "hangs up", hangUp: true, tries: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, opt := proxiedEnv(t)
			proxy := mqtttest.Proxy(t, brokerURL(), func(n int) metatest.Fate {
				switch {
				case tc.hangUp:
					return metatest.HangUp
				case n <= tc.stall:
					return metatest.Stall
				}
				return metatest.Forward
			})
			opt.BrokerURL = "tcp://" + proxy.Addr()
			in, err := New(ctxT(t, time.Minute), opt, e.ch, e.store, e.store)
			if in != nil {
				t.Cleanup(func() {
					_ = in.Close(ctxT(t, 30*time.Second))
					purgeSessions(t, opt)
				})
			}
			if tc.ok != (err == nil) {
				t.Fatalf("New: %v, want ok %v", err, tc.ok)
			}
			// Succeeding, New also connects to look for sessions a run
			// with more connections left (retireSessions): more than tries.
			if n := proxy.Accepted(); n < tc.tries || (!tc.ok && n != tc.tries) {
				t.Errorf("the broker saw %d connects, want %d", n, tc.tries)
			}
		})
	}
}

// TestConnectPoolAtOnce: New connects to every broker of a pool at once,
// so one broker's refusal is not waited for behind another's silence,
// and it ends the wait for the silent one: that one sees a single
// connect, not connectAttempts. Connecting one broker after another, the
// silent broker first, it would see every attempt before the refusal
// was found.
func TestConnectPoolAtOnce(t *testing.T) {
	e, opt := proxiedEnv(t)
	silent := mqtttest.Proxy(t, brokerURL(), func(int) metatest.Fate { return metatest.Stall })
	// The refusal waits for the silent broker's connect (up to 10 s): a
	// pool connected at once has both in flight, and the silent broker
	// then sees that one connect, however the two dials are scheduled. One
	// after another, the refusal comes only after the silent broker's
	// every attempt (or this wait) and the check below fails.
	refusing := mqtttest.Proxy(t, brokerURL(), func(int) metatest.Fate {
		for end := time.Now().Add(10 * time.Second); silent.Accepted() == 0 && time.Now().Before(end); {
			time.Sleep(5 * time.Millisecond)
		}
		return metatest.HangUp
	})
	opt.BrokerURL = "tcp://" + silent.Addr() + ",tcp://" + refusing.Addr()
	in, err := New(ctxT(t, time.Minute), opt, e.ch, e.store, e.store)
	if err == nil {
		_ = in.Close(ctxT(t, 30*time.Second))
		t.Fatal("New connected to a pool whose second broker hangs up")
	}
	if !strings.Contains(err.Error(), refusing.Addr()) {
		t.Errorf("New: %v, want the refusing broker's error", err)
	}
	if n := silent.Accepted(); n != 1 {
		t.Errorf("the silent broker saw %d connects, want 1 (the refusal ends its wait)", n)
	}
}

// proxiedEnv is a test environment with one device and options for one
// connection whose broker's answer is awaited 300 ms, for mqtttest.Proxy's
// proxies.
func proxiedEnv(t *testing.T) (*env, Options) {
	e, p, _ := newEnvOneDevice(t)
	opt := testOptions(p)
	opt.Connections = 1
	opt.ConnectTimeout = 300 * time.Millisecond
	return e, opt
}
