package schema

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"
)

// fullThingModel uses every value type and carries unknown fields at every
// level (model, definitions, valueType, expands, elements).
const fullThingModel = `{
  "x-model": {"rev": 3},
  "properties": [
    {"id": "temp", "name": "Temperature", "description": "", "sortsIndex": 0, "x-prop": [1, 2],
     "valueType": {"type": "float", "unit": "percent", "scale": 2, "x-vt": "keep", "expands": {"x-vte": true}},
     "expands": {"source": "device", "type": ["read", "report"], "metrics": [{"id": "m1", "x": null}], "x-exp": 1}},
    {"id": "cnt", "name": "Count", "sortsIndex": 1, "valueType": {"type": "int", "unit": "count", "expands": {}}},
    {"id": "total", "name": "Total", "valueType": {"type": "long", "unit": ""}},
    {"id": "dist", "name": "Distance", "valueType": {"type": "double", "unit": "kilometer", "scale": 0}},
    {"id": "label", "name": "Label", "valueType": {"type": "string", "expands": {"maxLength": 64, "x": "y"}}},
    {"id": "secret", "name": "Secret", "valueType": {"type": "password", "expands": {"maxLength": 1}}},
    {"id": "on", "name": "Switch", "valueType": {"type": "boolean", "trueText": "On", "trueValue": true, "falseText": "Off", "falseValue": false}},
    {"id": "onStr", "name": "Switch2", "valueType": {"type": "boolean", "trueValue": "1", "falseValue": "0"}},
    {"id": "ts", "name": "Time", "valueType": {"type": "date", "format": "yyyy-MM-dd"}},
    {"id": "mode", "name": "Mode", "valueType": {"type": "enum", "elements": [{"value": "a", "text": "Auto", "x-el": 1}, {"value": 2, "text": "Manual"}]}},
    {"id": "list", "name": "List", "valueType": {"type": "array", "elementType": {"type": "object", "properties": [{"id": "k", "name": "K", "valueType": {"type": "string"}}]}}},
    {"id": "obj", "name": "Obj", "valueType": {"type": "object", "properties": [
      {"id": "a", "name": "A", "valueType": {"type": "int", "unit": "meter"}, "x-nested": "n"},
      {"id": "b", "name": "B", "valueType": {"type": "object", "properties": []}}]}},
    {"id": "img", "name": "Image", "valueType": {"type": "file", "fileType": "Binary"}},
    {"id": "pos", "name": "Position", "valueType": {"type": "geoPoint", "x-geo": {"srid": 4326}}},
    {"id": "real_state_cpu_usage_rate", "name": "CPU", "valueType": {"type": "double", "unit": "percent", "scale": 1}}
  ],
  "events": [
    {"id": "alarm", "name": "Alarm", "sortsIndex": 0, "expands": {"level": "urgent", "x-lvl": 2}, "x-ev": "e",
     "valueType": {"type": "object", "properties": [{"id": "code", "name": "Code", "valueType": {"type": "int"}}]}}
  ],
  "functions": [
    {"id": "reboot", "name": "Reboot", "sortsIndex": 0, "async": false, "inputs": [], "output": {"type": "boolean", "expands": {}}, "x-fn": [true]},
    {"id": "set", "name": "Set", "async": true, "inputs": [
      {"id": "v", "name": "V", "valueType": {"type": "double", "scale": 3}, "x-in": 1}]}
  ],
  "tags": [
    {"id": "site", "name": "Site", "sortsIndex": 0, "valueType": {"type": "string"}, "expands": {"type": ["read", "custom"], "metrics": []}, "x-tag": "t"}
  ]
}`

func normalizeJSON(t *testing.T, s string) any {
	t.Helper()
	var v any
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatalf("invalid JSON %q: %s", s, err)
	}
	return v
}

