package mqttc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"
)

// Options configure Dial.
type Options struct {
	// Addr is the broker's host:port.
	Addr string
	// LocalIP is the source address (127.0.0.2, ... spread a fleet over
	// several loopback addresses: each has its own ephemeral ports); nil
	// lets the kernel choose.
	LocalIP net.IP
	// Connect is the CONNECT sent.
	Connect Connect
	// Timeout bounds the dial and the CONNACK, and each write. Default 10s.
	Timeout time.Duration
	// MaxPacket bounds a received packet (bytes); a larger one closes the
	// connection. Default 64 KiB.
	MaxPacket int
	// OnMessage receives each PUBLISH from the broker on the connection's
	// reader goroutine; it must not block. A QoS 1 message is acknowledged
	// after it returns. Its Payload is valid only during the call.
	OnMessage func(p Packet)
	// OnClose, if set, runs once when the connection is gone, with why,
	// after the outstanding acknowledgements have failed (a fleet
	// schedules its reconnection here instead of a goroutine per device
	// waiting on Done).
	OnClose func(err error)
}

// ConnackError is a CONNACK that refused the connection (its return code:
// 4 bad username or password, 5 not authorized).
type ConnackError byte

func (c ConnackError) Error() string {
	return "mqttc: CONNACK refused, return code " + strconv.Itoa(int(c))
}

// ErrClosed is the error of operations on a closed client, and of the
// acknowledgements that were outstanding when it closed.
var ErrClosed = errors.New("mqttc: connection closed")

// Client is one MQTT connection. Its methods may be called from several
// goroutines. It does not reconnect: once Done is closed, Dial again.
type Client struct {
	conn      net.Conn
	timeout   time.Duration
	maxPacket int
	onMessage func(Packet)
	onClose   func(error)

	wmu  sync.Mutex // one writer at a time; wbuf is reused
	wbuf []byte

	mu      sync.Mutex
	nextID  uint16
	pending []pending // outstanding PUBACKs and SUBACKs, oldest first
	err     error
	done    chan struct{}
}

type pending struct {
	id uint16
	fn func(p Packet, err error)
}

// Dial connects to the broker, sends the CONNECT and waits for the CONNACK:
// a refused login is a ConnackError.
func Dial(ctx context.Context, opt Options) (*Client, error) {
	if opt.Timeout <= 0 {
		opt.Timeout = 10 * time.Second
	}
	if opt.MaxPacket <= 0 {
		opt.MaxPacket = 64 << 10
	}
	pkt, err := AppendConnect(nil, opt.Connect)
	if err != nil {
		return nil, err
	}
	conn, err := dialer(opt).DialContext(ctx, "tcp", opt.Addr)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(opt.Timeout)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	_ = conn.SetDeadline(deadline)
	if _, err := conn.Write(pkt); err != nil {
		conn.Close()
		return nil, err
	}
	// The CONNACK is 4 bytes; read exactly it, so that nothing the broker
	// sends after it is consumed here.
	var ack [4]byte
	if _, err := readFull(conn, ack[:]); err != nil {
		conn.Close()
		return nil, fmt.Errorf("mqttc: no CONNACK: %w", err)
	}
	p, _, err := Decode(ack[:], 4)
	if err != nil || p.Type != CONNACK {
		conn.Close()
		return nil, fmt.Errorf("mqttc: not a CONNACK: % x", ack)
	}
	if p.ReturnCode != 0 {
		conn.Close()
		return nil, ConnackError(p.ReturnCode)
	}
	_ = conn.SetDeadline(time.Time{})
	c := &Client{conn: conn, timeout: opt.Timeout, maxPacket: opt.MaxPacket, onMessage: opt.OnMessage, onClose: opt.OnClose, done: make(chan struct{})}
	go c.read()
	return c, nil
}

// dialer dials from opt.LocalIP, if set, its port chosen at connect
// (deferPort).
func dialer(opt Options) *net.Dialer {
	d := &net.Dialer{Timeout: opt.Timeout}
	if opt.LocalIP != nil {
		d.LocalAddr = &net.TCPAddr{IP: opt.LocalIP}
		d.Control = deferPort
	}
	return d
}

func readFull(c net.Conn, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		k, err := c.Read(b[n:])
		n += k
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// LocalAddr is the connection's local address.
func (c *Client) LocalAddr() net.Addr { return c.conn.LocalAddr() }

// Done is closed when the connection is gone.
func (c *Client) Done() <-chan struct{} { return c.done }

// Err is why the connection is gone (nil while it is up).
func (c *Client) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Pending is the number of outstanding acknowledgements.
func (c *Client) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.pending)
}

// write sends pkt (built by build into the reused buffer) in one write.
func (c *Client) write(build func(b []byte) ([]byte, error)) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	b, err := build(c.wbuf[:0])
	if err != nil {
		return err
	}
	if cap(b) <= 512 {
		c.wbuf = b // keep small buffers only: a fleet has many clients
	}
	_ = c.conn.SetWriteDeadline(time.Now().Add(c.timeout))
	if _, err := c.conn.Write(b); err != nil {
		c.fail(err)
		return err
	}
	return nil
}

