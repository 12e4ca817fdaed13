package schema

import (
	"devicehub/schema/jsonw"
	"encoding/json"
	"maps"
	"slices"
	"strconv"
)

// Encoding of a thing model: deterministic and lossless, known fields in a
// fixed order, then the extras sorted by key.

// objWriter appends one JSON object.
type objWriter struct {
	b []byte
	n int
}

func beginObject(b []byte) *objWriter { return &objWriter{b: append(b, '{')} }

func (w *objWriter) key(k string) {
	if w.n > 0 {
		w.b = append(w.b, ',')
	}
	w.n++
	w.b = jsonw.StringNoHTML(w.b, k)
	w.b = append(w.b, ':')
}

func (w *objWriter) str(k, v string, force bool) {
	if v != "" || force {
		w.key(k)
		w.b = jsonw.StringNoHTML(w.b, v)
	}
}

func (w *objWriter) int(k string, v int, force bool) {
	if v != 0 || force {
		w.key(k)
		w.b = strconv.AppendInt(w.b, int64(v), 10)
	}
}

func (w *objWriter) raw(k string, v []byte) {
	if v != nil {
		w.key(k)
		w.b = jsonw.RawNoHTML(w.b, v)
	}
}

func (w *objWriter) end(extra map[string]json.RawMessage, known map[string]bool) []byte {
	for _, k := range slices.Sorted(maps.Keys(extra)) {
		if !known[k] {
			w.key(k)
			w.b = jsonw.RawNoHTML(w.b, extra[k])
		}
	}
	return append(w.b, '}')
}

func (m *ThingModel) appendJSON(b []byte) []byte {
	if m == nil {
		m = &ThingModel{}
	}
	w := beginObject(b)
	w.key("properties")
	w.b = jsonw.Array(w.b, m.Properties, (*Property).appendJSON)
	w.key("events")
	w.b = jsonw.Array(w.b, m.Events, (*Event).appendJSON)
	w.key("functions")
	w.b = jsonw.Array(w.b, m.Functions, (*Function).appendJSON)
	w.key("tags")
	w.b = jsonw.Array(w.b, m.Tags, (*Tag).appendJSON)
	return w.end(m.Extra, knownModel)
}

func (p *Property) appendJSON(b []byte) []byte {
	w := beginObject(b)
	w.str("id", p.ID, true)
	w.str("name", p.Name, true)
	w.str("description", p.Description, p.has&hasDescription != 0)
	w.int("sortsIndex", p.SortsIndex, p.has&hasSortsIndex != 0)
	w.key("valueType")
	w.b = p.ValueType.appendJSON(w.b)
	if p.has&hasExpands != 0 || !p.Expands.isZero() {
		w.key("expands")
		w.b = p.Expands.appendJSON(w.b)
	}
	return w.end(p.Extra, knownProperty)
}

func (x *PropertyExpands) isZero() bool {
	return x.has == 0 && x.Source == "" && x.Type == nil && x.Metrics == nil && len(x.Extra) == 0
}

func (x *PropertyExpands) appendJSON(b []byte) []byte {
	w := beginObject(b)
	w.str("source", x.Source, x.has&hasSource != 0)
	if x.Type != nil {
		w.key("type")
		w.b = jsonw.Array(w.b, x.Type, func(s *string, b []byte) []byte { return jsonw.StringNoHTML(b, *s) })
	}
	if x.Metrics != nil {
		w.key("metrics")
		w.b = jsonw.Array(w.b, x.Metrics, func(r *json.RawMessage, b []byte) []byte { return jsonw.RawNoHTML(b, *r) })
	}
	return w.end(x.Extra, knownPropExp)
}

func (e *Event) appendJSON(b []byte) []byte {
	w := beginObject(b)
	w.str("id", e.ID, true)
	w.str("name", e.Name, true)
	w.str("description", e.Description, e.has&hasDescription != 0)
	w.int("sortsIndex", e.SortsIndex, e.has&hasSortsIndex != 0)
	w.key("valueType")
	w.b = e.ValueType.appendJSON(w.b)
	if e.has&hasExpands != 0 || e.Expands.has != 0 || e.Expands.Level != "" || len(e.Expands.Extra) > 0 {
		w.key("expands")
		ew := beginObject(w.b)
		ew.str("level", e.Expands.Level, e.Expands.has&hasLevel != 0)
		w.b = ew.end(e.Expands.Extra, knownEventExp)
	}
	return w.end(e.Extra, knownEvent)
}

