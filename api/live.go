package api

import (
	"bufio"
	"context"
	"errors"
	"net"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/gofiber/fiber/v2"

	"devicehub/api/live"
	"devicehub/meta"
	"devicehub/schema"
)

// LiveHub subscribes clients to live updates; *live.Hub is one.
type LiveHub interface {
	Subscribe(devices, properties []string) (*live.Subscription, error)
}

// LiveDevices tells which of the devices asked for exist; *meta.Store is
// one.
type LiveDevices interface {
	DeviceStatuses(ctx context.Context, ids []string) (map[string]meta.DeviceStatus, error)
}

// Limits of one live subscription, each refused with 400 naming the field.
const (
	liveMaxDevices    = 100
	liveMaxProperties = 100
	liveMaxIDLen      = 64 // characters, as device ids (meta) and property ids (ingest)
)

const (
	livePing        = 15 * time.Second // heartbeat comment
	liveSendBuffer  = 64 << 10         // the socket's send buffer, see live
	liveLookup      = 5 * time.Second  // the device check's own timeout (fasthttp cancels nothing)
	liveRetryAfterS = 5                // Retry-After, seconds, when the instance has no slot
)

// live is GET /api/live?deviceId=..&property=..: Server-Sent Events of
// the devices' stored property values and online/offline changes (README
// "Live updates"). Its parameters and devices are checked before the
// stream starts, so a refusal is the usual envelope.
func (s *Server) live(c *fiber.Ctx) error {
	if s.deps.Live == nil || s.deps.LiveDevices == nil {
		return errors.New("api: live updates are not configured")
	}
	devices, err := liveIDs(c, "deviceId", liveMaxDevices)
	if err != nil {
		return err
	}
	if len(devices) == 0 {
		return schema.Invalid("deviceId", "is required: one or more, e.g. ?deviceId=meter-1&deviceId=meter-2")
	}
	props, err := liveIDs(c, "property", liveMaxProperties)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(c.UserContext(), liveLookup)
	known, err := s.deps.LiveDevices.DeviceStatuses(ctx, devices)
	cancel()
	if err != nil {
		return err
	}
	for _, d := range devices {
		if _, ok := known[d]; !ok {
			return schema.Invalid("deviceId", "unknown device %q", d)
		}
	}
	c.Set(fiber.HeaderContentType, "text/event-stream")
	c.Set(fiber.HeaderCacheControl, "no-cache")
	c.Set("X-Accel-Buffering", "no") // a proxy (nginx) must not hold events back
	if c.Method() == fiber.MethodHead {
		return nil
	}
	sub, err := s.deps.Live.Subscribe(devices, props)
	if errors.Is(err, live.ErrTooMany) || errors.Is(err, live.ErrClosed) {
		c.Set(fiber.HeaderRetryAfter, strconv.Itoa(liveRetryAfterS))
		return reply(c, fiber.StatusServiceUnavailable, codeTooManyRequests, "too many live subscribers on this instance; retry later", nil)
	}
	if err != nil {
		return err
	}
	rc := c.Context()
	conn, shutdown, timeout := rc.Conn(), rc.Done(), s.opts.WriteTimeout
	// What the kernel holds for a stalled client is bounded too: left
	// alone, Linux grows a socket's send buffer up to tcp_wmem's maximum
	// (4 MiB), measured here at 2.8 MB for a client that reads nothing.
	if tc, ok := conn.(interface{ SetWriteBuffer(int) error }); ok {
		_ = tc.SetWriteBuffer(liveSendBuffer)
	}
	rc.SetBodyStreamWriter(func(w *bufio.Writer) { streamLive(w, sub, conn, shutdown, timeout) })
	return nil
}

// liveIDs reads the distinct values of a repeated query parameter: each
// 1 to liveMaxIDLen characters of UTF-8, at most max of them.
func liveIDs(c *fiber.Ctx, field string, max int) ([]string, error) {
	var ids []string
	seen := make(map[string]bool)
	for _, v := range c.Context().QueryArgs().PeekMulti(field) {
		switch {
		case len(v) == 0:
			return nil, schema.Invalid(field, "must not be empty")
		case !utf8.Valid(v):
			return nil, schema.Invalid(field, "must be UTF-8")
		case utf8.RuneCount(v) > liveMaxIDLen:
			return nil, schema.Invalid(field, "%.20q... is longer than %d characters", v, liveMaxIDLen)
		}
		if id := string(v); !seen[id] {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	if len(ids) > max {
		return nil, schema.Invalid(field, "at most %d per subscription, got %d", max, len(ids))
	}
	return ids, nil
}

// streamLive writes the subscription's events until the client goes
// away, the subscription or the server ends. It runs on a goroutine of
// its own (fasthttp's body stream) and flushes after each round, so an
// event is on the wire as soon as it is taken.
//
// fasthttp sets the connection's write deadline (WriteTimeout) once,
// when the response starts; it is moved forward before each flush, so a
// stream lives as long as its client reads, and one whose client stops
// reading is dropped WriteTimeout after its socket buffers fill. Until
// then what it holds is bounded: its queue (live.Options) and the frames
// of the round being written.
func streamLive(w *bufio.Writer, sub *live.Subscription, conn net.Conn, shutdown <-chan struct{}, timeout time.Duration) {
	defer sub.Close()
	flush := func() bool {
		if timeout > 0 && conn != nil {
			_ = conn.SetWriteDeadline(time.Now().Add(timeout))
		}
		return w.Flush() == nil
	}
	// A first comment sends the headers: the client sees the stream open.
	if _, err := w.WriteString(": ping\n\n"); err != nil || !flush() {
		return
	}
	ping := time.NewTicker(livePing)
	defer ping.Stop()
	var frames [][]byte
	for {
		select {
		case <-sub.Ready():
			var skipped uint64
			frames, skipped = sub.Take(frames[:0])
			if skipped > 0 {
				if _, err := w.Write(live.SkippedFrame(skipped)); err != nil {
					return
				}
			}
			for _, f := range frames {
				if _, err := w.Write(f); err != nil {
					return
				}
			}
			clear(frames) // the frames are shared: let them go
		case <-ping.C:
			if _, err := w.WriteString(": ping\n\n"); err != nil {
				return
			}
		case <-sub.Done():
			return
		case <-shutdown:
			return
		}
		if !flush() {
			return
		}
	}
}
