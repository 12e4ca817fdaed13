package meta

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/jmoiron/sqlx/reflectx"
	"github.com/lib/pq"

	"devicehub/meta/cache"
)

// Page is one page of a list query (spec: page object). Total counts the
// whole match when TotalExact is true; when false, more rows match than the
// store counts exactly (Options.ExactTotalLimit) and Total is an estimate
// (see List.Query).
type Page[T any] struct {
	PageIndex  int
	PageSize   int
	Total      int
	TotalExact bool
	Data       []T
	// memo is set on a page of the page cache: what a caller made of it.
	memo *pageMemo
}

// pageMemo is what a caller made of a page of the page cache (Page.Memo).
type pageMemo struct {
	once sync.Once
	v    any
}

// Memo returns what derive makes of a page of the page cache (a product
// or device page), made on the first call and kept with the page: such a
// page is shared by every request that reads it, and so is what derive
// made of it, which its callers must not modify. A caller passes a derive
// of the same kind for a page type every time. For a page that is not
// kept, Memo returns false and does not call derive.
func (p *Page[T]) Memo(derive func(*Page[T]) any) (any, bool) {
	if p.memo == nil {
		return nil, false
	}
	p.memo.once.Do(func() { p.memo.v = derive(p) })
	return p.memo.v, true
}

// Defaults of Options.ExactTotalLimit, Options.TotalEstimateTTL and
// Options.PageCacheTTL.
const (
	DefaultExactTotalLimit  = 1000
	DefaultTotalEstimateTTL = 10 * time.Second
	DefaultPageCacheTTL     = 10 * time.Second
)

// ListSQL is a list's statement but for what the query body compiles to
// (its terms and sorts), which List.Query plugs in:
//
//	SELECT Select FROM From Joins
//	WHERE <the terms> AND Where[0] AND Where[1] ...
//	ORDER BY <the sorts> LIMIT <page size> OFFSET <offset>
//
// and its count, SELECT count(*) FROM From Joins WHERE ... Every fragment
// is trusted SQL, written by the programmer.
type ListSQL struct {
	// Select is the item's columns; none is named n, present or s<N>
	// (the names of the page cache's lists' counted statement).
	Select string
	From   string // the table and its alias, e.g. "devices d"
	Joins  string // joined for the columns and the terms, e.g. " LEFT JOIN products p ON ..."
	// Where are the list's own conditions, ANDed after the terms' in
	// order. One that names a parameter (@name, at most one) is in the
	// statement only when its parameter is bound: @products, when the
	// request is limited to some products (LimitProducts), to their ids;
	// another, when the caller binds it (params). One that names none is
	// always in it.
	Where []string
	// Key is a unique column of From; a list kept in the page cache joins
	// its page back to its rows by it.
	Key string
}

// Params binds the parameters of a list's own conditions (ListSQL.Where)
// by name; an absent one leaves its condition out.
type Params map[string]any

// List is a list of a Resource: its statement (ListSQL), the rows R it
// scans and the items T it returns. Every list of the store (products,
// devices, roles, users, keys, audit) and the paged lists of other
// packages over their own tables (ingest/alarm's rules and records,
// ingest/firmware's packages, rollouts and jobs, ingest/notify's dead
// letters) are one, read by a query body (Query) or by offset and limit
// (Range).
type List[R, T any] struct {
	res  *Resource
	sql  ListSQL
	conv func(r *R) T
	// dests returns the scan destinations of Select's columns, in order,
	// inside r; if nil they are found by the columns' names (db tags, as
	// sqlx maps them).
	dests func(r *R) []any
	// cached lists (products and devices; listTables names the tables
	// each reads) are kept in the page cache and estimate their total
	// past Options.ExactTotalLimit (readCounted); the others count every
	// match in the snapshot of their page (readExact).
	cached bool
	// total, if set, answers the exact number of matches of some terms
	// without counting them (ok false for other terms). It is asked only
	// when the list adds none of its own conditions.
	total func(ctx context.Context, s *Store, terms *Compiled) (n int, ok bool, err error)
	// bytes estimates the memory of an item of a cached list in the page
	// cache: the item and what a caller keeps with its page (Page.Memo).
	bytes func(*T) int
	// stmts caches the statements of each shape (see listStatements), by
	// Where and OrderBy; shapes counts them.
	stmts  sync.Map
	shapes atomic.Int32
}

