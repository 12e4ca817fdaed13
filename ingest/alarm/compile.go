package alarm

import (
	"encoding/json"
	"strconv"
	"strings"

	"devicehub/schema"
)

// A value as the evaluator holds it: a number (numbers, booleans as 0/1,
// dates as epoch ms) and its text.
type value struct {
	Num  float64 `json:"n,omitempty"`
	Str  string  `json:"s,omitempty"`
	Kind uint8   `json:"k,omitempty"`
}

// Value kinds.
const (
	kindNumber uint8 = iota
	kindString
	kindBool
	kindJSON
)

// NumberValue, StringValue, BoolValue and JSONValue make a Prop's value.
func NumberValue(f float64) Value { return Value{v: value{Num: f, Kind: kindNumber}} }

// StringValue is a text value.
func StringValue(s string) Value { return Value{v: value{Str: s, Kind: kindString}} }

// BoolValue is a boolean value.
func BoolValue(b bool) Value {
	if b {
		return Value{v: value{Num: 1, Str: "true", Kind: kindBool}}
	}
	return Value{v: value{Str: "false", Kind: kindBool}}
}

// JSONValue is an object or array value, kept as its text.
func JSONValue(raw string) Value { return Value{v: value{Str: raw, Kind: kindJSON}} }

// Value is a reported value (of a property or an event field).
type Value struct{ v value }

func (v value) text() string {
	if v.Kind == kindNumber {
		return strconv.FormatFloat(v.Num, 'f', -1, 64)
	}
	return v.Str
}

func (v value) numeric() (float64, bool) {
	switch v.Kind {
	case kindNumber, kindBool:
		return v.Num, true
	case kindString:
		f, err := strconv.ParseFloat(strings.TrimSpace(v.Str), 64)
		return f, err == nil
	}
	return 0, false
}

// compiled is a validated rule ready to evaluate.
type compiled struct {
	Rule
	base    uint8 // severity rank
	trigger group
	clear   group
	ladder  []rung
	props   map[string]bool // properties its conditions read
}

type rung struct {
	rank uint8
	g    group
}

type group struct {
	any   bool
	items []item
}

type item struct {
	leaf *leaf
	sub  *group
}

type leaf struct {
	prop    string
	op      string
	of      string
	num, hi float64
	str     string
	kind    uint8 // how to compare: kindNumber, kindBool (num 0/1) or kindString (text)
	refKind string
	refID   string
	hasDef  bool // a value is there when the ref is missing
}

// compile turns a rule validated against m into its evaluable form.
func compile(r Rule, m *schema.ThingModel) *compiled {
	if m == nil {
		m = schema.EmptyThingModel()
	}
	c := &compiled{Rule: r, base: severityRank[r.Severity], props: map[string]bool{}}
	var fields []schema.Property
	if r.Trigger.Type == TriggerEvent {
		if ev := findEvent(m, r.Trigger.Event); ev != nil && ev.ValueType.Type == schema.TypeObject {
			fields = ev.ValueType.Properties
		}
	} else {
		fields = m.Properties
	}
	c.trigger = compileGroup(&r.Trigger.Group, fields, c.props)
	c.clear = compileGroup(&r.Clear.Group, fields, c.props)
	for _, s := range r.Ladder {
		c.ladder = append(c.ladder, rung{rank: severityRank[s.Severity], g: compileGroup(&s.Group, fields, c.props)})
	}
	if r.Trigger.Type == TriggerEvent {
		c.props = nil // event fields, not device properties
	}
	if r.Trigger.Property != "" {
		c.props[r.Trigger.Property] = true // nodata: which reports count
	}
	return c
}

func compileGroup(g *Group, fields []schema.Property, props map[string]bool) group {
	out := group{any: len(g.Any) > 0}
	list := g.All
	if out.any {
		list = g.Any
	}
	for i := range list {
		c := &list[i]
		if c.Property == "" {
			sub := compileGroup(&c.Group, fields, props)
			out.items = append(out.items, item{sub: &sub})
			continue
		}
		out.items = append(out.items, item{leaf: compileLeaf(c, fields, props)})
	}
	return out
}

