package meta

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/lib/pq"

	"devicehub/schema"
)

// testResource is a product-like resource with one column of every kind.
var testResource = &Resource{
	Name: "product",
	Columns: map[string]Column{
		"id":               {Expr: "p.id", Kind: KindText},
		"name":             {Expr: "p.name", Kind: KindText},
		"superProductType": {Expr: "p.super_product_type", Kind: KindText},
		"state":            {Expr: "p.state", Kind: KindInt},
		"enabled":          {Expr: "p.enabled", Kind: KindBool},
		"createTime":       {Expr: "p.create_time", Kind: KindTime},
	},
	Sorts: map[string]string{
		"id":         "p.id",
		"name":       "p.name",
		"createTime": "p.create_time",
	},
	DefaultSort: "p.create_time DESC, p.id",
	TieBreak:    "p.id",
}

func compileBody(body string) (*Compiled, error) {
	q, err := DecodeQuery([]byte(body))
	if err != nil {
		return nil, err
	}
	return testResource.Compile(q)
}

func TestCompileQueryWhere(t *testing.T) {
	t.Parallel()
	f := func(body string, wantWhere string, wantArgs []any) {
		t.Helper()
		c, err := compileBody(body)
		if err != nil {
			t.Fatalf("body %s: unexpected error: %v", body, err)
		}
		if c.Where != wantWhere {
			t.Fatalf("body %s:\nwhere\n got %q\nwant %q", body, c.Where, wantWhere)
		}
		if len(c.Args) == 0 && len(wantArgs) == 0 {
			return
		}
		if !reflect.DeepEqual(c.Args, wantArgs) {
			t.Fatalf("body %s:\nargs\n got %#v\nwant %#v", body, c.Args, wantArgs)
		}
	}

	// no terms
	f(``, "", nil)
	f(`  `, "", nil)
	f(`{}`, "", nil)
	f(`{"terms":[]}`, "", nil)
	f(`{"terms":null}`, "", nil)
	f(`{"terms":[{}]}`, "", nil)
	f(`{"terms":[{"terms":[]}]}`, "", nil)
	f(`{"terms":[{"terms":[{"terms":[{}]}]}]}`, "", nil)

	// eq is the default termType; text values
	f(`{"terms":[{"column":"name","value":"a'b"}]}`, "p.name = $1", []any{"a'b"})
	f(`{"terms":[{"column":"name","value":"x","termType":"eq"}]}`, "p.name = $1", []any{"x"})
	f(`{"terms":[{"column":"name","value":"x","termType":"EQ"}]}`, "p.name = $1", []any{"x"})
	f(`{"terms":[{"column":"name","value":12.5}]}`, "p.name = $1", []any{"12.5"})
	f(`{"terms":[{"column":"name","value":true}]}`, "p.name = $1", []any{"true"})
	f(`{"terms":[{"column":"name","value":""}]}`, "p.name = $1", []any{""})
	f(`{"terms":[{"column":"name","value":"`+strings.Repeat("x", MaxValueLen)+`"}]}`, "p.name = $1", []any{strings.Repeat("x", MaxValueLen)})

	// the spec's example: a group of one level
	f(`{"terms":[{"terms":[{"column":"superProductType","value":"commonProduct","termType":"eq"}]}]}`,
		"p.super_product_type = $1", []any{"commonProduct"})

	// comparison termTypes on each kind
	f(`{"terms":[{"column":"state","value":1,"termType":"not"}]}`, "p.state <> $1", []any{int64(1)})
	f(`{"terms":[{"column":"state","value":"2","termType":"gt"}]}`, "p.state > $1", []any{int64(2)})
	f(`{"terms":[{"column":"state","value":" 3 ","termType":"gte"}]}`, "p.state >= $1", []any{int64(3)})
	f(`{"terms":[{"column":"state","value":4.0,"termType":"lt"}]}`, "p.state < $1", []any{int64(4)})
	f(`{"terms":[{"column":"state","value":-5,"termType":"lte"}]}`, "p.state <= $1", []any{int64(-5)})
	f(`{"terms":[{"column":"state","value":1e3}]}`, "p.state = $1", []any{int64(1000)})
	f(`{"terms":[{"column":"state","value":9223372036854775807}]}`, "p.state = $1", []any{int64(9223372036854775807)})
	f(`{"terms":[{"column":"name","value":"m","termType":"gt"}]}`, "p.name > $1", []any{"m"})
	f(`{"terms":[{"column":"enabled","value":true}]}`, "p.enabled = $1", []any{true})
	f(`{"terms":[{"column":"enabled","value":"false"}]}`, "p.enabled = $1", []any{false})
	f(`{"terms":[{"column":"enabled","value":"TRUE"}]}`, "p.enabled = $1", []any{true})
	f(`{"terms":[{"column":"enabled","value":1,"termType":"not"}]}`, "p.enabled <> $1", []any{true})
	f(`{"terms":[{"column":"enabled","value":0}]}`, "p.enabled = $1", []any{false})
	f(`{"terms":[{"column":"createTime","value":1700000000000,"termType":"gte"}]}`,
		"p.create_time >= to_timestamp($1::bigint / 1000.0)", []any{int64(1700000000000)})
	f(`{"terms":[{"column":"createTime","value":"1700000000000","termType":"lt"}]}`,
		"p.create_time < to_timestamp($1::bigint / 1000.0)", []any{int64(1700000000000)})
	f(`{"terms":[{"column":"createTime","value":"2023-11-14T22:13:20Z"}]}`,
		"p.create_time = to_timestamp($1::bigint / 1000.0)", []any{int64(1700000000000)})

	// like / nlike: ILIKE; values with % are kept, others wrapped and escaped
	f(`{"terms":[{"column":"name","value":"%abc%","termType":"like"}]}`, "p.name ILIKE $1", []any{"%abc%"})
	f(`{"terms":[{"column":"name","value":"abc%","termType":"Like"}]}`, "p.name ILIKE $1", []any{"abc%"})
	f(`{"terms":[{"column":"name","value":"a_b\\c","termType":"like"}]}`, "p.name ILIKE $1", []any{`%a\_b\\c%`})
	f(`{"terms":[{"column":"name","value":"abc","termType":"nlike"}]}`, "p.name NOT ILIKE $1", []any{"%abc%"})
	f(`{"terms":[{"column":"id","value":42,"termType":"like"}]}`, "p.id ILIKE $1", []any{"%42%"})

	// in / nin: arrays and comma-separated strings
	f(`{"terms":[{"column":"id","value":["a","b"],"termType":"in"}]}`, "p.id = ANY($1)", []any{pq.StringArray{"a", "b"}})
	f(`{"terms":[{"column":"id","value":"a, b,c","termType":"in"}]}`, "p.id = ANY($1)", []any{pq.StringArray{"a", "b", "c"}})
	f(`{"terms":[{"column":"id","value":[],"termType":"in"}]}`, "p.id = ANY($1)", []any{pq.StringArray{}})
	f(`{"terms":[{"column":"id","value":"","termType":"in"}]}`, "p.id = ANY($1)", []any{pq.StringArray{}})
	f(`{"terms":[{"column":"id","value":"a","termType":"nin"}]}`, "p.id <> ALL($1)", []any{pq.StringArray{"a"}})
	f(`{"terms":[{"column":"state","value":[1,"2"],"termType":"in"}]}`, "p.state = ANY($1)", []any{pq.Int64Array{1, 2}})
	f(`{"terms":[{"column":"state","value":"1,2","termType":"nin"}]}`, "p.state <> ALL($1)", []any{pq.Int64Array{1, 2}})
	f(`{"terms":[{"column":"state","value":7,"termType":"in"}]}`, "p.state = ANY($1)", []any{pq.Int64Array{7}})
	f(`{"terms":[{"column":"enabled","value":[true,"false"],"termType":"in"}]}`, "p.enabled = ANY($1)", []any{pq.BoolArray{true, false}})
	f(`{"terms":[{"column":"createTime","value":[1,2],"termType":"in"}]}`,
		"p.create_time = ANY(ARRAY(SELECT to_timestamp(x / 1000.0) FROM unnest($1::bigint[]) AS t(x)))", []any{pq.Int64Array{1, 2}})
	f(`{"terms":[{"column":"createTime","value":"1,2","termType":"nin"}]}`,
		"p.create_time <> ALL(ARRAY(SELECT to_timestamp(x / 1000.0) FROM unnest($1::bigint[]) AS t(x)))", []any{pq.Int64Array{1, 2}})

	// btw / nbtw
	f(`{"terms":[{"column":"state","value":[1,5],"termType":"btw"}]}`, "p.state BETWEEN $1 AND $2", []any{int64(1), int64(5)})
	f(`{"terms":[{"column":"state","value":"1,5","termType":"nbtw"}]}`, "p.state NOT BETWEEN $1 AND $2", []any{int64(1), int64(5)})
	f(`{"terms":[{"column":"name","value":"a,m","termType":"btw"}]}`, "p.name BETWEEN $1 AND $2", []any{"a", "m"})
	f(`{"terms":[{"column":"createTime","value":[1000,"2000"],"termType":"btw"}]}`,
		"p.create_time BETWEEN to_timestamp($1::bigint / 1000.0) AND to_timestamp($2::bigint / 1000.0)", []any{int64(1000), int64(2000)})

	// isnull / notnull / empty / nempty: the value is ignored
	f(`{"terms":[{"column":"name","termType":"isnull"}]}`, "p.name IS NULL", nil)
	f(`{"terms":[{"column":"name","value":"zzz","termType":"notnull"}]}`, "p.name IS NOT NULL", nil)
	f(`{"terms":[{"column":"name","termType":"empty"}]}`, "p.name = ''", nil)
	f(`{"terms":[{"column":"name","termType":"nempty"}]}`, "p.name <> ''", nil)
	f(`{"terms":[{"column":"state","termType":"empty"}]}`, "p.state IS NULL", nil)
	f(`{"terms":[{"column":"createTime","termType":"nempty"}]}`, "p.create_time IS NOT NULL", nil)

	// column$termType sets or overrides termType
	f(`{"terms":[{"column":"name$like","value":"ab"}]}`, "p.name ILIKE $1", []any{"%ab%"})
	f(`{"terms":[{"column":"name$NLIKE","value":"ab","termType":"eq"}]}`, "p.name NOT ILIKE $1", []any{"%ab%"})
	f(`{"terms":[{"column":"state$in","value":"1,2"}]}`, "p.state = ANY($1)", []any{pq.Int64Array{1, 2}})
	f(`{"terms":[{"column":"name$isnull"}]}`, "p.name IS NULL", nil)

	// and / or joins, top-level OR is parenthesised
	f(`{"terms":[{"column":"name","value":"a"},{"column":"state","value":1}]}`,
		"p.name = $1 AND p.state = $2", []any{"a", int64(1)})
	f(`{"terms":[{"column":"name","value":"a","type":"or"},{"column":"state","value":1,"type":"AND"}]}`,
		"p.name = $1 AND p.state = $2", []any{"a", int64(1)})
	f(`{"terms":[{"column":"name","value":"a"},{"column":"state","value":1,"type":"Or"}]}`,
		"(p.name = $1 OR p.state = $2)", []any{"a", int64(1)})
	f(`{"terms":[{"column":"name","value":"a"},{"column":"id","value":"b","type":"or"},{"column":"state","value":1}]}`,
		"(p.name = $1 OR p.id = $2 AND p.state = $3)", []any{"a", "b", int64(1)})

	// nested groups
	f(`{"terms":[{"column":"state","value":1},{"type":"and","terms":[{"column":"name","value":"a"},{"column":"id","value":"b","type":"or"}]}]}`,
		"p.state = $1 AND (p.name = $2 OR p.id = $3)", []any{int64(1), "a", "b"})
	f(`{"terms":[{"terms":[{"column":"name","value":"a"},{"column":"id","value":"b"}]},{"type":"or","terms":[{"column":"state","value":2}]}]}`,
		"((p.name = $1 AND p.id = $2) OR p.state = $3)", []any{"a", "b", int64(2)})
	f(`{"terms":[{"terms":[{"terms":[{"terms":[{"column":"name","value":"a"},{"column":"id","value":"b","type":"or"}]}]}]}]}`,
		"(p.name = $1 OR p.id = $2)", []any{"a", "b"})
	f(`{"terms":[{"terms":[]},{"column":"name","value":"a","type":"or"},{"terms":[{}],"type":"or"},{"column":"id","value":"b"}]}`,
		"p.name = $1 AND p.id = $2", []any{"a", "b"})
	f(`{"terms":[{"column":"name","value":"a"},{"terms":[{"column":"id","value":"x","type":"or"},{"column":"state","value":[1,2],"termType":"btw","type":"or"}],"type":"or"}]}`,
		"(p.name = $1 OR (p.id = $2 OR p.state BETWEEN $3 AND $4))", []any{"a", "x", int64(1), int64(2)})

	// unknown fields are ignored
	f(`{"whatever":[1,2],"terms":[{"column":"name","value":"a","options":["x"]}]}`, "p.name = $1", []any{"a"})
}

