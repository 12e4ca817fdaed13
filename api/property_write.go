package api

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"sort"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/gofiber/fiber/v2"

	"devicehub/ingest/link"
	"devicehub/schema"
)

// PropertyWriter writes properties of connected devices
// (link.Commands.WriteProperties): the write is sent as WRITE_PROPERTY
// and its reply waited for, with the command path's rules (client_offline
// when the device is not connected, time_out after the timeout).
type PropertyWriter interface {
	WriteProperties(ctx context.Context, t link.Target, values map[string]any, timeout time.Duration) (map[string]any, error)
}

// maxWriteProperties bounds the properties of one write (and of one
// change of a shadow's desired state).
const maxWriteProperties = 64

// writeProperties is PUT /api/device/instance/{deviceId}/property: a map of
// property ids to values, each a property whose thing model says `write`
// and a value of its type; the answer is the device's reply's properties.
func (s *Server) writeProperties(c *fiber.Ctx) error {
	timeout, err := commandTimeout(c)
	if err != nil {
		return err
	}
	// The device first: one outside the caller's products is not_found,
	// whatever the body.
	dev, err := s.deviceRef(c.UserContext(), c.Params("deviceId"))
	if err != nil {
		return err
	}
	raw, err := decodeValueMap(c)
	if err != nil {
		return err
	}
	if len(raw) == 0 {
		return schema.Invalid("body", "name at least one property")
	}
	model, err := schema.ParseThingModelString(dev.Metadata)
	if err != nil {
		return schema.Invalid("deviceId", "the device's thing model cannot be read: %v", err)
	}
	values, err := checkValues(model, raw, true, true)
	if err != nil {
		return err
	}
	_, target, err := s.commandTarget(c)
	if err != nil {
		return err
	}
	w, isWriter := s.deps.Commands.(PropertyWriter)
	if !isWriter { // a device link that cannot write reaches no device for it
		return link.ErrOffline
	}
	out, err := w.WriteProperties(c.UserContext(), target, values, timeout)
	if err != nil {
		return err
	}
	return ok(c, out)
}

// decodeValueMap reads a JSON object of property ids to values, keeping
// each value's text (numbers exact), with decodeJSON's checks; at most
// maxWriteProperties properties of 1 to 64 characters.
func decodeValueMap(c *fiber.Ctx) (map[string]json.RawMessage, error) {
	var raw map[string]json.RawMessage
	if err := decodeJSON(c, &raw); err != nil {
		return nil, err
	}
	if raw == nil {
		return nil, schema.Invalid("body", "must be an object of property ids to values")
	}
	if len(raw) > maxWriteProperties {
		return nil, schema.Invalid("body", "at most %d properties at once", maxWriteProperties)
	}
	return raw, nil
}

