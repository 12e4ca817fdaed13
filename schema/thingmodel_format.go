package schema

import (
	"encoding/json"
	"math"
	"strconv"
	"strings"
	"time"
)

// DateLayout is the layout FormatValue uses for date values.
const DateLayout = "2006-01-02 15:04:05"

// FormatValue renders a value of this type for dashboards. v may be nil,
// float64, float32, any integer type, string, bool or json.Number; other
// values are rendered as JSON.
//
//   - int, long, float, double: float/double get Scale fixed decimals when a
//     scale is set, then the unit symbol is appended ("12.50 m", "42%");
//   - enum: the text of the element whose value matches (as strings), else
//     the raw value;
//   - boolean: TrueText/FalseText (default "true"/"false") when v matches
//     TrueValue/FalseValue, or true/"true"/1 resp. false/"false"/0;
//   - date: epoch milliseconds as DateLayout in time.Local;
//   - anything else: the string, or the JSON form.
func (vt *ValueType) FormatValue(v any) string {
	if v == nil {
		return ""
	}
	if vt == nil {
		return plainText(v)
	}
	switch vt.Type {
	case TypeInt, TypeLong, TypeFloat, TypeDouble:
		return vt.formatNumber(v)
	case TypeEnum:
		s := plainText(v)
		for i := range vt.Elements {
			if vt.Elements[i].ValueString() == s {
				return vt.Elements[i].Text
			}
		}
		return s
	case TypeBoolean:
		return vt.formatBool(v)
	case TypeDate:
		f, ok := toFloat(v)
		if !ok || math.IsNaN(f) || math.IsInf(f, 0) {
			return plainText(v)
		}
		return time.UnixMilli(int64(f)).In(time.Local).Format(DateLayout)
	}
	return plainText(v)
}

func (vt *ValueType) formatNumber(v any) string {
	var s string
	switch n := v.(type) {
	case int:
		s = strconv.Itoa(n)
	case int64:
		s = strconv.FormatInt(n, 10)
	case int32:
		s = strconv.FormatInt(int64(n), 10)
	case uint:
		s = strconv.FormatUint(uint64(n), 10)
	case uint64:
		s = strconv.FormatUint(n, 10)
	case uint32:
		s = strconv.FormatUint(uint64(n), 10)
	}
	f, ok := toFloat(v)
	if !ok {
		return plainText(v)
	}
	if vt.Type == TypeFloat || vt.Type == TypeDouble {
		prec := -1
		if vt.hasScale() && vt.Scale >= 0 && vt.Scale <= 10 {
			prec = vt.Scale
		}
		s = strconv.FormatFloat(f, 'f', prec, 64)
	} else if s == "" {
		// int/long: keep exact integer text when there is one.
		if str, isStr := numberText(v); isStr {
			if _, err := strconv.ParseInt(str, 10, 64); err == nil {
				s = str
			}
		}
		if s == "" {
			s = strconv.FormatFloat(f, 'f', -1, 64)
		}
	}
	switch sym := UnitSymbol(vt.Unit); sym {
	case "":
		return s
	case "%":
		return s + sym
	default:
		return s + " " + sym
	}
}

func (vt *ValueType) formatBool(v any) string {
	trueText, falseText := vt.TrueText, vt.FalseText
	if trueText == "" {
		trueText = "true"
	}
	if falseText == "" {
		falseText = "false"
	}
	s := plainText(v)
	if vt.TrueValue != nil && s == scalarText(vt.TrueValue) {
		return trueText
	}
	if vt.FalseValue != nil && s == scalarText(vt.FalseValue) {
		return falseText
	}
	switch s {
	case "true", "1":
		return trueText
	case "false", "0":
		return falseText
	}
	return s
}

// numberText returns the text of a json.Number or string.
func numberText(v any) (string, bool) {
	switch n := v.(type) {
	case json.Number:
		return n.String(), true
	case string:
		return strings.TrimSpace(n), true
	}
	return "", false
}

func toFloat(v any) (float64, bool) {
	switch n := v.(type) {
	case float64:
		return n, true
	case float32:
		return float64(n), true
	case int:
		return float64(n), true
	case int64:
		return float64(n), true
	case int32:
		return float64(n), true
	case uint:
		return float64(n), true
	case uint64:
		return float64(n), true
	case uint32:
		return float64(n), true
	}
	if s, ok := numberText(v); ok {
		f, err := strconv.ParseFloat(s, 64)
		return f, err == nil
	}
	return 0, false
}

// plainText is the string form of v: strings as they are, numbers in their
// shortest form, booleans as true/false, the rest as JSON.
func plainText(v any) string {
	switch x := v.(type) {
	case nil:
		return ""
	case string:
		return x
	case json.Number:
		return x.String()
	case bool:
		return strconv.FormatBool(x)
	case float64:
		return strconv.FormatFloat(x, 'f', -1, 64)
	case float32:
		return strconv.FormatFloat(float64(x), 'f', -1, 32)
	case int:
		return strconv.Itoa(x)
	case int64:
		return strconv.FormatInt(x, 10)
	case int32:
		return strconv.FormatInt(int64(x), 10)
	case uint:
		return strconv.FormatUint(uint64(x), 10)
	case uint64:
		return strconv.FormatUint(x, 10)
	case uint32:
		return strconv.FormatUint(uint64(x), 10)
	case json.RawMessage:
		return string(x)
	}
	b, err := json.Marshal(v)
	if err != nil {
		return ""
	}
	return string(b)
}
