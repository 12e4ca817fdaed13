package schema

import (
	"bytes"
	"encoding/json"
	"errors"
	"maps"
	"slices"
	"strconv"
	"unicode/utf8"
)

// Thing model: the product and device metadata document. It holds four
// arrays (properties, events, functions, tags) and is carried in the API as
// an escaped JSON string. Every type below keeps the fields it does not know
// in Extra, so that parse -> serialise is lossless; serialisation is
// deterministic (known fields in a fixed order, then extras sorted by key).
//
// Optional known fields are written when they were present in the parsed
// document or when they hold a non-zero value.

// ErrInvalidThingModel is wrapped by every *ValidationError.
var ErrInvalidThingModel = errors.New("invalid thing model")

// MaxNestingDepth is the deepest allowed valueType nesting. The valueType of
// a top-level definition is at depth 1; each elementType or nested object
// property adds one.
const MaxNestingDepth = 8

// Value type names (valueType.type).
const (
	TypeInt      = "int"
	TypeLong     = "long"
	TypeFloat    = "float"
	TypeDouble   = "double"
	TypeString   = "string"
	TypeBoolean  = "boolean"
	TypeDate     = "date"
	TypeEnum     = "enum"
	TypeArray    = "array"
	TypeObject   = "object"
	TypeFile     = "file"
	TypePassword = "password"
	TypeGeoPoint = "geoPoint"
)

// ValidationError reports the first problem of a thing model: Path locates
// it (e.g. "properties[3].valueType.unit"), Msg describes it. It unwraps to
// ErrInvalidThingModel.
type ValidationError struct {
	Path string
	Msg  string
}

func (e *ValidationError) Error() string {
	if e.Path == "" {
		return e.Msg
	}
	return e.Path + ": " + e.Msg
}

// Unwrap returns ErrInvalidThingModel.
func (e *ValidationError) Unwrap() error { return ErrInvalidThingModel }

func vErr(path, msg string) *ValidationError { return &ValidationError{Path: path, Msg: msg} }

// ThingModel is the whole metadata document.
type ThingModel struct {
	Properties []Property
	Events     []Event
	Functions  []Function
	Tags       []Tag
	Extra      map[string]json.RawMessage
}

// Property is a property definition. It is also the shape of a nested object
// property (valueType.properties) and of a function input.
type Property struct {
	ID          string
	Name        string
	Description string
	SortsIndex  int
	ValueType   ValueType
	Expands     PropertyExpands
	Extra       map[string]json.RawMessage
	has         fieldSet
}

// PropertyExpands is the expands object of a property or a tag.
type PropertyExpands struct {
	Source  string            // device, manual or rule
	Type    []string          // any of read, write, report
	Metrics []json.RawMessage // kept verbatim
	Extra   map[string]json.RawMessage
	has     fieldSet
}

// Event is an event definition.
type Event struct {
	ID          string
	Name        string
	Description string
	SortsIndex  int
	ValueType   ValueType
	Expands     EventExpands
	Extra       map[string]json.RawMessage
	has         fieldSet
}

// EventExpands is the expands object of an event.
type EventExpands struct {
	Level string // ordinary, warn, urgent, ...
	Extra map[string]json.RawMessage
	has   fieldSet
}

// Function is a function (service) definition.
type Function struct {
	ID          string
	Name        string
	Description string
	SortsIndex  int
	Async       bool
	Inputs      []Property
	Output      *ValueType
	Extra       map[string]json.RawMessage
	has         fieldSet
}

// Tag is a tag definition.
type Tag struct {
	ID          string
	Name        string
	Description string
	SortsIndex  int
	ValueType   ValueType
	Expands     PropertyExpands
	Extra       map[string]json.RawMessage
	has         fieldSet
}

// ValueType describes the value of a property, event, input or tag.
type ValueType struct {
	Type        string
	Unit        string // int, long, float, double
	Scale       int    // float, double: decimals
	Format      string // date
	Elements    []EnumElement
	ElementType *ValueType // array
	Properties  []Property // object
	FileType    string     // file: url, base64, Binary
	TrueText    string
	TrueValue   json.RawMessage // boolean: JSON bool, string or number
	FalseText   string
	FalseValue  json.RawMessage
	Expands     ValueTypeExpands
	Extra       map[string]json.RawMessage
	has         fieldSet
}

// ValueTypeExpands is the expands object of a valueType.
type ValueTypeExpands struct {
	MaxLength int // string, password
	Extra     map[string]json.RawMessage
	has       fieldSet
}

