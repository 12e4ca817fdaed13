package ingest

import (
	"io"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// stallingProxy forwards TCP connections to the broker at target, but
// the first stall connections get no answer: what they send is read and
// dropped until the client gives up (a saturated broker that answers a
// CONNECT late); with hangUp every connection is closed at once (a
// broker that refuses). accepted counts the connections.
type stallingProxy struct {
	ln       net.Listener
	target   string
	stall    int32
	hangUp   bool
	accepted atomic.Int32
	wg       sync.WaitGroup
	mu       sync.Mutex
	conns    []net.Conn
}

func newStallingProxy(t *testing.T, brokerURL string, stall int32, hangUp bool) *stallingProxy {
	t.Helper()
	u, err := url.Parse(brokerURL)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &stallingProxy{ln: ln, target: u.Host, stall: stall, hangUp: hangUp}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(p.close)
	return p
}

func (p *stallingProxy) url() string { return "tcp://" + p.ln.Addr().String() }

func (p *stallingProxy) track(c net.Conn) {
	p.mu.Lock()
	p.conns = append(p.conns, c)
	p.mu.Unlock()
}

func (p *stallingProxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.track(c)
		if n := p.accepted.Add(1); p.hangUp {
			c.Close()
			continue
		} else if n <= p.stall {
			p.wg.Add(1)
			go func() { defer p.wg.Done(); _, _ = io.Copy(io.Discard, c) }()
			continue
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.track(up)
		p.wg.Add(2)
		go func() { defer p.wg.Done(); _, _ = io.Copy(up, c); up.Close() }()
		go func() { defer p.wg.Done(); _, _ = io.Copy(c, up); c.Close() }()
	}
}

func (p *stallingProxy) close() {
	p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// TestConnectWaitsForASlowBroker: a broker that does not answer the
// first connects in time (ConnectTimeout) is asked again, and New
// succeeds once it answers; one that never answers fails New after
// connectAttempts; one that hangs up fails it at the first. Without the
// retry (connectAttempts 1) the first case fails as the instance
// restarted in bench fleet-connect's reconnect storm did.
func TestConnectWaitsForASlowBroker(t *testing.T) {
	for _, tc := range []struct {
		name   string
		stall  int32 // connections the proxy leaves unanswered
		hangUp bool  // the proxy closes every connection at once
		ok     bool
		tries  int32 // connections the proxy sees
	}{
		{name: "answers at the third connect", stall: 2, ok: true, tries: 3},
		{name: "never answers", stall: 1000, tries: connectAttempts},
		{name: "hangs up", hangUp: true, tries: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, p, _ := newEnvOneDevice(t)
			opt := testOptions(p)
			opt.Connections = 1
			opt.ConnectTimeout = 300 * time.Millisecond
			proxy := newStallingProxy(t, brokerURL(), tc.stall, tc.hangUp)
			opt.BrokerURL = proxy.url()
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
			if n := proxy.accepted.Load(); n < tc.tries || (!tc.ok && n != tc.tries) {
				t.Errorf("the broker saw %d connects, want %d", n, tc.tries)
			}
		})
	}
}