// NewList is a list of res read by stmt, whose rows R (db tags name
// their columns, as sqlx maps them) conv turns into items. Its pages
// count their total exactly (see List.Query).
func NewList[R, T any](res *Resource, stmt ListSQL, conv func(r *R) T) *List[R, T] {
	return &List[R, T]{res: res, sql: stmt, conv: conv}
}

// listStatements are the statements of one shape of list query (its
// Where and order). The placeholders after the match's are, in order:
//
//	counted:  limit+1, page size, offset (cached lists)
//	page:     page size, offset
type listStatements struct {
	count    string
	counted  string
	page     string
	estimate string
}

// outputName is the name under which Select selects expr ("d.name" as
// name), if it selects it as it is and no other column under that name.
func (l *List[R, T]) outputName(expr string) (string, bool) {
	_, name, ok := strings.Cut(expr, ".")
	if !ok || strings.ContainsAny(name, ". ()") {
		return "", false
	}
	found, same := false, 0
	for _, col := range strings.Split(l.sql.Select, ",") {
		col = strings.TrimSpace(col)
		found = found || col == expr
		out := col
		if _, as, ok := strings.Cut(col, " AS "); ok {
			out = as
		} else if i := strings.LastIndexByte(col, '.'); i >= 0 {
			out = col[i+1:]
		}
		if out == name {
			same++
		}
	}
	return name, found && same == 1
}

func (l *List[R, T]) statements(c *Compiled) *listStatements {
	cacheKey := c.Where + "\x00" + c.OrderBy
	if v, ok := l.stmts.Load(cacheKey); ok {
		return v.(*listStatements)
	}
	where := ""
	if c.Where != "" {
		where = " WHERE " + c.Where
	}
	n := len(c.Args)
	p := func(i int) string { return "$" + strconv.Itoa(n+i) }
	from := l.sql.From + l.sql.Joins
	st := &listStatements{
		count: "SELECT count(*) FROM " + from + where,
		page:  "SELECT " + l.sql.Select + " FROM " + from + where + " ORDER BY " + c.OrderBy + " LIMIT " + p(1) + " OFFSET " + p(2),
	}
	if l.cached {
		// m's keys are s0, s1...; the page is sorted again after its
		// join, by the item's own column where the key is one
		// (d.create_time is create_time), else by the key selected after
		// the item's columns.
		var keys, inner, outer, extra strings.Builder
		for i, k := range c.Order {
			s := "s" + strconv.Itoa(i)
			dir := ""
			if k.Desc {
				dir = " DESC"
			}
			keys.WriteString(", " + k.Expr + " AS " + s)
			if i > 0 {
				inner.WriteString(", ")
				outer.WriteString(", ")
			}
			inner.WriteString(s + dir)
			if name, ok := l.outputName(k.Expr); ok {
				outer.WriteString("x." + name + dir)
			} else {
				extra.WriteString(", t." + s)
				outer.WriteString("x." + s + dir)
			}
		}
		// The candidates: at most limit+1 matches, in no order, with their
		// sort keys. If they are all the matches, the page is taken from
		// them and joined back to its rows by key; else the page part
		// answers nothing and the caller asks the page statement.
		st.counted = "WITH m AS MATERIALIZED (SELECT " + l.sql.Key + " AS k" + keys.String() + " FROM " + from + where +
			" LIMIT " + p(1) + ")\nSELECT c.n, x.* FROM (SELECT count(*) AS n FROM m) c LEFT JOIN LATERAL (SELECT true AS present, " +
			l.sql.Select + extra.String() + " FROM (SELECT * FROM m ORDER BY " + inner.String() +
			" LIMIT " + p(2) + " OFFSET " + p(3) + ") t JOIN " + l.sql.From + " ON " + l.sql.Key + " = t.k" + l.sql.Joins +
			" WHERE c.n < " + p(1) + ") x ON true ORDER BY " + outer.String()
		st.estimate = "EXPLAIN (FORMAT JSON) SELECT 1 FROM " + from + where
	}
	// Shapes are few (a UI sends the same terms with other values), but a
	// client could send many: beyond 1,000 they are built per request.
	if l.shapes.Load() < 1000 {
		if _, loaded := l.stmts.LoadOrStore(cacheKey, st); !loaded {
			l.shapes.Add(1)
		}
	}
	return st
}

