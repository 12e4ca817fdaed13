package mqttconn

import (
	"bufio"
	"net"
	"net/url"
	"sync"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
)

// BufferedDialer returns a paho connection opener with buffered I/O
// (bufConn) for tcp:// and mqtt:// brokers, or nil (paho's own) for other
// schemes.
func BufferedDialer(broker string, timeout time.Duration) mqtt.OpenConnectionFunc {
	u, err := url.Parse(broker)
	if err != nil || (u.Scheme != "tcp" && u.Scheme != "mqtt") {
		return nil
	}
	return func(uri *url.URL, _ mqtt.ClientOptions) (net.Conn, error) {
		d := net.Dialer{Timeout: timeout}
		conn, err := d.Dial("tcp", uri.Host)
		if err != nil {
			return nil, err
		}
		// No Nagle: a command's publish must leave at once, not wait for
		// the ack of the previous segment. Go's default, stated here
		// because the command latency depends on it; bufConn does the
		// coalescing Nagle would, without its delay.
		if tc, ok := conn.(*net.TCPConn); ok {
			if err := tc.SetNoDelay(true); err != nil {
				conn.Close()
				return nil, err
			}
		}
		return newBufConn(conn), nil
	}
}

// bufConn buffers reads and coalesces writes. Reads: paho reads every
// packet header byte by byte from the connection, one system call each,
// which caps a subscriber at a few tens of thousands of messages per
// second. Writes: at QoS 1 the ingester sends a 4-byte PUBACK per message,
// one system call each (a fifth of its CPU at 15k msg/s); here a Write
// appends to a buffer that one goroutine writes out, so packets written
// together leave together, with no added delay. A Write returns once
// buffered (it waits while maxPendingWrite bytes are); a failed write is
// reported by the next Write. Close writes out what is buffered first.
type bufConn struct {
	net.Conn
	r *bufio.Reader

	mu      sync.Mutex
	ready   *sync.Cond // pending has bytes, or closing
	space   *sync.Cond // pending was taken by the writer
	pending []byte
	werr    error // the first failed write
	closing bool
	done    chan struct{} // writeLoop exited
}

const maxPendingWrite = 256 << 10

func newBufConn(conn net.Conn) *bufConn {
	c := &bufConn{Conn: conn, r: bufio.NewReaderSize(conn, 64<<10), done: make(chan struct{})}
	c.ready, c.space = sync.NewCond(&c.mu), sync.NewCond(&c.mu)
	go c.writeLoop()
	return c
}

func (c *bufConn) Read(p []byte) (int, error) { return c.r.Read(p) }

func (c *bufConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for c.werr == nil && !c.closing && len(c.pending) >= maxPendingWrite {
		c.space.Wait()
	}
	switch {
	case c.werr != nil:
		return 0, c.werr
	case c.closing:
		return 0, net.ErrClosed
	}
	c.pending = append(c.pending, p...)
	c.ready.Signal()
	return len(p), nil
}

// writeLoop writes out what is buffered; the lock is not held across the
// system call, so writers append meanwhile.
func (c *bufConn) writeLoop() {
	defer close(c.done)
	var out []byte
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		for len(c.pending) == 0 && !c.closing {
			c.ready.Wait()
		}
		if len(c.pending) == 0 {
			return // closing, everything written
		}
		out, c.pending = c.pending, out[:0]
		c.space.Broadcast()
		c.mu.Unlock()
		_, err := c.Conn.Write(out)
		c.mu.Lock()
		if err != nil {
			c.werr, c.pending = err, nil
			c.space.Broadcast()
			return
		}
	}
}

// Close writes out what is buffered (waiting at most a second for a peer
// that does not read) and closes the connection.
func (c *bufConn) Close() error {
	c.mu.Lock()
	c.closing = true
	c.ready.Signal()
	c.space.Broadcast()
	c.mu.Unlock()
	t := time.NewTimer(time.Second)
	defer t.Stop()
	select {
	case <-c.done:
	case <-t.C:
	}
	return c.Conn.Close()
}
