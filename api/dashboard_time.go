package api

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

// parseJavaPattern accepts the letters y, M, d, H, h, m, s, S, a, E; other
// ASCII letters must be quoted, as in Java.
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
			if !strings.ContainsRune("yMdHhmsSaE", r) {
				return nil, fmt.Errorf("unsupported pattern letter %q in %q (use yyyy, MM, dd, HH, mm, ss, SSS or quote literals)", r, p)
			}
			j := i
			for j < len(rs) && rs[j] == r {
				j++
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

func (l javaLayout) format(t time.Time) string {
	var b strings.Builder
	num := func(v, width int) {
		s := strconv.Itoa(v)
		for k := len(s); k < width; k++ {
			b.WriteByte('0')
		}
		b.WriteString(s)
	}
	for _, tok := range l {
		switch tok.letter {
		case 0:
			b.WriteString(tok.text)
		case 'y':
			if tok.width == 2 {
				num(t.Year()%100, 2)
			} else {
				num(t.Year(), tok.width)
			}
		case 'M':
			switch {
			case tok.width >= 4:
				b.WriteString(t.Month().String())
			case tok.width == 3:
				b.WriteString(t.Month().String()[:3])
			default:
				num(int(t.Month()), tok.width)
			}
		case 'd':
			num(t.Day(), tok.width)
		case 'H':
			num(t.Hour(), tok.width)
		case 'h':
			h := t.Hour() % 12
			if h == 0 {
				h = 12
			}
			num(h, tok.width)
		case 'm':
			num(t.Minute(), tok.width)
		case 's':
			num(t.Second(), tok.width)
		case 'S':
			num(t.Nanosecond()/int(time.Millisecond), tok.width)
		case 'a':
			if t.Hour() < 12 {
				b.WriteString("AM")
			} else {
				b.WriteString("PM")
			}
		case 'E':
			if tok.width >= 4 {
				b.WriteString(t.Weekday().String())
			} else {
				b.WriteString(t.Weekday().String()[:3])
			}
		}
	}
	return b.String()
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
	var ms int64
	var s string
	switch {
	case json.Unmarshal(raw, &ms) == nil:
		t = time.UnixMilli(ms).In(loc)
		err = tsdb.CheckTime(t)
	case json.Unmarshal(raw, &s) == nil:
		t, err = tsdb.ParseTime(strings.TrimSpace(s), now, loc)
	default:
		return time.Time{}, schema.Invalid(field, "must be epoch milliseconds or date math like now-7d")
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("%s: %w", field, err)
	}
	return t, nil
}
