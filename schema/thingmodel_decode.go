package schema

import (
	"bytes"
	"encoding/json"
	"slices"
	"strconv"
)

// Decoding of a thing model: every type takes its known keys out of the
// JSON object and keeps the rest in Extra.

// fields is one JSON object being decoded; known keys are taken out, what
// remains becomes Extra. The first error is kept in err.
type fields struct {
	path string
	m    map[string]json.RawMessage
	err  error
}

func firstByte(raw []byte) byte {
	raw = bytes.TrimLeft(raw, " \t\r\n")
	if len(raw) == 0 {
		return 0
	}
	return raw[0]
}

func newFields(raw []byte, path string) (*fields, error) {
	if firstByte(raw) != '{' {
		if path == "" && !json.Valid(raw) {
			return nil, vErr("", "invalid JSON")
		}
		return nil, vErr(path, "must be a JSON object")
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, vErr(path, "invalid JSON: "+err.Error())
	}
	return &fields{path: path, m: m}, nil
}

func joinPath(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func indexPath(path string, i int) string { return path + "[" + strconv.Itoa(i) + "]" }

func (f *fields) sub(key string) string { return joinPath(f.path, key) }

func (f *fields) fail(key, msg string) {
	if f.err == nil {
		f.err = vErr(f.sub(key), msg)
	}
}

func (f *fields) setErr(err error) {
	if f.err == nil && err != nil {
		f.err = err
	}
}

func (f *fields) take(key string) (json.RawMessage, bool) {
	if f.err != nil {
		return nil, false
	}
	raw, ok := f.m[key]
	if ok {
		delete(f.m, key)
	}
	return raw, ok
}

func (f *fields) str(key string, dst *string) bool {
	raw, ok := f.take(key)
	if !ok {
		return false
	}
	if firstByte(raw) != '"' || json.Unmarshal(raw, dst) != nil {
		f.fail(key, "must be a string")
		return false
	}
	return true
}

func (f *fields) integer(key string, dst *int) bool {
	raw, ok := f.take(key)
	if !ok {
		return false
	}
	n, err := strconv.Atoi(string(bytes.TrimSpace(raw)))
	if err != nil {
		f.fail(key, "must be an integer")
		return false
	}
	*dst = n
	return true
}

func (f *fields) boolean(key string, dst *bool) bool {
	raw, ok := f.take(key)
	if !ok {
		return false
	}
	switch string(bytes.TrimSpace(raw)) {
	case "true":
		*dst = true
	case "false":
		*dst = false
	default:
		f.fail(key, "must be a boolean")
		return false
	}
	return true
}

// scalar takes a JSON string, number or boolean verbatim (compacted).
func (f *fields) scalar(key string, dst *json.RawMessage) {
	raw, ok := f.take(key)
	if !ok {
		return
	}
	raw = bytes.TrimSpace(raw)
	switch c := firstByte(raw); {
	case c == '"', c == '-', c >= '0' && c <= '9', c == 't', c == 'f':
		*dst = slices.Clone(raw)
	default:
		f.fail(key, "must be a string, number or boolean")
	}
}

func (f *fields) array(key string) ([]json.RawMessage, bool) {
	raw, ok := f.take(key)
	if !ok {
		return nil, false
	}
	var list []json.RawMessage
	if firstByte(raw) != '[' || json.Unmarshal(raw, &list) != nil {
		f.fail(key, "must be an array")
		return nil, false
	}
	if list == nil {
		list = []json.RawMessage{}
	}
	return list, true
}

func (f *fields) strings(key string) []string {
	list, ok := f.array(key)
	if !ok {
		return nil
	}
	out := make([]string, 0, len(list))
	for i, raw := range list {
		var s string
		if firstByte(raw) != '"' || json.Unmarshal(raw, &s) != nil {
			f.setErr(vErr(indexPath(f.sub(key), i), "must be a string"))
			return nil
		}
		out = append(out, s)
	}
	return out
}

// object decodes a nested object with fn, returning whether it was present.
func (f *fields) object(key string, fn func(raw []byte, path string) error) bool {
	raw, ok := f.take(key)
	if !ok {
		return false
	}
	f.setErr(fn(raw, f.sub(key)))
	return true
}

// objects decodes an array of objects with fn(i, raw, path).
func (f *fields) objects(key string, fn func(i int, raw []byte, path string) error) bool {
	list, ok := f.array(key)
	if !ok {
		return false
	}
	for i, raw := range list {
		if f.err != nil {
			break
		}
		f.setErr(fn(i, raw, indexPath(f.sub(key), i)))
	}
	return true
}

func (f *fields) extra() map[string]json.RawMessage {
	if len(f.m) == 0 {
		return nil
	}
	out := make(map[string]json.RawMessage, len(f.m))
	for k, v := range f.m {
		var buf bytes.Buffer
		if err := json.Compact(&buf, v); err != nil {
			f.fail(k, "invalid JSON")
			return nil
		}
		out[k] = buf.Bytes()
	}
	return out
}

func (m *ThingModel) decode(data []byte) error {
	f, err := newFields(data, "")
	if err != nil {
		return err
	}
	if f.objects("properties", func(i int, raw []byte, path string) error {
		var p Property
		err := p.decode(raw, path, 1)
		m.Properties = append(m.Properties, p)
		return err
	}) && m.Properties == nil {
		m.Properties = []Property{}
	}
	if f.objects("events", func(i int, raw []byte, path string) error {
		var e Event
		err := e.decode(raw, path)
		m.Events = append(m.Events, e)
		return err
	}) && m.Events == nil {
		m.Events = []Event{}
	}
	if f.objects("functions", func(i int, raw []byte, path string) error {
		var fn Function
		err := fn.decode(raw, path)
		m.Functions = append(m.Functions, fn)
		return err
	}) && m.Functions == nil {
		m.Functions = []Function{}
	}
	if f.objects("tags", func(i int, raw []byte, path string) error {
		var t Tag
		err := t.decode(raw, path)
		m.Tags = append(m.Tags, t)
		return err
	}) && m.Tags == nil {
		m.Tags = []Tag{}
	}
	m.Extra = f.extra()
	return f.err
}

// decodeCommon decodes the fields common to every definition.
func decodeCommon(f *fields, id, name, desc *string, sorts *int, has *fieldSet) {
	f.str("id", id)
	f.str("name", name)
	if f.str("description", desc) {
		*has |= hasDescription
	}
	if f.integer("sortsIndex", sorts) {
		*has |= hasSortsIndex
	}
}

// definition points at the fields of a property, event or tag, which are
// decoded alike: the common fields, a valueType and an expands object.
type definition struct {
	id, name, desc *string
	sorts          *int
	valueType      *ValueType
	expands        func(raw []byte, path string) error // decodes the expands object
	extra          *map[string]json.RawMessage
	has            *fieldSet
}

// decode decodes the definition at path; its valueType is at depth.
func (d definition) decode(raw []byte, path string, depth int) error {
	f, err := newFields(raw, path)
	if err != nil {
		return err
	}
	decodeCommon(f, d.id, d.name, d.desc, d.sorts, d.has)
	f.object("valueType", func(raw []byte, path string) error { return d.valueType.decode(raw, path, depth) })
	if f.object("expands", d.expands) {
		*d.has |= hasExpands
	}
	*d.extra = f.extra()
	return f.err
}

func (p *Property) decode(raw []byte, path string, depth int) error {
	return definition{&p.ID, &p.Name, &p.Description, &p.SortsIndex, &p.ValueType, p.Expands.decode, &p.Extra, &p.has}.
		decode(raw, path, depth)
}

func (x *PropertyExpands) decode(raw []byte, path string) error {
	f, err := newFields(raw, path)
	if err != nil {
		return err
	}
	if f.str("source", &x.Source) {
		x.has |= hasSource
	}
	x.Type = f.strings("type")
	if list, ok := f.array("metrics"); ok {
		x.Metrics = make([]json.RawMessage, 0, len(list))
		for _, m := range list {
			var buf bytes.Buffer
			_ = json.Compact(&buf, m) // already validated by json.Unmarshal
			x.Metrics = append(x.Metrics, buf.Bytes())
		}
	}
	x.Extra = f.extra()
	return f.err
}

func (e *Event) decode(raw []byte, path string) error {
	return definition{&e.ID, &e.Name, &e.Description, &e.SortsIndex, &e.ValueType, e.Expands.decode, &e.Extra, &e.has}.
		decode(raw, path, 1)
}

func (x *EventExpands) decode(raw []byte, path string) error {
	f, err := newFields(raw, path)
	if err != nil {
		return err
	}
	if f.str("level", &x.Level) {
		x.has |= hasLevel
	}
	x.Extra = f.extra()
	return f.err
}

func (fn *Function) decode(raw []byte, path string) error {
	f, err := newFields(raw, path)
	if err != nil {
		return err
	}
	decodeCommon(f, &fn.ID, &fn.Name, &fn.Description, &fn.SortsIndex, &fn.has)
	if f.boolean("async", &fn.Async) {
		fn.has |= hasAsync
	}
	if f.objects("inputs", func(i int, raw []byte, path string) error {
		var p Property
		err := p.decode(raw, path, 1)
		fn.Inputs = append(fn.Inputs, p)
		return err
	}) && fn.Inputs == nil {
		fn.Inputs = []Property{}
	}
	f.object("output", func(raw []byte, path string) error {
		fn.Output = &ValueType{}
		return fn.Output.decode(raw, path, 1)
	})
	fn.Extra = f.extra()
	return f.err
}

func (t *Tag) decode(raw []byte, path string) error {
	return definition{&t.ID, &t.Name, &t.Description, &t.SortsIndex, &t.ValueType, t.Expands.decode, &t.Extra, &t.has}.
		decode(raw, path, 1)
}

func depthError(path string) *ValidationError {
	return vErr(path, "nesting depth exceeds "+strconv.Itoa(MaxNestingDepth))
}

func (vt *ValueType) decode(raw []byte, path string, depth int) error {
	if depth > MaxNestingDepth {
		return depthError(path)
	}
	f, err := newFields(raw, path)
	if err != nil {
		return err
	}
	f.str("type", &vt.Type)
	if f.str("unit", &vt.Unit) {
		vt.has |= hasUnit
	}
	if f.integer("scale", &vt.Scale) {
		vt.has |= hasScale
	}
	if f.str("format", &vt.Format) {
		vt.has |= hasFormat
	}
	if f.objects("elements", func(i int, raw []byte, path string) error {
		var el EnumElement
		err := el.decode(raw, path)
		vt.Elements = append(vt.Elements, el)
		return err
	}) && vt.Elements == nil {
		vt.Elements = []EnumElement{}
	}
	f.object("elementType", func(raw []byte, path string) error {
		vt.ElementType = &ValueType{}
		return vt.ElementType.decode(raw, path, depth+1)
	})
	if f.objects("properties", func(i int, raw []byte, path string) error {
		var p Property
		err := p.decode(raw, path, depth+1)
		vt.Properties = append(vt.Properties, p)
		return err
	}) && vt.Properties == nil {
		vt.Properties = []Property{}
	}
	if f.str("fileType", &vt.FileType) {
		vt.has |= hasFileType
	}
	if f.str("trueText", &vt.TrueText) {
		vt.has |= hasTrueText
	}
	f.scalar("trueValue", &vt.TrueValue)
	if f.str("falseText", &vt.FalseText) {
		vt.has |= hasFalseText
	}
	f.scalar("falseValue", &vt.FalseValue)
	if f.object("expands", vt.Expands.decode) {
		vt.has |= hasExpands
	}
	vt.Extra = f.extra()
	return f.err
}

func (x *ValueTypeExpands) decode(raw []byte, path string) error {
	f, err := newFields(raw, path)
	if err != nil {
		return err
	}
	if f.integer("maxLength", &x.MaxLength) {
		x.has |= hasMaxLength
	}
	x.Extra = f.extra()
	return f.err
}

func (el *EnumElement) decode(raw []byte, path string) error {
	f, err := newFields(raw, path)
	if err != nil {
		return err
	}
	f.scalar("value", &el.Value)
	if f.str("text", &el.Text) {
		el.has |= hasText
	}
	el.Extra = f.extra()
	return f.err
}

// UnmarshalJSON implementations of the parts; like ThingModel.UnmarshalJSON
// they check the structure but not the rules of Validate.

func (p *Property) UnmarshalJSON(data []byte) error {
	return decodeInto(p, data, func(v *Property) error { return v.decode(data, "", 1) })
}
func (e *Event) UnmarshalJSON(data []byte) error {
	return decodeInto(e, data, func(v *Event) error { return v.decode(data, "") })
}
func (fn *Function) UnmarshalJSON(data []byte) error {
	return decodeInto(fn, data, func(v *Function) error { return v.decode(data, "") })
}
func (t *Tag) UnmarshalJSON(data []byte) error {
	return decodeInto(t, data, func(v *Tag) error { return v.decode(data, "") })
}
func (vt *ValueType) UnmarshalJSON(data []byte) error {
	return decodeInto(vt, data, func(v *ValueType) error { return v.decode(data, "", 1) })
}
func (el *EnumElement) UnmarshalJSON(data []byte) error {
	return decodeInto(el, data, func(v *EnumElement) error { return v.decode(data, "") })
}
func (x *PropertyExpands) UnmarshalJSON(data []byte) error {
	return decodeInto(x, data, func(v *PropertyExpands) error { return v.decode(data, "") })
}

func decodeInto[T any](dst *T, data []byte, fn func(*T) error) error {
	var v T
	if err := fn(&v); err != nil {
		return err
	}
	*dst = v
	return nil
}