// match compiles q's terms and ANDs the list's own conditions that are
// bound (ListSQL.Where) after them: own is whether any was.
func (l *List[R, T]) match(ctx context.Context, q *Query, params Params) (terms, m *Compiled, own bool, err error) {
	terms, err = l.res.Compile(q)
	if err != nil {
		return nil, nil, false, err
	}
	m = terms
	for _, cond := range l.sql.Where {
		name := paramName(cond)
		var v any
		switch {
		case name == "":
		case name == "products":
			all, ids := ProductsOf(ctx)
			if all {
				continue
			}
			v = pq.StringArray(ids)
		default:
			var ok bool
			if v, ok = params[name]; !ok {
				continue
			}
		}
		if !own {
			c := *terms
			c.Args = slices.Clone(terms.Args)
			m, own = &c, true
		}
		if name != "" {
			m.Args = append(m.Args, v)
			cond = strings.Replace(cond, "@"+name, "$"+strconv.Itoa(len(m.Args)), 1)
		}
		if m.Where == "" {
			m.Where = cond
		} else {
			m.Where += " AND " + cond
		}
	}
	return terms, m, own, nil
}

// paramName is the name of the parameter (@name) of a list's condition,
// "" if it has none.
func paramName(cond string) string {
	_, name, _ := strings.Cut(cond, "@")
	end := strings.IndexFunc(name, func(r rune) bool {
		return !(r == '_' || 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9')
	})
	if end >= 0 {
		name = name[:end]
	}
	return name
}

// Query answers q over the list, limited to ctx's products where the list
// says so (@products) and to the conditions params binds.
//
// A list that is not cached counts its match, then reads its page, in
// one snapshot (a pageIndex past the end gives the last page): its total
// is always exact, and agrees with its rows while others insert (the
// audit trail).
//
// A cached list (endpoints 1 and 7) answers with one statement in the
// common case (readCounted). Its pages are kept in the page cache
// (pagecache.go) until a table they read changes; they are shared, and
// never modified.
func (l *List[R, T]) Query(ctx context.Context, s *Store, q *Query, params Params) (Page[T], error) {
	terms, m, own, err := l.match(ctx, q, params)
	if err != nil {
		return Page[T]{}, err
	}
	if own {
		terms = nil // the list's own conditions narrow the terms' total
	}
	if !l.cached {
		return l.readExact(ctx, s, m, q.Page)
	}
	_, size, offset := q.Page(math.MaxInt)
	v, err := s.pages.get(ctx, l.res.Name, pageKey(l.res.Name, m, size, offset), func(ctx context.Context, keep bool) (any, int, error) {
		p, err := l.readCounted(ctx, s, q, m, terms)
		if err != nil || !keep {
			return p, 0, err
		}
		p.memo = &pageMemo{}
		n := 64
		for i := range p.Data {
			n += l.bytes(&p.Data[i])
		}
		return p, n, nil
	})
	if err != nil {
		return Page[T]{}, err
	}
	return v.(Page[T]), nil
}

// Count counts the matches of q, exactly (endpoint 6).
func (l *List[R, T]) Count(ctx context.Context, s *Store, q *Query, params Params) (int, error) {
	_, m, _, err := l.match(ctx, q, params)
	if err != nil {
		return 0, err
	}
	ctx, cancel := s.timeout(ctx)
	defer cancel()
	var n int
	if err := s.db.QueryRowContext(ctx, l.statements(m).count, m.Args...).Scan(&n); err != nil {
		return 0, fmt.Errorf("meta: count %s: %w", l.res.Name, err)
	}
	return n, nil
}

// Range reads at most limit items from offset, in the list's default
// order (its Resource's DefaultSort), and counts them all, in one
// snapshot: the lists paged by offset and limit rather than by a query
// body (ingest/firmware's, ingest/notify's dead letters). Past the end it
// reads no items.
func (l *List[R, T]) Range(ctx context.Context, s *Store, offset, limit int, params Params) ([]T, int, error) {
	_, m, _, err := l.match(ctx, nil, params)
	if err != nil {
		return nil, 0, err
	}
	p, err := l.readExact(ctx, s, m, func(int) (int, int, int) { return 0, limit, offset })
	return p.Data, p.Total, err
}

// readExact counts the match m and reads its page, placed by page from
// the count (Query.Page), in one snapshot.
func (l *List[R, T]) readExact(ctx context.Context, s *Store, m *Compiled, page func(total int) (idx, size, offset int)) (Page[T], error) {
	ctx, cancel := s.timeout(ctx)
	defer cancel()
	tx, err := s.db.BeginTxx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true})
	if err != nil {
		return Page[T]{}, fmt.Errorf("meta: query %s: %w", l.res.Name, err)
	}
	defer func() { _ = tx.Rollback() }()
	st := l.statements(m)
	var total int
	if err := tx.QueryRowContext(ctx, st.count, m.Args...).Scan(&total); err != nil {
		return Page[T]{}, fmt.Errorf("meta: count %s: %w", l.res.Name, err)
	}
	idx, size, offset := page(total)
	p := Page[T]{PageIndex: idx, PageSize: size, Total: total, TotalExact: true, Data: []T{}}
	if total <= offset {
		return p, nil
	}
	if p.Data, err = l.readPage(ctx, s, tx, st, m, size, offset); err != nil {
		return Page[T]{}, err
	}
	return p, nil
}

