package ingest

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/eclipse/paho.mqtt.golang/packets"
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
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := c.Write(make([]byte, 1024)); err != nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("writes to a reset connection kept succeeding")
		}
		time.Sleep(time.Millisecond)
	}
}

// The store keeps what paho reads back and skips inbound publishes, which
// it never does.
func TestIngestStore(t *testing.T) {
	s := newIngestStore()
	s.Open()
	defer s.Close()
	pub := func(qos byte, id uint16) *packets.PublishPacket {
		p := packets.NewControlPacket(packets.Publish).(*packets.PublishPacket)
		p.Qos, p.MessageID = qos, id
		return p
	}
	s.Put("i.1", pub(1, 1)) // a received QoS 1 message
	s.Del("i.1")            // its PUBACK sent
	s.Put("o.2", pub(1, 2)) // a sent QoS 1 message, kept until its PUBACK
	if got := s.All(); !slices.Equal(got, []string{"o.2"}) {
		t.Fatalf("keys %v, want [o.2]", got)
	}
	rel := packets.NewControlPacket(packets.Pubrel).(*packets.PubrelPacket)
	rel.MessageID = 3
	s.Put("i.3", rel) // inbound QoS 2 state is kept
	if s.Get("i.3") == nil {
		t.Fatal("inbound PUBREL not stored")
	}
	s.Del("i.3")
	s.Del("o.2")
	if got := s.All(); len(got) != 0 {
		t.Fatalf("keys %v after Del, want none", got)
	}
}