func TestThingModelRoundTrip(t *testing.T) {
	m, err := ParseThingModelString(fullThingModel)
	if err != nil {
		t.Fatalf("unexpected error: %s", err)
	}
	out := m.String()
	if got, want := normalizeJSON(t, out), normalizeJSON(t, fullThingModel); !reflect.DeepEqual(got, want) {
		t.Fatalf("round trip mismatch\ngot:  %s\nwant: %s", out, fullThingModel)
	}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatalf("json.Marshal: %s", err)
	}
	if string(b) != out {
		t.Fatalf("json.Marshal differs from String\n%s\n%s", b, out)
	}
	m2, err := ParseThingModelString(out)
	if err != nil {
		t.Fatalf("re-parse: %s", err)
	}
	if out2 := m2.String(); out2 != out {
		t.Fatalf("not idempotent\n%s\n%s", out, out2)
	}

	// Accessors.
	p, ok := m.Property("temp")
	if !ok || p.ValueType.Unit != "percent" || p.ValueType.Scale != 2 || string(p.Extra["x-prop"]) != "[1,2]" {
		t.Fatalf("unexpected property temp: %+v", p)
	}
	if _, ok := m.Property("missing"); ok {
		t.Fatalf("unexpected property missing")
	}
	if m.Functions[1].Inputs[0].ValueType.Scale != 3 || !m.Functions[1].Async {
		t.Fatalf("unexpected function: %+v", m.Functions[1])
	}

	// Key order is fixed and extras are sorted.
	const wantFirst = `{"id":"temp","name":"Temperature","description":"","sortsIndex":0,` +
		`"valueType":{"type":"float","unit":"percent","scale":2,"expands":{"x-vte":true},"x-vt":"keep"},` +
		`"expands":{"source":"device","type":["read","report"],"metrics":[{"id":"m1","x":null}],"x-exp":1},"x-prop":[1,2]}`
	if !strings.HasPrefix(out, `{"properties":[`+wantFirst+`,`) {
		t.Fatalf("unexpected serialisation:\n%s", out)
	}
	if !strings.HasSuffix(out, `],"x-model":{"rev":3}}`) {
		t.Fatalf("unexpected serialisation end:\n%s", out)
	}
}

func TestThingModelSerialise(t *testing.T) {
	f := func(input, want string) {
		t.Helper()
		m, err := ParseThingModelString(input)
		if err != nil {
			t.Fatalf("unexpected error for %s: %s", input, err)
		}
		if got := m.String(); got != want {
			t.Fatalf("unexpected output for %s\ngot:  %s\nwant: %s", input, got, want)
		}
	}
	const empty = `{"properties":[],"events":[],"functions":[],"tags":[]}`
	f(`{}`, empty)
	f(` { "properties" : [ ] } `, empty)
	f(`{"z":1,"a":{"b": [1, 2]}}`, `{"properties":[],"events":[],"functions":[],"tags":[],"a":{"b":[1,2]},"z":1}`)
	f(`{"tags":[{"name":"N","id":"t","valueType":{"type":"string"}}]}`,
		`{"properties":[],"events":[],"functions":[],"tags":[{"id":"t","name":"N","valueType":{"type":"string"}}]}`)
	f(`{"properties":[{"id":"p","name":"<a&b>\u2028","valueType":{"type":"int"}}]}`,
		`{"properties":[{"id":"p","name":"<a&b>\u2028","valueType":{"type":"int"}}],"events":[],"functions":[],"tags":[]}`)

	if got := EmptyThingModel().String(); got != empty {
		t.Fatalf("EmptyThingModel: %s", got)
	}
	var nilModel *ThingModel
	if got := nilModel.String(); got != empty {
		t.Fatalf("nil model: %s", got)
	}
	if got := (&ThingModel{}).String(); got != empty {
		t.Fatalf("zero model: %s", got)
	}

	// Programmatic construction.
	m := EmptyThingModel()
	m.Properties = append(m.Properties, Property{ID: "t", Name: "T", SortsIndex: 2,
		ValueType: ValueType{Type: TypeFloat, Unit: "meter", Scale: 1}, Expands: PropertyExpands{Source: "manual"}})
	if err := m.Validate(); err != nil {
		t.Fatalf("unexpected error: %s", err)
	}
	const want = `{"properties":[{"id":"t","name":"T","sortsIndex":2,"valueType":{"type":"float","unit":"meter","scale":1},` +
		`"expands":{"source":"manual"}}],"events":[],"functions":[],"tags":[]}`
	if got := m.String(); got != want {
		t.Fatalf("unexpected output\ngot:  %s\nwant: %s", got, want)
	}

	// Embedded in another document.
	var doc struct {
		Metadata *ThingModel `json:"metadata"`
	}
	if err := json.Unmarshal([]byte(`{"metadata":`+fullThingModel+`}`), &doc); err != nil {
		t.Fatalf("unmarshal: %s", err)
	}
	if len(doc.Metadata.Properties) != 15 {
		t.Fatalf("unexpected properties: %d", len(doc.Metadata.Properties))
	}
}