// readCounted reads a page of q (its match m) from PostgreSQL. Its total
// is exact while at most limit rows match, limit being
// Options.ExactTotalLimit or, for a page further on, the end of the
// requested page: one statement counts the matches up to limit+1 and,
// when there are no more, sorts them and joins the page back to its rows
// (a pageIndex past the end then gives the last page). When more match,
// the page is read on its own, sorted by the whole match, and Total is
// PostgreSQL's estimate of the match (never below what is known to
// match), kept for Options.TotalEstimateTTL under the match and its
// values: while it is kept, the same match reads only its page. A page
// that ends before its size makes the total exact again.
//
// A list that knows the total of some terms without counting
// (List.total: devices by state and product) reads only the page, with
// its exact total, whatever the size of the match; terms is nil when the
// list's own conditions narrow them.
func (l *List[R, T]) readCounted(ctx context.Context, s *Store, q *Query, m, terms *Compiled) (Page[T], error) {
	ctx, cancel := s.timeout(ctx)
	defer cancel()
	st := l.statements(m)
	if l.total != nil && terms != nil {
		n, ok, err := l.total(ctx, s, terms)
		if err != nil {
			return Page[T]{}, err
		}
		if ok {
			// The total is known: read only the page (the last one for a
			// pageIndex past the end).
			idx, size, offset := q.Page(n)
			data := []T{}
			if n > 0 {
				if data, err = l.readPage(ctx, s, s.db, st, m, size, offset); err != nil {
					return Page[T]{}, err
				}
			}
			return Page[T]{PageIndex: idx, PageSize: size, Total: n, TotalExact: true, Data: data}, nil
		}
	}
	idx, size, offset := q.Page(math.MaxInt)
	cacheKey := totalKey(l.res.Name, m)
	if est, ok := s.totals.get(cacheKey); ok {
		data, err := l.readPage(ctx, s, s.db, st, m, size, offset)
		if err != nil {
			return Page[T]{}, err
		}
		if len(data) > 0 {
			return estimatedPage(idx, size, offset, est, data), nil
		}
		// Past the end: count.
	}
	var limit int
	for retried := false; ; retried = true {
		limit = max(s.exactTotalLimit(), offset+size)
		n, data, err := l.countedPage(ctx, s, st, m, limit, size, offset)
		if err != nil {
			return Page[T]{}, err
		}
		if n > limit {
			break
		}
		if len(data) == 0 && n > 0 && !retried {
			// pageIndex past the end: read the last page.
			idx, size, offset = q.Page(n)
			continue
		}
		if n == 0 {
			idx = 0
		}
		return Page[T]{PageIndex: idx, PageSize: size, Total: n, TotalExact: true, Data: data}, nil
	}
	data, err := l.readPage(ctx, s, s.db, st, m, size, offset)
	if err != nil {
		return Page[T]{}, err
	}
	est, err := s.estimate(ctx, st.estimate, m.Args)
	if err != nil {
		return Page[T]{}, fmt.Errorf("meta: estimate %s: %w", l.res.Name, err)
	}
	est = max(est, limit+1)
	s.totals.put(cacheKey, est)
	return estimatedPage(idx, size, offset, est, data), nil
}

