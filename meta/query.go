package meta

import (
	"bytes"
	"encoding/json"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/lib/pq"

	"devicehub/schema"
)

// Limits of the common query body.
const (
	// DefaultPageSize is the page size used when pageSize is absent or 0.
	DefaultPageSize = 25
	// MaxPageSize caps pageSize, and is the size of the single page
	// returned when paging is false.
	MaxPageSize = 1000
	// MaxTermDepth is how many levels of term lists may be nested; the
	// top-level terms list is level 1, the spec's {terms:[{terms:[...]}]}
	// shape uses 2.
	MaxTermDepth = 4
	// MaxTerms caps the number of conditions of one query, which keeps the
	// SQL small and far from PostgreSQL's limit on bound parameters.
	MaxTerms = 1000
	// MaxValueLen is the largest text value, in bytes.
	MaxValueLen = 512
	// MaxListLen is the largest in/nin list.
	MaxListLen = 1000
)

// Query is the platform's common query body (product, device and role
// lists). All fields are optional. DecodeQuery checks its types; the
// resource-specific checks (columns, sorts, termTypes) happen in
// Resource.Compile, and the paging defaults in Query.Page.
type Query struct {
	PageIndex int    `json:"pageIndex"` // 0-based
	PageSize  int    `json:"pageSize"`  // 0 means DefaultPageSize
	Current   int    `json:"current"`   // 1-based alias, used only when pageIndex is 0
	Paging    *bool  `json:"paging"`    // false: one page of at most MaxPageSize
	Sorts     []Sort `json:"sorts"`
	Terms     []Term `json:"terms"`
}

// Sort is one sort key: Name is an API sort name of the resource, Order is
// asc or desc (case-insensitive, empty means asc).
type Sort struct {
	Name  string `json:"name"`
	Order string `json:"order"`
}

// Term is one condition, or a parenthesised group of conditions when it has
// Terms and no Column.
type Term struct {
	Column   string          `json:"column"`   // API column name, or name$termType
	Value    json.RawMessage `json:"value"`    // string, number, bool, array or null
	TermType string          `json:"termType"` // default eq, case-insensitive
	Type     string          `json:"type"`     // and|or: how this term joins the previous one; default and
	Terms    []Term          `json:"terms"`    // a nested group
}

// ColumnKind is the type of a queryable column; it decides how term values
// are converted before they are bound.
type ColumnKind int

// Column kinds.
const (
	KindText ColumnKind = iota // string; JSON numbers and bools become their text
	KindInt                    // int64, from a JSON number or a numeric string
	KindBool                   // true/false, "true"/"false", 1/0
	KindTime                   // timestamptz; API values are epoch milliseconds
)

func (k ColumnKind) String() string {
	switch k {
	case KindText:
		return "text"
	case KindInt:
		return "integer"
	case KindBool:
		return "boolean"
	case KindTime:
		return "time"
	}
	return "ColumnKind(" + strconv.Itoa(int(k)) + ")"
}

// Column is a queryable column. Expr is trusted SQL, e.g. "p.name".
type Column struct {
	Expr string
	Kind ColumnKind
}

// Resource describes what a query body may name for one kind of object.
// Every SQL fragment in it is trusted: it is written by the programmer, never
// taken from a request.
type Resource struct {
	Name        string            // for messages, e.g. "product"
	Columns     map[string]Column // API column name -> column, for terms
	Sorts       map[string]string // API sort name -> SQL expression
	DefaultSort string            // ORDER BY body used when the query has no sorts
	TieBreak    string            // appended to custom sorts for stable paging, e.g. "p.id"
}

// Compiled is the SQL of a query body. Where is "" or a condition without
// the WHERE keyword, using placeholders $1..$len(Args) in order; it is safe
// to AND with further conditions (it is parenthesised when it contains a
// top-level OR), whose placeholders must then be numbered from
// len(Args)+1. OrderBy has no ORDER BY keyword. No request text ever appears
// in Where or OrderBy: values are only in Args.
type Compiled struct {
	Where   string
	Args    []any
	OrderBy string
	// Order is OrderBy as keys, for statements that sort by the same keys
	// under other names (the list query's candidate set).
	Order []OrderKey
	// Conjunctive says whether Where is nothing but the conjunction of
	// the terms' conditions (no term joins another with OR, at any depth
	// of groups; true with no terms); Conj are then those conditions, in
	// order, for code that recognises terms by their structure (the
	// device list's totals, deviceCountTerms in devices.go).
	Conjunctive bool
	Conj        []Cond
}

