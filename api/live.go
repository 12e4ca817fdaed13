package api

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
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
	livePing        = 15 * time.Second       // heartbeat comment
	liveSendBuffer  = 64 << 10               // the socket's send buffer, see live
	liveLookup      = 5 * time.Second        // the device and token checks' own timeout (fasthttp cancels nothing)
	liveRetryAfterS = 5                      // Retry-After, seconds, when the instance has no slot
	liveRecheckMin  = 250 * time.Millisecond // the soonest a token is checked again (clocks apart)
)

// live is GET /api/live?deviceId=..&property=..: Server-Sent Events of
// the devices' property values (as ingest decodes them, before storage:
// "stored": false) and online/offline changes (REFERENCE.md "Live updates").
// Its parameters and devices are checked before the stream starts, so a
// refusal is the usual envelope.
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
	// The stream ends with its token (auth.go tokensEnded): it is
	// registered before the token is read again here, so that an end
	// committed after that read finds it, and one committed before is
	// seen by the read; the read also gives the expiry.
	token, _ := c.Locals(tokenKey).(string)
	st, err := s.streams.add(token, currentUser(c).ID, kindLive)
	if err != nil {
		return userStreamsReply(c, err)
	}
	ctx, cancel = context.WithTimeout(c.UserContext(), liveLookup)
	expires, err := s.deps.Auth.TokenExpiry(ctx, token)
	cancel()
	if err != nil {
		s.streams.remove(st)
		return err
	}
	sub, err := s.deps.Live.Subscribe(devices, props)
	if err != nil {
		s.streams.remove(st)
	}
	if errors.Is(err, live.ErrTooMany) || errors.Is(err, live.ErrClosed) {
		return busyError{msg: "too many live subscribers on this instance; retry later", retryAfter: liveRetryAfterS}
	}
	if err != nil {
		return err
	}
	rc := c.Context()
	ls := liveStream{sub: sub, st: st, conn: rc.Conn(), shutdown: rc.Done(), timeout: s.opts.WriteTimeout, expires: expires,
		check: func() (time.Time, error) {
			ctx, cancel := context.WithTimeout(context.Background(), liveLookup)
			defer cancel()
			return s.deps.Auth.TokenExpiry(ctx, token)
		}}
	// What the kernel holds for a stalled client is bounded too: left
	// alone, Linux grows a socket's send buffer up to tcp_wmem's maximum
	// (4 MiB), measured here at 2.8 MB for a client that reads nothing.
	if tc, ok := ls.conn.(interface{ SetWriteBuffer(int) error }); ok {
		_ = tc.SetWriteBuffer(liveSendBuffer)
	}
	// The stream reads the connection to see its client leave
	// (watchClient): it serves no request after this one.
	rc.Response.SetConnectionClose()
	rc.SetBodyStreamWriter(func(w *bufio.Writer) {
		defer s.streams.remove(st)
		ls.run(w)
	})
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

// liveStream is one open stream.
type liveStream struct {
	sub      *live.Subscription
	st       *streamEntry
	conn     net.Conn
	shutdown <-chan struct{}           // the server's
	timeout  time.Duration             // WriteTimeout
	expires  time.Time                 // the token's, when last read
	check    func() (time.Time, error) // reads the token's expiry again (AuthStore.TokenExpiry)
}