// checkValues checks raw (property id to JSON value) against model: every
// id a property of it, writable when needWrite (expands.type has write),
// every value of its type. A null is refused when refuseNull, else kept
// as nil (a shadow's "leave desired"). Properties are checked in id
// order, so that the first error named is always the same.
func checkValues(model *schema.ThingModel, raw map[string]json.RawMessage, needWrite, refuseNull bool) (map[string]any, error) {
	ids := make([]string, 0, len(raw))
	for id := range raw {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	out := make(map[string]any, len(raw))
	for _, id := range ids {
		if id == "" || len(id) > 64 {
			return nil, schema.Invalid("body", "property ids have 1 to 64 characters")
		}
		p, found := model.Property(id)
		if !found {
			return nil, schema.Invalid(id, "no such property in the device's thing model")
		}
		if needWrite && !writable(p) {
			return nil, schema.Invalid(id, "property is not writable (its expands.type has no write)")
		}
		v := bytes.TrimSpace(raw[id])
		if string(v) == "null" {
			if refuseNull {
				return nil, schema.Invalid(id, "a value is required")
			}
			out[id] = nil
			continue
		}
		val, err := checkValue(id, &p.ValueType, v, 0)
		if err != nil {
			return nil, err
		}
		out[id] = val
	}
	return out, nil
}

// writable reports whether the thing model lets a property be written.
func writable(p *schema.Property) bool {
	for _, t := range p.Expands.Type {
		if t == "write" {
			return true
		}
	}
	return false
}

// checkValue checks one JSON value against vt and returns it decoded
// (numbers as json.Number, kept exact); field names it in errors.
func checkValue(field string, vt *schema.ValueType, raw []byte, depth int) (any, error) {
	if depth > schema.MaxNestingDepth {
		return nil, schema.Invalid(field, "nested too deeply")
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, schema.Invalid(field, "not a JSON value")
	}
	return checkDecoded(field, vt, v, depth)
}

func checkDecoded(field string, vt *schema.ValueType, v any, depth int) (any, error) {
	if depth > schema.MaxNestingDepth {
		return nil, schema.Invalid(field, "nested too deeply")
	}
	bad := func(format string, args ...any) (any, error) { return nil, schema.Invalid(field, format, args...) }
	switch vt.Type {
	case schema.TypeInt, schema.TypeLong:
		n, isNum := v.(json.Number)
		if !isNum {
			return bad("must be an integer (%s)", vt.Type)
		}
		i, err := strconv.ParseInt(n.String(), 10, 64)
		if err != nil {
			return bad("must be an integer (%s) from %d to %d", vt.Type, int64(math.MinInt64), int64(math.MaxInt64))
		}
		if vt.Type == schema.TypeInt && (i < math.MinInt32 || i > math.MaxInt32) {
			return bad("must be an integer (int) from %d to %d", math.MinInt32, math.MaxInt32)
		}
		return n, nil
	case schema.TypeFloat, schema.TypeDouble:
		n, isNum := v.(json.Number)
		if !isNum {
			return bad("must be a number (%s)", vt.Type)
		}
		f, err := n.Float64()
		if err != nil || math.IsInf(f, 0) || (vt.Type == schema.TypeFloat && math.Abs(f) > math.MaxFloat32) {
			return bad("must be a number within the range of %s", vt.Type)
		}
		return n, nil
	case schema.TypeString, schema.TypePassword, schema.TypeFile:
		str, isStr := v.(string)
		if !isStr {
			return bad("must be a string")
		}
		if m := vt.Expands.MaxLength; m > 0 && utf8.RuneCountInString(str) > m {
			return bad("must be at most %d characters (maxLength)", m)
		}
		return str, nil
	case schema.TypeBoolean:
		if b, isBool := v.(bool); isBool {
			return b, nil
		}
		if text, scalar := scalarValueText(v); scalar {
			for _, tv := range []json.RawMessage{vt.TrueValue, vt.FalseValue} {
				if tv != nil && text == rawScalarText(tv) {
					return v, nil
				}
			}
		}
		return bad("must be true or false (or the model's trueValue or falseValue)")
	case schema.TypeEnum:
		text, scalar := scalarValueText(v)
		if scalar {
			for i := range vt.Elements {
				if vt.Elements[i].ValueString() == text {
					return v, nil
				}
			}
		}
		return bad("must be one of the enum's element values")
	case schema.TypeDate:
		switch x := v.(type) {
		case string:
			if x == "" || len(x) > 64 {
				return bad("must be a date (epoch milliseconds or text of 1 to 64 characters)")
			}
			return x, nil
		case json.Number:
			if _, err := strconv.ParseInt(x.String(), 10, 64); err != nil {
				return bad("must be a date (epoch milliseconds or text)")
			}
			return x, nil
		}
		return bad("must be a date (epoch milliseconds or text)")
	case schema.TypeArray:
		arr, isArr := v.([]any)
		if !isArr {
			return bad("must be an array")
		}
		if vt.ElementType == nil {
			return arr, nil
		}
		for i, el := range arr {
			c, err := checkDecoded(field+"["+strconv.Itoa(i)+"]", vt.ElementType, el, depth+1)
			if err != nil {
				return nil, err
			}
			arr[i] = c
		}
		return arr, nil
	case schema.TypeObject:
		obj, isObj := v.(map[string]any)
		if !isObj {
			return bad("must be an object")
		}
		for k, el := range obj {
			var sub *schema.Property
			for i := range vt.Properties {
				if vt.Properties[i].ID == k {
					sub = &vt.Properties[i]
				}
			}
			if sub == nil {
				return nil, schema.Invalid(field+"."+k, "no such property of the object")
			}
			if el == nil {
				continue
			}
			c, err := checkDecoded(field+"."+k, &sub.ValueType, el, depth+1)
			if err != nil {
				return nil, err
			}
			obj[k] = c
		}
		return obj, nil
	case schema.TypeGeoPoint:
		if obj, isObj := v.(map[string]any); isObj {
			lon, okLon := numberOf(obj["lon"])
			lat, okLat := numberOf(obj["lat"])
			if okLon && okLat && math.Abs(lon) <= 180 && math.Abs(lat) <= 90 {
				return obj, nil
			}
		}
		return bad(`must be {"lon": -180..180, "lat": -90..90}`)
	}
	return bad("values of type %q cannot be written", vt.Type)
}

func numberOf(v any) (float64, bool) {
	n, isNum := v.(json.Number)
	if !isNum {
		return 0, false
	}
	f, err := n.Float64()
	return f, err == nil
}

// scalarValueText is the text of a decoded JSON scalar (the content of a
// string, a number's or boolean's literal), as schema compares enum and
// boolean values.
func scalarValueText(v any) (string, bool) {
	switch x := v.(type) {
	case string:
		return x, true
	case json.Number:
		return x.String(), true
	case bool:
		return strconv.FormatBool(x), true
	}
	return "", false
}

func rawScalarText(raw json.RawMessage) string {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if dec.Decode(&v) != nil {
		return ""
	}
	s, _ := scalarValueText(v)
	return s
}