// Cond is one condition of a query body as compiled: its column (the
// Resource's name for it), its termType and its values' indexes in Args.
type Cond struct {
	Column   string
	TermType string
	Args     []int
}

// OrderKey is one key of an ORDER BY: a trusted SQL expression and its
// direction.
type OrderKey struct {
	Expr string
	Desc bool
}

// DecodeQuery decodes a common query body. An empty body, whitespace, null
// or {} give the zero Query. Malformed JSON, wrong types, negative
// pageIndex/pageSize/current and a pageSize above MaxPageSize give an
// *schema.ArgError naming the field. Integers may also be sent as numeric strings
// and paging as "true"/"false". Unknown fields are ignored; field names are
// matched exactly.
func DecodeQuery(body []byte) (*Query, error) {
	q := &Query{}
	body = bytes.TrimSpace(body)
	if len(body) == 0 || string(body) == "null" {
		return q, nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		if json.Valid(body) {
			return nil, schema.Invalid("", "query body must be a JSON object")
		}
		return nil, schema.Invalid("", "malformed JSON: %v", err)
	}
	var err error
	if raw, ok := m["pageIndex"]; ok {
		if q.PageIndex, err = decodeCount(raw, "pageIndex"); err != nil {
			return nil, err
		}
	}
	if raw, ok := m["pageSize"]; ok {
		if q.PageSize, err = decodeCount(raw, "pageSize"); err != nil {
			return nil, err
		}
		if q.PageSize > MaxPageSize {
			return nil, schema.Invalid("pageSize", "must be at most %d", MaxPageSize)
		}
	}
	if raw, ok := m["current"]; ok {
		if q.Current, err = decodeCount(raw, "current"); err != nil {
			return nil, err
		}
	}
	if raw, ok := m["paging"]; ok {
		if q.Paging, err = decodePaging(raw); err != nil {
			return nil, err
		}
	}
	if raw, ok := m["sorts"]; ok {
		if q.Sorts, err = decodeSorts(raw); err != nil {
			return nil, err
		}
	}
	if raw, ok := m["terms"]; ok {
		if q.Terms, err = decodeTerms(raw, "terms", 1); err != nil {
			return nil, err
		}
	}
	return q, nil
}

func isNull(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || string(raw) == "null"
}

// decodeCount decodes a non-negative integer (JSON number or numeric string).
func decodeCount(raw json.RawMessage, field string) (int, error) {
	if isNull(raw) {
		return 0, nil
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return 0, schema.Invalid(field, "must be an integer")
	}
	var s string
	switch v := v.(type) {
	case float64:
		s = string(bytes.TrimSpace(raw))
	case string:
		s = strings.TrimSpace(v)
	default:
		return 0, schema.Invalid(field, "must be an integer")
	}
	n, ok := parseInteger(s)
	if !ok || n > math.MaxInt32 || n < math.MinInt32 {
		return 0, schema.Invalid(field, "must be an integer")
	}
	if n < 0 {
		return 0, schema.Invalid(field, "must not be negative")
	}
	return int(n), nil
}

func decodePaging(raw json.RawMessage) (*bool, error) {
	if isNull(raw) {
		return nil, nil
	}
	var v any
	if err := json.Unmarshal(raw, &v); err == nil {
		switch v := v.(type) {
		case bool:
			return &v, nil
		case string:
			if b, ok := parseBoolText(v); ok {
				return &b, nil
			}
		}
	}
	return nil, schema.Invalid("paging", "must be a boolean")
}

func decodeString(raw json.RawMessage, field string) (string, error) {
	if isNull(raw) {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", schema.Invalid(field, "must be a string")
	}
	return s, nil
}

// decodeObjects decodes a JSON array of objects; null elements are nil maps.
func decodeObjects(raw json.RawMessage, field, what string) ([]map[string]json.RawMessage, error) {
	if isNull(raw) {
		return nil, nil
	}
	var elems []json.RawMessage
	if err := json.Unmarshal(raw, &elems); err != nil {
		return nil, schema.Invalid(field, "must be an array of %s", what)
	}
	out := make([]map[string]json.RawMessage, len(elems))
	for i, e := range elems {
		if isNull(e) {
			continue
		}
		if err := json.Unmarshal(e, &out[i]); err != nil {
			return nil, schema.Invalid(field+"["+strconv.Itoa(i)+"]", "must be an object")
		}
	}
	return out, nil
}

