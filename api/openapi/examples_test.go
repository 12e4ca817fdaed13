package openapi_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"devicehub/schema"
)

// TestExampleThingModelsValid parses every thing model among the
// document's examples as the server does: a client that copies an example
// gets 200, not 400 (a unit the server does not know, say). Thing models
// are the `metadata` strings of examples and the examples of ThingModel
// request bodies.
func TestExampleThingModelsValid(t *testing.T) {
	doc, _ := loadDoc(t)
	found := 0
	var walk func(node any, at string, inExample bool)
	walk = func(node any, at string, inExample bool) {
		switch v := node.(type) {
		case map[string]any:
			if inExample {
				if m, ok := v["metadata"].(string); ok && strings.TrimSpace(m) != "" {
					found++
					if _, err := schema.ParseThingModelString(m); err != nil {
						t.Errorf("%s.metadata: the server refuses this thing model: %v", at, err)
					}
				}
			}
			if !inExample {
				if s, ok := v["schema"].(map[string]any); ok && s["$ref"] == "#/components/schemas/ThingModel" && v["example"] != nil {
					found++
					b, _ := json.Marshal(v["example"])
					if _, err := schema.ParseThingModel(b); err != nil {
						t.Errorf("%s.example: the server refuses this thing model: %v", at, err)
					}
				}
			}
			for k, child := range v {
				walk(child, at+"/"+k, inExample || (!inExample && (k == "example" || k == "examples")))
			}
		case []any:
			for i, child := range v {
				walk(child, fmt.Sprintf("%s/%d", at, i), inExample)
			}
		}
	}
	walk(doc, "#", false)
	if found < 2 {
		t.Fatalf("found %d thing models among the examples, want the product PATCH's and the device metadata PUT's at least", found)
	}
}

// TestDocumentedUnits: the units the document lists for a thing model's
// numeric values are the ones the server accepts.
func TestDocumentedUnits(t *testing.T) {
	_, c := loadDoc(t)
	def, err := c.resolve("#/components/schemas/PropertyDefinition")
	if err != nil {
		t.Fatal(err)
	}
	unit := def["properties"].(map[string]any)["valueType"].(map[string]any)["properties"].(map[string]any)["unit"].(map[string]any)
	units := asSlice(unit["enum"])
	for _, u := range units {
		if !schema.IsAllowedUnit(u.(string)) {
			t.Errorf("the document lists unit %q, which the server refuses", u)
		}
	}
	// schema's own test pins its table at 27 units; with "" for none.
	if len(units) != 28 {
		t.Errorf("the document lists %d units, want schema's 27 and the empty one", len(units))
	}
}
