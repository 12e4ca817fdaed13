package api

import (
	"log/slog"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"
)

// maxLoggedPath bounds the path written to the access log; a client
// chooses it.
const maxLoggedPath = 512

// accessLog logs one line per request at level info once its response is
// written: method, path, status, duration, bytes and the peer's remote
// address. It is the outermost middleware, so a handler's error (or a
// recovered panic) is turned into its envelope here first and the status
// logged is the one sent. It logs no header and no query string: tokens
// travel in X-Access-Token or, for the live endpoint, in ?token=, and no
// body: passwords travel in the login's. bytes is the body's length, or -1
// for a streamed body (the line is written when the stream starts).
func accessLog(log *slog.Logger) fiber.Handler {
	return func(c *fiber.Ctx) error {
		start := time.Now()
		if err := c.Next(); err != nil {
			if herr := c.App().ErrorHandler(c, err); herr != nil {
				return herr
			}
		}
		// A streamed body is never read here: Body() would read the
		// stream to its end, here and now, so the client would get
		// nothing, and a live stream never ends.
		res := c.Response()
		n := -1
		if !res.IsBodyStream() {
			n = len(res.Body())
		}
		path := c.Path() // without the query string
		if len(path) > maxLoggedPath {
			path = path[:maxLoggedPath] + "..."
		}
		// fasthttp reuses the buffers behind Method and Path: the record
		// keeps copies, for handlers that hold it after Handle returns.
		log.LogAttrs(c.UserContext(), slog.LevelInfo, "http request",
			slog.String("method", strings.Clone(c.Method())),
			slog.String("path", strings.Clone(path)),
			slog.Int("status", res.StatusCode()),
			slog.Duration("duration", time.Since(start)),
			slog.Int("bytes", n),
			slog.String("remote", c.Context().RemoteAddr().String()),
		)
		return nil
	}
}