func decodeSorts(raw json.RawMessage) ([]Sort, error) {
	objs, err := decodeObjects(raw, "sorts", "{name, order} objects")
	if err != nil {
		return nil, err
	}
	var sorts []Sort
	for i, o := range objs {
		field := "sorts[" + strconv.Itoa(i) + "]"
		var s Sort
		if s.Name, err = decodeString(o["name"], field+".name"); err != nil {
			return nil, err
		}
		if s.Order, err = decodeString(o["order"], field+".order"); err != nil {
			return nil, err
		}
		sorts = append(sorts, s)
	}
	return sorts, nil
}

func decodeTerms(raw json.RawMessage, field string, depth int) ([]Term, error) {
	objs, err := decodeObjects(raw, field, "terms")
	if err != nil {
		return nil, err
	}
	if len(objs) > 0 && depth > MaxTermDepth {
		return nil, schema.Invalid(field, "terms nested deeper than %d levels", MaxTermDepth)
	}
	var terms []Term
	for i, o := range objs {
		f := field + "[" + strconv.Itoa(i) + "]"
		var t Term
		if t.Column, err = decodeString(o["column"], f+".column"); err != nil {
			return nil, err
		}
		if t.TermType, err = decodeString(o["termType"], f+".termType"); err != nil {
			return nil, err
		}
		if t.Type, err = decodeString(o["type"], f+".type"); err != nil {
			return nil, err
		}
		if !isNull(o["value"]) {
			t.Value = o["value"]
		}
		if t.Terms, err = decodeTerms(o["terms"], f+".terms", depth+1); err != nil {
			return nil, err
		}
		terms = append(terms, t)
	}
	return terms, nil
}

// Page returns the page to read for a result of total rows: a pageIndex
// past the end gives the last page (0 when total is 0); pageSize 0 gives
// DefaultPageSize; paging false gives pageIndex 0 and MaxPageSize. A nil
// Query is the zero Query.
func (q *Query) Page(total int) (pageIndex, pageSize, offset int) {
	if q == nil {
		q = &Query{}
	}
	if q.Paging != nil && !*q.Paging {
		return 0, MaxPageSize, 0
	}
	pageSize = q.PageSize
	if pageSize <= 0 {
		pageSize = DefaultPageSize
	}
	pageSize = min(pageSize, MaxPageSize)
	pageIndex = q.PageIndex
	if pageIndex <= 0 && q.Current > 0 {
		pageIndex = q.Current - 1
	}
	pageIndex = max(pageIndex, 0)
	if total <= 0 {
		return 0, pageSize, 0
	}
	pageIndex = min(pageIndex, (total-1)/pageSize)
	return pageIndex, pageSize, pageIndex * pageSize
}

// Compile translates q into SQL over r's whitelisted columns and sorts. A
// nil q is the zero Query. Every input error is an *schema.ArgError naming the
// field, e.g. "terms[1].terms[0].column" or "sorts[0].name".
//
// Term semantics (termType, case-insensitive, default eq; a column may be
// written name$termType, which sets the termType):
//
//	eq, not            Expr = $n, Expr <> $n (not excludes NULLs, as SQL does)
//	like, nlike        Expr ILIKE $n, Expr NOT ILIKE $n: text columns only,
//	                   case-insensitive for user-friendly fuzzy search. A
//	                   value holding a % is used as is; one without is
//	                   searched as a substring (%value%, with _ and \ escaped)
//	in, nin            Expr = ANY($n), Expr <> ALL($n); value is a JSON array
//	                   or a comma-separated string (items trimmed)
//	gt, gte, lt, lte   Expr > $n, >=, <, <=
//	btw, nbtw          Expr [NOT] BETWEEN $a AND $b; value is an array of two
//	                   or an "a,b" string
//	isnull, notnull    Expr IS [NOT] NULL; value ignored
//	empty, nempty      text: Expr = '' / Expr <> ''; other kinds: IS [NOT] NULL
//
// Time values are epoch milliseconds (or RFC 3339 strings) and compare as
// to_timestamp($n::bigint / 1000.0). Terms join the previous term with their
// type (and|or, default and) under SQL precedence, AND binding tighter than
// OR; use groups for other groupings. Empty groups are skipped.
//
// Sorts map through r.Sorts and are followed by r.TieBreak; without sorts
// OrderBy is r.DefaultSort.
func (r *Resource) Compile(q *Query) (*Compiled, error) {
	if q == nil {
		q = &Query{}
	}
	c := &compiler{r: r}
	where, n, hasOr, err := c.list(q.Terms, "terms", 1)
	if err != nil {
		return nil, err
	}
	if n > 1 && hasOr {
		where = "(" + where + ")"
	}
	order, orderBy, err := r.orderBy(q.Sorts)
	if err != nil {
		return nil, err
	}
	out := &Compiled{Where: where, Args: c.args, OrderBy: orderBy, Order: order, Conjunctive: !c.or}
	if out.Conjunctive {
		out.Conj = c.conds
	}
	return out, nil
}

