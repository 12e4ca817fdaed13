package ingest

import (
	"bufio"
	"net"
	"net/url"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
)

// bufConn buffers reads: paho reads every packet header byte by byte from
// the connection, one system call each, which caps a subscriber at a few
// tens of thousands of messages per second.
type bufConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// bufferedDialer returns a paho connection opener with buffered reads for
// tcp:// and mqtt:// brokers, or nil (paho's own) for other schemes.
func bufferedDialer(broker string, timeout time.Duration) mqtt.OpenConnectionFunc {
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
		return &bufConn{Conn: conn, r: bufio.NewReaderSize(conn, 64<<10)}, nil
	}
}

// waitToken waits for t up to d and returns its error, or a timeout error.
func waitToken(t mqtt.Token, d time.Duration) error {
	if !t.WaitTimeout(d) {
		return errTimeout
	}
	return t.Error()
}

type timeoutError struct{}

func (timeoutError) Error() string { return "ingest: MQTT operation timed out" }

var errTimeout error = timeoutError{}