// run writes the subscription's events until the client goes away, its
// token ends, the subscription or the server ends. It runs on a goroutine
// of its own (fasthttp's body stream) and flushes after each round, so an
// event is on the wire as soon as it is taken.
//
// fasthttp sets the connection's write deadline (WriteTimeout) once,
// when the response starts; it is moved forward before each flush, so a
// stream lives as long as its client reads, and one whose client stops
// reading is dropped WriteTimeout after its socket buffers fill. Until
// then what it holds is bounded: its queue (live.Options) and the frames
// of the round being written.
//
// A client that leaves is seen at once (watchClient), not at the next
// failed write: a write to a socket the peer closed succeeds, the one
// after it fails, so that took up to two pings (30 s) and more.
//
// The token is read again when it would expire (a request may have slid
// it meanwhile) and when the store's announcements were interrupted; an
// announced end (logout, user disabled) ends the stream through st.
func (ls *liveStream) run(w *bufio.Writer) {
	sub := ls.sub
	defer sub.Close()
	gone, stopWatch := watchClient(ls.conn)
	defer stopWatch()
	flush := func() bool {
		if ls.timeout > 0 && ls.conn != nil {
			_ = ls.conn.SetWriteDeadline(time.Now().Add(ls.timeout))
		}
		return w.Flush() == nil
	}
	// A first comment sends the headers: the client sees the stream open.
	if _, err := w.WriteString(": ping\n\n"); err != nil || !flush() {
		return
	}
	ping := time.NewTicker(livePing)
	defer ping.Stop()
	expiry := time.NewTimer(untilRecheck(ls.expires))
	defer expiry.Stop()
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
		case <-expiry.C:
			if !ls.recheck(expiry) {
				return
			}
			continue
		case <-ls.st.recheck:
			if !ls.recheck(expiry) {
				return
			}
			continue
		case <-ls.st.end:
			return
		case <-gone:
			return
		case <-sub.Done():
			return
		case <-ls.shutdown:
			return
		}
		if !flush() {
			return
		}
	}
}

// recheck reads the token's expiry again and sets timer to it; false
// when the token has ended or cannot be read (a stream never outlives a
// token it cannot vouch for: its client reconnects).
func (ls *liveStream) recheck(timer *time.Timer) bool {
	expires, err := ls.check()
	if err != nil {
		return false
	}
	timer.Reset(untilRecheck(expires))
	return true
}

// untilRecheck is how long until a token expiring at expires is read
// again: at its expiry, but not sooner than liveRecheckMin, so that
// clocks apart (this one ahead of PostgreSQL's) cost a read per
// liveRecheckMin at most.
func untilRecheck(expires time.Time) time.Duration {
	return max(time.Until(expires), liveRecheckMin)
}

// aLongTimeAgo is a read deadline in the past: it ends a read at once.
var aLongTimeAgo = time.Unix(1, 0)

// watchClient reads conn until its client closes it, or only its sending
// side, or the connection fails; gone is closed then. A client of a
// stream sends nothing after its request (anything it sends is
// discarded; the connection serves no further request). stop ends the
// watch and returns once its read has.
func watchClient(conn net.Conn) (gone <-chan struct{}, stop func()) {
	ch := make(chan struct{})
	if conn == nil {
		return ch, func() {}
	}
	done := make(chan struct{})
	_ = conn.SetReadDeadline(time.Time{}) // fasthttp's was for the request
	go func() {
		defer close(done)
		defer close(ch)
		var buf [512]byte
		for {
			if _, err := conn.Read(buf[:]); err != nil {
				return
			}
		}
	}()
	return ch, func() {
		_ = conn.SetReadDeadline(aLongTimeAgo)
		<-done
	}
}

// Per-user limits of long responses (UserLimits): how many live streams
// and exports one user (a credential's owner: its logins and API keys
// alike) may hold open on an instance at once. The instance's own limits
// (live.Options MaxSubscribers, api/dashboard's maxExports) stay: these keep one user
// from taking all of them.
const (
	defaultUserLiveStreams = 20
	defaultUserExports     = 2
)

// UserLimits are the per-user limits of an instance's long responses; a
// zero field is its default (20 live streams, 2 exports).
type UserLimits struct {
	LiveStreams int // GET /api/live streams open at once
	Exports     int // POST /api/dashboard/_export answers in progress
}

// DefaultUserLimits returns the defaults.
func DefaultUserLimits() UserLimits {
	return UserLimits{LiveStreams: defaultUserLiveStreams, Exports: defaultUserExports}
}