func TestCompileQueryOrderBy(t *testing.T) {
	t.Parallel()
	f := func(body string, want string) {
		t.Helper()
		c, err := compileBody(body)
		if err != nil {
			t.Fatalf("body %s: unexpected error: %v", body, err)
		}
		if c.OrderBy != want {
			t.Fatalf("body %s: orderBy\n got %q\nwant %q", body, c.OrderBy, want)
		}
	}
	f(`{}`, "p.create_time DESC, p.id")
	f(`{"sorts":[]}`, "p.create_time DESC, p.id")
	f(`{"sorts":[{"name":"name"}]}`, "p.name ASC, p.id")
	f(`{"sorts":[{"name":"name","order":"DESC"}]}`, "p.name DESC, p.id")
	f(`{"sorts":[{"name":"name","order":"desc"},{"name":"createTime","order":"Asc"}]}`, "p.name DESC, p.create_time ASC, p.id")
	f(`{"sorts":[{"name":"id","order":"desc"}]}`, "p.id DESC")
	f(`{"sorts":[{"name":"name","order":"asc"},{"name":"name","order":"desc"}]}`, "p.name ASC, p.id")
}

// TestCompileQueryOrderKeys checks Compiled.Order, the keys of OrderBy.
func TestCompileQueryOrderKeys(t *testing.T) {
	t.Parallel()
	cases := []struct {
		body string
		want []OrderKey
	}{
		{`{}`, []OrderKey{{"p.create_time", true}, {"p.id", false}}},
		{`{"sorts":[{"name":"name"}]}`, []OrderKey{{"p.name", false}, {"p.id", false}}},
		{`{"sorts":[{"name":"name","order":"desc"},{"name":"createTime","order":"Asc"}]}`,
			[]OrderKey{{"p.name", true}, {"p.create_time", false}, {"p.id", false}}},
		{`{"sorts":[{"name":"id","order":"desc"}]}`, []OrderKey{{"p.id", true}}},
		{`{"sorts":[{"name":"name","order":"asc"},{"name":"name","order":"desc"}]}`, []OrderKey{{"p.name", false}, {"p.id", false}}},
	}
	for _, c := range cases {
		compiled, err := compileBody(c.body)
		if err != nil {
			t.Fatalf("body %s: %v", c.body, err)
		}
		if !reflect.DeepEqual(compiled.Order, c.want) {
			t.Errorf("body %s: order %+v, want %+v", c.body, compiled.Order, c.want)
		}
	}
	// The default order ends with the tie-break's column, in the byte
	// order of the creation-time indexes (create_time DESC, id) that serve
	// it, where a custom sort's tie-break is that column in the natural
	// collation: ids are distinct, so either makes the order total.
	for _, r := range []*Resource{testResource, DeviceResource, ProductResource, RoleResource} {
		if got := parseOrder(r.DefaultSort); len(got) == 0 || (got[len(got)-1].Expr != r.TieBreak && Natural(got[len(got)-1].Expr) != r.TieBreak) {
			t.Errorf("%s: default sort %q parses to %+v, not ending with the tie-break %s", r.Name, r.DefaultSort, got, r.TieBreak)
		}
	}
}

