package meta

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/lib/pq"

	"devicehub/schema"
)

// queryVocabulary is every piece of SQL the compiler may write for
// testResource: column and sort expressions, keywords, operators and the
// time conversions. It is joined with NUL so that no match spans two pieces.
var queryVocabulary = func() string {
	pieces := []string{
		testResource.DefaultSort, testResource.TieBreak,
		"ANY(ARRAY(SELECT to_timestamp(x / 1000.0) FROM unnest($",
		"ALL(ARRAY(SELECT to_timestamp(x / 1000.0) FROM unnest($",
		"::bigint[]) AS t(x)))", "::bigint / 1000.0)", "to_timestamp($",
		" = ANY($", " <> ALL($", " NOT BETWEEN ", " BETWEEN ", " NOT ILIKE ", " ILIKE ",
		" IS NOT NULL", " IS NULL", " = ''", " <> ''",
		" = $", " <> $", " > $", " >= $", " < $", " <= $",
		" AND (", " OR (", ") AND ", ") OR ", "((", "))",
	}
	// every condition the compiler writes, rendered with harmless values
	values := map[ColumnKind]string{KindText: `"vv"`, KindInt: `1`, KindBool: `true`, KindTime: `1`}
	lists := map[ColumnKind]string{KindText: `["vv","ww"]`, KindInt: `[1,2]`, KindBool: `[true,false]`, KindTime: `[1,2]`}
	for name, col := range testResource.Columns {
		for _, tt := range termTypes {
			v := values[col.Kind]
			if tt == "in" || tt == "nin" || tt == "btw" || tt == "nbtw" {
				v = lists[col.Kind]
			}
			q := &Query{Terms: []Term{{Column: name, TermType: tt, Value: []byte(v)}}}
			if c, err := testResource.Compile(q); err == nil {
				pieces = append(pieces, " AND "+c.Where+" AND ", " OR "+c.Where+" OR ",
					"("+c.Where+" AND ", "("+c.Where+" OR ", " AND "+c.Where+")", " OR "+c.Where+")")
			}
		}
	}
	for _, s := range testResource.Sorts {
		pieces = append(pieces, s+" ASC, ", s+" DESC, ")
	}
	return strings.Join(pieces, "\x00")
}()

var (
	placeholderRe = regexp.MustCompile(`\$[0-9]+`)
	// sqlTokenRe splits a Where string into SQL tokens.
	sqlTokenRe = regexp.MustCompile(`\s+|[A-Za-z_][A-Za-z0-9_.]*|\$[0-9]+|[0-9]+(\.[0-9]+)?|''|::|<>|<=|>=|[=<>()/,\[\]]`)
)

// trustedWords are the identifiers and keywords Where may contain.
var trustedWords = func() map[string]bool {
	m := map[string]bool{}
	for _, w := range strings.Fields("AND OR NOT IS NULL ILIKE BETWEEN ANY ALL ARRAY SELECT FROM AS to_timestamp unnest bigint t x") {
		m[w] = true
	}
	for _, c := range testResource.Columns {
		m[c.Expr] = true
	}
	return m
}()

// stringArgs returns the text of every string argument, array items
// included.
func stringArgs(args []any) []string {
	var out []string
	for _, a := range args {
		switch a := a.(type) {
		case string:
			out = append(out, a)
		case pq.StringArray:
			out = append(out, a...)
		}
	}
	return out
}

// checkCompiled asserts that c holds no request text in its SQL.
func checkCompiled(c *Compiled) error {
	// placeholders: $1..$n, in order, one per argument
	ps := placeholderRe.FindAllString(c.Where, -1)
	if len(ps) != len(c.Args) {
		return fmt.Errorf("%d placeholders for %d args in %q", len(ps), len(c.Args), c.Where)
	}
	for i, p := range ps {
		if p != "$"+strconv.Itoa(i+1) {
			return fmt.Errorf("placeholder %d is %s in %q", i+1, p, c.Where)
		}
	}
	// only trusted tokens
	depth := 0
	rest := c.Where
	for rest != "" {
		loc := sqlTokenRe.FindStringIndex(rest)
		if loc == nil || loc[0] != 0 {
			return fmt.Errorf("untrusted text at %q in %q", rest, c.Where)
		}
		tok := rest[:loc[1]]
		rest = rest[loc[1]:]
		switch {
		case tok == "(":
			depth++
		case tok == ")":
			depth--
			if depth < 0 {
				return fmt.Errorf("unbalanced parentheses in %q", c.Where)
			}
		case tok[0] >= 'A' && tok[0] <= 'Z' || tok[0] >= 'a' && tok[0] <= 'z' || tok[0] == '_':
			if !trustedWords[tok] {
				return fmt.Errorf("untrusted word %q in %q", tok, c.Where)
			}
		case tok[0] >= '0' && tok[0] <= '9':
			if tok != "1000.0" {
				return fmt.Errorf("literal number %q in %q", tok, c.Where)
			}
		}
	}
	if depth != 0 {
		return fmt.Errorf("unbalanced parentheses in %q", c.Where)
	}
	// no substring (len >= 3) of a string argument appears in Where unless
	// it is trusted vocabulary: checking, from each start, the longest
	// substring found in Where suffices.
	for _, s := range stringArgs(c.Args) {
		for i := 0; i+3 <= len(s); i++ {
			j := i + 3
			if !strings.Contains(c.Where, s[i:j]) {
				continue
			}
			for j < len(s) && strings.Contains(c.Where, s[i:j+1]) {
				j++
			}
			if !strings.Contains(queryVocabulary, s[i:j]) {
				return fmt.Errorf("argument text %q appears in %q", s[i:j], c.Where)
			}
		}
	}
	// OrderBy comes from the resource only
	if c.OrderBy != testResource.DefaultSort {
		for part := range strings.SplitSeq(c.OrderBy, ", ") {
			e := strings.TrimSuffix(strings.TrimSuffix(part, " ASC"), " DESC")
			found := e == testResource.TieBreak
			for _, s := range testResource.Sorts {
				found = found || e == s
			}
			if !found {
				return fmt.Errorf("untrusted order by %q", c.OrderBy)
			}
		}
	}
	return nil
}

