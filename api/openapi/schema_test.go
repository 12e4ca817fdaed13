package openapi_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

// decodeJSON decodes b keeping numbers as json.Number, so that integers
// and other numbers can be told apart.
func decodeJSON(b []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	return v, nil
}

// checker validates JSON values against the document's schemas: the
// subset of OpenAPI 3.0 schema objects the document uses ($ref to
// #/components/..., allOf, oneOf, anyOf, nullable, type, enum, properties,
// required, additionalProperties, items, the length, size and range
// bounds, pattern). Keywords it does not know are ignored, as
// annotations.
type checker struct {
	doc map[string]any
}

// resolve follows ref ("#/components/schemas/Product") in the document.
func (c *checker) resolve(ref string) (map[string]any, error) {
	if !strings.HasPrefix(ref, "#/") {
		return nil, fmt.Errorf("$ref %q is not local", ref)
	}
	var node any = c.doc
	for _, part := range strings.Split(strings.TrimPrefix(ref, "#/"), "/") {
		m, ok := node.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("$ref %q: %q is not in an object", ref, part)
		}
		if node, ok = m[part]; !ok {
			return nil, fmt.Errorf("$ref %q: no %q", ref, part)
		}
	}
	m, ok := node.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("$ref %q is not an object", ref)
	}
	return m, nil
}

// deref returns obj, or what its $ref names.
func (c *checker) deref(obj map[string]any) (map[string]any, error) {
	for range 10 {
		ref, ok := obj["$ref"].(string)
		if !ok {
			return obj, nil
		}
		var err error
		if obj, err = c.resolve(ref); err != nil {
			return nil, err
		}
	}
	return nil, fmt.Errorf("$ref chain too long")
}

// check returns what is wrong with v under schema, each problem prefixed
// with its path in v (at); none when v conforms.
func (c *checker) check(schemaNode any, v any, at string) []string {
	schema, ok := schemaNode.(map[string]any)
	if !ok {
		return []string{at + ": schema is not an object"}
	}
	schema, err := c.deref(schema)
	if err != nil {
		return []string{at + ": " + err.Error()}
	}
	var errs []string
	if v == nil {
		if schema["nullable"] == true {
			return nil
		}
		if _, typed := schema["type"]; typed {
			return []string{at + ": null, want " + fmt.Sprint(schema["type"])}
		}
	}
	for _, sub := range asSlice(schema["allOf"]) {
		errs = append(errs, c.check(sub, v, at)...)
	}
	if alts := asSlice(schema["oneOf"]); alts != nil {
		var matched []int
		var why []string
		for i, alt := range alts {
			if e := c.check(alt, v, at); len(e) == 0 {
				matched = append(matched, i)
			} else {
				why = append(why, fmt.Sprintf("option %d: %s", i+1, strings.Join(e, "; ")))
			}
		}
		if len(matched) != 1 {
			errs = append(errs, fmt.Sprintf("%s: matches %d options of oneOf, want exactly 1 (matched %v; %s)", at, len(matched), matched, strings.Join(why, " | ")))
		}
	}
	if alts := asSlice(schema["anyOf"]); alts != nil {
		ok := false
		for _, alt := range alts {
			if len(c.check(alt, v, at)) == 0 {
				ok = true
				break
			}
		}
		if !ok {
			errs = append(errs, at+": matches no option of anyOf")
		}
	}
	if enum := asSlice(schema["enum"]); enum != nil {
		found := false
		for _, e := range enum {
			if sameJSON(e, v) {
				found = true
				break
			}
		}
		if !found {
			errs = append(errs, fmt.Sprintf("%s: %s is not one of %s", at, jsonText(v), jsonText(enum)))
		}
	}
	if t, ok := schema["type"].(string); ok && !hasType(v, t) {
		return append(errs, fmt.Sprintf("%s: %s is not of type %s", at, jsonText(v), t))
	}
	switch x := v.(type) {
	case map[string]any:
		errs = append(errs, c.checkObject(schema, x, at)...)
	case []any:
		if n, ok := number(schema["minItems"]); ok && float64(len(x)) < n {
			errs = append(errs, fmt.Sprintf("%s: %d items, want at least %v", at, len(x), n))
		}
		if n, ok := number(schema["maxItems"]); ok && float64(len(x)) > n {
			errs = append(errs, fmt.Sprintf("%s: %d items, want at most %v", at, len(x), n))
		}
		if items, ok := schema["items"]; ok {
			for i, item := range x {
				errs = append(errs, c.check(items, item, fmt.Sprintf("%s[%d]", at, i))...)
			}
		}
	case string:
		n := float64(utf8.RuneCountInString(x))
		if m, ok := number(schema["minLength"]); ok && n < m {
			errs = append(errs, fmt.Sprintf("%s: %q is shorter than %v", at, x, m))
		}
		if m, ok := number(schema["maxLength"]); ok && n > m {
			errs = append(errs, fmt.Sprintf("%s: %q is longer than %v", at, x, m))
		}
		if p, ok := schema["pattern"].(string); ok {
			re, err := regexp.Compile(p)
			if err != nil {
				errs = append(errs, fmt.Sprintf("%s: bad pattern %q: %v", at, p, err))
			} else if !re.MatchString(x) {
				errs = append(errs, fmt.Sprintf("%s: %q does not match %s", at, x, p))
			}
		}
	case json.Number:
		f, _ := x.Float64()
		if m, ok := number(schema["minimum"]); ok && f < m {
			errs = append(errs, fmt.Sprintf("%s: %s is below %v", at, x, m))
		}
		if m, ok := number(schema["maximum"]); ok && f > m {
			errs = append(errs, fmt.Sprintf("%s: %s is above %v", at, x, m))
		}
	}
	return errs
}