func TestCompileQueryErrors(t *testing.T) {
	t.Parallel()
	f := func(body string, wantField, wantMsg string) {
		t.Helper()
		_, err := compileBody(body)
		if err == nil {
			t.Fatalf("body %s: expected an error", body)
		}
		if !errors.Is(err, schema.ErrIllegalArgument) {
			t.Fatalf("body %s: error %v is not schema.ErrIllegalArgument", body, err)
		}
		var ae *schema.ArgError
		if !errors.As(err, &ae) {
			t.Fatalf("body %s: error %T is not *schema.ArgError", body, err)
		}
		if ae.Field != wantField {
			t.Fatalf("body %s: field\n got %q\nwant %q (error %v)", body, ae.Field, wantField, err)
		}
		if !strings.Contains(ae.Msg, wantMsg) {
			t.Fatalf("body %s: message %q does not contain %q", body, ae.Msg, wantMsg)
		}
	}

	// decoding
	f(`{`, "", "malformed JSON")
	f(`{"terms":[]}x`, "", "malformed JSON")
	f(`[]`, "", "must be a JSON object")
	f(`"x"`, "", "must be a JSON object")
	f(`{"pageSize":"abc"}`, "pageSize", "must be an integer")
	f(`{"pageSize":1.5}`, "pageSize", "must be an integer")
	f(`{"pageSize":true}`, "pageSize", "must be an integer")
	f(`{"pageSize":-1}`, "pageSize", "must not be negative")
	f(`{"pageSize":1001}`, "pageSize", "must be at most 1000")
	f(`{"pageSize":1e10}`, "pageSize", "must be an integer")
	f(`{"pageIndex":-1}`, "pageIndex", "must not be negative")
	f(`{"pageIndex":[]}`, "pageIndex", "must be an integer")
	f(`{"current":-2}`, "current", "must not be negative")
	f(`{"paging":"maybe"}`, "paging", "must be a boolean")
	f(`{"paging":1}`, "paging", "must be a boolean")
	f(`{"sorts":{}}`, "sorts", "must be an array")
	f(`{"sorts":["name"]}`, "sorts[0]", "must be an object")
	f(`{"sorts":[{"name":1}]}`, "sorts[0].name", "must be a string")
	f(`{"sorts":[{"name":"name","order":true}]}`, "sorts[0].order", "must be a string")
	f(`{"terms":{}}`, "terms", "must be an array")
	f(`{"terms":[1]}`, "terms[0]", "must be an object")
	f(`{"terms":[{"column":5}]}`, "terms[0].column", "must be a string")
	f(`{"terms":[{"column":"name","termType":[]}]}`, "terms[0].termType", "must be a string")
	f(`{"terms":[{"column":"name","type":1}]}`, "terms[0].type", "must be a string")
	f(`{"terms":[{"terms":"x"}]}`, "terms[0].terms", "must be an array")
	f(`{"terms":[{"terms":[{"terms":[{"terms":[{"terms":[{"column":"name","value":"a"}]}]}]}]}]}`,
		"terms[0].terms[0].terms[0].terms[0].terms", "deeper than 4 levels")

	// sorts
	f(`{"sorts":[{"name":"bogus"}]}`, "sorts[0].name", `unknown sort "bogus" for product; allowed: createTime, id, name`)
	f(`{"sorts":[{"name":"name"},{"order":"asc"}]}`, "sorts[1].name", "is required")
	f(`{"sorts":[{"name":"name","order":"descending"}]}`, "sorts[0].order", `unknown order "descending"; allowed: asc, desc`)

	// columns and termTypes
	f(`{"terms":[{"column":"bogus","value":"a"}]}`, "terms[0].column",
		`unknown column "bogus" for product; allowed: createTime, enabled, id, name, state, superProductType`)
	f(`{"terms":[{"column":"name","value":"a"},{"terms":[{"column":"id","value":"a"},{"column":"p.name","value":"a"}]}]}`,
		"terms[1].terms[1].column", `unknown column "p.name"`)
	f(`{"terms":[{"column":"name","value":"a","termType":"regex"}]}`, "terms[0].termType", `unknown termType "regex"; allowed: eq, not, like`)
	f(`{"terms":[{"column":"name$regex","value":"a"}]}`, "terms[0].column", `unknown termType "regex"`)
	f(`{"terms":[{"column":"name$like$not","value":"a"}]}`, "terms[0].column", "at most one $termType")
	f(`{"terms":[{"column":"name$","value":"a"}]}`, "terms[0].column", "missing termType")
	f(`{"terms":[{"column":"$eq","value":"a"}]}`, "terms[0].column", `unknown column ""`)
	f(`{"terms":[{"column":"name","value":"a","type":"xor"}]}`, "terms[0].type", `unknown type "xor"; allowed: and, or`)
	f(`{"terms":[{"value":"a"}]}`, "terms[0].column", "is required")
	f(`{"terms":[{"termType":"eq"}]}`, "terms[0].column", "is required")
	f(`{"terms":[{"column":"name","value":"a","terms":[{"column":"id","value":"b"}]}]}`, "terms[0]", "not both")

	// values
	f(`{"terms":[{"column":"name"}]}`, "terms[0].value", "is required")
	f(`{"terms":[{"column":"name","value":null,"termType":"like"}]}`, "terms[0].value", "is required")
	f(`{"terms":[{"column":"name","value":["a"]}]}`, "terms[0].value", "not an array")
	f(`{"terms":[{"column":"name","value":{"a":1}}]}`, "terms[0].value", "not an object")
	f(`{"terms":[{"column":"name","value":"`+strings.Repeat("x", MaxValueLen+1)+`"}]}`, "terms[0].value", "at most 512 bytes")
	f(`{"terms":[{"column":"state","value":"one"}]}`, "terms[0].value", "must be an integer")
	f(`{"terms":[{"column":"state","value":1.5}]}`, "terms[0].value", "must be an integer")
	f(`{"terms":[{"column":"state","value":true}]}`, "terms[0].value", "must be an integer")
	f(`{"terms":[{"column":"state","value":"0x10"}]}`, "terms[0].value", "must be an integer")
	f(`{"terms":[{"column":"state","value":"NaN"}]}`, "terms[0].value", "must be an integer")
	f(`{"terms":[{"column":"enabled","value":"yes"}]}`, "terms[0].value", "must be a boolean")
	f(`{"terms":[{"column":"enabled","value":2}]}`, "terms[0].value", "must be a boolean")
	f(`{"terms":[{"column":"createTime","value":"yesterday"}]}`, "terms[0].value", "epoch milliseconds")
	f(`{"terms":[{"column":"createTime","value":300000000000000000}]}`, "terms[0].value", "out of range")
	f(`{"terms":[{"column":"state","value":"abc","termType":"like"}]}`, "terms[0].termType", "only for text columns")
	f(`{"terms":[{"column":"createTime$like","value":"1"}]}`, "terms[0].column", "only for text columns")
	f(`{"terms":[{"column":"state","value":[1,"x"],"termType":"in"}]}`, "terms[0].value[1]", "must be an integer")
	f(`{"terms":[{"column":"state","value":"1,x","termType":"in"}]}`, "terms[0].value", "must be an integer")
	f(`{"terms":[{"column":"id","value":[["a"]],"termType":"in"}]}`, "terms[0].value[0]", "not an array")
	f(`{"terms":[{"column":"id","value":{"a":1},"termType":"in"}]}`, "terms[0].value", "must be an array or a comma-separated string")
	f(`{"terms":[{"column":"id","value":[null],"termType":"nin"}]}`, "terms[0].value[0]", "must not be null")
	f(`{"terms":[{"column":"id","value":[`+strings.Repeat(`"a",`, MaxListLen)+`"a"],"termType":"in"}]}`, "terms[0].value", "at most 1000 values")
	f(`{"terms":[{"column":"id","value":"`+strings.Repeat(`a,`, MaxListLen)+`a","termType":"in"}]}`, "terms[0].value", "at most 1000 values")
	f(`{"terms":[{"column":"state","value":[1],"termType":"btw"}]}`, "terms[0].value", "must be 2 values")
	f(`{"terms":[{"column":"state","value":"1,2,3","termType":"nbtw"}]}`, "terms[0].value", "must be 2 values")
	f(`{"terms":[{"column":"state","value":5,"termType":"btw"}]}`, "terms[0].value", "must be 2 values")
	f(`{"terms":[{"column":"state","value":[1,"b"],"termType":"btw"}]}`, "terms[0].value[1]", "must be an integer")
	f(`{"terms":[{"terms":[{"column":"name","value":"a"},{"column":"state","value":"z","type":"or"}]}]}`, "terms[0].terms[1].value", "must be an integer")

	// too many terms
	many := strings.Repeat(`{"column":"name","value":"a"},`, MaxTerms) + `{"column":"name","value":"a"}`
	f(`{"terms":[`+many+`]}`, "terms", "too many terms")
}