func FuzzCompileQuery(f *testing.F) {
	for _, seed := range []string{
		``,
		`{}`,
		`{"pageIndex":2,"pageSize":10,"current":3,"paging":false}`,
		`{"sorts":[{"name":"name","order":"desc"},{"name":"createTime"}]}`,
		`{"terms":[{"terms":[{"column":"superProductType","value":"commonProduct","termType":"eq"}]}]}`,
		`{"terms":[{"column":"name","value":"%p.name OR 1=1 --%","termType":"like"}]}`,
		`{"terms":[{"column":"name$nlike","value":"ab_c"}]}`,
		`{"terms":[{"column":"id","value":["a","b'); DROP TABLE x; --"],"termType":"in"}]}`,
		`{"terms":[{"column":"state","value":"1,2,3","termType":"nin"}]}`,
		`{"terms":[{"column":"createTime","value":[1000,"2000"],"termType":"btw"}]}`,
		`{"terms":[{"column":"createTime","value":"2023-11-14T22:13:20Z","termType":"gte"},{"column":"enabled","value":"true","type":"or"}]}`,
		`{"terms":[{"column":"name","termType":"isnull"},{"column":"state","termType":"nempty","type":"or"}]}`,
		`{"terms":[{"column":"state","value":1},{"type":"or","terms":[{"column":"name","value":"a"},{"column":"id","value":"b","type":"or"}]}]}`,
		`{"terms":[{"terms":[{"terms":[{"terms":[{"column":"name","value":"x"}]}]}]}]}`,
		`{"terms":[{"column":"bogus","value":"a"}],"sorts":[{"name":"nope"}]}`,
		`{"terms":[{"column":"createTime$in","value":"1,2"},{"column":"name$btw","value":"a,z","type":"OR"}]}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		q, err := DecodeQuery(body)
		if err != nil {
			if !errors.Is(err, schema.ErrIllegalArgument) {
				t.Fatalf("DecodeQuery error %v is not schema.ErrIllegalArgument", err)
			}
			return
		}
		for _, total := range []int{0, 1, 37, 1 << 30} {
			index, size, offset := q.Page(total)
			if size < 1 || size > MaxPageSize || index < 0 || offset != index*size ||
				offset < 0 || (total > 0 && offset >= total) || (total == 0 && offset != 0) {
				t.Fatalf("Page(%d) = (%d, %d, %d) for %+v", total, index, size, offset, q)
			}
		}
		c, err := testResource.Compile(q)
		if err != nil {
			var ae *schema.ArgError
			if !errors.As(err, &ae) {
				t.Fatalf("Compile error %v is not *schema.ArgError", err)
			}
			return
		}
		if err := checkCompiled(c); err != nil {
			t.Fatalf("body %q: %v", body, err)
		}
	})
}

// TestCheckCompiled makes sure the fuzz assertions catch leaked values.
func TestCheckCompiledQuery(t *testing.T) {
	t.Parallel()
	bad := []*Compiled{
		{Where: "p.name = $2", Args: []any{"a", "b"}},
		{Where: "p.name = $1", Args: []any{"a", "b"}},
		{Where: "p.name = 'abc'", Args: nil},
		{Where: "p.name = $1 OR evil", Args: []any{"evil"}},
		{Where: "p.name = $1 OR 1=1", Args: []any{"x"}},
		{Where: "(p.name = $1", Args: []any{"x"}},
		{Where: "p.id = $1", Args: []any{"x"}, OrderBy: "p.name; DROP"},
	}
	for _, c := range bad {
		if err := checkCompiled(c); err == nil {
			t.Errorf("checkCompiled(%+v) = nil, want an error", c)
		}
	}
	good := &Compiled{Where: "p.name = $1 AND p.id ILIKE $2", Args: []any{"p.name = ", "ILIKE"}, OrderBy: "p.name ASC, p.id"}
	if err := checkCompiled(good); err != nil {
		t.Errorf("checkCompiled(%+v) = %v", good, err)
	}
}
