package testkit

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"
)

// Serve runs serve on a listener on a free loopback port and returns the
// base URL (http://127.0.0.1:port). When the test ends, shutdown is called
// with a 5 s deadline, and then every connection the listener accepted is
// closed: fasthttp's shutdown leaves open a connection that had sent no
// request yet (it counts as idle only 5 s after it was taken up, e.g. one
// that net/http's Transport dialed for a request and then kept unused),
// and that connection's goroutines, and the client's, would outlive the
// test (goleak). serve is, for a fiber app, app.Listener.
func Serve(t testing.TB, serve func(net.Listener) error, shutdown func(context.Context) error) string {
	t.Helper()
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := &trackingListener{Listener: inner}
	go func() { _ = serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = shutdown(ctx)
		ln.closeAll()
	})
	return "http://" + ln.Addr().String()
}

// trackingListener keeps the connections it accepted, for closeAll. They
// are handed out as they are (not wrapped), so that the server still sees
// a *net.TCPConn (SetLinger, for one).
type trackingListener struct {
	net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func (l *trackingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.mu.Lock()
		l.conns = append(l.conns, c)
		l.mu.Unlock()
	}
	return c, err
}

// closeAll closes the listener and every connection it accepted (those
// already closed just return an error).
func (l *trackingListener) closeAll() {
	_ = l.Listener.Close()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.conns {
		_ = c.Close()
	}
	l.conns = nil
}

// Envelope is the body of every API response (api-spec.md, "Envelope").
type Envelope struct {
	Message   string          `json:"message"`
	Result    json.RawMessage `json:"result"`
	Status    int             `json:"status"`
	Code      string          `json:"code"`
	Timestamp int64           `json:"timestamp"`
}

// Response is an API answer: its HTTP status and headers, the raw body
// and the body decoded as an envelope (zero if it is not one).
type Response struct {
	HTTPStatus int
	Header     http.Header
	Raw        []byte
	Envelope
}

// Decode decodes the envelope's result into out.
func (r Response) Decode(out any) error {
	if err := json.Unmarshal(r.Result, out); err != nil {
		return fmt.Errorf("result: %w: %.500s", err, r.Raw)
	}
	return nil
}

// API calls one devicehub API at Base with Token (none if empty).
type API struct {
	Base  string
	Token string
	// Client sends the requests; nil is a client with a 2 min timeout: far
	// above any answer on a loaded machine (a login's password hash under
	// the race detector), so that only a hang fails the call.
	Client *http.Client
}

var defaultClient = &http.Client{Timeout: 2 * time.Minute}

// WithToken is a copy of a calling with token.
func (a API) WithToken(token string) API { a.Token = token; return a }

// Request sends a request and returns the answer; an error is one of
// transport only (any HTTP status is an answer). body is sent as it is if
// it is a string or []byte, else as JSON; nil sends none. The request
// says Content-Type: application/json either way, as the API's clients do.
func (a API) Request(method, path string, body any) (Response, error) {
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = bytes.NewBufferString(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		js, err := json.Marshal(b)
		if err != nil {
			return Response{}, err
		}
		rd = bytes.NewReader(js)
	}
	req, err := http.NewRequest(method, a.Base+path, rd)
	if err != nil {
		return Response{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	if a.Token != "" {
		req.Header.Set("X-Access-Token", a.Token)
	}
	c := a.Client
	if c == nil {
		c = defaultClient
	}
	res, err := c.Do(req)
	if err != nil {
		return Response{}, fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	r := Response{HTTPStatus: res.StatusCode, Header: res.Header, Raw: raw}
	if err != nil {
		return r, fmt.Errorf("%s %s: reading the body: %w", method, path, err)
	}
	_ = json.Unmarshal(raw, &r.Envelope) // not every answer is an envelope (/metrics)
	return r, nil
}

// Send is Request that fails t on a transport error.
func (a API) Send(t testing.TB, method, path string, body any) Response {
	t.Helper()
	r, err := a.Request(method, path, body)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// Try sends a request and decodes the result into out (if not nil); an
// answer other than 200 is an error naming the request and the body.
func (a API) Try(method, path string, body, out any) error {
	r, err := a.Request(method, path, body)
	if err != nil {
		return err
	}
	if r.HTTPStatus != http.StatusOK {
		return &StatusError{Method: method, Path: path, Response: r}
	}
	if out != nil {
		if err := r.Decode(out); err != nil {
			return fmt.Errorf("%s %s: %w", method, path, err)
		}
	}
	return nil
}

// Call is Try that fails t on any error.
func (a API) Call(t testing.TB, method, path string, body, out any) {
	t.Helper()
	if err := a.Try(method, path, body, out); err != nil {
		t.Fatal(err)
	}
}

// Login logs username in at base (endpoint 1) and returns the API with
// its token.
func Login(t testing.TB, base, username, password string) API {
	t.Helper()
	a := API{Base: base}
	var res struct {
		Token string `json:"token"`
	}
	a.Call(t, "POST", "/api/authorize/login", map[string]any{"username": username, "password": password}, &res)
	if res.Token == "" {
		t.Fatalf("login %s: no token", username)
	}
	return a.WithToken(res.Token)
}
