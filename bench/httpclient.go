package bench

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/valyala/fasthttp"
)

// loadClient is the load generators' keep-alive HTTP/1.1 client of one
// host, holding up to conns connections so a closed loop of conns workers
// never redials. It is fasthttp's: a request is written and its answer
// read in the calling goroutine. net/http's client hands every request to
// two more goroutines (a writer and a reader per connection); on two
// cores shared with the server, a generator that costs more CPU than the
// server it loads ends up measuring itself. The bare-Fiber ceilings use
// the same client, so ratios compare like with like.
type loadClient struct {
	hc *fasthttp.HostClient
}

// idleConn is how long an idle connection is kept for reuse: less than
// devicehub's ReadTimeout (30 s), after which the server closes an idle
// connection, so a request after a long pause (data generation) never goes
// out on one the server has closed.
const idleConn = 10 * time.Second

// requestTimeout bounds one request when its context has no deadline.
const requestTimeout = 60 * time.Second

func newLoadClient(base string, conns int) *loadClient {
	return &loadClient{hc: &fasthttp.HostClient{
		Addr:                     strings.TrimPrefix(base, "http://"),
		MaxConns:                 max(conns, 1),
		MaxConnWaitTimeout:       requestTimeout, // more workers than connections wait, not fail
		MaxIdleConnDuration:      idleConn,       // below the server's idle timeout: never reuse a closed connection
		NoDefaultUserAgentHeader: true,
		ReadBufferSize:           16 << 10,
	}}
}

// do sends one request with the given headers (name, value pairs) and
// body (nil: none) and returns the status and a copy of the answer's
// body. ctx bounds it by its deadline; fasthttp cannot abandon a request
// in flight on cancellation, so a cancelled ctx only stops new ones.
func (c *loadClient) do(ctx context.Context, method, uri string, headers []string, body []byte) (int, []byte, error) {
	var status int
	var out []byte
	err := c.send(ctx, method, uri, headers, body, func(st int, b []byte) {
		status, out = st, append([]byte(nil), b...)
	})
	return status, out, err
}

// send is do without copying the answer: answer sees its status and body
// only while it runs (the buffers are reused after). A load that checks
// the status alone allocates nothing per request for the body.
func (c *loadClient) send(ctx context.Context, method, uri string, headers []string, body []byte, answer func(status int, body []byte)) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(requestTimeout)
	}
	req, res := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(res)
	req.SetRequestURI(uri)
	req.Header.SetMethod(method)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	if body != nil {
		req.SetBodyRaw(body)
	}
	if err := c.hc.DoDeadline(req, res, deadline); err != nil {
		return fmt.Errorf("bench: %s %s: %w", method, uri, err)
	}
	answer(res.StatusCode(), res.Body())
	return nil
}

// close closes the idle connections.
func (c *loadClient) close() { c.hc.CloseIdleConnections() }
