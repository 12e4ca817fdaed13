package api

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/gofiber/fiber/v2"

	"devicehub/api/dashboard"
	"devicehub/ingest/link"
	"devicehub/ingest/notify"
	"devicehub/ingest/shadow"
	"devicehub/meta"
	"devicehub/schema"
	"devicehub/schema/jsonw"
)

// Envelope codes.
const (
	codeUnauthorized    = "unauthorized"
	codeAccessDenied    = "access_denied"
	codeIllegalArgument = "illegal_argument"
	codeIllegalPassword = "illegal_password"
	codeNotFound        = "not_found"
	codeDuplicateKey    = "duplicate_key"
	codeConflict        = "conflict"
	codeServerError     = "server_error"
	codeClientOffline   = "client_offline"
	codeTimeOut         = "time_out"
	codeRequestHandling = "request_handling"
	codeTooManyRequests = "too_many_requests"
	codeUnsupportedType = "unsupported_media_type"
	codeBrokerTimeout   = "broker_timeout"
	codeVersionConflict = "version_conflict"
)

// errorHandler is the one place where errors become envelope codes. It is
// Fiber's ErrorHandler, so errors returned by handlers, unknown routes and
// recovered panics all pass through it.
func errorHandler(log *slog.Logger) fiber.ErrorHandler {
	return func(c *fiber.Ctx, err error) error {
		var (
			argErr  *schema.ArgError
			tmErr   *schema.ValidationError
			fe      *fiber.Error
			devErr  *link.DeviceError
			bulkErr *meta.BulkError
		)
		var (
			denied  accessDeniedError
			busy    busyError
			streams *errUserStreams
			rules   importRefused
			bulkTO  bulkTimeoutError
			ready   notReadyError
			missing notFoundError
			media   unsupportedTypeError
			basic   basicAuthError
			rng     rangeError
		)
		var dashBusy *dashboard.BusyError
		switch {
		case errors.As(err, &denied):
			return reply(c, fiber.StatusForbidden, codeAccessDenied, string(denied), nil)
		case errors.As(err, &missing):
			return reply(c, fiber.StatusNotFound, codeNotFound, string(missing), nil)
		case errors.As(err, &media):
			return reply(c, fiber.StatusUnsupportedMediaType, codeUnsupportedType, string(media), nil)
		case errors.As(err, &basic):
			c.Set(fiber.HeaderWWWAuthenticate, `Basic realm="`+basic.realm+`"`)
			return reply(c, fiber.StatusUnauthorized, codeUnauthorized, basic.msg, nil)
		case errors.As(err, &rng):
			c.Set(fiber.HeaderContentRange, "bytes */"+strconv.FormatInt(rng.size, 10))
			return reply(c, fiber.StatusRequestedRangeNotSatisfiable, codeIllegalArgument, rng.Error(), nil)
		case errors.As(err, &busy):
			c.Set(fiber.HeaderRetryAfter, strconv.Itoa(busy.retryAfter))
			return reply(c, fiber.StatusServiceUnavailable, codeTooManyRequests, busy.msg, nil)
		case errors.As(err, &dashBusy): // endpoint 14's and exports' admission
			c.Set(fiber.HeaderRetryAfter, strconv.Itoa(dashBusy.RetryAfter))
			return reply(c, fiber.StatusServiceUnavailable, codeTooManyRequests, dashBusy.Error(), nil)
		case errors.As(err, &streams):
			c.Set(fiber.HeaderRetryAfter, strconv.Itoa(liveRetryAfterS))
			return reply(c, fiber.StatusTooManyRequests, codeTooManyRequests, streams.Error(), nil)
		case errors.As(err, &rules):
			return reply(c, fiber.StatusBadRequest, codeIllegalArgument, rules.Error(), []importError(rules))
		case errors.As(err, &bulkTO): // before errBrokerTimeout: the devices created are the result
			return reply(c, fiber.StatusServiceUnavailable, codeBrokerTimeout, bulkTO.err.Error(), bulkTO.created)
		case errors.As(err, &ready):
			return reply(c, fiber.StatusServiceUnavailable, codeServerError, "not ready", map[string]string(ready))
		case errors.Is(err, meta.ErrUnauthorized):
			return reply(c, fiber.StatusUnauthorized, codeUnauthorized, "login expired or token missing",
				enumObject{Text: "expired", Value: "expired"})
		case errors.Is(err, meta.ErrLoginLocked):
			return reply(c, fiber.StatusTooManyRequests, codeTooManyRequests, err.Error(), nil)
		case errors.Is(err, meta.ErrBadCredentials):
			return reply(c, fiber.StatusBadRequest, codeIllegalPassword, "wrong username or password", nil)
		case errors.Is(err, notify.ErrInUse):
			return reply(c, fiber.StatusConflict, codeConflict, safeText(err.Error()), nil)
		case errors.Is(err, meta.ErrNotFound):
			return reply(c, fiber.StatusNotFound, codeNotFound, safeText(err.Error()), nil)
		case errors.Is(err, meta.ErrConflict):
			return reply(c, fiber.StatusConflict, codeConflict, safeText(err.Error()), nil)
		case errors.Is(err, meta.ErrDuplicateKey):
			return reply(c, fiber.StatusBadRequest, codeDuplicateKey, safeText(err.Error())+" already exists", nil)
		case errors.As(err, &bulkErr): // before argErr: its rows are the result
			return reply(c, fiber.StatusBadRequest, codeIllegalArgument, safeText(bulkErr.Error()),
				json.RawMessage(jsonw.List(nil, bulkErr.Rows, appendBulkRowError)))
		case errors.As(err, &argErr):
			var result any
			if argErr.Allowed != nil { // the whole set, where the message may be cut
				result = argChoice{Field: argErr.Field, Allowed: argErr.Allowed}
			}
			return reply(c, fiber.StatusBadRequest, codeIllegalArgument, safeText(argErr.Error()), result)
		case errors.As(err, &tmErr):
			return reply(c, fiber.StatusBadRequest, codeIllegalArgument, "invalid thing model: "+safeText(tmErr.Error()), nil)
		case errors.Is(err, schema.ErrIllegalArgument):
			// The caller names the field; the sentinel's own text adds nothing.
			msg := strings.TrimSuffix(err.Error(), ": "+schema.ErrIllegalArgument.Error())
			return reply(c, fiber.StatusBadRequest, codeIllegalArgument, safeText(msg), nil)
		case errors.Is(err, shadow.ErrVersionConflict):
			return reply(c, fiber.StatusConflict, codeVersionConflict, safeText(err.Error()), nil)
		case errors.Is(err, shadow.ErrTooLarge):
			return reply(c, fiber.StatusBadRequest, codeIllegalArgument, "desired: "+safeText(err.Error()), nil)
		case errors.Is(err, errBrokerTimeout):
			return reply(c, fiber.StatusServiceUnavailable, codeBrokerTimeout, err.Error(), nil)
		case errors.Is(err, link.ErrOffline):
			return reply(c, fiber.StatusInternalServerError, codeClientOffline, "device is offline", nil)
		case errors.Is(err, link.ErrTimeout):
			return reply(c, fiber.StatusInternalServerError, codeTimeOut, "device did not reply in time", nil)
		case errors.Is(err, link.ErrTooBusy):
			return reply(c, fiber.StatusServiceUnavailable, codeTooManyRequests, "too many pending commands; retry later", nil)
		case errors.As(err, &devErr):
			return reply(c, fiber.StatusInternalServerError, safeText(devErr.Code), safeText(devErr.Error()), nil)
		case errors.As(err, &fe):
			return fiberError(c, fe)
		case errors.Is(err, context.DeadlineExceeded), meta.IsStatementCanceled(err):
			// A store's own bound passed (PostgreSQL or ClickHouse busy):
			// the request may be retried; logged, as the server's limit.
			log.Warn("request timed out in storage", "method", c.Method(), "path", c.Path(), "err", err)
			c.Set(fiber.HeaderRetryAfter, strconv.Itoa(storageRetryAfterS))
			return reply(c, fiber.StatusServiceUnavailable, codeTimeOut, "the server's storage did not answer in time; retry later", nil)
		}
		log.Error("request failed", "method", c.Method(), "path", c.Path(), "err", err)
		return reply(c, fiber.StatusInternalServerError, codeServerError, "internal server error", nil)
	}
}

