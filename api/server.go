package api

import (
	"context"
	"log/slog"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/middleware/recover"
	"github.com/prometheus/client_golang/prometheus"

	"devicehub/meta"
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
	// asking PostgreSQL; 0 checks every request.
	TokenCacheTTL time.Duration
	// DeviceCacheTTL is how long a device looked up for a command is reused;
	// writes through this instance forget it at once. 0 looks up every time.
	DeviceCacheTTL time.Duration
	// DashboardConcurrency is how many dashboard requests run at once
	// (0: 2 x GOMAXPROCS); DashboardWait is how long one more waits for a
	// slot before it is refused with 503 too_many_requests (0: 2 s).
	DashboardConcurrency int
	DashboardWait        time.Duration
}

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
	}
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
	// Health checks are run by /healthz, by name.
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
	tokens *lookupCache[meta.User]      // token checks
	refs   *lookupCache[meta.DeviceRef] // devices behind commands
	dash   *dashboardGate               // dashboard requests in flight
}

// New builds the server with every route registered.
func New(opts Options, deps Deps) *Server {
	if deps.Logger == nil {
		deps.Logger = slog.Default()
	}
	s := &Server{opts: opts, deps: deps, log: deps.Logger, tokens: newLookupCache[meta.User](opts.TokenCacheTTL, 100_000),
		refs: newLookupCache[meta.DeviceRef](opts.DeviceCacheTTL, 100_000),
		dash: newDashboardGate(opts.DashboardConcurrency, opts.DashboardWait)}
	s.app = fiber.New(fiber.Config{
		AppName:               "devicehub",
		BodyLimit:             opts.BodyLimit,
		ReadTimeout:           opts.ReadTimeout,
		WriteTimeout:          opts.WriteTimeout,
		DisableStartupMessage: true,
		ErrorHandler:          errorHandler(deps.Logger),
	})
	s.app.Use(recover.New(recover.Config{EnableStackTrace: true, StackTraceHandler: func(c *fiber.Ctx, e any) {
		s.log.Error("panic in handler", "method", c.Method(), "path", c.Path(), "panic", e)
	}}))
	s.app.Use(newMetrics(deps.Registry).middleware)
	s.app.Use(jsonBodies)
	s.routes()
	return s
}

// jsonBodies checks every request body before any handler reads it, so
// that every endpoint, whichever way it decodes its body, refuses alike: a
// body is JSON (checkContentType; 415 otherwise), sent uncompressed (415
// otherwise: a compressed body would be inflated past BodyLimit), and none
// of its strings holds NUL or bytes that are not UTF-8 (checkJSONText;
// 400 naming the field). Requests without a body pass as they are.
func jsonBodies(c *fiber.Ctx) error {
	body := c.Request().Body()
	if len(body) == 0 {
		return c.Next()
	}
	if err := checkContentType(c.Get(fiber.HeaderContentType)); err != nil {
		return err
	}
	if enc := c.Get(fiber.HeaderContentEncoding); enc != "" && !strings.EqualFold(enc, "identity") {
		return fiber.NewError(fiber.StatusUnsupportedMediaType, "Content-Encoding is not supported: send the body uncompressed")
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
// at most until ctx ends.
func (s *Server) Shutdown(ctx context.Context) error { return s.app.ShutdownWithContext(ctx) }
