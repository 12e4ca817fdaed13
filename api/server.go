package api

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/middleware/cors"
	"github.com/gofiber/fiber/v2/middleware/recover"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"devicehub/api/dashboard"
	"devicehub/ingest/alarm"
	"devicehub/meta"
	"devicehub/meta/cache"
	"devicehub/schema"
)

// Options configures the HTTP server.
type Options struct {
	// BodyLimit caps request bodies; larger ones are refused with 400.
	BodyLimit int
	// ReadTimeout and WriteTimeout bound slow clients.
	ReadTimeout, WriteTimeout time.Duration
	// TokenLifetime is the default sliding lifetime of a login.
	TokenLifetime time.Duration
	// MaxTokenLifetime bounds the `expires` a client may ask for at login.
	MaxTokenLifetime time.Duration
	// TokenCacheTTL is how long a successful token check is reused without
	// asking PostgreSQL; 0 checks every request. A token that ends (logout,
	// user disabled or deleted, through any instance) is dropped as soon
	// as its end is announced (AuthStore.WatchTokens); while announcements
	// are not heard, no check is reused.
	TokenCacheTTL time.Duration
	// DeviceCacheTTL is how long a device looked up for a command is reused;
	// writes through this instance forget it at once. 0 looks up every time.
	DeviceCacheTTL time.Duration
	// DashboardConcurrency is how many dashboard requests run at once
	// (0: 2 x GOMAXPROCS); DashboardWait is how long one more waits for a
	// slot before it is refused with 503 too_many_requests (0: 2 s).
	DashboardConcurrency int
	DashboardWait        time.Duration
	// CORSOrigins are the browser origins (scheme://host[:port], or "*"
	// for any) allowed to call the API across origins; see
	// ParseCORSOrigins. None (the default) sends no CORS headers.
	CORSOrigins []string
	// AccessLog logs every request at level info through Deps.Logger
	// (accesslog.go).
	AccessLog bool
	// LoginWait bounds how long a device write waits for the broker to
	// hold its login change (logins.go) before it answers 503
	// broker_timeout; the change is applied when the broker answers.
	LoginWait time.Duration
	// The audit trail's writer (auditlog.go): entries are stored
	// AuditBatch at a time, at least every AuditFlushInterval; at most
	// AuditQueue wait, further ones are dropped (counted and logged).
	AuditBatch         int
	AuditFlushInterval time.Duration
	AuditQueue         int
	// GET /metrics (fleet counts, routes, versions) is served to clients
	// whose address (the TCP peer's; no forwarding header is trusted) is
	// in MetricsAllow, and to any sending Authorization: Bearer
	// MetricsToken (if not empty); to nobody else (403). See
	// ParseAddressList.
	MetricsAllow []netip.Prefix
	MetricsToken string
	// dashboardClock is the "now" of endpoint 14's and exports' date math
	// and default ranges (nil: time.Now). Only tests set it
	// (SetDashboardClock, hooks_test.go), to fix the golden set's dates.
	dashboardClock func() time.Time
}

// DefaultMetricsAllow is the default of Options.MetricsAllow: loopback,
// a Prometheus on the same host.
const DefaultMetricsAllow = "127.0.0.0/8,::1/128"