func (c *checker) checkObject(schema, obj map[string]any, at string) []string {
	var errs []string
	props, _ := schema["properties"].(map[string]any)
	for _, r := range asSlice(schema["required"]) {
		name, _ := r.(string)
		if _, ok := obj[name]; !ok {
			errs = append(errs, fmt.Sprintf("%s: no required %q", at, name))
		}
	}
	keys := make([]string, 0, len(obj))
	for k := range obj {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if ps, ok := props[k]; ok {
			errs = append(errs, c.check(ps, obj[k], at+"."+k)...)
			continue
		}
		switch ap := schema["additionalProperties"].(type) {
		case bool:
			if !ap {
				errs = append(errs, fmt.Sprintf("%s: %q is not in the schema (additionalProperties false)", at, k))
			}
		case map[string]any:
			errs = append(errs, c.check(ap, obj[k], at+"."+k)...)
		}
	}
	return errs
}

func hasType(v any, t string) bool {
	switch t {
	case "object":
		_, ok := v.(map[string]any)
		return ok
	case "array":
		_, ok := v.([]any)
		return ok
	case "string":
		_, ok := v.(string)
		return ok
	case "boolean":
		_, ok := v.(bool)
		return ok
	case "number":
		_, ok := v.(json.Number)
		return ok
	case "integer":
		n, ok := v.(json.Number)
		if !ok {
			return false
		}
		_, err := strconv.ParseInt(n.String(), 10, 64)
		return err == nil
	}
	return false
}

func asSlice(v any) []any {
	s, _ := v.([]any)
	return s
}

func number(v any) (float64, bool) {
	n, ok := v.(json.Number)
	if !ok {
		return 0, false
	}
	f, err := n.Float64()
	return f, err == nil
}

func jsonText(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	if len(b) > 120 {
		b = append(b[:120], "..."...)
	}
	return string(b)
}

// sameJSON compares two decoded values as JSON (json.Number by value).
func sameJSON(a, b any) bool {
	na, aok := a.(json.Number)
	nb, bok := b.(json.Number)
	if aok && bok {
		fa, _ := na.Float64()
		fb, _ := nb.Float64()
		return fa == fb
	}
	return jsonText(a) == jsonText(b)
}

// TestChecker shows that the checker refuses what the document's schemas
// rule out, so that a passing shape check means something.
func TestChecker(t *testing.T) {
	doc, err := decodeJSON([]byte(`{"components":{"schemas":{
		"Closed":{"type":"object","additionalProperties":false,"required":["id"],"properties":{"id":{"type":"string"},"n":{"type":"integer","minimum":0},"tags":{"type":"array","nullable":true,"items":{"type":"string","maxLength":3}}}},
		"Env":{"type":"object","additionalProperties":false,"required":["status"],"properties":{"status":{"type":"integer"},"result":{}}},
		"WithResult":{"allOf":[{"$ref":"#/components/schemas/Env"},{"properties":{"result":{"$ref":"#/components/schemas/Closed"}}}]},
		"Either":{"oneOf":[{"type":"object","required":["a"],"properties":{"a":{"type":"string"}},"additionalProperties":false},{"type":"object","required":["b"],"properties":{"b":{"type":"number","nullable":true}},"additionalProperties":false}]},
		"Loose":{"oneOf":[{"type":"object"},{"type":"object","required":["a"]}]},
		"Code":{"type":"string","enum":["up","down"],"pattern":"^[a-z]+$"}}}}`))
	if err != nil {
		t.Fatal(err)
	}
	c := &checker{doc: doc.(map[string]any)}
	f := func(schema, value string, wantOK bool) {
		t.Helper()
		v, err := decodeJSON([]byte(value))
		if err != nil {
			t.Fatal(err)
		}
		errs := c.check(map[string]any{"$ref": "#/components/schemas/" + schema}, v, "$")
		if (len(errs) == 0) != wantOK {
			t.Errorf("%s %s: errors %v, want ok %v", schema, value, errs, wantOK)
		}
	}
	f("Closed", `{"id":"a","n":3,"tags":["x"]}`, true)
	f("Closed", `{"id":"a","tags":null}`, true)
	f("Closed", `{"n":3}`, false)                    // required
	f("Closed", `{"id":"a","extra":1}`, false)       // additionalProperties false
	f("Closed", `{"id":1}`, false)                   // type
	f("Closed", `{"id":"a","n":1.5}`, false)         // integer
	f("Closed", `{"id":"a","n":-1}`, false)          // minimum
	f("Closed", `{"id":"a","tags":["long"]}`, false) // maxLength in items
	f("Closed", `null`, false)
	f("WithResult", `{"status":200,"result":{"id":"a"}}`, true)
	f("WithResult", `{"status":200}`, true)
	f("WithResult", `{"status":200,"result":{"id":2}}`, false) // allOf's result schema applies
	f("WithResult", `{"status":200,"code":"x"}`, false)        // closed envelope
	f("Either", `{"a":"x"}`, true)
	f("Either", `{"b":null}`, true)
	f("Either", `{"c":1}`, false)
	f("Loose", `{"a":1}`, false) // matches both: oneOf wants exactly one
	f("Code", `"up"`, true)
	f("Code", `"left"`, false)
}