// storageRetryAfterS is the Retry-After, in seconds, of a request whose
// storage did not answer within its bound (503 time_out).
const storageRetryAfterS = 2

// accessDeniedError is a refusal of a request its caller may not make:
// 403 access_denied, the text (which names what is missing) its message.
type accessDeniedError string

func (e accessDeniedError) Error() string { return string(e) }

// notFoundError is a refusal of a request for something that is not
// there, outside the stores' meta.ErrNotFound: 404 not_found, the text
// its message.
type notFoundError string

func (e notFoundError) Error() string { return string(e) }

// unsupportedTypeError refuses a body of a Content-Type, charset or
// Content-Encoding the route does not read: 415 unsupported_media_type,
// the text (which names what the route takes) its message.
type unsupportedTypeError string

func (e unsupportedTypeError) Error() string { return string(e) }

// basicAuthError refuses a request whose HTTP Basic credentials are
// missing or wrong: 401 unauthorized, msg its message, with
// WWW-Authenticate asking for Basic credentials of realm.
type basicAuthError struct {
	realm, msg string
}

func (e basicAuthError) Error() string { return e.msg }

// rangeError refuses a Range past the end of a firmware package of size
// bytes: 416 illegal_argument, with Content-Range "bytes */size".
type rangeError struct{ size int64 }

