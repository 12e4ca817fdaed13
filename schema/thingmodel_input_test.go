package schema_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"devicehub/schema"
)

// TestNormalizeThingModelInput: a model written through the API has only
// the four arrays at its top (the first unknown key, in key order, is
// named) and at most MaxThingModelBytes as stored; keys inside stay, and
// white space it was sent with does not count.
func TestNormalizeThingModelInput(t *testing.T) {
	prop := func(i int, desc string) string {
		return fmt.Sprintf(`{"id":"p%d","name":"P","description":"%s","valueType":{"type":"int"}}`, i, desc)
	}
	model := func(n, descLen int, pad string) string {
		ps := make([]string, n)
		for i := range ps {
			ps[i] = prop(i, strings.Repeat("d", descLen))
		}
		return `{"properties":[` + pad + strings.Join(ps, ","+pad) + `]}`
	}
	// One property with an empty description, stored; each byte of
	// description adds one.
	stored, err := schema.NormalizeThingModelInput(model(1, 0, ""))
	if err != nil {
		t.Fatal(err)
	}
	at := schema.MaxThingModelBytes - len(stored) // the description putting it at the limit
	for _, c := range []struct {
		name, in string
		path     string // of the error; "-" for none
	}{
		{"empty", `{}`, "-"},
		{"the four arrays", `{"properties":[],"events":[],"functions":[],"tags":[]}`, "-"},
		{"keys inside kept", `{"properties":[{"id":"a","name":"A","valueType":{"type":"int","x":1},"y":[2]}]}`, "-"},
		{"unknown key", `{"properties":[],"junk":1}`, "junk"},
		{"first unknown key by name", `{"zz":1,"properties":[],"aa":2}`, "aa"},
		{"name at the top", `{"name":"model"}`, "name"},
		{"at the limit", model(1, at, ""), "-"},
		{"a byte over", model(1, at+1, ""), ""},
		{"white space not counted", model(1, at, strings.Repeat(" ", 4096)), "-"},
		{"many properties over", model(400, 1000, ""), ""},
		{"invalid first", `{"properties":{},"junk":1}`, "properties"},
	} {
		got, err := schema.NormalizeThingModelInput(c.in)
		if c.path == "-" {
			if err != nil {
				t.Errorf("%s: %v", c.name, err)
			} else if len(got) > schema.MaxThingModelBytes {
				t.Errorf("%s: %d bytes taken", c.name, len(got))
			}
			continue
		}
		var ve *schema.ValidationError
		if !errors.As(err, &ve) || !errors.Is(err, schema.ErrInvalidThingModel) || ve.Path != c.path {
			t.Errorf("%s: err %v, want a ValidationError at %q", c.name, err, c.path)
			continue
		}
		if c.path == "" && !strings.Contains(ve.Msg, fmt.Sprint(schema.MaxThingModelBytes)) {
			t.Errorf("%s: %q does not say the limit", c.name, ve.Msg)
		}
	}
	// The stored form of what is kept is the parsed one's.
	if got, _ := schema.NormalizeThingModelInput(`{ "properties" : [ ] }`); got != `{"properties":[],"events":[],"functions":[],"tags":[]}` {
		t.Errorf("stored %s", got)
	}
}
