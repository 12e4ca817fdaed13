package api

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gofiber/fiber/v2"
	"github.com/lib/pq"
)

// TestErrorHandlerTypedRefusals: the typed refusals handlers return are
// answered by errorHandler alone, each with its status, code, message,
// result and Retry-After. No services needed.
func TestErrorHandlerTypedRefusals(t *testing.T) {
	tests := []struct {
		name       string
		err        error
		status     int
		code       string
		message    string
		result     string // JSON; "" for none
		retryAfter string
		header     string // "Name: value" the refusal sets; "" for none
	}{
		{"access denied", accessDeniedError("access denied: this needs permission device:read"),
			403, "access_denied", "access denied: this needs permission device:read", "", "", ""},
		{"busy", busyError{msg: "too many dashboard requests in progress; retry later", retryAfter: 1},
			503, "too_many_requests", "too many dashboard requests in progress; retry later", "", "1", ""},
		{"user streams", fmt.Errorf("live: %w", &errUserStreams{kind: kindExport, limit: 2}),
			429, "too_many_requests", "too many exports of this user at once (at most 2 per user); end one and retry", "", "5", ""},
		{"import refused", importRefused{{Index: 1, Field: "name", Message: "is required"}, {Index: 3, Message: "x"}},
			400, "illegal_argument", "rules[1].name: is required (nothing imported)",
			`[{"index":1,"field":"name","message":"is required"},{"index":3,"message":"x"}]`, "", ""},
		{"bulk broker timeout", bulkTimeoutError{err: fmt.Errorf("logins: %w", errBrokerTimeout), created: json.RawMessage(`{"created":1}`)},
			503, "broker_timeout", "logins: " + errBrokerTimeout.Error(), `{"created":1}`, "", ""},
		{"not ready", notReadyError{"postgres": "down"},
			503, "server_error", "not ready", `{"postgres":"down"}`, "", ""},
		{"not found", notFoundError("unknown download link"),
			404, "not_found", "unknown download link", "", "", ""},
		{"unsupported type", unsupportedTypeError(`Content-Type must be application/json (got "text/plain")`),
			415, "unsupported_media_type", `Content-Type must be application/json (got "text/plain")`, "", "", ""},
		{"basic auth", basicAuthError{realm: "devicehub firmware", msg: "credentials required"},
			401, "unauthorized", "credentials required", "", "", `WWW-Authenticate: Basic realm="devicehub firmware"`},
		{"storage timeout", fmt.Errorf("meta: create devices: %w", context.DeadlineExceeded),
			503, "time_out", "the server's storage did not answer in time; retry later", "", "2", ""},
		{"statement canceled", fmt.Errorf("meta: create devices: %w", &pq.Error{Code: "57014", Message: "canceling statement due to user request"}),
			503, "time_out", "the server's storage did not answer in time; retry later", "", "2", ""},
		{"range", fmt.Errorf("download: %w", rangeError{size: 1000}),
			416, "illegal_argument", "range not satisfiable: the package has 1000 bytes", "", "", "Content-Range: bytes */1000"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			app := fiber.New(fiber.Config{ErrorHandler: errorHandler(slog.New(slog.NewTextHandler(io.Discard, nil)))})
			app.Get("/", func(*fiber.Ctx) error { return tt.err })
			res, err := app.Test(httptest.NewRequest("GET", "/", nil))
			if err != nil {
				t.Fatal(err)
			}
			var env struct {
				Message string          `json:"message"`
				Result  json.RawMessage `json:"result"`
				Status  int             `json:"status"`
				Code    string          `json:"code"`
			}
			body, _ := io.ReadAll(res.Body)
			if err := json.Unmarshal(body, &env); err != nil {
				t.Fatalf("%v: %s", err, body)
			}
			if res.StatusCode != tt.status || env.Status != tt.status || env.Code != tt.code || env.Message != tt.message ||
				string(env.Result) != tt.result || res.Header.Get("Retry-After") != tt.retryAfter {
				t.Errorf("got %d %s (Retry-After %q), want %d %s %q result %s (Retry-After %q)",
					res.StatusCode, body, res.Header.Get("Retry-After"), tt.status, tt.code, tt.message, tt.result, tt.retryAfter)
			}
			if name, value, _ := strings.Cut(tt.header, ": "); name != "" && res.Header.Get(name) != value {
				t.Errorf("%s: %q, want %q", name, res.Header.Get(name), value)
			}
		})
	}
}
