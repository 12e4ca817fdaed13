package mqttconn

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/url"
	"syscall"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"devicehub/bench/testkit"
)

// loopback returns a bufConn over TCP and the peer's end.
func loopback(t *testing.T) (*bufConn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	raw, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	peer := <-accepted
	if peer == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { peer.Close() })
	return newBufConn(raw), peer
}

// TestBufConnWrites: coalesced writes arrive whole and in order, more than
// the buffer's bound included, and Close writes out what is buffered.
func TestBufConnWrites(t *testing.T) {
	c, peer := loopback(t)
	got := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(peer)
		got <- b
	}()
	var want bytes.Buffer
	for i := range 200000 { // about 3 MB, past maxPendingWrite many times
		p := []byte(fmt.Sprintf("ack-%d;", i))
		want.Write(p)
		if n, err := c.Write(p); err != nil || n != len(p) {
			t.Fatalf("write %d: n=%d err=%v", i, n, err)
		}
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case b := <-got:
		if !bytes.Equal(b, want.Bytes()) {
			t.Fatalf("peer read %d bytes, want %d in order", len(b), want.Len())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("peer did not see the connection close")
	}
	if _, err := c.Write([]byte("late")); err == nil {
		t.Fatal("write after Close succeeded")
	}
}

// TestBufConnWriteError: once the connection breaks, Write reports it.
func TestBufConnWriteError(t *testing.T) {
	c, peer := loopback(t)
	defer c.Close()
	peer.(*net.TCPConn).SetLinger(0)
	peer.Close() // a reset: the next writes fail
	testkit.Eventually(t, 10*time.Second, "a write to the reset connection failing", func() bool {
		_, err := c.Write(make([]byte, 1024))
		return err != nil
	})
}

// TestDialerNoDelay: the broker connection BufferedDialer opens has
// TCP_NODELAY set, so a command's publish is not held back by Nagle.
func TestDialerNoDelay(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		if c, err := ln.Accept(); err == nil {
			defer c.Close()
			_, _ = io.Copy(io.Discard, c)
		}
	}()
	broker := "tcp://" + ln.Addr().String()
	open := BufferedDialer(broker, time.Second)
	if open == nil {
		t.Fatal("no dialer for a tcp:// broker")
	}
	u, _ := url.Parse(broker)
	conn, err := open(u, mqtt.ClientOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	bc, ok := conn.(*bufConn)
	if !ok {
		t.Fatalf("dialer returned %T, want *bufConn", conn)
	}
	raw, err := bc.Conn.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var v int
	var serr error
	if err := raw.Control(func(fd uintptr) {
		v, serr = syscall.GetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_NODELAY)
	}); err != nil || serr != nil {
		t.Fatal(err, serr)
	}
	if v == 0 {
		t.Fatal("TCP_NODELAY is off on the broker connection")
	}
	for _, other := range []string{"ws://127.0.0.1:1", "ssl://127.0.0.1:1", "::bad"} {
		if BufferedDialer(other, time.Second) != nil {
			t.Errorf("BufferedDialer(%q) is not nil: paho's own opener handles it", other)
		}
	}
}