// DefaultOptions returns the defaults used by `make run`.
func DefaultOptions() Options {
	return Options{
		BodyLimit:        1 << 20,
		ReadTimeout:      30 * time.Second,
		WriteTimeout:     30 * time.Second,
		TokenLifetime:    30 * time.Minute,
		MaxTokenLifetime: 30 * 24 * time.Hour,
		TokenCacheTTL:    5 * time.Second,
		DeviceCacheTTL:   time.Second,
		LoginWait:        5 * time.Second,

		AuditBatch:         500,
		AuditFlushInterval: time.Second,
		AuditQueue:         20_000,

		MetricsAllow: must(ParseAddressList(DefaultMetricsAllow)),
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// ParseAddressList reads a comma-separated list of IP addresses and
// CIDR prefixes (10.0.0.7, 10.0.0.0/8, fd00::/8) for
// Options.MetricsAllow; an address is the prefix of itself alone.
// "none" alone is the empty list. Blank entries are skipped.
func ParseAddressList(text string) ([]netip.Prefix, error) {
	if strings.TrimSpace(text) == "none" {
		return []netip.Prefix{}, nil
	}
	var out []netip.Prefix
	for _, a := range strings.Split(text, ",") {
		a = strings.TrimSpace(a)
		if a == "" {
			continue
		}
		if strings.Contains(a, "/") {
			p, err := netip.ParsePrefix(a)
			if err != nil {
				return nil, fmt.Errorf("%q: want an IP address or a CIDR prefix like 10.0.0.0/8", a)
			}
			out = append(out, p.Masked())
			continue
		}
		ip, err := netip.ParseAddr(a)
		if err != nil || ip.Zone() != "" {
			return nil, fmt.Errorf("%q: want an IP address or a CIDR prefix like 10.0.0.0/8", a)
		}
		out = append(out, netip.PrefixFrom(ip.Unmap(), ip.Unmap().BitLen()))
	}
	if len(out) == 0 {
		return nil, errors.New(`no address: give "none" to allow none`)
	}
	return out, nil
}

// metricsAccess lets GET /metrics through for the addresses of
// Options.MetricsAllow and with its bearer token (compared in constant
// time); anyone else is 403 access_denied.
func (s *Server) metricsAccess(c *fiber.Ctx) error {
	if ip, err := netip.ParseAddr(c.IP()); err == nil {
		ip = ip.Unmap()
		for _, p := range s.opts.MetricsAllow {
			if p.Contains(ip) {
				return c.Next()
			}
		}
	}
	if want := s.opts.MetricsToken; want != "" {
		got, ok := strings.CutPrefix(c.Get(fiber.HeaderAuthorization), "Bearer ")
		if ok && subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1 {
			return c.Next()
		}
	}
	return accessDeniedError("access denied: /metrics is served to the addresses of -metrics-allow, or with Authorization: Bearer and -metrics-token")
}

// Deps are the stores the API calls, each through the interface the handlers
// need. Nil optional members leave their routes answering server_error.
type Deps struct {
	Auth     AuthStore
	Products ProductStore
	Roles    RoleStore
	Devices  DeviceStore
	// Dashboard answers endpoint 14 from ClickHouse; Models resolves a
	// device's product and thing model for it.
	Dashboard DashboardStore
	Models    DeviceModels
	// Commands sends property reads and function invokes (endpoints 10-12).
	Commands Commander
	// Shadows keeps devices' desired state (shadow.go); nil leaves its
	// routes answering server_error.
	Shadows ShadowService
	// Logins confirms that the broker holds device login changes
	// (logins.go); nil confirms at once (the broker reads them itself).
	Logins LoginWaiter
	// Live serves GET /api/live (live.go); LiveDevices checks the devices
	// asked for.
	Live        LiveHub
	LiveDevices LiveDevices
	// Audit stores the audit trail (audit.go); nil records none.
	Audit AuditStore
	// Alarms keeps alarm rules and records (alarms.go); nil: the alarm
	// routes answer server_error.
	Alarms AlarmStore
	// AlarmHandled, if set, is given each acknowledgement and clear by
	// hand once committed (the live feed: cmd/devicehub announces it to
	// every instance, as the evaluator's transitions are).
	AlarmHandled func(alarm.Transition)

	// Notify keeps notification channels, subscriptions and dead letters
	// (notify.go); nil answers those routes with a server error.
	Notify NotifyStore
	// Forward keeps forwarding rules and their status (forward.go); nil
	// answers those routes with a server error.
	Forward ForwardStore
	// Firmware is firmware updates (firmware.go); nil: those routes
	// answer server_error.
	Firmware FirmwareService
	// FirmwareMaxSize is the largest package upload (bytes); the upload
	// route reads up to it, only for a caller with firmware:write.
	FirmwareMaxSize int
	// Health checks are run by /readyz, by name (/healthz runs none).
	Health   map[string]func(context.Context) error
	Logger   *slog.Logger
	Registry prometheus.Registerer
	Gatherer prometheus.Gatherer
}

// Server is the HTTP API.
type Server struct {
	app    *fiber.App
	opts   Options
	deps   Deps
	log    *slog.Logger
	tokens *lookupCache[[sha256.Size]byte, *meta.User] // token checks, by meta.TokenDigest
	refs   *lookupCache[string, meta.DeviceRef]        // devices behind commands and dashboard queries
	models *lookupCache[string, string]                // thing models of products behind product-wide dashboard queries
	dash   *dashboard.Service                          // endpoint 14 and exports, and their admission

	tokenWatch *meta.TokenWatch // ended tokens, from every instance (auth.go tokensEnded); nil: none heard
	streams    liveStreams      // open live streams, by token (live.go)
	access     access           // what each route needs (permissions.go)
	audit      *auditLog        // the audit trail's writer; nil: none

	bulkLimits func(*fasthttp.RequestHeader) fasthttp.RequestConfig // the bulk routes' body limit (requestLimits)
}

// New builds the server with every route registered.
func New(opts Options, deps Deps) *Server {
	if deps.Logger == nil {
		deps.Logger = slog.Default()
	}
	s := &Server{opts: opts, deps: deps, log: deps.Logger, tokens: &lookupCache[[sha256.Size]byte, *meta.User]{c: cache.New(keyedLookupOptions[[sha256.Size]byte, *meta.User](opts.TokenCacheTTL, 100_000))},
		refs:   newLookupCache[meta.DeviceRef](opts.DeviceCacheTTL, 100_000),
		models: newLookupCache[string](opts.DeviceCacheTTL, 10_000)}
	s.dash = s.newDashboard()
	s.app = fiber.New(fiber.Config{
		AppName:        "devicehub",
		BodyLimit:      opts.BodyLimit,
		ReadTimeout:    opts.ReadTimeout,
		WriteTimeout:   opts.WriteTimeout,
		ReadBufferSize: 16 << 10, // request line and headers: GET /api/live of 100 ids of 64 characters (live.go)
		// A response up to this size (a page of 25 devices is 22 KB) goes
		// out in one write; at fasthttp's default, 4 KiB, a page took two
		// or three.
		WriteBufferSize:       32 << 10,
		DisableStartupMessage: true,
		// Bodies are read by the handlers, as they arrive: a package
		// upload streams to disk (firmware.go); every other route has its
		// body read whole, within its limit, before it runs (readBodies).
		// No multipart form is parsed before its route's limit is known.
		StreamRequestBody:            true,
		DisablePreParseMultipartForm: true,
		ErrorHandler:                 withNoSniff(errorHandler(deps.Logger)),
	})
	// Larger bodies for bulk routes only (devices_bulk.go), and only to
	// a caller who may write devices; 100 Continue only to a caller
	// signed in (or signing in).
	s.bulkLimits = bulkBodyLimits(opts.BodyLimit)
	s.app.Server().HeaderReceived = s.headerReceived
	s.app.Server().ContinueHandler = s.mayContinue
	s.app.Use(s.readBodies)
	s.app.Use(baseHeaders)
	if opts.AccessLog {
		s.app.Use(accessLog(s.log))
	}
	s.app.Use(recover.New(recover.Config{EnableStackTrace: true, StackTraceHandler: func(c *fiber.Ctx, e any) {
		s.log.Error("panic in handler", "method", c.Method(), "path", c.Path(), "panic", e)
	}}))
	s.app.Use(newMetrics(deps.Registry).middleware)
	s.app.Use(framing)
	if len(opts.CORSOrigins) > 0 {
		s.app.Use(corsMiddleware(opts.CORSOrigins))
	}
	if deps.Audit != nil {
		s.audit = newAuditLog(deps.Audit, opts, s.log, deps.Registry)
	}
	s.app.Use(requestText)
	s.app.Use(jsonBodies)
	s.routes()
	if deps.Auth != nil {
		s.tokenWatch = deps.Auth.WatchTokens(s.tokensEnded)
	}
	return s
}

// baseHeaders has every response say X-Content-Type-Options: nosniff,
// so that no browser takes a JSON answer, which may echo text a client
// chose, for HTML or script; withNoSniff does the same for the answers
// made before any handler runs (a request fasthttp cannot read).
//
// It says Cache-Control: no-store too, unless the handler says otherwise
// (the console's files, the live stream): one rule for every answer
// that carries a secret (a login's token, an API key, a device's
// secureKey at its creation, rotation, bulk creation or import) and for
// every other answer of the API, which only a token may read.
func baseHeaders(c *fiber.Ctx) error {
	c.Set(fiber.HeaderXContentTypeOptions, "nosniff")
	c.Set(fiber.HeaderCacheControl, "no-store")
	return c.Next()
}

func withNoSniff(h fiber.ErrorHandler) fiber.ErrorHandler {
	return func(c *fiber.Ctx, err error) error {
		c.Set(fiber.HeaderXContentTypeOptions, "nosniff")
		return h(c, err)
	}
}

// requestLimits is the server's HeaderReceived hook, run once a
// request's header is read and before any of its body is: a bulk route
// may send a body up to bulkBodyLimit (bulkBodyLimits) only with the
// token of a user who may write devices (headerUser), checked here,
// before fasthttp reads (and allocates) the length it declares. Any
// other caller, and every other route, keeps the server's BodyLimit,
// refused from its Content-Length (400 too large) before its body is
// read: without a token, nobody gets more than the small limit read.
func (s *Server) requestLimits(h *fasthttp.RequestHeader) fasthttp.RequestConfig {
	if s.deps.FirmwareMaxSize > 0 && firmwareUploadRoute(string(h.Method()), requestPath(h)) {
		if u := s.headerUser(h); u != nil && u.Can(permFirmwareWrite) {
			return fasthttp.RequestConfig{MaxRequestBodySize: s.firmwareBodyLimit()}
		}
		return fasthttp.RequestConfig{}
	}
	conf := s.bulkLimits(h)
	if conf.MaxRequestBodySize > 0 {
		if u := s.headerUser(h); u == nil || !u.Can(permDeviceWrite) {
			return fasthttp.RequestConfig{}
		}
	}
	return conf
}

// mayContinue is the server's ContinueHandler: a request saying Expect:
// 100-continue is told to send its body only if it carries a live token
// (or is a login, which needs none) and declares a length within its
// limit (requestLimits). Otherwise it gets 417 Expectation Failed, no
// handler runs, and the connection is closed: its body is never read.
func (s *Server) mayContinue(h *fasthttp.RequestHeader) bool {
	limit := s.app.Server().MaxRequestBodySize
	if conf := s.requestLimits(h); conf.MaxRequestBodySize > 0 {
		limit = conf.MaxRequestBodySize
	}
	ok := h.ContentLength() <= limit && len(h.Peek(tooLargeHeader)) == 0 && (isLogin(h) || s.headerUser(h) != nil)
	if !ok {
		h.SetConnectionClose()
	}
	return ok
}

// headerUser is the user of the token of a request's header (its
// X-Access-Token), checked as the token check of the routes checks it;
// nil without a live one.
func (s *Server) headerUser(h *fasthttp.RequestHeader) *meta.User {
	token := h.Peek(tokenHeader)
	if len(token) == 0 || s.deps.Auth == nil {
		return nil
	}
	wait := s.opts.ReadTimeout // the client waits as long for its header to be read
	if wait <= 0 {
		wait = 30 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	u, err := s.authenticate(ctx, string(token))
	if err != nil {
		return nil
	}
	return u
}

// isLogin reports whether a request's header is one of the login route
// (routes ignore letter case and a trailing slash).
func isLogin(h *fasthttp.RequestHeader) bool {
	uri := string(h.RequestURI())
	if i := strings.IndexByte(uri, '?'); i >= 0 {
		uri = uri[:i]
	}
	for _, scheme := range []string{"http://", "https://"} { // absolute form
		if rest, ok := strings.CutPrefix(uri, scheme); ok {
			uri = rest[strings.IndexByte(rest+"/", '/'):]
		}
	}
	return string(h.Method()) == fiber.MethodPost && strings.EqualFold(strings.TrimSuffix(uri, "/"), "/api/authorize/login")
}

// framing refuses a request whose headers tell its body's length in
// more than one way: two Content-Length values that differ (fasthttp
// takes the last), Content-Length with Transfer-Encoding (fasthttp takes
// the coding), or a Transfer-Encoding other than one "chunked". A proxy
// in front may have read it the other way and sent a request hidden in
// what fasthttp took for the body, or the other way round; so the answer
// is 400 illegal_argument and the connection is closed after it, ending
// whatever the client sent behind it.
func framing(c *fiber.Ctx) error {
	if problem := framingProblem(c.Request().Header.RawHeaders()); problem != "" {
		c.Context().SetConnectionClose()
		return schema.Invalid("header", "ambiguous framing: %s", problem)
	}
	return c.Next()
}

// framingProblem names what makes raw, a request's header lines as
// received, frame its body ambiguously; "" if nothing does.
func framingProblem(raw []byte) string {
	var length []byte
	lengths, codings := 0, 0
	chunked := false
	for len(raw) > 0 {
		line := raw
		if i := bytes.IndexByte(raw, '\n'); i >= 0 {
			line, raw = raw[:i], raw[i+1:]
		} else {
			raw = nil
		}
		name, value, ok := bytes.Cut(line, []byte{':'})
		if !ok {
			continue
		}
		value = bytes.TrimSpace(value)
		switch {
		case bytes.EqualFold(name, []byte(fiber.HeaderContentLength)):
			if lengths > 0 && !bytes.Equal(value, length) {
				return "two different Content-Length headers"
			}
			length = value
			lengths++
		case bytes.EqualFold(name, []byte(fiber.HeaderTransferEncoding)):
			codings++
			chunked = bytes.EqualFold(value, []byte("chunked"))
		}
	}
	switch {
	case codings > 0 && lengths > 0:
		return "Content-Length with Transfer-Encoding"
	case codings > 1 || codings == 1 && !chunked:
		return "the only Transfer-Encoding accepted is one chunked"
	}
	return ""
}

// requestText checks the text of every request's path and query string,
// before routing: a NUL or bytes that are not UTF-8, percent-encoded or
// not, in the path or in a query parameter's name or value are 400
// illegal_argument naming it (no id, name or parameter may hold them, and
// PostgreSQL cannot take them). It decodes the path's percent-encoding
// before routing, so that every route's parameters are decoded
// (/api/device/instance/co%3Alon/detail is device co:lon's), segment by
// segment: a segment whose decoding holds "/" is refused rather than
// split, so that no encoding changes the route a request reaches. "+"
// stays "+" in a path.
func requestText(c *fiber.Ctx) error {
	if path := c.Path(); strings.IndexByte(path, '%') >= 0 {
		segs := strings.Split(path, "/")
		for i, seg := range segs {
			d, err := url.PathUnescape(seg)
			if err != nil {
				return schema.Invalid("path", "malformed percent-encoding: %s", err.Error())
			}
			if strings.IndexByte(d, '/') >= 0 {
				return schema.Invalid("path", "a segment must not hold an encoded / (%%2F)")
			}
			segs[i] = d
		}
		c.Path(strings.Join(segs, "/"))
	}
	if problem := textProblem(c.Path()); problem != "" {
		return schema.Invalid("path", "%s", problem)
	}
	var err error
	c.Context().QueryArgs().VisitAll(func(k, v []byte) {
		if err != nil {
			return
		}
		if problem := textProblem(string(k)); problem != "" {
			err = schema.Invalid("query", "a parameter's name %s", problem)
		} else if problem := textProblem(string(v)); problem != "" {
			err = schema.Invalid(string(k), "%s", problem)
		}
	})
	if err != nil {
		return err
	}
	return c.Next()
}

// textProblem names what is wrong with text no request may hold: a NUL,
// or bytes that are not UTF-8; "" if nothing is.
func textProblem(s string) string {
	switch {
	case strings.IndexByte(s, 0) >= 0:
		return "must not contain NUL (\\u0000)"
	case !utf8.ValidString(s):
		return "must be valid UTF-8"
	}
	return ""
}

// corsMiddleware answers preflights (OPTIONS with Origin and
// Access-Control-Request-Method) itself, before the token check, with 204
// and, for an allowed origin, the Access-Control-Allow-* headers; other
// requests from an allowed origin get Access-Control-Allow-Origin. Origins
// are compared as ParseCORSOrigins normalises them (the browser sends them
// so); one that is not allowed gets no Access-Control-Allow-* header (its
// preflight is still 204, which the browser fails without them).
func corsMiddleware(origins []string) fiber.Handler {
	cfg := cors.Config{
		AllowMethods: strings.Join([]string{fiber.MethodGet, fiber.MethodHead, fiber.MethodPost,
			fiber.MethodPut, fiber.MethodPatch, fiber.MethodDelete}, ","),
		AllowHeaders: strings.Join([]string{fiber.HeaderContentType, "X-Access-Token"}, ","),
	}
	allowed := make(map[string]bool, len(origins))
	for _, o := range origins {
		if o == "*" {
			cfg.AllowOrigins = "*"
			return cors.New(cfg)
		}
		allowed[strings.ToLower(strings.TrimSuffix(o, "/"))] = true
	}
	// A func rather than cors' AllowOrigins text, which panics on an
	// origin it cannot parse: here such an origin just matches nothing.
	cfg.AllowOriginsFunc = func(origin string) bool { return allowed[origin] }
	h := cors.New(cfg)
	return func(c *fiber.Ctx) error {
		err := h(c)
		// cors sets the methods and headers on every preflight; keep them
		// for the allowed origins only.
		if hdr := &c.Response().Header; len(hdr.Peek(fiber.HeaderAccessControlAllowOrigin)) == 0 {
			hdr.Del(fiber.HeaderAccessControlAllowMethods)
			hdr.Del(fiber.HeaderAccessControlAllowHeaders)
		}
		return err
	}
}

// ParseCORSOrigins reads a comma-separated list of origins for
// Options.CORSOrigins: each scheme://host[:port] with scheme http or
// https and nothing after the host, or "*" alone for any origin. Blank
// entries are skipped; empty text gives none.
func ParseCORSOrigins(text string) ([]string, error) {
	var origins []string
	for _, o := range strings.Split(text, ",") {
		o = strings.TrimSpace(o)
		if o == "" {
			continue
		}
		if o == "*" {
			origins = append(origins, o)
			continue
		}
		u, err := url.Parse(o)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil ||
			strings.TrimSuffix(u.Path, "/") != "" || u.RawQuery != "" || u.Fragment != "" || strings.HasSuffix(o, "?") {
			return nil, fmt.Errorf("origin %q: want scheme://host[:port], e.g. https://console.example.com", o)
		}
		origins = append(origins, strings.ToLower(u.Scheme+"://"+u.Host))
	}
	if len(origins) > 1 && slices.Contains(origins, "*") {
		return nil, errors.New(`"*" allows every origin: give it alone`)
	}
	return origins, nil
}

// jsonBodies checks every request body before any handler reads it, so
// that every endpoint, whichever way it decodes its body, refuses alike: a
// body is JSON (checkContentType; 415 otherwise), sent uncompressed (415
// otherwise: a compressed body would be inflated past BodyLimit), and none
// of its strings holds NUL or bytes that are not UTF-8 (checkJSONText;
// 400 naming the field). Requests without a body pass as they are.
func jsonBodies(c *fiber.Ctx) error {
	if firmwareUploadRoute(c.Method(), c.Path()) { // a package is a file, read as it arrives (its body is not read here)
		return c.Next()
	}
	body := c.Request().Body()
	if len(body) == 0 || bulkRoute(c.Method(), c.Path()) { // devices_bulk.go checks those, row by row
		return c.Next()
	}
	if err := checkContentType(c.Get(fiber.HeaderContentType)); err != nil {
		return err
	}
	if err := checkIdentity(c); err != nil {
		return err
	}
	if err := checkJSONText(body); err != nil {
		return err
	}
	return c.Next()
}

// App exposes the Fiber app, for tests (app.Test) and embedding.
func (s *Server) App() *fiber.App { return s.app }

// Listen serves on addr until Shutdown.
func (s *Server) Listen(addr string) error { return s.app.Listen(addr) }

// Shutdown stops accepting connections and waits for requests in flight,
// at most until ctx ends; then it stops hearing of ended tokens and
// stores the audit entries still buffered (before ctx ends).
func (s *Server) Shutdown(ctx context.Context) error {
	err := s.app.ShutdownWithContext(ctx)
	s.tokenWatch.Stop()
	s.audit.close(ctx)
	return err
}
