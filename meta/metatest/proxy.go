package metatest

import (
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"devicehub/meta"
)

// Proxy forwards TCP connections to a target until Down, which also cuts
// the connections open through it; Up listens again on the same address.
// Tests put it between devicehub and a real server (PostgreSQL, the
// broker) to take the server away and bring it back, or, with a Fate, to
// make it answer late or hang up.
type Proxy struct {
	t        testing.TB
	addr     string
	target   string
	fate     func(n int) Fate // nil: every connection is forwarded
	mu       sync.Mutex
	ln       net.Listener
	conns    []net.Conn
	accepted int
	wg       sync.WaitGroup
}

// Fate is what the proxy does with an accepted connection.
type Fate int

const (
	Forward Fate = iota // to the target
	Stall               // read and dropped, never answered (a server that answers late)
	HangUp              // closed at once (a server that refuses)
)

// NewProxy listens on a free loopback port and forwards to target.
func NewProxy(t testing.TB, target string) *Proxy { return NewProxyWith(t, target, nil) }

// NewProxyWith is NewProxy deciding each connection's fate by fate(n),
// n counting the accepted connections from 1.
func NewProxyWith(t testing.TB, target string, fate func(n int) Fate) *Proxy {
	p := &Proxy{t: t, target: target, fate: fate}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.addr = ln.Addr().String()
	p.serve(ln)
	t.Cleanup(func() { p.Down(); p.wg.Wait() })
	return p
}

// Addr is the proxy's listening address.
func (p *Proxy) Addr() string { return p.addr }

// Accepted is how many connections the proxy accepted.
func (p *Proxy) Accepted() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted
}

func (p *Proxy) serve(ln net.Listener) {
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			p.accepted++
			fate := Forward
			if p.fate != nil {
				fate = p.fate(p.accepted)
			}
			if fate == Stall {
				p.conns = append(p.conns, c)
			}
			p.mu.Unlock()
			switch fate {
			case HangUp:
				c.Close()
				continue
			case Stall:
				p.wg.Add(1)
				go func() { defer p.wg.Done(); _, _ = io.Copy(io.Discard, c) }()
				continue
			}
			u, err := net.Dial("tcp", p.target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, u)
			p.mu.Unlock()
			p.wg.Add(2)
			go func() { defer p.wg.Done(); _, _ = io.Copy(u, c); u.Close() }()
			go func() { defer p.wg.Done(); _, _ = io.Copy(c, u); c.Close() }()
		}
	}()
}

// Down stops listening and cuts every connection.
func (p *Proxy) Down() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// Up listens again on the same address.
func (p *Proxy) Up() {
	var ln net.Listener
	var err error
	for range 50 {
		if ln, err = net.Listen("tcp", p.addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		p.t.Fatalf("proxy up: %v", err)
	}
	p.serve(ln)
}

// NewStoreBehindProxy is NewStore reached through a Proxy, with a query
// timeout of 2 s.
func NewStoreBehindProxy(t testing.TB) (*meta.Store, *Proxy) {
	t.Helper()
	u, err := url.Parse(NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	px := NewProxy(t, u.Host)
	u.Host = px.Addr()
	opts := meta.DefaultOptions()
	opts.DSN = u.String()
	opts.QueryTimeout = 2 * time.Second
	s := openStore(t, opts)
	return s, px
}