func compileLeaf(c *Condition, fields []schema.Property, props map[string]bool) *leaf {
	l := &leaf{prop: c.Property, op: c.Op, of: c.Of, kind: kindString}
	props[c.Property] = true
	var vt *schema.ValueType
	if p := findProp(fields, c.Property); p != nil {
		vt = &p.ValueType
	}
	switch {
	case c.Of == OfChange || c.Of == OfRate, vt == nil, vt.IsNumeric(), vt.Type == schema.TypeDate:
		l.kind = kindNumber
	case vt.Type == schema.TypeBoolean:
		l.kind = kindBool
	}
	if c.Ref != "" {
		l.refKind, l.refID, _ = strings.Cut(c.Ref, ".")
		if l.refKind == "property" {
			props[l.refID] = true
		}
	}
	if c.Value != nil {
		l.hasDef = true
		switch {
		case c.Op == OpBetween:
			var pair []json.RawMessage
			_ = json.Unmarshal(c.Value, &pair)
			if len(pair) == 2 {
				l.num, _ = jsonNumber(pair[0])
				l.hi, _ = jsonNumber(pair[1])
			}
		case l.kind == kindNumber:
			l.num, _ = jsonNumber(c.Value)
		case l.kind == kindBool:
			b, _ := boolValue(vt, c.Value)
			if b {
				l.num = 1
			}
		default:
			l.str, _ = scalarText(c.Value)
		}
	}
	return l
}

// env is what conditions read: current values, and for reports the
// previous value of the properties this message carries.
type env interface {
	// current is the latest value of prop.
	current(prop string) (value, bool)
	// fresh is the value of prop in this message, its previous value and
	// the seconds between them; ok false when the message does not carry
	// prop, hasPrev false when there was no earlier value.
	fresh(prop string) (cur, prev value, dt float64, ok, hasPrev bool)
	// ref is a device value a threshold names.
	ref(kind, id string) (value, bool)
	// lack records that a threshold's device value was missing and the
	// condition had no default: the rule is not evaluated.
	lack()
}

func (g *group) eval(e env) bool {
	if len(g.items) == 0 {
		return false
	}
	for i := range g.items {
		it := &g.items[i]
		var ok bool
		if it.leaf != nil {
			ok = it.leaf.eval(e)
		} else {
			ok = it.sub.eval(e)
		}
		if g.any && ok {
			return true
		}
		if !g.any && !ok {
			return false
		}
	}
	return !g.any
}

func (l *leaf) eval(e env) bool {
	var x value
	switch {
	case l.op == OpChanged:
		cur, prev, _, ok, hasPrev := e.fresh(l.prop)
		if !ok || !hasPrev {
			return false
		}
		return cur.Kind != prev.Kind || cur.text() != prev.text()
	case l.of == OfChange || l.of == OfRate:
		cur, prev, dt, ok, hasPrev := e.fresh(l.prop)
		if !ok || !hasPrev {
			return false
		}
		a, ok1 := cur.numeric()
		b, ok2 := prev.numeric()
		if !ok1 || !ok2 {
			return false
		}
		d := a - b
		if l.of == OfRate {
			if dt <= 0 {
				return false
			}
			d /= dt
		}
		x = value{Num: d}
	default:
		v, ok := e.current(l.prop)
		if !ok {
			return false
		}
		x = v
	}
	num, hi, str := l.num, l.hi, l.str
	if l.refKind != "" {
		if r, ok := e.ref(l.refKind, l.refID); ok {
			switch l.kind {
			case kindNumber, kindBool:
				f, ok := r.numeric()
				if !ok {
					return false
				}
				num = f
			default:
				str = r.text()
			}
		} else if !l.hasDef {
			e.lack()
			return false
		}
	}
	if l.kind == kindString {
		t := x.text()
		switch l.op {
		case OpEQ:
			return t == str
		case OpNE:
			return t != str
		}
		return false
	}
	f, ok := x.numeric()
	if !ok {
		return false
	}
	switch l.op {
	case OpGT:
		return f > num
	case OpGE:
		return f >= num
	case OpLT:
		return f < num
	case OpLE:
		return f <= num
	case OpEQ:
		return f == num
	case OpNE:
		return f != num
	case OpBetween:
		return f >= num && f <= hi
	}
	return false
}

// touches reports whether a message carrying props can change the
// group's result: a group is evaluated only on reports of its properties.
func (g *group) touches(has func(string) bool) bool {
	for i := range g.items {
		it := &g.items[i]
		if it.leaf != nil {
			if has(it.leaf.prop) || it.leaf.refKind == "property" && has(it.leaf.refID) {
				return true
			}
		} else if it.sub.touches(has) {
			return true
		}
	}
	return false
}

// leaves calls fn for each leaf property, in order.
func (g *group) leaves(fn func(*leaf)) {
	for i := range g.items {
		if g.items[i].leaf != nil {
			fn(g.items[i].leaf)
		} else {
			g.items[i].sub.leaves(fn)
		}
	}
}
