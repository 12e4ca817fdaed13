package api

import (
	"time"

	"github.com/gofiber/fiber/v2"
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