// EnumElement is one element of an enum valueType. Value is a JSON string,
// number or boolean kept verbatim; ValueString gives its text.
type EnumElement struct {
	Value json.RawMessage
	Text  string
	Extra map[string]json.RawMessage
	has   fieldSet
}

// ValueString returns the element value as text ("" when absent).
func (e *EnumElement) ValueString() string { return scalarText(e.Value) }

// fieldSet records which optional known fields were present when parsing.
type fieldSet uint16

const (
	hasDescription fieldSet = 1 << iota
	hasSortsIndex
	hasExpands
	hasSource
	hasUnit
	hasScale
	hasFormat
	hasFileType
	hasTrueText
	hasFalseText
	hasMaxLength
	hasLevel
	hasAsync
	hasText
)

var (
	knownModel     = keySet("properties", "events", "functions", "tags")
	knownProperty  = keySet("id", "name", "description", "sortsIndex", "valueType", "expands")
	knownPropExp   = keySet("source", "type", "metrics")
	knownEvent     = knownProperty
	knownEventExp  = keySet("level")
	knownFunction  = keySet("id", "name", "description", "sortsIndex", "async", "inputs", "output")
	knownTag       = knownProperty
	knownValueType = keySet("type", "unit", "scale", "format", "elements", "elementType", "properties",
		"fileType", "trueText", "trueValue", "falseText", "falseValue", "expands")
	knownVTExp    = keySet("maxLength")
	knownElement  = keySet("value", "text")
	emptyJSONList = []byte("[]")
)

func keySet(keys ...string) map[string]bool {
	m := make(map[string]bool, len(keys))
	for _, k := range keys {
		m[k] = true
	}
	return m
}

// EmptyThingModel returns a model with four empty arrays.
func EmptyThingModel() *ThingModel {
	return &ThingModel{Properties: []Property{}, Events: []Event{}, Functions: []Function{}, Tags: []Tag{}}
}

// ParseThingModel decodes a thing model document and validates it. Every
// error is a *ValidationError wrapping ErrInvalidThingModel.
func ParseThingModel(data []byte) (*ThingModel, error) {
	m := &ThingModel{}
	if err := m.decode(data); err != nil {
		return nil, err
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return m, nil
}

// ParseThingModelString is ParseThingModel for the escaped-string form
// carried by the API (already unescaped by the JSON decoder).
func ParseThingModelString(s string) (*ThingModel, error) {
	return ParseThingModel([]byte(s))
}

// Property returns the top-level property with the given id.
func (m *ThingModel) Property(id string) (*Property, bool) {
	if m == nil {
		return nil, false
	}
	for i := range m.Properties {
		if m.Properties[i].ID == id {
			return &m.Properties[i], true
		}
	}
	return nil, false
}

// String returns the compact JSON form, the one stored in the database.
func (m *ThingModel) String() string { return string(m.appendJSON(nil)) }

// MarshalJSON implements json.Marshaler. Missing arrays are written as [].
func (m *ThingModel) MarshalJSON() ([]byte, error) { return m.appendJSON(nil), nil }

// UnmarshalJSON implements json.Unmarshaler. It checks the structure (types
// of known fields) but not the rules of Validate.
func (m *ThingModel) UnmarshalJSON(data []byte) error {
	var tm ThingModel
	if err := tm.decode(data); err != nil {
		return err
	}
	*m = tm
	return nil
}

// ---------------------------------------------------------------------------
// decoding

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

// definition decodes the fields common to every definition.
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

func (p *Property) decode(raw []byte, path string, depth int) error {
	f, err := newFields(raw, path)
	if err != nil {
		return err
	}
	decodeCommon(f, &p.ID, &p.Name, &p.Description, &p.SortsIndex, &p.has)
	f.object("valueType", func(raw []byte, path string) error { return p.ValueType.decode(raw, path, depth) })
	if f.object("expands", p.Expands.decode) {
		p.has |= hasExpands
	}
	p.Extra = f.extra()
	return f.err
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
	f, err := newFields(raw, path)
	if err != nil {
		return err
	}
	decodeCommon(f, &e.ID, &e.Name, &e.Description, &e.SortsIndex, &e.has)
	f.object("valueType", func(raw []byte, path string) error { return e.ValueType.decode(raw, path, 1) })
	if f.object("expands", e.Expands.decode) {
		e.has |= hasExpands
	}
	e.Extra = f.extra()
	return f.err
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
	f, err := newFields(raw, path)
	if err != nil {
		return err
	}
	decodeCommon(f, &t.ID, &t.Name, &t.Description, &t.SortsIndex, &t.has)
	f.object("valueType", func(raw []byte, path string) error { return t.ValueType.decode(raw, path, 1) })
	if f.object("expands", t.Expands.decode) {
		t.has |= hasExpands
	}
	t.Extra = f.extra()
	return f.err
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

// ---------------------------------------------------------------------------
// encoding

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
	w.b = appendString(w.b, k)
	w.b = append(w.b, ':')
}

func (w *objWriter) str(k, v string, force bool) {
	if v != "" || force {
		w.key(k)
		w.b = appendString(w.b, v)
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
		w.b = appendRaw(w.b, v)
	}
}

func (w *objWriter) end(extra map[string]json.RawMessage, known map[string]bool) []byte {
	for _, k := range slices.Sorted(maps.Keys(extra)) {
		if !known[k] {
			w.key(k)
			w.b = appendRaw(w.b, extra[k])
		}
	}
	return append(w.b, '}')
}

// appendRaw appends compacted raw JSON, or null if it is not valid JSON
// (only possible for values set by hand; Validate reports those).
func appendRaw(b []byte, raw []byte) []byte {
	buf := bytes.NewBuffer(b)
	if err := json.Compact(buf, raw); err != nil {
		return append(b, "null"...)
	}
	return buf.Bytes()
}

const hexDigits = "0123456789abcdef"

// appendString appends s as a JSON string without HTML escaping; invalid
// UTF-8 becomes U+FFFD.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				b = append(b, '\\', c)
			case c == '\n':
				b = append(b, '\\', 'n')
			case c == '\r':
				b = append(b, '\\', 'r')
			case c == '\t':
				b = append(b, '\\', 't')
			case c < 0x20:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			default:
				b = append(b, c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b = append(b, `\ufffd`...)
		case r == '\u2028':
			b = append(b, `\u2028`...)
		case r == '\u2029':
			b = append(b, `\u2029`...)
		default:
			b = append(b, s[i:i+size]...)
		}
		i += size
	}
	return append(b, '"')
}