// parseOrder splits a trusted ORDER BY body ("d.create_time DESC, d.id")
// into keys.
func parseOrder(s string) []OrderKey {
	var keys []OrderKey
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		k := OrderKey{Expr: part}
		if e, ok := strings.CutSuffix(part, " DESC"); ok {
			k = OrderKey{Expr: strings.TrimSpace(e), Desc: true}
		} else if e, ok := strings.CutSuffix(part, " ASC"); ok {
			k.Expr = strings.TrimSpace(e)
		}
		keys = append(keys, k)
	}
	return keys
}

// orderBy returns the keys of sorts, followed by r.TieBreak, and them as
// an ORDER BY body; without sorts, r.DefaultSort.
func (r *Resource) orderBy(sorts []Sort) ([]OrderKey, string, error) {
	if len(sorts) == 0 {
		return parseOrder(r.DefaultSort), r.DefaultSort, nil
	}
	var keys []OrderKey
	var parts []string
	seen := make(map[string]bool)
	for i, s := range sorts {
		field := "sorts[" + strconv.Itoa(i) + "]"
		expr, ok := r.Sorts[s.Name]
		if !ok {
			if s.Name == "" {
				return nil, "", schema.InvalidChoice(field+".name", sortedKeys(r.Sorts), "is required; allowed: %s", allowed(r.Sorts))
			}
			return nil, "", schema.InvalidChoice(field+".name", sortedKeys(r.Sorts), "unknown sort %q for %s; allowed: %s", short(s.Name), r.Name, allowed(r.Sorts))
		}
		dir := " ASC"
		switch strings.ToLower(strings.TrimSpace(s.Order)) {
		case "", "asc":
		case "desc":
			dir = " DESC"
		default:
			return nil, "", schema.Invalid(field+".order", "unknown order %q; allowed: asc, desc", short(s.Order))
		}
		if seen[expr] {
			continue // a later repeat of a key changes nothing
		}
		seen[expr] = true
		keys = append(keys, OrderKey{Expr: expr, Desc: dir == " DESC"})
		parts = append(parts, expr+dir)
	}
	if r.TieBreak != "" && !seen[r.TieBreak] {
		keys = append(keys, OrderKey{Expr: r.TieBreak})
		parts = append(parts, r.TieBreak)
	}
	return keys, strings.Join(parts, ", "), nil
}

type compiler struct {
	r     *Resource
	args  []any
	terms int
	conds []Cond // every condition compiled, in order
	or    bool   // a term joins another with OR, at some depth
}