type invalidCase struct {
	input    string
	wantPath string
}

// prop wraps a property valueType into a model.
func prop(vt string) string {
	return `{"properties":[{"id":"p","name":"P","valueType":` + vt + `}]}`
}

func nested(depth int) string {
	s := `{"type":"int"}`
	for i := 1; i < depth; i++ {
		s = `{"type":"array","elementType":` + s + `}`
	}
	return s
}

var invalidCases = []invalidCase{
	// Structure.
	{``, ""},
	{`[]`, ""},
	{`null`, ""},
	{`{"properties":{}}`, "properties"},
	{`{"properties":null}`, "properties"},
	{`{"events":[1]}`, "events[0]"},
	{`{"properties":[{"id":1,"name":"x","valueType":{"type":"int"}}]}`, "properties[0].id"},
	{`{"properties":[{"id":"a","name":"A","sortsIndex":"1","valueType":{"type":"int"}}]}`, "properties[0].sortsIndex"},
	{`{"properties":[{"id":"a","name":"A","sortsIndex":1.5,"valueType":{"type":"int"}}]}`, "properties[0].sortsIndex"},
	{`{"functions":[{"id":"f","name":"F","async":"yes"}]}`, "functions[0].async"},
	{`{"properties":[{"id":"a","name":"A","valueType":{"type":"int"},"expands":{"type":"read"}}]}`, "properties[0].expands.type"},
	{`{"properties":[{"id":"a","name":"A","valueType":{"type":"int"},"expands":{"type":[1]}}]}`, "properties[0].expands.type[0]"},
	{prop(`{"type":"boolean","trueValue":{}}`), "properties[0].valueType.trueValue"},
	{prop(`"int"`), "properties[0].valueType"},
	// Identifiers and names.
	{`{"properties":[{"name":"A","valueType":{"type":"int"}}]}`, "properties[0].id"},
	{`{"properties":[{"id":"1a","name":"A","valueType":{"type":"int"}}]}`, "properties[0].id"},
	{`{"properties":[{"id":"a b","name":"A","valueType":{"type":"int"}}]}`, "properties[0].id"},
	{`{"properties":[{"id":"` + strings.Repeat("a", 65) + `","name":"A","valueType":{"type":"int"}}]}`, "properties[0].id"},
	{`{"properties":[{"id":"a","valueType":{"type":"int"}}]}`, "properties[0].name"},
	{`{"tags":[{"id":"a","name":"` + strings.Repeat("é", 129) + `","valueType":{"type":"int"}}]}`, "tags[0].name"},
	{`{"properties":[{"id":"a","name":"A","valueType":{"type":"int"}},{"id":"b","name":"B","valueType":{"type":"int"}},{"id":"a","name":"C","valueType":{"type":"int"}}]}`, "properties[2].id"},
	{`{"events":[{"id":"e","name":"E","valueType":{"type":"object","properties":[]}},{"id":"e","name":"E2","valueType":{"type":"object","properties":[]}}]}`, "events[1].id"},
	{`{"functions":[{"id":"f","name":"F","inputs":[{"id":"x","name":"X","valueType":{"type":"int"}},{"id":"x","name":"Y","valueType":{"type":"int"}}]}]}`, "functions[0].inputs[1].id"},
	{`{"events":[{"id":"e","name":"E","valueType":{"type":"object","properties":[{"id":"a","name":"A","valueType":{"type":"int"}},{"name":"B","valueType":{"type":"int"}}]}}]}`, "events[0].valueType.properties[1].id"},
	// Value types.
	{`{"properties":[{"id":"a","name":"A"}]}`, "properties[0].valueType.type"},
	{prop(`{"type":"integer"}`), "properties[0].valueType.type"},
	{`{"functions":[{"id":"f0","name":"F"},{"id":"f1","name":"F"},{"id":"f2","name":"F","inputs":[{"id":"x","name":"X","valueType":{}}]}]}`, "functions[2].inputs[0].valueType.type"},
	{`{"functions":[{"id":"f","name":"F","output":{"type":"nope"}}]}`, "functions[0].output.type"},
	{`{"properties":[{"id":"a","name":"A","valueType":{"type":"int"}},{"id":"b","name":"B","valueType":{"type":"int"}},{"id":"c","name":"C","valueType":{"type":"int"}},{"id":"d","name":"D","valueType":{"type":"int","unit":"furlong"}}]}`, "properties[3].valueType.unit"},
	{prop(`{"type":"string","unit":"meter"}`), "properties[0].valueType.unit"},
	{prop(`{"type":"int","scale":2}`), "properties[0].valueType.scale"},
	{prop(`{"type":"float","scale":11}`), "properties[0].valueType.scale"},
	{prop(`{"type":"double","scale":-1}`), "properties[0].valueType.scale"},
	{prop(`{"type":"string","expands":{"maxLength":0}}`), "properties[0].valueType.expands.maxLength"},
	{prop(`{"type":"password","expands":{"maxLength":"10"}}`), "properties[0].valueType.expands.maxLength"},
	{prop(`{"type":"enum"}`), "properties[0].valueType.elements"},
	{prop(`{"type":"enum","elements":[]}`), "properties[0].valueType.elements"},
	{prop(`{"type":"enum","elements":[{"value":"","text":"E"}]}`), "properties[0].valueType.elements[0].value"},
	{prop(`{"type":"enum","elements":[{"text":"E"}]}`), "properties[0].valueType.elements[0].value"},
	{prop(`{"type":"enum","elements":[{"value":"1","text":"A"},{"value":1,"text":"B"}]}`), "properties[0].valueType.elements[1].value"},
	{prop(`{"type":"array"}`), "properties[0].valueType.elementType"},
	{prop(`{"type":"array","elementType":{"type":"enum","elements":[]}}`), "properties[0].valueType.elementType.elements"},
	{prop(`{"type":"object"}`), "properties[0].valueType.properties"},
	{prop(`{"type":"object","properties":[{"id":"a","name":"A","valueType":{"type":"object","properties":[{"id":"b","name":"B","valueType":{"type":"int","unit":"x"}}]}}]}`), "properties[0].valueType.properties[0].valueType.properties[0].valueType.unit"},
	{prop(`{"type":"file"}`), "properties[0].valueType.fileType"},
	{prop(`{"type":"file","fileType":"binary"}`), "properties[0].valueType.fileType"},
	{prop(`{"type":"boolean","trueValue":true,"falseValue":"true"}`), "properties[0].valueType.falseValue"},
	{prop(`{"type":"boolean","trueValue":1,"falseValue":1}`), "properties[0].valueType.falseValue"},
	// Expands.
	{`{"properties":[{"id":"a","name":"A","valueType":{"type":"int"},"expands":{"source":"cloud"}}]}`, "properties[0].expands.source"},
	{`{"properties":[{"id":"a","name":"A","valueType":{"type":"int"},"expands":{"source":""}}]}`, "properties[0].expands.source"},
	{`{"properties":[{"id":"a","name":"A","valueType":{"type":"int"},"expands":{"type":["read","exec"]}}]}`, "properties[0].expands.type[1]"},
	{`{"properties":[{"id":"a","name":"A","valueType":{"type":"int"},"expands":{"type":["read","write","read"]}}]}`, "properties[0].expands.type[2]"},
	{`{"properties":[{"id":"a","name":"A","valueType":{"type":"int"},"expands":{"metrics":{}}}]}`, "properties[0].expands.metrics"},
	{`{"events":[{"id":"e","name":"E","expands":{"level":""},"valueType":{"type":"object","properties":[]}}]}`, "events[0].expands.level"},
	{`{"tags":[{"id":"t","name":"T","valueType":{"type":"string"},"expands":{"type":["a","a"]}}]}`, "tags[0].expands.type[1]"},
	// Depth.
	{prop(nested(MaxNestingDepth + 1)), "properties[0].valueType" + strings.Repeat(".elementType", MaxNestingDepth)},
	{`{"functions":[{"id":"f","name":"F","output":` + nested(MaxNestingDepth+2) + `}]}`, "functions[0].output" + strings.Repeat(".elementType", MaxNestingDepth)},
}

