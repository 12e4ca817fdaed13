package schema

import (
	"encoding/json"
	"testing"
)

// TestOutside: every kind of type against values of every kind, enum
// elements of each JSON scalar kind, booleans with their own values, and
// a property the model does not declare.
func TestOutside(t *testing.T) {
	m, err := ParseThingModelString(`{"properties":[
{"id":"f","name":"F","valueType":{"type":"float"}},
{"id":"i","name":"I","valueType":{"type":"int"}},
{"id":"t","name":"T","valueType":{"type":"date"}},
{"id":"b","name":"B","valueType":{"type":"boolean"}},
{"id":"b01","name":"B01","valueType":{"type":"boolean","trueValue":"1","falseValue":0}},
{"id":"e","name":"E","valueType":{"type":"enum","elements":[{"value":"eco","text":"Eco"},{"value":2,"text":"Two"},{"value":true,"text":"Yes"}]}},
{"id":"s","name":"S","valueType":{"type":"string"}},
{"id":"pw","name":"PW","valueType":{"type":"password"}},
{"id":"o","name":"O","valueType":{"type":"object","properties":[{"id":"x","name":"X","valueType":{"type":"int"}}]}},
{"id":"a","name":"A","valueType":{"type":"array","elementType":{"type":"int"}}},
{"id":"g","name":"G","valueType":{"type":"geoPoint"}}]}`)
	if err != nil {
		t.Fatal(err)
	}
	obj, arr := json.RawMessage(`{"x":1}`), json.RawMessage(` [1]`)
	f := func(id string, v any, want string) {
		t.Helper()
		if got := m.Outside(id, v); got != want {
			t.Fatalf("%s %#v: %q, want %q", id, v, got, want)
		}
	}
	f("nosuch", 1.0, OutsideUndeclared)
	f("nosuch", nil, OutsideUndeclared)
	f("f", 21.5, "")
	f("f", "21.5", OutsideWrongType)
	f("f", true, OutsideWrongType)
	f("f", obj, OutsideWrongType)
	f("f", nil, "")
	f("i", 3.0, "")
	f("i", "3", OutsideWrongType)
	f("t", 1.7e12, "")
	f("t", "2026-11-29 10:00:00", "")
	f("t", false, OutsideWrongType)
	f("b", true, "")
	f("b", 1.0, OutsideWrongType)
	f("b", "true", OutsideWrongType)
	f("b01", false, "")
	f("b01", 1.0, "")
	f("b01", "0", "")
	f("b01", 2.0, OutsideWrongType)
	f("e", "eco", "")
	f("e", 2.0, "")
	f("e", "2", "")
	f("e", true, "")
	f("e", "boost", OutsideNotInEnum)
	f("e", 3.0, OutsideNotInEnum)
	f("e", false, OutsideNotInEnum)
	f("e", obj, OutsideWrongType)
	f("s", "x", "")
	f("s", 1.0, OutsideWrongType)
	f("pw", "x", "")
	f("pw", arr, OutsideWrongType)
	f("o", obj, "")
	f("o", arr, OutsideWrongType)
	f("o", "x", OutsideWrongType)
	f("a", arr, "")
	f("a", obj, OutsideWrongType)
	f("g", "120.1,30.2", "")
	f("g", obj, "")
	f("g", 1.0, OutsideWrongType)
	if got := (*ThingModel)(nil).Outside("f", 1.0); got != OutsideUndeclared {
		t.Fatalf("nil model: %q", got)
	}
}
