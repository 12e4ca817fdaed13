package alarm

import (
	"strconv"

	"devicehub/schema/jsonw"
)

// A device's row is written by hand: appendRow writes what json.Marshal
// writes for the devRow holding the same state, byte for byte (the keys
// of the struct tags, omitempty's omissions, rule states sorted by id),
// without reflection and without the map a devRow's Rules would be. It
// is read by json.Unmarshal (Restore, Store.Load). TestRowEncoding
// compares both over states of every kind.

// ruleEntry is one rule state of a row: the rule's id and its state (nil
// is written null).
type ruleEntry struct {
	id string
	s  *stateData
}

// sortEntries sorts a row's rule states by id (a few: insertion sort), as
// encoding/json sorts a map's keys.
func sortEntries(es []ruleEntry) {
	for i := 1; i < len(es); i++ {
		for j := i; j > 0 && es[j].id < es[j-1].id; j-- {
			es[j], es[j-1] = es[j-1], es[j]
		}
	}
}

// appendJSON appends r as json.Marshal would write it.
func (r *devRow) appendJSON(b []byte) []byte {
	var es []ruleEntry
	if len(r.Rules) > 0 {
		es = make([]ruleEntry, 0, len(r.Rules))
		for id, s := range r.Rules {
			es = append(es, ruleEntry{id, s})
		}
		sortEntries(es)
	}
	return appendRow(b, &r.devData, es)
}

// appendRow appends the row of dd and the rule states rules (sorted by
// id, each id once; none: no "r").
func appendRow(b []byte, dd *devData, rules []ruleEntry) []byte {
	b = append(b, '{')
	open := len(b)
	if dd.LastAt != 0 {
		b = strconv.AppendInt(append(b, `"t":`...), dd.LastAt, 10)
	}
	if len(dd.Keys) > 0 {
		b = append(sep(b, open), `"k":[`...)
		for i, k := range dd.Keys {
			if i > 0 {
				b = append(b, ',')
			}
			b = jsonw.String(b, k)
		}
		b = append(b, ']')
	}
	if len(dd.Props) > 0 {
		b = dd.Props.appendJSON(append(sep(b, open), `"p":`...))
	}
	if len(rules) > 0 {
		b = append(sep(b, open), `"r":{`...)
		for i, r := range rules {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(jsonw.String(b, r.id), ':')
			if r.s == nil {
				b = append(b, "null"...)
			} else {
				b = r.s.appendJSON(b)
			}
		}
		b = append(b, '}')
	}
	return append(b, '}')
}

// sep appends the comma before a member, unless the object opened at
// open is still empty.
func sep(b []byte, open int) []byte {
	if len(b) > open {
		return append(b, ',')
	}
	return b
}

// MarshalJSON writes ps as appendJSON does, for json.Marshal of a devRow
// or devData (the tests' old layouts, logs).
func (ps props) MarshalJSON() ([]byte, error) { return ps.appendJSON(nil), nil }

// appendJSON writes ps as an object by property id, each a propJSON as
// json.Marshal writes it.
func (ps props) appendJSON(b []byte) []byte {
	b = append(b, '{')
	for i := range ps {
		p := &ps[i]
		if i > 0 {
			b = append(b, ',')
		}
		b = append(jsonw.String(b, p.ID), `:{"c":`...)
		b = p.Cur.appendJSON(b)
		b = strconv.AppendInt(append(b, `,"t":`...), p.At, 10)
		if p.hasPrev {
			b = p.Prev.appendJSON(append(b, `,"p":`...))
		}
		if p.PrevAt != 0 {
			b = strconv.AppendInt(append(b, `,"q":`...), p.PrevAt, 10)
		}
		b = append(b, '}')
	}
	return append(b, '}')
}

// appendJSON writes v as json.Marshal does (value's tags, all omitempty).
func (v *value) appendJSON(b []byte) []byte {
	b = append(b, '{')
	open := len(b)
	if v.Num != 0 {
		b = jsonw.Float(append(b, `"n":`...), v.Num)
	}
	if v.Str != "" {
		b = jsonw.String(append(sep(b, open), `"s":`...), v.Str)
	}
	if v.Kind != 0 {
		b = strconv.AppendUint(append(sep(b, open), `"k":`...), uint64(v.Kind), 10)
	}
	return append(b, '}')
}

// appendJSON writes s as json.Marshal does (stateData's tags, all
// omitempty, in their order).
func (s *stateData) appendJSON(b []byte) []byte {
	b = append(b, '{')
	open := len(b)
	num := func(b []byte, key string, n int64) []byte {
		if n == 0 {
			return b
		}
		return strconv.AppendInt(append(sep(b, open), key...), n, 10)
	}
	flag := func(b []byte, key string, on bool) []byte {
		if !on {
			return b
		}
		return append(append(sep(b, open), key...), "true"...)
	}
	b = num(b, `"s":`, s.Since)
	if len(s.Hits) > 0 {
		b = append(sep(b, open), `"h":[`...)
		for i, h := range s.Hits {
			if i > 0 {
				b = append(b, ',')
			}
			b = strconv.AppendInt(b, h, 10)
		}
		b = append(b, ']')
	}
	b = flag(b, `"a":`, s.Active)
	b = num(b, `"v":`, int64(s.Sev))
	b = num(b, `"c":`, s.ClearSince)
	b = num(b, `"d":`, s.Deadline)
	b = flag(b, `"o":`, s.Offline)
	b = num(b, `"l":`, s.LastSeen)
	b = num(b, `"r":`, s.RaisedAt)
	return append(b, '}')
}
