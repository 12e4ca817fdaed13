package wire

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"unicode/utf8"
	"unsafe"
)

// scanner is a minimal validating JSON reader over a byte slice: enough to
// walk an object's keys and take each value's raw span, without building
// a tree.
type scanner struct {
	b []byte
	i int
}

func malformed(s *scanner, what string) error {
	return fmt.Errorf("%s at byte %d: %w", what, s.i, ErrMalformed)
}

func (s *scanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

func (s *scanner) peek() byte {
	s.ws()
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

func (s *scanner) end() error {
	s.ws()
	if s.i != len(s.b) {
		return malformed(s, "trailing data")
	}
	return nil
}

// object reads {"key": value, ...}, calling field with the scanner on each
// value, which field must consume.
func (s *scanner) object(depth int, field func(key string) error) error {
	if depth > maxDepth {
		return malformed(s, "nesting too deep")
	}
	if s.peek() != '{' {
		return malformed(s, "expected object")
	}
	s.i++
	if s.peek() == '}' {
		s.i++
		return nil
	}
	for {
		if s.peek() != '"' {
			return malformed(s, "expected key")
		}
		key, err := s.str()
		if err != nil {
			return err
		}
		if s.peek() != ':' {
			return malformed(s, "expected ':'")
		}
		s.i++
		s.ws()
		if err := field(key); err != nil {
			return err
		}
		switch s.peek() {
		case ',':
			s.i++
		case '}':
			s.i++
			return nil
		default:
			return malformed(s, "expected ',' or '}'")
		}
	}
}

// skip consumes one value, validating it.
func (s *scanner) skip(depth int) error {
	if depth > maxDepth {
		return malformed(s, "nesting too deep")
	}
	switch c := s.peek(); c {
	case '{':
		return s.object(depth+1, func(string) error { return s.skip(depth + 1) })
	case '[':
		s.i++
		if s.peek() == ']' {
			s.i++
			return nil
		}
		for {
			if err := s.skip(depth + 1); err != nil {
				return err
			}
			switch s.peek() {
			case ',':
				s.i++
			case ']':
				s.i++
				return nil
			default:
				return malformed(s, "expected ',' or ']'")
			}
		}
	case '"':
		_, _, err := s.strSpan()
		return err
	case 't':
		return s.lit("true")
	case 'f':
		return s.lit("false")
	case 'n':
		return s.lit("null")
	default:
		txt, err := s.number()
		if err != nil {
			return err
		}
		// A number that no float64 holds (1e700) is refused everywhere, as
		// encoding/json refuses it: readers of the stored payload decode it
		// with standard JSON libraries.
		if len(txt) > 15 || bytes.ContainsAny(txt, "eE") {
			if _, err := strconv.ParseFloat(string(txt), 64); err != nil {
				return malformed(s, "number out of range")
			}
		}
		return nil
	}
}

func (s *scanner) lit(w string) error {
	if len(s.b)-s.i < len(w) || string(s.b[s.i:s.i+len(w)]) != w {
		return malformed(s, "bad literal")
	}
	s.i += len(w)
	return nil
}

// number consumes a JSON number and returns its text.
func (s *scanner) number() ([]byte, error) {
	start := s.i
	b := s.b
	i := s.i
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		i = digits(b, i)
	default:
		return nil, malformed(s, "bad value")
	}
	if i < len(b) && b[i] == '.' {
		d := i + 1
		if i = digits(b, d); i == d {
			s.i = i
			return nil, malformed(s, "bad number")
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		d := i
		if i = digits(b, d); i == d {
			s.i = i
			return nil, malformed(s, "bad number")
		}
	}
	s.i = i
	return b[start:i], nil
}

// digits returns the index of the first non-digit of b at or after i.
func digits(b []byte, i int) int {
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		i++
	}
	return i
}

// strSpan consumes a string; it returns the span between the quotes and
// whether it holds escapes.
func (s *scanner) strSpan() (span []byte, escaped bool, err error) {
	if s.peek() != '"' {
		return nil, false, malformed(s, "expected string")
	}
	s.i++
	start := s.i
	b := s.b
	for i := start; i < len(b); i++ {
		switch c := b[i]; {
		case c == '"':
			s.i = i + 1
			return b[start:i], escaped, nil
		case c == '\\':
			escaped = true
			i++
			if i >= len(b) {
				break
			}
			switch b[i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if i+4 >= len(b) {
					s.i = i
					return nil, false, malformed(s, "bad escape")
				}
				for _, h := range b[i+1 : i+5] {
					if !isHex(h) {
						s.i = i
						return nil, false, malformed(s, "bad escape")
					}
				}
				i += 4
			default:
				s.i = i
				return nil, false, malformed(s, "bad escape")
			}
		case c < 0x20:
			s.i = i
			return nil, false, malformed(s, "control character in string")
		}
	}
	s.i = len(b)
	return nil, false, malformed(s, "unterminated string")
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

// str consumes a string and returns its value.
func (s *scanner) str() (string, error) {
	start := s.i
	span, esc, err := s.strSpan()
	if err != nil {
		return "", err
	}
	if !esc && utf8.Valid(span) {
		return view(span), nil
	}
	var v string
	if err := json.Unmarshal(s.b[start:s.i], &v); err != nil {
		return "", malformed(s, "bad string")
	}
	return v, nil
}

// scalarString reads a string, or a number/bool taken as its text; null is "".
func (s *scanner) scalarString() (string, error) {
	switch s.peek() {
	case '"':
		return s.str()
	case '{', '[':
		return "", malformed(s, "expected string")
	case 'n':
		return "", s.lit("null")
	}
	start := s.i
	if err := s.skip(0); err != nil {
		return "", err
	}
	return view(s.b[start:s.i]), nil
}

// view is b as a string without a copy. Decoded rows refer to their
// payload already (Message.Payload), which must not change while they are
// in use, so its strings may as well: a copy of each property id and
// message id was a twelfth of devicehub's CPU at full ingest load, and
// the writer copies the rows it keeps.
func view(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(&b[0], len(b))
}

// parseNumber parses a JSON number that scanner.number has checked. Most
// device values are short decimals ("21.5", "-3", "1013.25"): with at most
// 15 digits, the digits as an integer and the power of ten of the fraction
// are both exact float64s, so one division gives the correctly rounded
// value that strconv.ParseFloat would, without its general parser, which
// was a fifth of decoding a report. Anything else goes to strconv.
func parseNumber(txt []byte) (float64, error) {
	i, neg := 0, false
	if len(txt) > 0 && txt[0] == '-' {
		i, neg = 1, true
	}
	var mant uint64
	nd, frac := 0, -1 // digits; digits after the point, -1 before it
	for ; i < len(txt); i++ {
		switch c := txt[i]; {
		case c >= '0' && c <= '9':
			mant = mant*10 + uint64(c-'0')
			nd++
			if frac >= 0 {
				frac++
			}
		case c == '.' && frac < 0:
			frac = 0
		default: // an exponent
			return strconv.ParseFloat(view(txt), 64)
		}
	}
	if nd == 0 || nd > 15 {
		return strconv.ParseFloat(view(txt), 64)
	}
	f := float64(mant)
	if frac > 0 {
		f /= float64pow10[frac]
	}
	if neg {
		f = -f
	}
	return f, nil
}

var float64pow10 = [16]float64{1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15}
