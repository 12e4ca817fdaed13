package bench

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/gofiber/fiber/v2"
)

// ceilingEnvelope is shaped like the API's envelope, so the ceiling
// encodes a body of the same size and kind.
type ceilingEnvelope struct {
	Message   string         `json:"message"`
	Result    map[string]any `json:"result,omitempty"`
	Status    int            `json:"status"`
	Timestamp int64          `json:"timestamp"`
}

// fiberCeiling is a bare Fiber app on 127.0.0.1:0 answering a tiny
// envelope from a handler that does nothing else: what HTTP alone costs on
// this machine, client included.
type fiberCeiling struct {
	app  *fiber.App
	base string
	http *loadClient
}

func startFiberCeiling(conns int) (*fiberCeiling, error) {
	app := fiber.New(fiber.Config{DisableStartupMessage: true})
	h := func(c *fiber.Ctx) error {
		return c.JSON(ceilingEnvelope{Message: "success", Result: map[string]any{c.Params("p"): 21.5},
			Status: 200, Timestamp: time.Now().UnixMilli()})
	}
	app.Get("/c/:d/property/:p", h)
	app.Post("/c/:d/property/:p", h)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	go func() { _ = app.Listener(ln) }()
	base := "http://" + ln.Addr().String()
	return &fiberCeiling{app: app, base: base, http: newLoadClient(base, conns)}, nil
}

func (f *fiberCeiling) close() {
	f.http.close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = f.app.ShutdownWithContext(ctx)
}

// do sends one request like the scenario's (same method, a body of the
// same size, a token header) and drains the answer.
func (f *fiberCeiling) do(ctx context.Context, method string, i int, body []byte) error {
	headers := []string{"X-Access-Token", "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}
	if body != nil {
		headers = append(headers, "Content-Type", "application/json")
	}
	var status int
	err := f.http.send(ctx, method, f.base+"/c/d"+strconv.Itoa(i%1000)+"/property/temp", headers, body, func(st int, _ []byte) { status = st })
	if err != nil {
		return err
	}
	if status != http.StatusOK {
		return fmt.Errorf("bench: ceiling: HTTP %d", status)
	}
	return nil
}

// CeilingParams shape a FiberCeiling run like the scenario it bounds.
type CeilingParams struct {
	Concurrency, Requests, Warmup int
	Rate                          float64 // as loadSpec.Rate
	Method                        string  // default GET
	Body                          []byte  // sent as is (nil: none)
	Progress                      io.Writer
}

// FiberCeiling measures the bare Fiber handler with the load shape of a
// scenario: the same workers, warm-up, requests, method and body size.
func FiberCeiling(ctx context.Context, p CeilingParams) (LoadResult, error) {
	if p.Method == "" {
		p.Method = http.MethodGet
	}
	f, err := startFiberCeiling(max(p.Concurrency, 1))
	if err != nil {
		return LoadResult{}, err
	}
	defer f.close()
	// Its CPU per request (server and clients are this process) is what a
	// request costs the machine at that rate with nothing but HTTP to do.
	var span *cpuSpan
	var end cpuSnapshot
	res, err := runLoad(ctx, loadSpec{
		Name: "fiber ceiling", Concurrency: p.Concurrency, Requests: p.Requests, Warmup: p.Warmup, Rate: p.Rate,
		Progress: p.Progress,
		Do:       func(ctx context.Context, i int) error { return f.do(ctx, p.Method, i, p.Body) },
		Measured: func() func() {
			span = startCPUSpan("bare Fiber ceiling", []namedProc{{Name: "bench (bare Fiber server and its clients)"}})
			return func() { end = span.snapshot() }
		},
	})
	if span != nil {
		c := span.breakdown(end, res.Requests)
		c.Unit = "req"
		res.CPU = &c
	}
	return res, err
}

// Ratio is a/b, 0 when b is 0.
func Ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}