// estimatedPage is a page of a match known to hold more than its rows:
// Total is est, or what the page shows to match if that is more. A page
// shorter than size ends the match, and makes Total exact.
func estimatedPage[T any](idx, size, offset, est int, data []T) Page[T] {
	if len(data) < size {
		return Page[T]{PageIndex: idx, PageSize: size, Total: offset + len(data), TotalExact: true, Data: data}
	}
	return Page[T]{PageIndex: idx, PageSize: size, Total: max(est, offset+len(data)), Data: data}
}

// countedPage runs the counted statement: n is the number of matches up to
// limit+1; data is the page when n <= limit, else empty.
func (l *List[R, T]) countedPage(ctx context.Context, s *Store, st *listStatements, m *Compiled, limit, size, offset int) (int, []T, error) {
	args := append(append(make([]any, 0, len(m.Args)+3), m.Args...), limit+1, size, offset)
	rows, err := s.db.QueryContext(ctx, st.counted, args...)
	if err != nil {
		return 0, nil, fmt.Errorf("meta: query %s: %w", l.res.Name, err)
	}
	defer rows.Close()
	var (
		r       R
		n       int
		present presence
	)
	cols, err := rows.Columns()
	if err != nil {
		return 0, nil, fmt.Errorf("meta: query %s: %w", l.res.Name, err)
	}
	// n, present, the item's columns, its sort keys (statements).
	destsOf, fresh, err := l.scanner(s, cols[2:])
	if err != nil {
		return 0, nil, err
	}
	item := func() []any {
		d := append([]any{&n, &present}, destsOf(&r)...)
		return append(d, discards(len(cols)-len(d))...)
	}
	dests := item()
	data := make([]T, 0, min(size, 64))
	first := true
	for rows.Next() {
		if first {
			first = false
			// The one row of an empty page has NULL columns: look before
			// scanning them into their fields.
			if err := rows.Scan(append([]any{&n, &present}, discards(len(dests)-2)...)...); err != nil {
				return 0, nil, fmt.Errorf("meta: query %s: %w", l.res.Name, err)
			}
			if !present {
				continue
			}
		}
		if fresh {
			r = *new(R)
			dests = item()
		}
		if err := rows.Scan(dests...); err != nil {
			return 0, nil, fmt.Errorf("meta: query %s: %w", l.res.Name, err)
		}
		data = append(data, l.conv(&r))
	}
	if err := rows.Err(); err != nil {
		return 0, nil, fmt.Errorf("meta: query %s: %w", l.res.Name, err)
	}
	return n, data, nil
}

// readPage reads one page of the whole match m, through db (the store's
// pool, or the snapshot of readExact).
func (l *List[R, T]) readPage(ctx context.Context, s *Store, db sqlx.QueryerContext, st *listStatements, m *Compiled, size, offset int) ([]T, error) {
	args := append(append(make([]any, 0, len(m.Args)+2), m.Args...), size, offset)
	rows, err := db.QueryContext(ctx, st.page, args...)
	if err != nil {
		return nil, fmt.Errorf("meta: query %s: %w", l.res.Name, err)
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return nil, fmt.Errorf("meta: query %s: %w", l.res.Name, err)
	}
	destsOf, fresh, err := l.scanner(s, cols)
	if err != nil {
		return nil, err
	}
	var r R
	dests := destsOf(&r)
	data := make([]T, 0, min(size, 64))
	for rows.Next() {
		if fresh {
			r = *new(R)
			dests = destsOf(&r)
		}
		if err := rows.Scan(dests...); err != nil {
			return nil, fmt.Errorf("meta: query %s: %w", l.res.Name, err)
		}
		data = append(data, l.conv(&r))
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("meta: query %s: %w", l.res.Name, err)
	}
	return data, nil
}

// scanner returns the scan destinations inside r of Select's columns,
// the first of cols (those after them are the counted statement's sort
// keys), and whether each row is scanned into a zeroed r (fresh):
// List.dests, into the same r, or the fields cols name (db tags, as sqlx
// maps them), into a zeroed r, as sqlx scans, since conv may keep what r
// holds (a map, a pointer).
func (l *List[R, T]) scanner(s *Store, cols []string) (dests func(r *R) []any, fresh bool, err error) {
	if l.dests != nil {
		return l.dests, false, nil
	}
	for len(cols) > 0 && isSortKey(cols[len(cols)-1]) {
		cols = cols[:len(cols)-1]
	}
	fields := s.db.Mapper.TraversalsByName(reflect.TypeFor[R](), cols)
	for i, idx := range fields {
		if len(idx) == 0 {
			return nil, false, fmt.Errorf("meta: query %s: no field for column %q", l.res.Name, cols[i])
		}
	}
	return func(r *R) []any {
		v := reflect.ValueOf(r).Elem()
		dests := make([]any, len(fields))
		for i, idx := range fields {
			dests[i] = reflectx.FieldByIndexes(v, idx).Addr().Interface()
		}
		return dests
	}, true, nil
}

