//go:build linux

package mqttc

import (
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// holdListener accepts connections on 127.0.0.1 and keeps them open until
// the test ends.
func holdListener(t testing.TB) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var held []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				for _, c := range held {
					c.Close()
				}
				return
			}
			held = append(held, c)
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return ln
}

// A connection from a source address has its port chosen at connect:
// without IP_BIND_ADDRESS_NO_PORT the bind searches every port of the
// address (deferPort's doc).
func TestDialDefersSourcePort(t *testing.T) {
	ln := holdListener(t)
	src := net.IPv4(127, 0, 0, 2)
	c, err := dialer(Options{Timeout: 5 * time.Second, LocalIP: src}).Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if ip := c.LocalAddr().(*net.TCPAddr).IP; !ip.Equal(src) {
		t.Fatalf("source address %v, want %v", ip, src)
	}
	raw, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var v int
	var gerr error
	if err := raw.Control(func(fd uintptr) {
		v, gerr = unix.GetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_BIND_ADDRESS_NO_PORT)
	}); err != nil || gerr != nil {
		t.Fatal(err, gerr)
	}
	if v != 1 {
		t.Fatalf("IP_BIND_ADDRESS_NO_PORT = %d, want 1: the port is searched at bind", v)
	}
}