// SetUserLimits sets the per-user limits of live streams and exports
// (cmd/devicehub: DEVICEHUB_LIVE_STREAMS_PER_USER,
// DEVICEHUB_EXPORTS_PER_USER). Streams already open count against the
// new limits; none is ended.
func (s *Server) SetUserLimits(l UserLimits) {
	s.streams.mu.Lock()
	defer s.streams.mu.Unlock()
	s.streams.limits = l
}

// Kinds of streams (streamEntry.kind).
const (
	kindLive   = "live"
	kindExport = "export"
)

// errUserStreams refuses a stream beyond its user's limit (429).
type errUserStreams struct {
	kind  string
	limit int
}

func (e *errUserStreams) Error() string {
	what := "live streams"
	if e.kind == kindExport {
		what = "exports"
	}
	return fmt.Sprintf("too many %s of this user at once (at most %d per user); end one and retry", what, e.limit)
}

// userStreamsReply is the answer to a refusal of add (an *errUserStreams,
// which errors.go maps to 429 too_many_requests with Retry-After).
func userStreamsReply(_ *fiber.Ctx, err error) error {
	return err
}

// streamEntry is an open stream (live or export) as its token's end
// reaches it.
type streamEntry struct {
	id      string        // meta.TokenID of its token
	user    string        // its user's id, for the per-user limits
	kind    string        // kindLive or kindExport
	end     chan struct{} // closed when the token ended
	once    sync.Once
	recheck chan struct{} // a token when the token must be read again
}

// userKind counts one user's streams of one kind.
type userKind struct{ user, kind string }

// liveStreams are the open streams (live and exports) by the token they
// were opened with, and their counts by user.
type liveStreams struct {
	mu     sync.Mutex
	m      map[string]map[*streamEntry]struct{}
	users  map[userKind]int
	limits UserLimits
}

// limit is the per-user limit of kind.
func (ls *liveStreams) limit(kind string) int {
	n := ls.limits.LiveStreams
	if kind == kindExport {
		n = ls.limits.Exports
	}
	if n > 0 {
		return n
	}
	if kind == kindExport {
		return defaultUserExports
	}
	return defaultUserLiveStreams
}

// add registers a stream of kind opened with token by user; an
// *errUserStreams when user holds as many of kind as its limit.
func (ls *liveStreams) add(token, user, kind string) (*streamEntry, error) {
	e := &streamEntry{id: meta.TokenID(token), user: user, kind: kind, end: make(chan struct{}), recheck: make(chan struct{}, 1)}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	uk := userKind{user, kind}
	if n := ls.limit(kind); ls.users[uk] >= n {
		return nil, &errUserStreams{kind: kind, limit: n}
	}
	if ls.m == nil {
		ls.m = make(map[string]map[*streamEntry]struct{})
		ls.users = make(map[userKind]int)
	}
	if ls.m[e.id] == nil {
		ls.m[e.id] = make(map[*streamEntry]struct{})
	}
	ls.m[e.id][e] = struct{}{}
	ls.users[uk]++
	return e, nil
}

// remove forgets e; once per add.
func (ls *liveStreams) remove(e *streamEntry) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if _, ok := ls.m[e.id][e]; !ok {
		return
	}
	delete(ls.m[e.id], e)
	if len(ls.m[e.id]) == 0 {
		delete(ls.m, e.id)
	}
	uk := userKind{e.user, e.kind}
	if ls.users[uk]--; ls.users[uk] <= 0 {
		delete(ls.users, uk)
	}
}

// end ends the streams of the token named id.
func (ls *liveStreams) end(id string) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	for e := range ls.m[id] {
		e.once.Do(func() { close(e.end) })
	}
}

// recheckAll has every stream read its token again.
func (ls *liveStreams) recheckAll() {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	for _, es := range ls.m {
		for e := range es {
			select {
			case e.recheck <- struct{}{}:
			default:
			}
		}
	}
}
