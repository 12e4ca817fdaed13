package meta

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"regexp"
	"time"

	"devicehub/schema"
)

// Enum is an enumerated value, written to clients as the spec's
// EnumObject {text, value} (by api) and read from either that object or a
// bare string (product creation sends deviceType as a string).
type Enum string

// enumText holds display labels; a value without one shows itself.
var enumText = map[string]string{
	"gateway":        "Gateway",
	"childrenDevice": "Gateway sub-device",
	"device":         "Directly connected device",
	"commonProduct":  "Common product",
	"real":           "Real device",
	"virtual":        "Virtual device",
	"manual":         "Manual",
	"none":           "None",
	"notActive":      "Not active",
	"offline":        "Offline",
	"online":         "Online",
	"normalDevice":   "Normal device",
	"cloud":          "Cloud",
	"fromProduct":    "From product",
	"enabled":        "Enabled",
	"disabled":       "Disabled",
	"keep":           "Keep and flag",
	"drop":           "Drop",
}

// Text is the display label of e.
func (e Enum) Text() string {
	if t, ok := enumText[string(e)]; ok {
		return t
	}
	return string(e)
}

// UnmarshalJSON accepts "value" or {"text"?, "value"}.
func (e *Enum) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) > 0 && b[0] == '{' {
		var o struct {
			Value *string `json:"value"`
		}
		if err := json.Unmarshal(b, &o); err != nil {
			return err
		}
		if o.Value == nil {
			return errEnumNoValue
		}
		*e = Enum(*o.Value)
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	*e = Enum(s)
	return nil
}

var errEnumNoValue = errors.New("object needs a \"value\"")

// Millis is a time written to clients as epoch milliseconds, 0 for none
// (by api). No request carries one.
type Millis time.Time

// NullMillis converts a nullable database time.
func NullMillis(t *time.Time) Millis {
	if t == nil {
		return Millis{}
	}
	return Millis(*t)
}

// MaskSecret hides a secret in responses; the spec returns secureKey
// "masked with asterisks".
func MaskSecret(s string) string {
	if s == "" {
		return ""
	}
	return "******"
}

// NewID returns a random 16-character hex id.
func NewID() string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand never fails on supported platforms
	}
	return hex.EncodeToString(b[:])
}

// newSecret returns a random 32-character hex secret.
func newSecret() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b[:])
}

// idPattern keeps ids usable as MQTT topic levels and URL path segments:
// 1 to 64 of A-Z a-z 0-9 _ - . :, but not "." or ".." alone, which
// clients and proxies resolve away in a URL path (checkID).
var idPattern = regexp.MustCompile(`^[A-Za-z0-9_\-.:]{1,64}$`)

// checkID validates a client-chosen id (product, device, role).
func checkID(field, id string) error {
	if !idPattern.MatchString(id) || id == "." || id == ".." {
		return schema.Invalid(field, "must be 1 to 64 letters, digits or _-.:, and not . or .. alone (got %q)", truncate(id, 80))
	}
	return nil
}

// checkText validates a free-text field's length.
func checkText(field, s string, max int, required bool) error {
	if required && s == "" {
		return schema.Invalid(field, "is required")
	}
	if len(s) > max {
		return schema.Invalid(field, "must be at most %d bytes", max)
	}
	return nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