// TestCompileQueryDirect covers a Query built in Go rather than decoded.
func TestCompileQueryDirect(t *testing.T) {
	t.Parallel()
	c, err := testResource.Compile(nil)
	if err != nil || c.Where != "" || len(c.Args) != 0 || c.OrderBy != testResource.DefaultSort {
		t.Fatalf("Compile(nil) = %+v, %v", c, err)
	}
	deep := []Term{{Column: "name", Value: []byte(`"a"`)}}
	for range MaxTermDepth {
		deep = []Term{{Terms: deep}}
	}
	_, err = testResource.Compile(&Query{Terms: deep})
	var ae *schema.ArgError
	if !errors.As(err, &ae) || ae.Field != "terms[0].terms[0].terms[0].terms[0].terms" {
		t.Fatalf("too deep: got %v", err)
	}
	_, err = testResource.Compile(&Query{Terms: []Term{{Column: "name", Value: []byte(`"a`)}}})
	if !errors.As(err, &ae) || ae.Field != "terms[0].value" {
		t.Fatalf("bad raw value: got %v", err)
	}
}

func TestDecodeQuery(t *testing.T) {
	t.Parallel()
	tr, fa := true, false
	f := func(body string, want Query) {
		t.Helper()
		q, err := DecodeQuery([]byte(body))
		if err != nil {
			t.Fatalf("body %s: unexpected error: %v", body, err)
		}
		if !reflect.DeepEqual(*q, want) {
			t.Fatalf("body %s:\n got %+v\nwant %+v", body, *q, want)
		}
	}
	f(``, Query{})
	f(" \n\t", Query{})
	f(`null`, Query{})
	f(`{}`, Query{})
	f(`{"pageIndex":2,"pageSize":10,"current":3,"paging":true}`, Query{PageIndex: 2, PageSize: 10, Current: 3, Paging: &tr})
	f(`{"pageIndex":"2","pageSize":"10","paging":"false"}`, Query{PageIndex: 2, PageSize: 10, Paging: &fa})
	f(`{"pageIndex":null,"pageSize":0,"paging":null,"sorts":null,"terms":null}`, Query{})
	f(`{"pageSize":1000}`, Query{PageSize: 1000})
	f(`{"PageSize":5000,"other":{"x":[1]}}`, Query{})
	f(`{"sorts":[{"name":"name","order":"desc"},null]}`, Query{Sorts: []Sort{{Name: "name", Order: "desc"}, {}}})
	f(`{"terms":[{"column":"name","value":"a","termType":"like","type":"or","terms":[{"column":"id","value":[1,2]}]}]}`,
		Query{Terms: []Term{{Column: "name", Value: []byte(`"a"`), TermType: "like", Type: "or",
			Terms: []Term{{Column: "id", Value: []byte(`[1,2]`)}}}}})
	f(`{"terms":[{"column":"name","value":null}]}`, Query{Terms: []Term{{Column: "name"}}})
}