func (fn *Function) appendJSON(b []byte) []byte {
	w := beginObject(b)
	w.str("id", fn.ID, true)
	w.str("name", fn.Name, true)
	w.str("description", fn.Description, fn.has&hasDescription != 0)
	w.int("sortsIndex", fn.SortsIndex, fn.has&hasSortsIndex != 0)
	if fn.Async || fn.has&hasAsync != 0 {
		w.key("async")
		w.b = strconv.AppendBool(w.b, fn.Async)
	}
	if fn.Inputs != nil {
		w.key("inputs")
		w.b = jsonw.Array(w.b, fn.Inputs, (*Property).appendJSON)
	}
	if fn.Output != nil {
		w.key("output")
		w.b = fn.Output.appendJSON(w.b)
	}
	return w.end(fn.Extra, knownFunction)
}

// appendJSON writes a tag as a property: the two have the same fields and
// the same known keys.
func (t *Tag) appendJSON(b []byte) []byte { return (*Property)(t).appendJSON(b) }

func (vt *ValueType) appendJSON(b []byte) []byte {
	w := beginObject(b)
	w.str("type", vt.Type, true)
	w.str("unit", vt.Unit, vt.has&hasUnit != 0)
	w.int("scale", vt.Scale, vt.has&hasScale != 0)
	w.str("format", vt.Format, vt.has&hasFormat != 0)
	if vt.Elements != nil {
		w.key("elements")
		w.b = jsonw.Array(w.b, vt.Elements, (*EnumElement).appendJSON)
	}
	if vt.ElementType != nil {
		w.key("elementType")
		w.b = vt.ElementType.appendJSON(w.b)
	}
	if vt.Properties != nil {
		w.key("properties")
		w.b = jsonw.Array(w.b, vt.Properties, (*Property).appendJSON)
	}
	w.str("fileType", vt.FileType, vt.has&hasFileType != 0)
	w.str("trueText", vt.TrueText, vt.has&hasTrueText != 0)
	w.raw("trueValue", vt.TrueValue)
	w.str("falseText", vt.FalseText, vt.has&hasFalseText != 0)
	w.raw("falseValue", vt.FalseValue)
	x := &vt.Expands
	if vt.has&hasExpands != 0 || x.has != 0 || x.MaxLength != 0 || len(x.Extra) > 0 {
		w.key("expands")
		ew := beginObject(w.b)
		ew.int("maxLength", x.MaxLength, x.has&hasMaxLength != 0)
		w.b = ew.end(x.Extra, knownVTExp)
	}
	return w.end(vt.Extra, knownValueType)
}

func (el *EnumElement) appendJSON(b []byte) []byte {
	w := beginObject(b)
	w.raw("value", el.Value)
	w.str("text", el.Text, el.has&hasText != 0)
	return w.end(el.Extra, knownElement)
}

// MarshalJSON implementations of the parts, so that they can be embedded in
// other JSON documents with the same lossless form.

func (p Property) MarshalJSON() ([]byte, error)        { return p.appendJSON(nil), nil }
func (e Event) MarshalJSON() ([]byte, error)           { return e.appendJSON(nil), nil }
func (fn Function) MarshalJSON() ([]byte, error)       { return fn.appendJSON(nil), nil }
func (t Tag) MarshalJSON() ([]byte, error)             { return t.appendJSON(nil), nil }
func (vt ValueType) MarshalJSON() ([]byte, error)      { return vt.appendJSON(nil), nil }
func (x PropertyExpands) MarshalJSON() ([]byte, error) { return x.appendJSON(nil), nil }
func (el EnumElement) MarshalJSON() ([]byte, error)    { return el.appendJSON(nil), nil }
