package tsdb

import (
	"strings"
	"testing"
)

// The codecs and LowCardinality reach the DDL only for servers of
// layoutCodecsSince or newer; 18.16 (and anything before the gate) gets
// plain types; every placeholder is filled either way.
func TestLayoutGate(t *testing.T) {
	for _, c := range []struct {
		v      Version
		codecs bool
	}{
		{Version{18, 16, 1}, false},
		{Version{19, 17, 0}, false},
		{Version{20, 2, 99}, false},
		{Version{20, 3, 0}, true},
		{Version{20, 10, 1}, true},
		{Version{24, 8, 4}, true},
		{Version{25, 1, 0}, true},
	} {
		db := &DB{version: c.v, tzName: "UTC"}
		stmts, err := db.statements()
		if err != nil {
			t.Fatal(err)
		}
		var table string
		for _, s := range stmts {
			if strings.Contains(s.sql, "{{") {
				t.Errorf("%s: a placeholder left in %q", c.v, firstLine(s.sql))
			}
			if strings.HasPrefix(s.sql, "CREATE TABLE IF NOT EXISTS device_property_v6 ") {
				table = s.sql
			}
			if !strings.Contains(s.sql, "device_property_v6 ") && (strings.Contains(s.sql, "CODEC") || strings.Contains(s.sql, "LowCardinality")) {
				t.Errorf("%s: codecs outside the layout's table: %q", c.v, firstLine(s.sql))
			}
		}
		if table == "" {
			t.Fatalf("%s: no device_property_v6 in the DDL", c.v)
		}
		for _, want := range []string{"ts         Int64 CODEC(Delta, ZSTD(1))", "product_id LowCardinality(String)", "property   LowCardinality(String)",
			"num_value  Float64 CODEC(ZSTD(1))", "str_value  String CODEC(ZSTD(1))"} {
			if got := strings.Contains(table, want); got != c.codecs {
				t.Errorf("%s: %q in the table: %v, want %v", c.v, want, got, c.codecs)
			}
		}
		if !c.codecs {
			for _, want := range []string{"ts         Int64,", "product_id String,", "num_value  Float64,", "str_value  String\n"} {
				if !strings.Contains(table, want) {
					t.Errorf("%s: no %q in %s", c.v, want, table)
				}
			}
		}
	}
}

func TestVersionAtLeast(t *testing.T) {
	for _, c := range []struct {
		v, w Version
		want bool
	}{
		{Version{18, 16, 1}, Version{20, 3, 0}, false},
		{Version{20, 3, 0}, Version{20, 3, 0}, true},
		{Version{20, 2, 9}, Version{20, 3, 0}, false},
		{Version{21, 0, 0}, Version{20, 3, 0}, true},
		{Version{20, 4, 0}, Version{20, 3, 5}, true},
		{Version{20, 3, 4}, Version{20, 3, 5}, false},
	} {
		if got := c.v.AtLeast(c.w); got != c.want {
			t.Errorf("%s.AtLeast(%s) = %v", c.v, c.w, got)
		}
	}
}
