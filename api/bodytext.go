package api

import (
	"bytes"
	"errors"
	"fmt"
	"mime"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/gofiber/fiber/v2"

	"devicehub/schema"
)

// checkContentType accepts the Content-Type of a JSON body: none at all,
// application/json or application/*+json, in UTF-8 if a charset is named.
// Anything else is 415.
func checkContentType(contentType string) error {
	if contentType == "" || contentType == fiber.MIMEApplicationJSON {
		return nil
	}
	mt, params, err := mime.ParseMediaType(contentType)
	if err == nil && (mt == "application/json" || strings.HasPrefix(mt, "application/") && strings.HasSuffix(mt, "+json")) {
		if cs, ok := params["charset"]; !ok || strings.EqualFold(cs, "utf-8") || strings.EqualFold(cs, "utf8") {
			return nil
		}
	}
	return unsupportedTypeError(fmt.Sprintf("Content-Type must be application/json (got %q)", safeText(contentType)))
}

// checkIdentity refuses a body sent compressed: the routes that read
// JSON or CSV take it as it is.
func checkIdentity(c *fiber.Ctx) error {
	if enc := c.Get(fiber.HeaderContentEncoding); enc != "" && !strings.EqualFold(enc, "identity") {
		return unsupportedTypeError("Content-Encoding is not supported: send the body uncompressed")
	}
	return nil
}

// maxTextDepth bounds the nesting checkJSONText follows, as encoding/json
// does; deeper bodies are left to the decoder, which refuses them.
const maxTextDepth = 10000

// errTextSyntax stops checkJSONText at malformed JSON: the decoder that
// reads the body next reports it, with its offset.
var errTextSyntax = errors.New("malformed JSON")

// checkJSONText refuses a JSON body with a NUL character (raw or escaped as
// \u0000) or bytes that are not UTF-8 in any string, key or value, at any
// depth: PostgreSQL cannot store either in text or jsonb. The error names
// the field's path as the other input errors do (terms[0].value,
// [0].params.deviceId), "body" for the body itself. A body without either
// costs one pass of utf8.Valid and bytes.Contains.
func checkJSONText(body []byte) error {
	if utf8.Valid(body) && bytes.IndexByte(body, 0) < 0 && !bytes.Contains(body, []byte(`\u0000`)) {
		return nil
	}
	sc := textScanner{b: body}
	if err := sc.value(0); err != nil && err != errTextSyntax {
		return err
	}
	return nil
}

// textScanner walks JSON bytes, keeping the path to the current value.
type textScanner struct {
	b    []byte
	i    int
	path []string // ".key" and "[i]" segments
}

func (s *textScanner) field() string {
	f := strings.TrimPrefix(strings.Join(s.path, ""), ".")
	if f == "" {
		return "body"
	}
	return f
}

func (s *textScanner) space() {
	for s.i < len(s.b) && (s.b[s.i] == ' ' || s.b[s.i] == '\t' || s.b[s.i] == '\n' || s.b[s.i] == '\r') {
		s.i++
	}
}

// next skips white space and reports whether the next byte is c.
func (s *textScanner) next(c byte) bool {
	s.space()
	return s.i < len(s.b) && s.b[s.i] == c
}

func (s *textScanner) value(depth int) error {
	s.space()
	if s.i >= len(s.b) || depth > maxTextDepth {
		return errTextSyntax
	}
	switch s.b[s.i] {
	case '{':
		s.i++
		if s.next('}') {
			s.i++
			return nil
		}
		for {
			if !s.next('"') {
				return errTextSyntax
			}
			start := s.i
			problem, err := s.str()
			if err != nil {
				return err
			}
			key := string(s.b[start+1 : s.i-1])
			if problem != "" {
				return schema.Invalid(s.field(), "key %s %s", strconv.QuoteToASCII(key), problem)
			}
			if !s.next(':') {
				return errTextSyntax
			}
			s.i++
			s.path = append(s.path, "."+key)
			if err := s.value(depth + 1); err != nil {
				return err
			}
			s.path = s.path[:len(s.path)-1]
			if more, err := s.more('}'); !more {
				return err
			}
		}
	case '[':
		s.i++
		if s.next(']') {
			s.i++
			return nil
		}
		for n := 0; ; n++ {
			s.path = append(s.path, "["+strconv.Itoa(n)+"]")
			if err := s.value(depth + 1); err != nil {
				return err
			}
			s.path = s.path[:len(s.path)-1]
			if more, err := s.more(']'); !more {
				return err
			}
		}
	case '"':
		problem, err := s.str()
		if err != nil {
			return err
		}
		if problem != "" {
			return schema.Invalid(s.field(), "%s", problem)
		}
		return nil
	}
	// A number, true, false or null: the decoder checks which.
	start := s.i
	for s.i < len(s.b) && strings.IndexByte(",:{}[]\" \t\r\n", s.b[s.i]) < 0 {
		s.i++
	}
	if s.i == start {
		return errTextSyntax
	}
	return nil
}

// str reads the string starting at the opening quote at s.i, up to and
// past its closing quote, and names the first problem of its text, if any.
func (s *textScanner) str() (problem string, err error) {
	s.i++
	for s.i < len(s.b) {
		c := s.b[s.i]
		switch {
		case c == '"':
			s.i++
			return problem, nil
		case c == '\\':
			if s.i+1 >= len(s.b) {
				return "", errTextSyntax
			}
			if s.b[s.i+1] == 'u' {
				if s.i+6 > len(s.b) {
					return "", errTextSyntax
				}
				if string(s.b[s.i+2:s.i+6]) == "0000" && problem == "" {
					problem = "must not contain NUL (\\u0000)"
				}
				s.i += 6
				continue
			}
			s.i += 2
		case c == 0:
			if problem == "" {
				problem = "must not contain NUL (\\u0000)"
			}
			s.i++
		case c < 0x20:
			return "", errTextSyntax
		case c < utf8.RuneSelf:
			s.i++
		default:
			r, size := utf8.DecodeRune(s.b[s.i:])
			if r == utf8.RuneError && size == 1 && problem == "" {
				problem = "must be valid UTF-8"
			}
			s.i += size
		}
	}
	return "", errTextSyntax
}

// more follows a member or an element: true after a ",", false (and nil)
// after closer, which ends the object or array; anything else is a syntax
// error.
func (s *textScanner) more(closer byte) (bool, error) {
	switch {
	case s.next(','):
		s.i++
		return true, nil
	case s.next(closer):
		s.i++
		return false, nil
	}
	return false, errTextSyntax
}
