package openapi_test

import (
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"devicehub/ingest/alarm"
	"devicehub/meta"
)

// TestListColumnsDocumented: the description of every list and count
// operation names each column its terms may filter on and each sort
// (the resource's whitelists in meta and ingest/alarm), so that a client
// learns them from the document, not from a refusal.
func TestListColumnsDocumented(t *testing.T) {
	doc, _ := loadDoc(t)
	descriptions := map[string]string{}
	for _, ops := range doc["paths"].(map[string]any) {
		for _, op := range ops.(map[string]any) {
			if o, ok := op.(map[string]any); ok {
				id, _ := o["operationId"].(string)
				descriptions[id], _ = o["description"].(string)
			}
		}
	}
	for _, c := range []struct {
		op         string
		r          *meta.Resource
		terms, srt bool
	}{
		{"queryProducts", meta.ProductResource, true, true},
		{"countProducts", meta.ProductResource, true, false},
		{"queryDevices", meta.DeviceResource, true, true},
		{"queryRoles", meta.RoleResource, true, true},
		{"queryUsers", meta.UserResource, true, true},
		{"queryKeys", meta.KeyResource, true, true},
		{"queryAudit", meta.AuditResource, true, true},
		{"queryAlarmRules", alarm.RuleResource, true, true},
		{"queryAlarmRecords", alarm.RecordResource, true, true},
	} {
		desc, ok := descriptions[c.op]
		if !ok {
			t.Errorf("no operation %s", c.op)
			continue
		}
		var missing []string
		if c.terms {
			for col := range c.r.Columns {
				if !strings.Contains(desc, "`"+col+"`") {
					missing = append(missing, "term "+col)
				}
			}
		}
		if c.srt {
			for s := range c.r.Sorts {
				if !strings.Contains(desc, "`"+s+"`") {
					missing = append(missing, "sort "+s)
				}
			}
		}
		sort.Strings(missing)
		if len(missing) > 0 {
			t.Errorf("%s does not name: %s", c.op, strings.Join(missing, ", "))
		}
	}
}

// TestListColumnsInReference: REFERENCE.md's table of term columns and
// sorts per list is exactly the resources' whitelists.
func TestListColumnsInReference(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "..", "REFERENCE.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(raw), "| list | term columns | sorts |\n|---|---|---|\n")
	if !ok {
		t.Fatal("REFERENCE.md has no table of list columns")
	}
	table, _, _ = strings.Cut(table, "\n\n")
	resources := map[string]*meta.Resource{
		"products (endpoints 1, 6)": meta.ProductResource, "devices (endpoint 7)": meta.DeviceResource,
		"roles (endpoint 13)": meta.RoleResource, "users": meta.UserResource, "API keys": meta.KeyResource,
		"audit": meta.AuditResource, "alarm rules": alarm.RuleResource, "alarm records": alarm.RecordResource,
	}
	names := func(cell string) []string {
		var out []string
		for _, f := range strings.Split(cell, ",") {
			out = append(out, strings.Trim(strings.TrimSpace(f), "`"))
		}
		sort.Strings(out)
		return out
	}
	keys := func(m map[string]string) []string {
		var out []string
		for k := range m {
			out = append(out, k)
		}
		sort.Strings(out)
		return out
	}
	seen := 0
	for _, line := range strings.Split(table, "\n") {
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if len(cells) != 3 {
			t.Fatalf("table line %q", line)
		}
		r, ok := resources[strings.TrimSpace(cells[0])]
		if !ok {
			t.Errorf("unknown list %q", cells[0])
			continue
		}
		seen++
		cols := make(map[string]string, len(r.Columns))
		for k := range r.Columns {
			cols[k] = ""
		}
		if got, want := names(cells[1]), keys(cols); strings.Join(got, " ") != strings.Join(want, " ") {
			t.Errorf("%s: terms %v, want %v", cells[0], got, want)
		}
		if got, want := names(cells[2]), keys(r.Sorts); strings.Join(got, " ") != strings.Join(want, " ") {
			t.Errorf("%s: sorts %v, want %v", cells[0], got, want)
		}
	}
	if seen != len(resources) {
		t.Errorf("%d lists in the table, want %d", seen, len(resources))
	}
}
