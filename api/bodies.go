package api

import (
	"bytes"
	"errors"
	"io"
	"net"

	"github.com/gofiber/fiber/v2"
	"github.com/valyala/fasthttp"

	"devicehub/meta"
)

// tooLargeHeader marks a request whose declared body is past its limit
// (headerReceived); one a client sends is dropped.
const tooLargeHeader = "X-Devicehub-Body-Too-Large"

// headerReceived is the server's HeaderReceived hook: the request's
// limit (requestLimits) and, as fasthttp streaming bodies refuses none
// and reads up to 8 KiB of one before any handler runs, the refusal of a
// Content-Length past it from the header alone: its length is made 0
// (nothing of it is read) and the request marked, for readBodies to
// answer 400 too large and close the connection.
func (s *Server) headerReceived(h *fasthttp.RequestHeader) fasthttp.RequestConfig {
	h.Del(tooLargeHeader)
	conf := s.requestLimits(h)
	limit := conf.MaxRequestBodySize
	if limit <= 0 {
		limit = s.app.Server().MaxRequestBodySize
	}
	if h.ContentLength() > limit {
		h.Set(tooLargeHeader, "1")
		h.SetContentLength(0)
	}
	return conf
}

// readBodies is the first middleware. The server streams request bodies
// (StreamRequestBody, so that a package upload goes to disk as it
// arrives, firmware.go), which means fasthttp has read at most 8 KiB of
// a body when a handler runs, and no longer refuses one past its limit.
// So every route but the package upload gets here what it got before:
// its body read whole, refused (400 "request body too large", the
// connection closed, the rest unread) when its Content-Length, or a
// chunked body as it is read, is past the request's limit
// (requestLimits: BodyLimit, or the bulk routes' for a caller who may
// use them).
func (s *Server) readBodies(c *fiber.Ctx) error {
	req := c.Request()
	if len(req.Header.Peek(tooLargeHeader)) > 0 {
		c.Context().SetConnectionClose()
		return fiber.ErrRequestEntityTooLarge
	}
	if !req.IsBodyStream() {
		return c.Next()
	}
	if firmwareUploadRoute(c.Method(), c.Path()) {
		// Read by its handler. A body it did not read to its end is read
		// to its end now when the caller may upload packages (a refusal
		// of bad input: the client, still sending, would otherwise see a
		// reset instead of its 400), within the upload's limit; anyone
		// else's (a 401 or 403) is not read: the connection is closed,
		// whose next request would otherwise start inside the body.
		err := c.Next()
		if c.Locals(bodyReadKey{}) == nil && !s.drainUpload(c) {
			c.Context().SetConnectionClose()
		}
		return err
	}
	limit := s.app.Server().MaxRequestBodySize
	n := req.Header.ContentLength()
	if n < 0 || n > limit {
		if conf := s.requestLimits(&req.Header); conf.MaxRequestBodySize > 0 {
			limit = conf.MaxRequestBodySize
		}
	}
	if n > limit {
		c.Context().SetConnectionClose()
		return fiber.ErrRequestEntityTooLarge
	}
	var body []byte
	var err error
	if n >= 0 {
		body = make([]byte, n)
		_, err = io.ReadFull(req.BodyStream(), body)
	} else {
		body, err = io.ReadAll(io.LimitReader(req.BodyStream(), int64(limit)+1))
	}
	if err != nil {
		c.Context().SetConnectionClose()
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return fiber.ErrRequestTimeout
		}
		return fiber.ErrBadRequest
	}
	if len(body) > limit {
		c.Context().SetConnectionClose()
		return fiber.ErrRequestEntityTooLarge
	}
	req.SetBodyRaw(body)
	return c.Next()
}

// drainUpload reads the rest of a package upload's body that its handler
// left unread, for a caller who may upload packages, up to the upload's
// limit; it reports whether the body was read to its end (the connection
// may then serve the next request).
func (s *Server) drainUpload(c *fiber.Ctx) bool {
	u, _ := c.Locals(userKey).(*meta.User)
	if u == nil || !u.Can(permFirmwareWrite) {
		return false
	}
	r := c.Context().RequestBodyStream()
	if r == nil {
		return true
	}
	return readRest(r, int64(s.firmwareBodyLimit()))
}

// readRest reads what is left of a streamed body, at most limit bytes of
// it, and reports whether that was its end (nothing past limit left).
func readRest(r io.Reader, limit int64) bool {
	n, err := io.Copy(io.Discard, io.LimitReader(r, limit+1))
	return err == nil && n <= limit
}

// requestBody is the body of a request as it arrives.
func requestBody(c *fiber.Ctx) io.Reader {
	if r := c.Context().RequestBodyStream(); r != nil {
		return r
	}
	return bytes.NewReader(c.Request().Body())
}

// bodyReader reads a streamed body, knowing whether it was read to its
// end.
type bodyReader struct {
	r   io.Reader
	eof bool
}

func (b *bodyReader) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if errors.Is(err, io.EOF) {
		b.eof = true
	}
	return n, err
}

// finish ends a handler that read a body as it arrived: what is left of
// a body read well is skipped (a multipart's epilogue, up to 64 KiB);
// one read to its end is marked so (readBodies keeps the connection).
func (b *bodyReader) finish(c *fiber.Ctx, err error) {
	if !b.eof && err == nil {
		readRest(b, 64<<10)
	}
	if b.eof {
		c.Locals(bodyReadKey{}, true)
	}
}

// bodyReadKey is the Locals key of a streamed body read to its end.
type bodyReadKey struct{}