func TestQueryPage(t *testing.T) {
	t.Parallel()
	tr, fa := true, false
	f := func(q *Query, total int, wantIndex, wantSize, wantOffset int) {
		t.Helper()
		index, size, offset := q.Page(total)
		if index != wantIndex || size != wantSize || offset != wantOffset {
			t.Fatalf("%+v.Page(%d) = (%d, %d, %d), want (%d, %d, %d)", q, total, index, size, offset, wantIndex, wantSize, wantOffset)
		}
	}
	f(nil, 100, 0, 25, 0)
	f(&Query{}, 0, 0, 25, 0)
	f(&Query{}, 100, 0, 25, 0)
	f(&Query{PageIndex: 1, PageSize: 10}, 100, 1, 10, 10)
	f(&Query{PageIndex: 9, PageSize: 10}, 100, 9, 10, 90)
	// past the end: the last page
	f(&Query{PageIndex: 10, PageSize: 10}, 100, 9, 10, 90)
	f(&Query{PageIndex: 1000000, PageSize: 10}, 101, 10, 10, 100)
	f(&Query{PageIndex: 3, PageSize: 10}, 1, 0, 10, 0)
	f(&Query{PageIndex: 3, PageSize: 10}, 0, 0, 10, 0)
	// current is a 1-based alias used only without pageIndex
	f(&Query{Current: 2, PageSize: 10}, 100, 1, 10, 10)
	f(&Query{Current: 1, PageSize: 10}, 100, 0, 10, 0)
	f(&Query{PageIndex: 4, Current: 2, PageSize: 10}, 100, 4, 10, 40)
	f(&Query{Current: 50, PageSize: 10}, 35, 3, 10, 30)
	// paging false: one page of at most MaxPageSize
	f(&Query{PageIndex: 3, PageSize: 10, Paging: &fa}, 5000, 0, MaxPageSize, 0)
	f(&Query{PageIndex: 3, PageSize: 10, Paging: &tr}, 5000, 3, 10, 30)
	// sizes built in Go outside the decoder's checks
	f(&Query{PageSize: 5000}, 5000, 0, MaxPageSize, 0)
	f(&Query{PageIndex: -3, PageSize: -1}, 100, 0, 25, 0)
}

func TestDecodeQueryCurrentPage(t *testing.T) {
	t.Parallel()
	q, err := DecodeQuery([]byte(`{"current":3,"pageSize":20}`))
	if err != nil {
		t.Fatal(err)
	}
	if index, size, offset := q.Page(1000); index != 2 || size != 20 || offset != 40 {
		t.Fatalf("Page = (%d, %d, %d), want (2, 20, 40)", index, size, offset)
	}
}
