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
// Tests put it between devicehub and the real PostgreSQL to take the
// database away and bring it back.
type Proxy struct {
	t      testing.TB
	addr   string
	target string
	mu     sync.Mutex
	ln     net.Listener
	conns  []net.Conn
	wg     sync.WaitGroup
}

// NewProxy listens on a free loopback port and forwards to target.
func NewProxy(t testing.TB, target string) *Proxy {
	p := &Proxy{t: t, target: target}
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
