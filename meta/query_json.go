package meta

import (
	"strconv"
	"time"
	"unicode/utf8"
)

// The list pages' JSON is written by hand: the same bytes as encoding/json
// writes for Page, Device and Product (TestAppendJSON compares them), without
// its reflection and the re-scan of every MarshalJSON result.

// AppendPageJSON appends p as encoding/json would, each item by item; a
// page from the page cache carries its JSON, written by the same encoders,
// and is copied.
func AppendPageJSON[T any](b []byte, p *Page[T], item func(*T, []byte) []byte) []byte {
	if p.json != nil {
		return append(b, p.json...)
	}
	b = append(b, `{"pageIndex":`...)
	b = strconv.AppendInt(b, int64(p.PageIndex), 10)
	b = append(b, `,"pageSize":`...)
	b = strconv.AppendInt(b, int64(p.PageSize), 10)
	b = append(b, `,"total":`...)
	b = strconv.AppendInt(b, int64(p.Total), 10)
	b = append(b, `,"totalExact":`...)
	b = strconv.AppendBool(b, p.TotalExact)
	b = append(b, `,"data":`...)
	if p.Data == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '[')
		for i := range p.Data {
			if i > 0 {
				b = append(b, ',')
			}
			b = item(&p.Data[i], b)
		}
		b = append(b, ']')
	}
	return append(b, '}')
}

// appendField appends ,"name": (no comma before the first field: first).
func appendField(b []byte, name string, first bool) []byte {
	if !first {
		b = append(b, ',')
	}
	b = append(b, '"')
	b = append(b, name...)
	return append(b, '"', ':')
}

func appendStringField(b []byte, name, v string) []byte {
	return appendJSONString(appendField(b, name, false), v)
}

func appendBoolField(b []byte, name string, v bool) []byte {
	return strconv.AppendBool(appendField(b, name, false), v)
}

func appendEnumField(b []byte, name string, v Enum) []byte {
	return v.appendJSON(appendField(b, name, false))
}

func appendMillisField(b []byte, name string, v Millis) []byte {
	return v.appendJSON(appendField(b, name, false))
}

// appendJSON appends e as MarshalJSON writes it.
func (e Enum) appendJSON(b []byte) []byte {
	b = append(b, `{"text":`...)
	b = appendJSONString(b, e.Text())
	b = append(b, `,"value":`...)
	b = appendJSONString(b, string(e))
	return append(b, '}')
}

// appendJSON appends m as MarshalJSON writes it.
func (m Millis) appendJSON(b []byte) []byte {
	t := time.Time(m)
	if t.IsZero() {
		return append(b, '0')
	}
	return strconv.AppendInt(b, t.UnixMilli(), 10)
}

const hexDigits = "0123456789abcdef"

// appendJSONString appends s quoted as encoding/json.Marshal does: HTML
// characters, control characters, U+2028 and U+2029 escaped, invalid UTF-8
// replaced by U+FFFD.
func appendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
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