// isSortKey reports whether col is a sort key the counted statement
// selects after the item's columns (s0, s1...).
func isSortKey(col string) bool {
	return len(col) > 1 && col[0] == 's' && strings.Trim(col[1:], "0123456789") == ""
}

// presence scans whether a column is not NULL.
type presence bool

func (p *presence) Scan(src any) error {
	*p = src != nil
	return nil
}

// discard scans a column into nothing.
type discard struct{}

func (discard) Scan(any) error { return nil }

func discards(n int) []any {
	d := make([]any, n)
	for i := range d {
		d[i] = discard{}
	}
	return d
}

// estimate is PostgreSQL's estimate of the rows of an EXPLAIN statement.
func (s *Store) estimate(ctx context.Context, explain string, args []any) (int, error) {
	var text []byte
	if err := s.db.QueryRowContext(ctx, explain, args...).Scan(&text); err != nil {
		return 0, err
	}
	var plan []struct {
		Plan struct {
			Rows float64 `json:"Plan Rows"`
		} `json:"Plan"`
	}
	if err := json.Unmarshal(text, &plan); err != nil || len(plan) == 0 {
		return 0, fmt.Errorf("unexpected EXPLAIN output %.100q", text)
	}
	return int(min(plan[0].Plan.Rows, 1<<40)), nil
}

func (s *Store) exactTotalLimit() int {
	if s.opts.ExactTotalLimit > 0 {
		return s.opts.ExactTotalLimit
	}
	return DefaultExactTotalLimit
}

// totalKey names a match: the resource, the compiled terms and their
// values (not the page or the order).
func totalKey(resource string, c *Compiled) string {
	b := make([]byte, 0, len(resource)+len(c.Where)+16*len(c.Args)+2)
	b = append(append(append(b, resource...), 0), c.Where...)
	for _, a := range c.Args {
		b = append(b, 0)
		switch v := a.(type) {
		case string:
			b = appendKeyText(append(b, 's'), v)
		case int64:
			b = strconv.AppendInt(append(b, 'i'), v, 10)
		case bool:
			b = strconv.AppendBool(append(b, 'b'), v)
		case pq.StringArray:
			b = strconv.AppendInt(append(b, 'S'), int64(len(v)), 10)
			for _, e := range v {
				b = appendKeyText(append(b, ','), e)
			}
		case pq.Int64Array:
			b = strconv.AppendInt(append(b, 'I'), int64(len(v)), 10)
			for _, e := range v {
				b = strconv.AppendInt(append(b, ','), e, 10)
			}
		case pq.BoolArray:
			b = strconv.AppendInt(append(b, 'B'), int64(len(v)), 10)
			for _, e := range v {
				b = strconv.AppendBool(append(b, ','), e)
			}
		default:
			b = fmt.Appendf(append(b, '?'), "%T:%v", v, v)
		}
	}
	return string(b)
}

// appendKeyText appends s with its length, so that no text can end early.
func appendKeyText(b []byte, s string) []byte {
	return append(append(strconv.AppendInt(b, int64(len(s)), 10), ':'), s...)
}

// totalCache keeps estimated totals for a while (Options.TotalEstimateTTL).
type totalCache struct {
	c *cache.Cache[string, int]
}

// totalCacheSize bounds the estimates kept; totalKeyMax the key of one
// (longer terms are estimated each time): at most about 16 MiB of keys.
const (
	totalCacheSize = 4096
	totalKeyMax    = 4096
)

func newTotalCache(ttl time.Duration) *totalCache {
	o := cache.DefaultOptions[string, int]()
	o.TTL = ttl
	o.MaxEntries = totalCacheSize
	return &totalCache{c: cache.New(o)}
}

func (c *totalCache) get(key string) (int, bool) {
	if c == nil {
		return 0, false
	}
	return c.c.Peek(key)
}

func (c *totalCache) put(key string, total int) {
	if c == nil || len(key) > totalKeyMax {
		return
	}
	c.c.Put(key, total)
}
