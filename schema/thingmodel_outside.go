package schema

import (
	"encoding/json"
	"strconv"
)

// Reasons a reported value is outside its thing model (ValueType.Outside,
// ThingModel.Outside). They are label values of ingest's
// devicehub_ingest_outside_model_values_total and the value of the
// outsideModel mark the API puts on such values.
const (
	OutsideUndeclared = "undeclared"  // the property is not in the model
	OutsideNotInEnum  = "not_in_enum" // an enum value none of whose elements has
	OutsideWrongType  = "wrong_type"  // a value of another kind (a string for a number...)
)

// OutsideReasons lists every reason, in a fixed order.
var OutsideReasons = []string{OutsideUndeclared, OutsideNotInEnum, OutsideWrongType}

// OutsideText is the label of a reason, the text of the API's
// outsideModel mark ("" for an unknown reason).
func OutsideText(reason string) string { return outsideLabels[reason] }

var outsideLabels = map[string]string{
	OutsideUndeclared: "Not in the thing model",
	OutsideNotInEnum:  "Not one of the enum's elements",
	OutsideWrongType:  "Not of the property's type",
}

// Outside says why the reported value v of property id does not fit m:
// OutsideUndeclared when m declares no such top-level property, else what
// its ValueType.Outside says ("" when it fits). A nil m declares nothing.
func (m *ThingModel) Outside(id string, v any) string {
	p, ok := m.Property(id)
	if !ok {
		return OutsideUndeclared
	}
	return p.ValueType.Outside(v)
}

// Outside says why a reported value v does not fit this type: "" when it
// fits, OutsideNotInEnum for an enum value none of Elements has (compared
// as text, as FormatValue finds an element's text), else OutsideWrongType
// when v is not of the type's kind. v is a value as a device's JSON gives
// it: float64 (a number), bool, string, json.RawMessage (an object or an
// array), or nil (no value: it fits).
//
// The kinds: int, long, float and double take numbers; date a number
// (epoch ms) or a string; boolean a bool, or the text of its TrueValue or
// FalseValue (a device may send "1"/"0" or 1/0 where they say so); string,
// password and file take strings; object an object; array an array;
// geoPoint an object, an array or a string ("lon,lat"). A type the
// platform does not know takes anything.
func (vt *ValueType) Outside(v any) string {
	if v == nil || vt == nil {
		return ""
	}
	raw, isJSON := v.(json.RawMessage)
	switch vt.Type {
	case TypeInt, TypeLong, TypeFloat, TypeDouble:
		if _, ok := v.(float64); ok {
			return ""
		}
	case TypeDate:
		switch v.(type) {
		case float64, string:
			return ""
		}
	case TypeBoolean:
		if _, ok := v.(bool); ok {
			return ""
		}
		if !isJSON {
			s := outsideText(v)
			if vt.TrueValue != nil && s == scalarText(vt.TrueValue) || vt.FalseValue != nil && s == scalarText(vt.FalseValue) {
				return ""
			}
		}
	case TypeEnum:
		if isJSON {
			break
		}
		s := outsideText(v)
		for i := range vt.Elements {
			if vt.Elements[i].ValueString() == s {
				return ""
			}
		}
		return OutsideNotInEnum
	case TypeString, TypePassword, TypeFile:
		if _, ok := v.(string); ok {
			return ""
		}
	case TypeObject:
		if isJSON && firstByte(raw) == '{' {
			return ""
		}
	case TypeArray:
		if isJSON && firstByte(raw) == '[' {
			return ""
		}
	case TypeGeoPoint:
		if _, ok := v.(string); ok || isJSON && (firstByte(raw) == '{' || firstByte(raw) == '[') {
			return ""
		}
	default:
		return ""
	}
	return OutsideWrongType
}

// outsideText is a scalar's text as element and boolean values are
// compared: numbers in their shortest form.
func outsideText(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case bool:
		return strconv.FormatBool(x)
	case float64:
		return strconv.FormatFloat(x, 'f', -1, 64)
	}
	return plainText(v)
}