func TestParseThingModelInvalid(t *testing.T) {
	f := func(input, wantPath string) {
		t.Helper()
		m, err := ParseThingModelString(input)
		if err == nil {
			t.Fatalf("expected error for %s; got %s", input, m)
		}
		var ve *ValidationError
		if !errors.As(err, &ve) {
			t.Fatalf("expected *ValidationError for %s; got %T %s", input, err, err)
		}
		if !errors.Is(err, ErrInvalidThingModel) {
			t.Fatalf("error does not wrap ErrInvalidThingModel: %s", err)
		}
		if ve.Path != wantPath {
			t.Fatalf("unexpected path for %s\ngot:  %q (%s)\nwant: %q", input, ve.Path, err, wantPath)
		}
		if wantPath != "" && !strings.HasPrefix(err.Error(), wantPath+": ") {
			t.Fatalf("unexpected error text %q", err)
		}
	}
	for _, c := range invalidCases {
		f(c.input, c.wantPath)
	}
	if len(invalidCases) < 25 {
		t.Fatalf("too few invalid cases: %d", len(invalidCases))
	}
}

func TestParseThingModelValidEdges(t *testing.T) {
	f := func(input string) {
		t.Helper()
		if _, err := ParseThingModelString(input); err != nil {
			t.Fatalf("unexpected error for %s: %s", input, err)
		}
	}
	f(prop(nested(MaxNestingDepth)))
	f(`{"properties":[{"id":"_a-` + strings.Repeat("b", 61) + `","name":"` + strings.Repeat("é", 128) + `","valueType":{"type":"int"}}]}`)
	f(`{"properties":[{"id":"a","name":"A","valueType":{"type":"int"}}],"events":[{"id":"a","name":"A","valueType":{"type":"object","properties":[]}}]}`)
	f(prop(`{"type":"int","unit":""}`))
	f(prop(`{"type":"string","unit":""}`))
	f(prop(`{"type":"float","scale":0}`))
	f(prop(`{"type":"double","scale":10}`))
	f(prop(`{"type":"boolean","trueValue":"yes","falseValue":"no"}`))
	f(prop(`{"type":"date"}`))
	f(prop(`{"type":"geoPoint"}`))
	f(`{"events":[{"id":"e","name":"E","valueType":{"type":"object","properties":[]},"expands":{"level":"warn"}}]}`)
	f(`{"functions":[{"id":"f","name":"F","async":true,"inputs":[]}]}`)
}

