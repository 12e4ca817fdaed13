package jsonw

import (
	"encoding/json"
	"math"
	"strconv"
	"unicode/utf8"
)

const hexDigits = "0123456789abcdef"

// String appends s quoted as json.Marshal does: HTML characters, control
// characters, U+2028 and U+2029 escaped, invalid UTF-8 replaced by U+FFFD.
func String(b []byte, s string) []byte { return appendString(b, s, true) }

// StringNoHTML is String without escaping <, > and &, as an Encoder with
// SetEscapeHTML(false) writes it.
func StringNoHTML(b []byte, s string) []byte { return appendString(b, s, false) }

func appendString(b []byte, s string, html bool) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && (!html || (c != '<' && c != '>' && c != '&')) {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '\\', '"':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// Bytes is String of p's text, without a copy when none of it needs
// escaping.
func Bytes(b, p []byte) []byte {
	for _, c := range p {
		if !plain[c] {
			return String(b, string(p))
		}
	}
	b = append(b, '"')
	b = append(b, p...)
	return append(b, '"')
}

// plain is true for the bytes String writes as they are.
var plain = func() (t [256]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\' && c != '<' && c != '>' && c != '&'
	}
	return t
}()

// Raw appends raw, a JSON value read from storage, as json.Marshal writes
// a json.RawMessage: compacted, with <, >, & and U+2028, U+2029 escaped,
// nil as null. A value that is not JSON is written as null, where
// encoding/json would refuse the whole document.
func Raw(b, raw []byte) []byte {
	if raw == nil || !json.Valid(raw) {
		return append(b, "null"...)
	}
	return Compact(b, raw)
}

// RawNoHTML is Raw as an Encoder with SetEscapeHTML(false) writes it:
// compacted, nothing escaped.
func RawNoHTML(b, raw []byte) []byte {
	if raw == nil || !json.Valid(raw) {
		return append(b, "null"...)
	}
	return compact(b, raw, false)
}

// Compact appends raw, valid JSON, as json.Marshal writes a
// json.RawMessage holding it: compacted, with <, >, & and U+2028, U+2029
// escaped.
func Compact(b, raw []byte) []byte { return compact(b, raw, true) }

func compact(b, raw []byte, html bool) []byte {
	start, inString, escaped := 0, false, false
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		if !inString {
			switch c {
			case ' ', '\t', '\n', '\r':
				b = append(b, raw[start:i]...)
				start = i + 1
			case '"':
				inString = true
			}
			continue
		}
		if escaped {
			escaped = false
			continue
		}
		switch c {
		case '\\':
			escaped = true
		case '"':
			inString = false
		case '<', '>', '&':
			if html {
				b = append(b, raw[start:i]...)
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
				start = i + 1
			}
		case 0xE2: // U+2028, U+2029: E2 80 A8, E2 80 A9
			if html && i+2 < len(raw) && raw[i+1] == 0x80 && raw[i+2]&^1 == 0xA8 {
				b = append(b, raw[start:i]...)
				b = append(b, '\\', 'u', '2', '0', '2', hexDigits[raw[i+2]&0xF])
				i += 2
				start = i + 1
			}
		}
	}
	return append(b, raw[start:]...)
}

// List appends s as a JSON array, each element by item; nil is null, as
// encoding/json writes a nil slice.
func List[T any](b []byte, s []T, item func(*T, []byte) []byte) []byte {
	if s == nil {
		return append(b, "null"...)
	}
	return Array(b, s, item)
}

// Array is List with nil written as [].
func Array[T any](b []byte, s []T, item func(*T, []byte) []byte) []byte {
	b = append(b, '[')
	for i := range s {
		if i > 0 {
			b = append(b, ',')
		}
		b = item(&s[i], b)
	}
	return append(b, ']')
}

// Float appends f as json.Marshal writes a float64: the shortest text
// that reads back as f, in exponent form below 1e-6 and from 1e21 on
// (1e-07 written 1e-7). NaN and infinities, which JSON cannot hold and
// json.Marshal refuses, are written as null.
func Float(b []byte, f float64) []byte {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return append(b, "null"...)
	}
	if i := int64(f); float64(i) == f && i > -1e15 && i < 1e15 && (i != 0 || !math.Signbit(f)) {
		return strconv.AppendInt(b, i, 10) // a whole number: its digits (-0 is "-0", below)
	}
	format := byte('f')
	if abs := math.Abs(f); abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	b = strconv.AppendFloat(b, f, format, -1, 64)
	if format == 'e' {
		if n := len(b); n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
	}
	return b
}
