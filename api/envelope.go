package api

import (
	"strconv"
	"sync"
	"time"

	"github.com/gofiber/fiber/v2"

	"devicehub/meta"
)

// envelope is every response body: {message, result, status, code?, timestamp}.
type envelope struct {
	Message   string `json:"message"`
	Result    any    `json:"result,omitempty"`
	Status    int    `json:"status"`
	Code      string `json:"code,omitempty"`
	Timestamp int64  `json:"timestamp"`
}

// ok answers 200 "success" with result (nil leaves result out).
func ok(c *fiber.Ctx, result any) error {
	return c.Status(fiber.StatusOK).JSON(envelope{
		Message:   "success",
		Result:    result,
		Status:    fiber.StatusOK,
		Timestamp: time.Now().UnixMilli(),
	})
}

// reply answers with an explicit status, code and message; the code is
// kept for the audit trail (audit.go).
func reply(c *fiber.Ctx, status int, code, message string, result any) error {
	c.Locals(replyCodeKey, code)
	return c.Status(status).JSON(envelope{
		Message:   message,
		Result:    result,
		Status:    status,
		Code:      code,
		Timestamp: time.Now().UnixMilli(),
	})
}

// enumObject is the spec's EnumObject.
type enumObject struct {
	Text  string `json:"text"`
	Value string `json:"value"`
}

// okPage answers 200 "success" with a page as its result: the bytes ok
// writes, the page written by appendPage and item. A page of meta's page
// cache is shared by the requests that read it, and so is its JSON,
// written once and kept with it (meta.Page.Memo), then copied.
func okPage[T any](c *fiber.Ctx, page *meta.Page[T], item func(*T, []byte) []byte) error {
	return okWith(c, func(b []byte) []byte {
		if kept, ok := page.Memo(func(p *meta.Page[T]) any { return appendPage(nil, p, item) }); ok {
			return append(b, kept.([]byte)...)
		}
		return appendPage(b, page, item)
	})
}

// okItem answers 200 "success" with x, written by item.
func okItem[T any](c *fiber.Ctx, x *T, item func(*T, []byte) []byte) error {
	return okWith(c, func(b []byte) []byte { return item(x, b) })
}

// okWith answers 200 "success" with the result result appends: the bytes
// ok writes for a result encoding/json writes so.
func okWith(c *fiber.Ctx, result func(b []byte) []byte) error {
	buf := bodyBuffers.Get().(*[]byte)
	b := append((*buf)[:0], `{"message":"success","result":`...)
	b = result(b)
	b = append(b, `,"status":200,"timestamp":`...)
	b = strconv.AppendInt(b, time.Now().UnixMilli(), 10)
	b = append(b, '}')
	c.Status(fiber.StatusOK)
	c.Response().SetBody(b) // a copy: the buffer goes back to the pool
	c.Response().Header.SetContentType(fiber.MIMEApplicationJSON)
	if cap(b) <= 1<<20 {
		*buf = b
		bodyBuffers.Put(buf)
	}
	return nil
}

// bodyBuffers hold okWith's bodies while they are written.
var bodyBuffers = sync.Pool{New: func() any { b := make([]byte, 0, 32<<10); return &b }}
