package schema

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
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

// Tag is a tag definition: a property's fields, with methods of its own
// (its expands' source and type are not held to a property's values).
type Tag Property

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
	knownValueType = keySet("type", "unit", "scale", "format", "elements", "elementType", "properties",
		"fileType", "trueText", "trueValue", "falseText", "falseValue", "expands")
	knownVTExp   = keySet("maxLength")
	knownElement = keySet("value", "text")
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

// MaxThingModelBytes bounds a thing model written through the API (a
// product's or a device's metadata): its compact JSON, as stored and as
// every read of it carries it, at most 256 KiB. A list or a dashboard
// query reads models whole; unbounded (up to the 1 MiB body limit), 40
// devices with their own models made one device list 57 MB.
const MaxThingModelBytes = 256 << 10

// NormalizeThingModelInput parses and validates a thing model written
// through the API and returns its compact form, the one stored. Beyond
// ParseThingModel's rules it refuses a top-level key other than the four
// arrays the spec names (properties, events, functions, tags), naming it
// (keys inside the arrays stay the document's own: a valueType, the spec
// says, may carry more fields), and a model whose compact form is over
// MaxThingModelBytes. Models stored before are read with ParseThingModel,
// which keeps what it does not know.
func NormalizeThingModelInput(s string) (string, error) {
	m, err := ParseThingModelString(s)
	if err != nil {
		return "", err
	}
	if len(m.Extra) > 0 {
		keys := make([]string, 0, len(m.Extra))
		for k := range m.Extra {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		return "", vErr(keys[0], "unknown top-level key: a thing model has properties, events, functions and tags only")
	}
	b := m.appendJSON(nil)
	if len(b) > MaxThingModelBytes {
		return "", vErr("", fmt.Sprintf("the thing model is %d bytes as compact JSON; at most %d (256 KiB)", len(b), MaxThingModelBytes))
	}
	return string(b), nil
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
