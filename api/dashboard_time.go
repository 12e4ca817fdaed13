package api

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"devicehub/meta"
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

// dateMath matches now, now-7d, now+1h, now-1M/d (rounded down to the unit).
var dateMath = regexp.MustCompile(`^now((?:[+-]\d{1,6}[smhdwMy])*)(?:/([smhdwMy]))?$`)
var dateMathTerm = regexp.MustCompile(`([+-])(\d{1,6})([smhdwMy])`)

// parseTimeParam reads epoch ms (number or numeric string) or date math
// relative to now; absent gives def.
func parseTimeParam(field string, raw json.RawMessage, now, def time.Time) (time.Time, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return def, nil
	}
	var ms int64
	if err := json.Unmarshal(raw, &ms); err == nil {
		return checkTime(field, time.UnixMilli(ms))
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return time.Time{}, meta.Invalid(field, "must be epoch milliseconds or date math like now-7d")
	}
	s = strings.TrimSpace(s)
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		return checkTime(field, time.UnixMilli(n))
	}
	m := dateMath.FindStringSubmatch(s)
	if m == nil {
		return time.Time{}, meta.Invalid(field, "must be epoch milliseconds or date math like now-7d (got %q)", s)
	}
	t := now
	for _, term := range dateMathTerm.FindAllStringSubmatch(m[1], -1) {
		n, _ := strconv.Atoi(term[2])
		if term[1] == "-" {
			n = -n
		}
		t = addUnit(t, term[3], n)
	}
	if m[2] != "" {
		t = roundDown(t, m[2])
	}
	return checkTime(field, t)
}

func addUnit(t time.Time, unit string, n int) time.Time {
	switch unit {
	case "s":
		return t.Add(time.Duration(n) * time.Second)
	case "m":
		return t.Add(time.Duration(n) * time.Minute)
	case "h":
		return t.Add(time.Duration(n) * time.Hour)
	case "d":
		return t.AddDate(0, 0, n)
	case "w":
		return t.AddDate(0, 0, 7*n)
	case "M":
		return t.AddDate(0, n, 0)
	}
	return t.AddDate(n, 0, 0)
}

func roundDown(t time.Time, unit string) time.Time {
	y, mo, d := t.Date()
	switch unit {
	case "s":
		return t.Truncate(time.Second)
	case "m":
		return t.Truncate(time.Minute)
	case "h":
		return time.Date(y, mo, d, t.Hour(), 0, 0, 0, t.Location())
	case "d":
		return time.Date(y, mo, d, 0, 0, 0, 0, t.Location())
	case "w":
		d0 := time.Date(y, mo, d, 0, 0, 0, 0, t.Location())
		return d0.AddDate(0, 0, -((int(d0.Weekday()) + 6) % 7))
	case "M":
		return time.Date(y, mo, 1, 0, 0, 0, 0, t.Location())
	}
	return time.Date(y, 1, 1, 0, 0, 0, 0, t.Location())
}

// checkTime keeps times within what ClickHouse's DateTime holds.
func checkTime(field string, t time.Time) (time.Time, error) {
	if t.Year() < 1971 || t.Year() > 2105 {
		return time.Time{}, meta.Invalid(field, "must be between 1971 and 2105")
	}
	return t, nil
}