func (e rangeError) Error() string {
	return "range not satisfiable: the package has " + strconv.FormatInt(e.size, 10) + " bytes"
}

// busyError refuses a request for want of capacity on this instance (a
// slot of a bounded pool): 503 too_many_requests, with Retry-After
// retryAfter seconds.
type busyError struct {
	msg        string
	retryAfter int
}

func (e busyError) Error() string { return e.msg }

// bulkTimeoutError is a bulk creation whose devices were created but whose
// broker logins were not confirmed in time: 503 broker_timeout, err's
// text, the devices created (JSON) as the result.
type bulkTimeoutError struct {
	err     error
	created json.RawMessage
}

func (e bulkTimeoutError) Error() string { return e.err.Error() }
func (e bulkTimeoutError) Unwrap() error { return e.err }

// notReadyError is a failed readiness check (GET /readyz): 503
// server_error "not ready", each check's "up" or "down" as the result.
type notReadyError map[string]string

func (e notReadyError) Error() string { return "not ready" }

// argChoice is the result of a 400 for a field that takes one of a set:
// the field and every value it takes.
type argChoice struct {
	Field   string   `json:"field"`
	Allowed []string `json:"allowed"`
}

func fiberError(c *fiber.Ctx, fe *fiber.Error) error {
	switch fe.Code {
	case fiber.StatusNotFound:
		return reply(c, fe.Code, codeNotFound, "no such endpoint: "+c.Method()+" "+safeText(c.Path()), nil)
	case fiber.StatusMethodNotAllowed:
		return reply(c, fe.Code, codeNotFound, "method not allowed", nil)
	case fiber.StatusRequestEntityTooLarge:
		return reply(c, fiber.StatusBadRequest, codeIllegalArgument, "request body too large", nil)
	case fiber.StatusUnsupportedMediaType:
		return reply(c, fe.Code, codeUnsupportedType, fe.Message, nil)
	case fiber.StatusTooManyRequests:
		return reply(c, fe.Code, codeTooManyRequests, fe.Message, nil)
	case fiber.StatusBadRequest:
		return reply(c, fe.Code, codeIllegalArgument, safeText(fe.Message), nil)
	}
	if fe.Code >= 500 {
		return reply(c, fe.Code, codeServerError, "internal server error", nil)
	}
	return reply(c, fe.Code, codeIllegalArgument, safeText(fe.Message), nil)
}

// safeText keeps client-supplied text in messages valid UTF-8 and short.
func safeText(s string) string {
	if !utf8.ValidString(s) {
		s = string([]rune(s)) // replaces invalid bytes with U+FFFD
	}
	if len(s) > 300 {
		s = s[:300] + "..."
	}
	return s
}

// decodeJSON reads the request body into v; malformed JSON, wrong types
// and strings PostgreSQL cannot store (see checkJSONText) are input errors
// naming the field.
func decodeJSON(c *fiber.Ctx, v any) error {
	body, err := checkedBody(c)
	if err != nil {
		return err
	}
	return jsonError(json.Unmarshal(body, v))
}

// checkedBody is the request body once decodeJSON's checks before
// decoding pass.
func checkedBody(c *fiber.Ctx) ([]byte, error) {
	body := c.Body()
	if len(body) == 0 {
		return nil, schema.Invalid("body", "a JSON body is required")
	}
	if err := checkJSONText(body); err != nil {
		return nil, err
	}
	if !utf8.Valid(body) {
		return nil, schema.Invalid("body", "must be UTF-8")
	}
	return body, nil
}

func jsonError(err error) error {
	if err == nil {
		return nil
	}
	var (
		te *json.UnmarshalTypeError
		se *json.SyntaxError
		ae *schema.ArgError
	)
	switch {
	case errors.As(err, &ae): // a field's own decoder (meta.ProductList)
		return ae
	case errors.As(err, &te):
		field := te.Field
		if field == "" {
			field = "body"
		}
		return schema.Invalid(field, "must be %s, not %s", jsonTypeName(te.Type.Kind().String()), te.Value)
	case errors.As(err, &se):
		return schema.Invalid("body", "malformed JSON at offset %d", se.Offset)
	}
	return schema.Invalid("body", "malformed JSON: %s", err.Error())
}

func jsonTypeName(kind string) string {
	switch kind {
	case "string":
		return "a string"
	case "int", "int8", "int16", "int32", "int64", "uint", "uint8", "uint16", "uint32", "uint64":
		return "an integer"
	case "float32", "float64":
		return "a number"
	case "bool":
		return "a boolean"
	case "slice", "array":
		return "an array"
	case "struct", "map":
		return "an object"
	}
	return kind
}