// list renders a term list at the given depth, returning the SQL, the number
// of rendered items and whether a rendered item joins with OR.
func (c *compiler) list(terms []Term, field string, depth int) (string, int, bool, error) {
	if len(terms) > 0 && depth > MaxTermDepth {
		return "", 0, false, schema.Invalid(field, "terms nested deeper than %d levels", MaxTermDepth)
	}
	var sb strings.Builder
	n, hasOr := 0, false
	for i := range terms {
		t := &terms[i]
		f := field + "[" + strconv.Itoa(i) + "]"
		var joiner string
		switch strings.ToLower(t.Type) {
		case "", "and":
			joiner = " AND "
		case "or":
			joiner = " OR "
		default:
			return "", 0, false, schema.Invalid(f+".type", "unknown type %q; allowed: and, or", short(t.Type))
		}
		var s string
		switch {
		case t.Column != "":
			if len(t.Terms) > 0 {
				return "", 0, false, schema.Invalid(f, "a term has either a column or nested terms, not both")
			}
			var err error
			first := len(c.args)
			if s, err = c.cond(t, f); err != nil {
				return "", 0, false, err
			}
			c.record(first)
		case len(t.Terms) > 0:
			inner, m, _, err := c.list(t.Terms, f+".terms", depth+1)
			if err != nil {
				return "", 0, false, err
			}
			if m == 0 {
				continue
			}
			s = inner
			if m > 1 {
				s = "(" + inner + ")"
			}
		default:
			if t.TermType != "" || !isNull(t.Value) {
				return "", 0, false, schema.Invalid(f+".column", "is required")
			}
			continue // an empty group
		}
		if n > 0 {
			sb.WriteString(joiner)
			hasOr = hasOr || joiner == " OR "
			c.or = c.or || joiner == " OR "
		}
		sb.WriteString(s)
		n++
	}
	return sb.String(), n, hasOr, nil
}

// record gives the condition cond just added to c.conds its values:
// Args from index first on.
func (c *compiler) record(first int) {
	cond := &c.conds[len(c.conds)-1]
	for i := first; i < len(c.args); i++ {
		cond.Args = append(cond.Args, i)
	}
}

// termTypes lists the known termTypes, for messages.
var termTypes = []string{"eq", "not", "like", "nlike", "in", "nin", "gt", "gte", "lt", "lte", "btw", "nbtw", "isnull", "notnull", "empty", "nempty"}

var compareOps = map[string]string{"eq": " = ", "not": " <> ", "gt": " > ", "gte": " >= ", "lt": " < ", "lte": " <= "}

func (c *compiler) cond(t *Term, field string) (string, error) {
	c.terms++
	if c.terms > MaxTerms {
		return "", schema.Invalid("terms", "too many terms (max %d)", MaxTerms)
	}
	name, tt := t.Column, t.TermType
	ttField := field + ".termType"
	if i := strings.IndexByte(name, '$'); i >= 0 {
		rest := name[i+1:]
		if strings.IndexByte(rest, '$') >= 0 {
			return "", schema.Invalid(field+".column", "at most one $termType suffix allowed in %q", short(t.Column))
		}
		if rest == "" {
			return "", schema.Invalid(field+".column", "missing termType after $ in %q", short(t.Column))
		}
		name, tt, ttField = name[:i], rest, field+".column"
	}
	col, ok := c.r.Columns[name]
	if !ok {
		return "", schema.InvalidChoice(field+".column", sortedKeys(c.r.Columns), "unknown column %q for %s; allowed: %s", short(name), c.r.Name, allowed(c.r.Columns))
	}
	tt = strings.ToLower(strings.TrimSpace(tt))
	if tt == "" {
		tt = "eq"
	}
	c.conds = append(c.conds, Cond{Column: name, TermType: tt})
	vField := field + ".value"
	switch tt {
	case "eq", "not", "gt", "gte", "lt", "lte":
		v, err := parseValue(t.Value, vField)
		if err != nil {
			return "", err
		}
		arg, err := scalar(v, col.Kind, vField)
		if err != nil {
			return "", err
		}
		return col.Expr + compareOps[tt] + c.bind(arg, col.Kind), nil
	case "like", "nlike":
		if col.Kind != KindText {
			return "", schema.Invalid(ttField, "%s is only for text columns; %q is %s", tt, name, col.Kind)
		}
		v, err := parseValue(t.Value, vField)
		if err != nil {
			return "", err
		}
		arg, err := scalar(v, KindText, vField)
		if err != nil {
			return "", err
		}
		s := arg.(string)
		if !strings.Contains(s, "%") {
			s = "%" + likeEscaper.Replace(s) + "%"
		}
		op := " ILIKE "
		if tt == "nlike" {
			op = " NOT ILIKE "
		}
		return col.Expr + op + c.bind(s, KindText), nil
	case "in", "nin":
		v, err := parseValue(t.Value, vField)
		if err != nil {
			return "", err
		}
		items, err := listItems(v, vField, -1)
		if err != nil {
			return "", err
		}
		arr, err := listArg(items, col.Kind, vField)
		if err != nil {
			return "", err
		}
		c.args = append(c.args, arr)
		p := "$" + strconv.Itoa(len(c.args))
		if col.Kind == KindTime {
			p = "ARRAY(SELECT to_timestamp(x / 1000.0) FROM unnest(" + p + "::bigint[]) AS t(x))"
		}
		if tt == "in" {
			return col.Expr + " = ANY(" + p + ")", nil
		}
		return col.Expr + " <> ALL(" + p + ")", nil
	case "btw", "nbtw":
		v, err := parseValue(t.Value, vField)
		if err != nil {
			return "", err
		}
		items, err := listItems(v, vField, 2)
		if err != nil {
			return "", err
		}
		var b [2]any
		for i, it := range items {
			f := vField
			if it.indexed {
				f += "[" + strconv.Itoa(i) + "]"
			}
			if b[i], err = scalar(it.v, col.Kind, f); err != nil {
				return "", err
			}
		}
		op := " BETWEEN "
		if tt == "nbtw" {
			op = " NOT BETWEEN "
		}
		lo := c.bind(b[0], col.Kind)
		return col.Expr + op + lo + " AND " + c.bind(b[1], col.Kind), nil
	case "isnull":
		return col.Expr + " IS NULL", nil
	case "notnull":
		return col.Expr + " IS NOT NULL", nil
	case "empty":
		if col.Kind == KindText {
			return col.Expr + " = ''", nil
		}
		return col.Expr + " IS NULL", nil
	case "nempty":
		if col.Kind == KindText {
			return col.Expr + " <> ''", nil
		}
		return col.Expr + " IS NOT NULL", nil
	}
	return "", schema.Invalid(ttField, "unknown termType %q; allowed: %s", short(tt), strings.Join(termTypes, ", "))
}

