package dashboard

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"devicehub/schema"
	"devicehub/tsdb"
)

// javaLayout is a parsed Java-style date pattern (yyyy-MM-dd, MM月dd日,
// 'quoted' literals), formatted without reflection per call.
type javaLayout []javaToken

type javaToken struct {
	letter rune // 0 for literal text
	width  int
	text   string
}

// patternLetters are the pattern letters parseJavaPattern accepts, as
// Java's DateTimeFormatter reads them: year, month, day, hour (0-23,
// 1-12), minute, second, millisecond, AM/PM, weekday, and the zone: z
// (its abbreviation, "CST"; zzzz its name, "Asia/Shanghai"), Z (+0800),
// X (+08, Z at UTC; XX +0800, XXX +08:00), x (as X, never Z), VV (its
// name).
const patternLetters = "yMdHhmsSaEzZXxV"

// patternHelp is the pattern error's list of what works.
const patternHelp = "use yyyy, yy, M, MM, MMM, MMMM, d, dd, H, HH, h, hh, m, mm, s, ss, SSS, a, EEE, EEEE, z, zzzz, Z, X, XX, XXX, x, xx, xxx, VV, or quote literals"

// parseJavaPattern accepts the letters of patternLetters; other ASCII
// letters must be quoted, as in Java.
func parseJavaPattern(p string) (javaLayout, error) {
	if len(p) > 64 {
		return nil, fmt.Errorf("must be at most 64 characters")
	}
	var out javaLayout
	rs := []rune(p)
	for i := 0; i < len(rs); {
		r := rs[i]
		switch {
		case r == '\'':
			j := i + 1
			var lit strings.Builder
			for ; j < len(rs); j++ {
				if rs[j] == '\'' {
					if j+1 < len(rs) && rs[j+1] == '\'' { // '' is a quote
						lit.WriteRune('\'')
						j++
						continue
					}
					break
				}
				lit.WriteRune(rs[j])
			}
			if j >= len(rs) {
				return nil, fmt.Errorf("unterminated quote in %q", p)
			}
			if j == i+1 {
				lit.WriteRune('\'')
			}
			out = append(out, javaToken{text: lit.String()})
			i = j + 1
		case (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z'):
			if !strings.ContainsRune(patternLetters, r) {
				return nil, fmt.Errorf("unsupported pattern letter %q in %q (%s)", r, p, patternHelp)
			}
			j := i
			for j < len(rs) && rs[j] == r {
				j++
			}
			switch w := j - i; {
			case r == 'V' && w != 2:
				return nil, fmt.Errorf("pattern letter V must be VV (the zone's name) in %q", p)
			case (r == 'X' || r == 'x') && w > 3, r == 'Z' && w > 3, r == 'z' && w > 4:
				return nil, fmt.Errorf("too many pattern letters %q in %q (%s)", string(rs[i:j]), p, patternHelp)
			}
			out = append(out, javaToken{letter: r, width: j - i})
			i = j
		default:
			out = append(out, javaToken{text: string(r)})
			i++
		}
	}
	return out, nil
}

func (l javaLayout) format(t time.Time) string { return string(l.appendFormat(nil, t)) }

// appendFormat appends t as format writes it.
func (l javaLayout) appendFormat(b []byte, t time.Time) []byte {
	num := func(b []byte, v, width int) []byte {
		if v >= 0 && v < 10000 { // years, days, hours...
			var d [4]byte
			n := len(d)
			for {
				n--
				d[n] = byte('0' + v%10)
				if v /= 10; v == 0 {
					break
				}
			}
			for k := len(d) - n; k < width; k++ {
				b = append(b, '0')
			}
			return append(b, d[n:]...)
		}
		var digits [24]byte
		d := strconv.AppendInt(digits[:0], int64(v), 10)
		for k := len(d); k < width; k++ {
			b = append(b, '0')
		}
		return append(b, d...)
	}
	year, month, day := t.Date()
	hour, minute, second := t.Clock()
	for _, tok := range l {
		switch tok.letter {
		case 0:
			b = append(b, tok.text...)
		case 'y':
			if tok.width == 2 {
				b = num(b, year%100, 2)
			} else {
				b = num(b, year, tok.width)
			}
		case 'M':
			switch {
			case tok.width >= 4:
				b = append(b, month.String()...)
			case tok.width == 3:
				b = append(b, month.String()[:3]...)
			default:
				b = num(b, int(month), tok.width)
			}
		case 'd':
			b = num(b, day, tok.width)
		case 'H':
			b = num(b, hour, tok.width)
		case 'h':
			h := hour % 12
			if h == 0 {
				h = 12
			}
			b = num(b, h, tok.width)
		case 'm':
			b = num(b, minute, tok.width)
		case 's':
			b = num(b, second, tok.width)
		case 'S':
			b = num(b, t.Nanosecond()/int(time.Millisecond), tok.width)
		case 'a':
			if hour < 12 {
				b = append(b, "AM"...)
			} else {
				b = append(b, "PM"...)
			}
		case 'E':
			if tok.width >= 4 {
				b = append(b, t.Weekday().String()...)
			} else {
				b = append(b, t.Weekday().String()[:3]...)
			}
		case 'z':
			if tok.width >= 4 {
				b = append(b, t.Location().String()...)
			} else {
				name, _ := t.Zone()
				b = append(b, name...)
			}
		case 'V':
			b = append(b, t.Location().String()...)
		case 'Z':
			b = appendOffset(b, t, 2, false)
		case 'X', 'x':
			b = appendOffset(b, t, tok.width, tok.letter == 'X')
		}
	}
	return b
}

// appendOffset appends t's offset from UTC as Java's X (zulu: "Z" at
// UTC) or x and Z write it: width 1 "+08" (with minutes "+0530"), 2
// "+0800", 3 "+08:00".
func appendOffset(b []byte, t time.Time, width int, zulu bool) []byte {
	_, off := t.Zone()
	if off == 0 && zulu {
		return append(b, 'Z')
	}
	sign := byte('+')
	if off < 0 {
		sign, off = '-', -off
	}
	h, m := off/3600, off/60%60
	b = append(b, sign, byte('0'+h/10), byte('0'+h%10))
	switch {
	case width == 3:
		b = append(b, ':', byte('0'+m/10), byte('0'+m%10))
	case width == 2 || m != 0:
		b = append(b, byte('0'+m/10), byte('0'+m%10))
	}
	return b
}

// epochMillis reads raw, a JSON number of at most 18 digits (no fraction
// or exponent), as json.Unmarshal into an int64 does, and says whether it
// did; anything else is left to json.Unmarshal.
func epochMillis(raw []byte) (int64, bool) {
	digits := raw
	if len(digits) > 0 && digits[0] == '-' {
		digits = digits[1:]
	}
	if len(digits) == 0 || len(digits) > 18 || (digits[0] == '0' && len(digits) > 1) {
		return 0, false
	}
	var v int64
	for _, c := range digits {
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + int64(c-'0')
	}
	if len(digits) < len(raw) {
		v = -v
	}
	return v, true
}

// parseTimeParam reads a time parameter: epoch milliseconds (a JSON number
// or numeric string) or date math relative to now such as now-7d/d, which
// tsdb.ParseTime evaluates in the platform zone loc; absent gives def.
// Errors name field.
func parseTimeParam(field string, raw json.RawMessage, now time.Time, loc *time.Location, def time.Time) (time.Time, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return def, nil
	}
	var t time.Time
	var err error
	if ms, ok := epochMillis(raw); ok {
		t = time.UnixMilli(ms).In(loc)
		err = tsdb.CheckTime(t)
	} else if t, ok, err = parseTimeJSON(raw, now, loc); !ok {
		return time.Time{}, schema.Invalid(field, "must be epoch milliseconds or date math like now-7d")
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("%s: %w", field, err)
	}
	return t, nil
}

// parseTimeJSON is parseTimeParam of a parameter that is not a plain
// integer: its time, whether it is either kind of time parameter at all,
// and the error of checking the time.
func parseTimeJSON(raw json.RawMessage, now time.Time, loc *time.Location) (time.Time, bool, error) {
	var ms int64
	var s string
	switch {
	case json.Unmarshal(raw, &ms) == nil:
		t := time.UnixMilli(ms).In(loc)
		return t, true, tsdb.CheckTime(t)
	case json.Unmarshal(raw, &s) == nil:
		t, err := tsdb.ParseTime(strings.TrimSpace(s), now, loc)
		return t, true, err
	}
	return time.Time{}, false, nil
}