// track registers fn for the acknowledgement of a new packet id.
func (c *Client) track(fn func(Packet, error)) (uint16, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return 0, c.err
	}
	for {
		c.nextID++
		if c.nextID == 0 {
			continue
		}
		inUse := false
		for _, p := range c.pending {
			if p.id == c.nextID {
				inUse = true
				break
			}
		}
		if !inUse {
			break
		}
	}
	c.pending = append(c.pending, pending{c.nextID, fn})
	return c.nextID, nil
}

// untrack removes id's entry and returns its function (nil if none).
func (c *Client) untrack(id uint16) func(Packet, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, p := range c.pending {
		if p.id == id {
			c.pending = append(c.pending[:i], c.pending[i+1:]...)
			if len(c.pending) == 0 {
				c.pending = nil // a quiet device holds no slice
			}
			return p.fn
		}
	}
	return nil
}

// Publish sends a message. At QoS 1, onAck (if not nil) runs once: with
// nil on the PUBACK, or with the error that closed the connection first;
// it runs on the reader goroutine and must not block. QoS 2 is not
// supported.
func (c *Client) Publish(topic string, payload []byte, qos byte, retain bool, onAck func(err error)) error {
	if qos > 1 {
		return fmt.Errorf("mqttc: QoS %d: not supported", qos)
	}
	var id uint16
	if qos == 1 {
		var err error
		if id, err = c.track(func(_ Packet, err error) {
			if onAck != nil {
				onAck(err)
			}
		}); err != nil {
			return err
		}
	}
	err := c.write(func(b []byte) ([]byte, error) { return AppendPublish(b, topic, payload, qos, retain, false, id) })
	if err != nil && qos == 1 {
		if fn := c.untrack(id); fn != nil {
			fn(Packet{}, err)
		}
	}
	return err
}

// Subscribe subscribes to one filter and returns the granted QoS (0x80:
// refused by the broker).
func (c *Client) Subscribe(ctx context.Context, filter string, qos byte) (byte, error) {
	type result struct {
		p   Packet
		err error
	}
	ch := make(chan result, 1)
	id, err := c.track(func(p Packet, err error) { ch <- result{p, err} })
	if err != nil {
		return 0, err
	}
	if err := c.write(func(b []byte) ([]byte, error) { return AppendSubscribe(b, id, filter, qos) }); err != nil {
		c.untrack(id)
		return 0, err
	}
	select {
	case r := <-ch:
		if r.err != nil {
			return 0, r.err
		}
		if r.p.Type != SUBACK || len(r.p.Granted) != 1 {
			return 0, fmt.Errorf("mqttc: subscribe %s: answered by packet type %d", filter, r.p.Type)
		}
		return r.p.Granted[0], nil
	case <-ctx.Done():
		c.untrack(id)
		return 0, ctx.Err()
	}
}

// Ping sends a PINGREQ (the broker's PINGRESP is read and dropped).
func (c *Client) Ping() error {
	return c.write(func(b []byte) ([]byte, error) { return AppendPingreq(b), nil })
}

// Disconnect sends DISCONNECT (the broker discards the last will) and
// closes the connection.
func (c *Client) Disconnect() error {
	err := c.write(func(b []byte) ([]byte, error) { return AppendDisconnect(b), nil })
	c.fail(ErrClosed)
	<-c.done
	return err
}

// Close closes the connection without DISCONNECT: the broker publishes
// the last will.
func (c *Client) Close() error {
	c.fail(ErrClosed)
	<-c.done
	return nil
}

// fail records the first error and closes the socket; the reader then
// fails what is outstanding and closes done.
func (c *Client) fail(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = err
	}
	c.mu.Unlock()
	c.conn.Close()
}

// read decodes packets until the connection fails.
func (c *Client) read() {
	buf := make([]byte, 0, 64)
	var err error
	for err == nil {
		if len(buf) == cap(buf) {
			nb := make([]byte, len(buf), 2*cap(buf))
			copy(nb, buf)
			buf = nb
		}
		var n int
		n, err = c.conn.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		for err == nil {
			p, size, derr := Decode(buf, c.maxPacket)
			if errors.Is(derr, ErrShort) {
				break
			}
			if derr != nil {
				err = derr
				break
			}
			err = c.handle(p)
			buf = buf[:copy(buf, buf[size:])]
		}
		if len(buf) == 0 && cap(buf) > 256 {
			buf = make([]byte, 0, 64) // a large packet passed: give its buffer back
		}
	}
	c.fail(err)
	c.mu.Lock()
	pend := c.pending
	c.pending = nil
	err = c.err
	c.mu.Unlock()
	for _, p := range pend {
		p.fn(Packet{}, err)
	}
	close(c.done)
	if c.onClose != nil {
		c.onClose(err)
	}
}

func (c *Client) handle(p Packet) error {
	switch p.Type {
	case PUBACK, SUBACK:
		if fn := c.untrack(p.ID); fn != nil {
			fn(p, nil)
		}
	case PUBLISH:
		if c.onMessage != nil {
			c.onMessage(p)
		}
		switch p.QoS() {
		case 1:
			return c.write(func(b []byte) ([]byte, error) { return AppendPuback(b, p.ID), nil })
		case 2:
			return fmt.Errorf("mqttc: QoS 2 message: not supported")
		}
	case PINGRESP, UNSUBACK:
	default:
		return fmt.Errorf("mqttc: unexpected packet type %d from the broker: %w", p.Type, ErrMalformed)
	}
	return nil
}