func appendList[T any](b []byte, list []T, fn func(v *T, b []byte) []byte) []byte {
	b = append(b, '[')
	for i := range list {
		if i > 0 {
			b = append(b, ',')
		}
		b = fn(&list[i], b)
	}
	return append(b, ']')
}

func (m *ThingModel) appendJSON(b []byte) []byte {
	if m == nil {
		m = &ThingModel{}
	}
	w := beginObject(b)
	w.key("properties")
	w.b = appendList(w.b, m.Properties, (*Property).appendJSON)
	w.key("events")
	w.b = appendList(w.b, m.Events, (*Event).appendJSON)
	w.key("functions")
	w.b = appendList(w.b, m.Functions, (*Function).appendJSON)
	w.key("tags")
	w.b = appendList(w.b, m.Tags, (*Tag).appendJSON)
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
		w.b = appendList(w.b, x.Type, func(s *string, b []byte) []byte { return appendString(b, *s) })
	}
	if x.Metrics != nil {
		w.key("metrics")
		w.b = appendList(w.b, x.Metrics, func(r *json.RawMessage, b []byte) []byte { return appendRaw(b, *r) })
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
		w.b = appendList(w.b, fn.Inputs, (*Property).appendJSON)
	}
	if fn.Output != nil {
		w.key("output")
		w.b = fn.Output.appendJSON(w.b)
	}
	return w.end(fn.Extra, knownFunction)
}

func (t *Tag) appendJSON(b []byte) []byte {
	w := beginObject(b)
	w.str("id", t.ID, true)
	w.str("name", t.Name, true)
	w.str("description", t.Description, t.has&hasDescription != 0)
	w.int("sortsIndex", t.SortsIndex, t.has&hasSortsIndex != 0)
	w.key("valueType")
	w.b = t.ValueType.appendJSON(w.b)
	if t.has&hasExpands != 0 || !t.Expands.isZero() {
		w.key("expands")
		w.b = t.Expands.appendJSON(w.b)
	}
	return w.end(t.Extra, knownTag)
}

func (vt *ValueType) appendJSON(b []byte) []byte {
	w := beginObject(b)
	w.str("type", vt.Type, true)
	w.str("unit", vt.Unit, vt.has&hasUnit != 0)
	w.int("scale", vt.Scale, vt.has&hasScale != 0)
	w.str("format", vt.Format, vt.has&hasFormat != 0)
	if vt.Elements != nil {
		w.key("elements")
		w.b = appendList(w.b, vt.Elements, (*EnumElement).appendJSON)
	}
	if vt.ElementType != nil {
		w.key("elementType")
		w.b = vt.ElementType.appendJSON(w.b)
	}
	if vt.Properties != nil {
		w.key("properties")
		w.b = appendList(w.b, vt.Properties, (*Property).appendJSON)
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