func TestValidateProgrammatic(t *testing.T) {
	m := EmptyThingModel()
	m.Properties = []Property{{ID: "a", Name: "A", ValueType: ValueType{Type: TypeString}, Extra: map[string]json.RawMessage{"bad": json.RawMessage("{")}}}
	err := m.Validate()
	var ve *ValidationError
	if !errors.As(err, &ve) || ve.Path != "properties[0].bad" {
		t.Fatalf("unexpected error: %v", err)
	}
	m.Properties[0].Extra = nil
	m.Properties[0].ValueType.Expands.MaxLength = -1
	if err := m.Validate(); !errors.As(err, &ve) || ve.Path != "properties[0].valueType.expands.maxLength" {
		t.Fatalf("unexpected error: %v", err)
	}
	var nilModel *ThingModel
	if err := nilModel.Validate(); err != nil {
		t.Fatalf("unexpected error: %s", err)
	}
}

func TestFormatValue(t *testing.T) {
	saved := time.Local
	time.Local = time.FixedZone("UTC+8", 8*3600)
	defer func() { time.Local = saved }()

	f := func(vt string, v any, want string) {
		t.Helper()
		var x ValueType
		if err := json.Unmarshal([]byte(vt), &x); err != nil {
			t.Fatalf("bad valueType %s: %s", vt, err)
		}
		if got := x.FormatValue(v); got != want {
			t.Fatalf("FormatValue(%s, %#v)\ngot:  %q\nwant: %q", vt, v, got, want)
		}
	}
	// Numeric.
	f(`{"type":"float","scale":2,"unit":"meter"}`, 3.14159, "3.14 m")
	f(`{"type":"float","scale":2,"unit":"meter"}`, json.Number("2"), "2.00 m")
	f(`{"type":"double","scale":0,"unit":"percent"}`, 42.6, "43%")
	f(`{"type":"double","unit":"percent"}`, 42.5, "42.5%")
	f(`{"type":"double","scale":1}`, "7.25", "7.2")
	f(`{"type":"int","unit":"count"}`, int64(12), "12")
	f(`{"type":"int","unit":"seconds"}`, 12.0, "12 s")
	f(`{"type":"long","unit":"milliseconds"}`, json.Number("9007199254740993"), "9007199254740993 ms")
	f(`{"type":"long","unit":"cubicMeter"}`, 5, "5 m³")
	f(`{"type":"int","unit":"hour"}`, "n/a", "n/a")
	f(`{"type":"int","unit":"days"}`, nil, "")
	f(`{"type":"float","unit":"cubicMeterPerSec","scale":3}`, float32(1.5), "1.500 m³/s")
	f(`{"type":"int","unit":"minutes"}`, int64(-3), "-3 min")
	// Enum.
	const enum = `{"type":"enum","elements":[{"value":"a","text":"Auto"},{"value":2,"text":"Manual"},{"value":"3","text":"Three"}]}`
	f(enum, "a", "Auto")
	f(enum, 2.0, "Manual")
	f(enum, json.Number("2"), "Manual")
	f(enum, int64(3), "Three")
	f(enum, "zzz", "zzz")
	f(enum, 9.5, "9.5")
	// Boolean.
	const boolean = `{"type":"boolean","trueText":"On","trueValue":true,"falseText":"Off","falseValue":false}`
	f(boolean, true, "On")
	f(boolean, false, "Off")
	f(boolean, "true", "On")
	f(boolean, 1.0, "On")
	f(boolean, int64(0), "Off")
	f(boolean, "maybe", "maybe")
	f(`{"type":"boolean"}`, true, "true")
	f(`{"type":"boolean"}`, json.Number("0"), "false")
	f(`{"type":"boolean","trueText":"Open","trueValue":"O","falseText":"Closed","falseValue":"C"}`, "C", "Closed")
	f(`{"type":"boolean","trueText":"Open","trueValue":"O","falseText":"Closed","falseValue":"C"}`, "O", "Open")
	// Date.
	f(`{"type":"date"}`, int64(0), "1970-01-01 08:00:00")
	f(`{"type":"date"}`, 1700000000123.0, "2023-11-15 06:13:20")
	f(`{"type":"date"}`, json.Number("1700000000000"), "2023-11-15 06:13:20")
	f(`{"type":"date"}`, "yesterday", "yesterday")
	// Others.
	f(`{"type":"string"}`, "hello", "hello")
	f(`{"type":"string"}`, 1.5, "1.5")
	f(`{"type":"geoPoint"}`, map[string]any{"lat": 1.5, "lon": 2}, `{"lat":1.5,"lon":2}`)
	f(`{"type":"array","elementType":{"type":"int"}}`, []any{1.0, 2.0}, "[1,2]")
	f(`{"type":"file","fileType":"url"}`, "http://x/y.png", "http://x/y.png")

	var nilVT *ValueType
	if got := nilVT.FormatValue(true); got != "true" {
		t.Fatalf("nil ValueType: %q", got)
	}
}

func TestIsNumericAndUnits(t *testing.T) {
	for typ, want := range map[string]bool{TypeInt: true, TypeLong: true, TypeFloat: true, TypeDouble: true,
		TypeString: false, TypeEnum: false, TypeDate: false, "": false} {
		vt := &ValueType{Type: typ}
		if got := vt.IsNumeric(); got != want {
			t.Fatalf("IsNumeric(%q) = %v", typ, got)
		}
	}
	if !IsAllowedUnit("cubicKilometerPerSec") || !IsAllowedUnit("") || IsAllowedUnit("furlong") {
		t.Fatalf("unexpected IsAllowedUnit")
	}
	if len(allowedUnits) != 27 {
		t.Fatalf("unexpected number of units: %d", len(allowedUnits))
	}
	if UnitSymbol("percent") != "%" || UnitSymbol("count") != "" || UnitSymbol("squareMeter") != "m²" {
		t.Fatalf("unexpected UnitSymbol")
	}
}