// bind appends a converted value and returns its placeholder.
func (c *compiler) bind(v any, kind ColumnKind) string {
	c.args = append(c.args, v)
	p := "$" + strconv.Itoa(len(c.args))
	if kind == KindTime {
		return "to_timestamp(" + p + "::bigint / 1000.0)"
	}
	return p
}

var likeEscaper = strings.NewReplacer(`\`, `\\`, `_`, `\_`)

// parseValue decodes a term value: nil, string, json.Number, bool, []any or
// map[string]any. An absent or null value is an error: use isnull/notnull.
func parseValue(raw json.RawMessage, field string) (any, error) {
	if isNull(raw) {
		return nil, schema.Invalid(field, "is required (use termType isnull or notnull to match NULL)")
	}
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil || d.More() {
		return nil, schema.Invalid(field, "malformed JSON")
	}
	return v, nil
}

type listItem struct {
	v       any
	indexed bool // came from a JSON array, so errors name its index
}

// listItems splits an in/btw value: a JSON array, a comma-separated string
// (items trimmed, "" is the empty list) or a single number or bool. want is
// the exact number of items required, or -1.
func listItems(v any, field string, want int) ([]listItem, error) {
	var items []listItem
	switch v := v.(type) {
	case []any:
		if len(v) > MaxListLen {
			return nil, schema.Invalid(field, "at most %d values allowed", MaxListLen)
		}
		for _, e := range v {
			items = append(items, listItem{v: e, indexed: true})
		}
	case string:
		if len(v) > MaxListLen*(MaxValueLen+1) {
			return nil, schema.Invalid(field, "too long")
		}
		if strings.TrimSpace(v) != "" {
			parts := strings.Split(v, ",")
			if len(parts) > MaxListLen {
				return nil, schema.Invalid(field, "at most %d values allowed", MaxListLen)
			}
			for _, p := range parts {
				items = append(items, listItem{v: strings.TrimSpace(p)})
			}
		}
	case map[string]any:
		return nil, schema.Invalid(field, "must be an array or a comma-separated string")
	default:
		items = append(items, listItem{v: v})
	}
	if want >= 0 && len(items) != want {
		return nil, schema.Invalid(field, "must be %d values (an array or a comma-separated string), got %d", want, len(items))
	}
	return items, nil
}

// listArg converts list items to a PostgreSQL array argument of the kind.
func listArg(items []listItem, kind ColumnKind, field string) (any, error) {
	var (
		ss []string
		is []int64
		bs []bool
	)
	for i, it := range items {
		f := field
		if it.indexed {
			f += "[" + strconv.Itoa(i) + "]"
		}
		v, err := scalar(it.v, kind, f)
		if err != nil {
			return nil, err
		}
		switch v := v.(type) {
		case string:
			ss = append(ss, v)
		case int64:
			is = append(is, v)
		case bool:
			bs = append(bs, v)
		}
	}
	switch kind {
	case KindInt, KindTime:
		return pq.Int64Array(orEmpty(is)), nil
	case KindBool:
		return pq.BoolArray(orEmpty(bs)), nil
	}
	return pq.StringArray(orEmpty(ss)), nil
}

// orEmpty turns nil into an empty slice, so that an empty list binds as {}
// rather than NULL.
func orEmpty[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// Epoch milliseconds of 0001-01-01 and 9999-12-31T23:59:59.999Z, the range
// accepted for time values.
const (
	minMillis = -62135596800000
	maxMillis = 253402300799999
)

// scalar converts one decoded JSON value to the Go value bound for kind:
// string, int64 (also for KindTime, in epoch ms) or bool.
func scalar(v any, kind ColumnKind, field string) (any, error) {
	switch v := v.(type) {
	case nil:
		return nil, schema.Invalid(field, "must not be null")
	case []any:
		return nil, schema.Invalid(field, "must be a single value, not an array")
	case map[string]any:
		return nil, schema.Invalid(field, "must be a single value, not an object")
	case string:
		if len(v) > MaxValueLen {
			return nil, schema.Invalid(field, "must be at most %d bytes", MaxValueLen)
		}
	}
	switch kind {
	case KindText:
		switch v := v.(type) {
		case string:
			return v, nil
		case json.Number:
			return string(v), nil
		case bool:
			return strconv.FormatBool(v), nil
		}
	case KindInt:
		if n, ok := parseInteger(numberText(v)); ok {
			return n, nil
		}
		return nil, schema.Invalid(field, "must be an integer")
	case KindBool:
		switch v := v.(type) {
		case bool:
			return v, nil
		case string:
			if b, ok := parseBoolText(v); ok {
				return b, nil
			}
		case json.Number:
			switch v {
			case "1":
				return true, nil
			case "0":
				return false, nil
			}
		}
		return nil, schema.Invalid(field, "must be a boolean (true, false, 1 or 0)")
	case KindTime:
		s := numberText(v)
		n, ok := parseInteger(s)
		if !ok {
			tm, err := time.Parse(time.RFC3339Nano, s)
			if err != nil {
				return nil, schema.Invalid(field, "must be a time in epoch milliseconds")
			}
			n, ok = tm.UnixMilli(), true
		}
		if n < minMillis || n > maxMillis {
			return nil, schema.Invalid(field, "time out of range")
		}
		return n, nil
	}
	return nil, schema.Invalid(field, "unsupported value for a %s column", kind)
}

// numberText is the text of a number given as a JSON number or a string
// (trimmed); "" for any other value.
func numberText(v any) string {
	switch v := v.(type) {
	case string:
		return strings.TrimSpace(v)
	case json.Number:
		return string(v)
	}
	return ""
}

// parseInteger parses a decimal integer; a number with a fraction or
// exponent is accepted when its value is an exact integer (e.g. 2.0, 1e3).
func parseInteger(s string) (int64, bool) {
	if s == "" || len(s) > 64 || strings.Trim(s, "0123456789+-.eE") != "" {
		return 0, false
	}
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		return n, true
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f != math.Trunc(f) || math.Abs(f) > 1<<53 {
		return 0, false
	}
	return int64(f), true
}

func parseBoolText(s string) (bool, bool) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "true", "1":
		return true, true
	case "false", "0":
		return false, true
	}
	return false, false
}

// allowed lists a map's keys, sorted, for messages.
func allowed[V any](m map[string]V) string { return strings.Join(sortedKeys(m), ", ") }

// sortedKeys are a map's keys, sorted.
func sortedKeys[V any](m map[string]V) []string {
	out := keys(m)
	sort.Strings(out)
	return out
}

// short cuts a request string for an error message.
func short(s string) string {
	const limit = 64
	if len(s) <= limit {
		return s
	}
	return s[:limit] + "..."
}
