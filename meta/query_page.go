package meta

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"devicehub/meta/cache"
)

// Page is one page of a list query (spec: page object). Total counts the
// whole match when TotalExact is true; when false, more rows match than the
// store counts exactly (Options.ExactTotalLimit) and Total is an estimate
// (see queryList). The page cache's pages also keep their encoding (Kept).
type Page[T any] struct {
	PageIndex  int
	PageSize   int
	Total      int
	TotalExact bool
	Data       []T
	// kept is set on a page of the page cache: its encoding, made once.
	kept *keptEncoding
}

// keptEncoding is the encoding of a page kept in the page cache.
type keptEncoding struct {
	once sync.Once
	b    []byte
}

// Kept returns the encoding of a page of the page cache (a product or
// device page), made by encode on the first call: such a page is shared by
// every request that reads it, and so is its encoding, which its callers
// copy and never modify. A caller passes the same encoder for a page type
// every time (api writes the page's JSON). For a page that is not kept, it
// returns false and does not call encode: the caller encodes it itself.
func (p *Page[T]) Kept(encode func(*Page[T]) []byte) ([]byte, bool) {
	if p.kept == nil {
		return nil, false
	}
	p.kept.once.Do(func() { p.kept.b = encode(p) })
	return p.kept.b, true
}

// Defaults of Options.ExactTotalLimit, Options.TotalEstimateTTL and
// Options.PageCacheTTL.
const (
	DefaultExactTotalLimit  = 1000
	DefaultTotalEstimateTTL = 10 * time.Second
	DefaultPageCacheTTL     = 10 * time.Second
)

// listSpec says how a resource's list query reads its items: R is the row
// scanned, T the item returned.
type listSpec[R, T any] struct {
	res     *Resource
	columns string // select list of an item; no column is named present or s<N>
	base    string // the table with its alias, e.g. "devices d"
	joins   string // joins added to base for the columns and terms, e.g. " LEFT JOIN products p ON ..."
	key     string // a unique column of base, e.g. "d.id"
	// dests returns the scan destinations of columns, in order, inside r.
	dests func(r *R) []any
	conv  func(r *R) T
	// total, if set, answers the exact number of matches of some terms
	// without counting them (ok false for other terms).
	total func(ctx context.Context, s *Store, c *Compiled) (n int, ok bool, err error)
	// bytes estimates the memory of an item in the page cache: the item
	// and its share of the page's encoding.
	bytes func(*T) int
	// sql caches the statements of each shape (see listSQL), by Where and
	// OrderBy; shapes counts them.
	sql    sync.Map
	shapes atomic.Int32
}

// listSQL are the statements of one shape of list query (its Where and
// order); their placeholders after the terms' are, in order:
//
//	counted:  limit+1, page size, offset
//	page:     page size, offset
type listSQL struct {
	counted  string
	page     string
	estimate string
}

// outputName is the name under which columns selects expr ("d.name" as
// name), if it selects it as it is and no other column under that name.
func (l *listSpec[R, T]) outputName(expr string) (string, bool) {
	_, name, ok := strings.Cut(expr, ".")
	if !ok || strings.ContainsAny(name, ". ()") {
		return "", false
	}
	found, same := false, 0
	for _, col := range strings.Split(l.columns, ",") {
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

func (l *listSpec[R, T]) statements(c *Compiled) *listSQL {
	cacheKey := c.Where + "\x00" + c.OrderBy
	if v, ok := l.sql.Load(cacheKey); ok {
		return v.(*listSQL)
	}
	where := ""
	if c.Where != "" {
		where = " WHERE " + c.Where
	}
	n := len(c.Args)
	p := func(i int) string { return "$" + strconv.Itoa(n+i) }
	// m's keys are s0, s1...; the page is sorted again after its join,
	// by the item's own column where the key is one (d.create_time is
	// create_time), else by the key selected after the item's columns.
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
	from := l.base + l.joins
	st := &listSQL{
		// The candidates: at most limit+1 matches, in no order, with their
		// sort keys. If they are all the matches, the page is taken from
		// them and joined back to its rows by key; else the page part
		// answers nothing and the caller asks the page statement.
		counted: "WITH m AS MATERIALIZED (SELECT " + l.key + " AS k" + keys.String() + " FROM " + from + where +
			" LIMIT " + p(1) + ")\nSELECT c.n, x.* FROM (SELECT count(*) AS n FROM m) c LEFT JOIN LATERAL (SELECT true AS present, " +
			l.columns + extra.String() + " FROM (SELECT * FROM m ORDER BY " + inner.String() +
			" LIMIT " + p(2) + " OFFSET " + p(3) + ") t JOIN " + l.base + " ON " + l.key + " = t.k" + l.joins +
			" WHERE c.n < " + p(1) + ") x ON true ORDER BY " + outer.String(),
		page:     "SELECT " + l.columns + " FROM " + from + where + " ORDER BY " + c.OrderBy + " LIMIT " + p(1) + " OFFSET " + p(2),
		estimate: "EXPLAIN (FORMAT JSON) SELECT 1 FROM " + from + where,
	}
	// Shapes are few (a UI sends the same terms with other values), but a
	// client could send many: beyond 1,000 they are built per request.
	if l.shapes.Load() < 1000 {
		if _, loaded := l.sql.LoadOrStore(cacheKey, st); !loaded {
			l.shapes.Add(1)
		}
	}
	return st
}

// queryList answers a list query (endpoints 1 and 7) with one statement in
// the common case. Its total is exact while at most limit rows match, limit
// being Options.ExactTotalLimit or, for a page further on, the end of the
// requested page: one statement counts the matches up to limit+1 and, when
// there are no more, sorts them and joins the page back to its rows (a
// pageIndex past the end then gives the last page). When more match, the
// page is read on its own, sorted by the whole match, and Total is
// PostgreSQL's estimate of the match (never below what is known to match),
// kept for Options.TotalEstimateTTL under the terms and their values:
// while it is kept, the same terms read only their page. A page that ends
// before its size makes the total exact again.
//
// A resource that knows the total of some terms without counting
// (listSpec.total: devices by state and product) reads only the page,
// with its exact total, whatever the size of the match.
//
// Pages are kept in the page cache (pagecache.go) until a table they read
// changes; they are shared, and never modified.
func queryList[R, T any](ctx context.Context, s *Store, l *listSpec[R, T], q *Query) (Page[T], error) {
	c, err := l.res.Compile(q)
	if err != nil {
		return Page[T]{}, err
	}
	limitWhere(ctx, c, l.res.Product)
	_, size, offset := q.Page(math.MaxInt)
	v, err := s.pages.get(ctx, l.res.Name, pageKey(l.res.Name, c, size, offset), func(ctx context.Context, keep bool) (any, int, error) {
		p, err := readList(ctx, s, l, q, c)
		if err != nil || !keep {
			return p, 0, err
		}
		p.kept = &keptEncoding{}
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

// readList reads a page of q (compiled into c) from PostgreSQL.
func readList[R, T any](ctx context.Context, s *Store, l *listSpec[R, T], q *Query, c *Compiled) (Page[T], error) {
	ctx, cancel := s.timeout(ctx)
	defer cancel()
	st := l.statements(c)
	if l.total != nil {
		n, ok, err := l.total(ctx, s, c)
		if err != nil {
			return Page[T]{}, err
		}
		if ok {
			// The total is known: read only the page (the last one for a
			// pageIndex past the end).
			idx, size, offset := q.Page(n)
			data := []T{}
			if n > 0 {
				if data, err = listPage(ctx, s, l, st, c, size, offset); err != nil {
					return Page[T]{}, err
				}
			}
			return Page[T]{PageIndex: idx, PageSize: size, Total: n, TotalExact: true, Data: data}, nil
		}
	}
	idx, size, offset := q.Page(math.MaxInt)
	cacheKey := totalKey(l.res.Name, c)
	if est, ok := s.totals.get(cacheKey); ok {
		data, err := listPage(ctx, s, l, st, c, size, offset)
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
		n, data, err := countedPage(ctx, s, l, st, c, limit, size, offset)
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
	data, err := listPage(ctx, s, l, st, c, size, offset)
	if err != nil {
		return Page[T]{}, err
	}
	est, err := s.estimate(ctx, st.estimate, c.Args)
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
func countedPage[R, T any](ctx context.Context, s *Store, l *listSpec[R, T], st *listSQL, c *Compiled, limit, size, offset int) (int, []T, error) {
	args := append(append(make([]any, 0, len(c.Args)+3), c.Args...), limit+1, size, offset)
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
	// n, present, the item's columns, its sort keys.
	dests := append([]any{&n, &present}, l.dests(&r)...)
	if cols, err := rows.Columns(); err == nil && len(cols) > len(dests) {
		dests = append(dests, discards(len(cols)-len(dests))...) // sort keys (statements)
	}
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

// listPage reads one page of the whole match.
func listPage[R, T any](ctx context.Context, s *Store, l *listSpec[R, T], st *listSQL, c *Compiled, size, offset int) ([]T, error) {
	args := append(append(make([]any, 0, len(c.Args)+2), c.Args...), size, offset)
	rows, err := s.db.QueryContext(ctx, st.page, args...)
	if err != nil {
		return nil, fmt.Errorf("meta: query %s: %w", l.res.Name, err)
	}
	defer rows.Close()
	var r R
	dests := l.dests(&r)
	data := make([]T, 0, min(size, 64))
	for rows.Next() {
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

// queryPage runs a paged list query with an exact total: count, then the
// page (a pageIndex past the end gives the last page). from is the FROM
// clause with joins. Roles (a few rows) are read so; products and devices
// through queryList.
func queryPage[R any, T any](ctx context.Context, s *Store, res *Resource, q *Query, columns, from string, conv func(*R) T) (Page[T], error) {
	c, err := res.Compile(q)
	if err != nil {
		return Page[T]{}, err
	}
	return queryCompiled(ctx, s, res, q, c, columns, from, conv)
}

// queryCompiled is queryPage of q compiled (c), to which the caller may
// have ANDed conditions of its own.
func queryCompiled[R any, T any](ctx context.Context, s *Store, res *Resource, q *Query, c *Compiled, columns, from string, conv func(*R) T) (Page[T], error) {
	ctx, cancel := s.timeout(ctx)
	defer cancel()
	// The count and the page are read from one snapshot, so that the
	// total agrees with the rows while others insert (the audit trail).
	tx, err := s.db.BeginTxx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true})
	if err != nil {
		return Page[T]{}, fmt.Errorf("meta: query %s: %w", res.Name, err)
	}
	defer func() { _ = tx.Rollback() }()
	where, total, err := s.count(ctx, tx, res, c, from)
	if err != nil {
		return Page[T]{}, err
	}
	idx, size, offset := q.Page(total)
	page := Page[T]{PageIndex: idx, PageSize: size, Total: total, TotalExact: true, Data: []T{}}
	if total == 0 {
		return page, nil
	}
	n := len(c.Args)
	sqlText := fmt.Sprintf("SELECT %s FROM %s%s ORDER BY %s LIMIT $%d OFFSET $%d", columns, from, where, c.OrderBy, n+1, n+2)
	var rows []R
	if err := tx.SelectContext(ctx, &rows, sqlText, append(c.Args, size, offset)...); err != nil {
		return Page[T]{}, fmt.Errorf("meta: query %s: %w", res.Name, err)
	}
	for i := range rows {
		page.Data = append(page.Data, conv(&rows[i]))
	}
	return page, nil
}

// countWhere counts the rows of from matching q's terms, exactly.
func (s *Store) countWhere(ctx context.Context, res *Resource, q *Query, from string) (int, error) {
	c, err := res.Compile(q)
	if err != nil {
		return 0, err
	}
	limitWhere(ctx, c, res.Product)
	ctx, cancel := s.timeout(ctx)
	defer cancel()
	_, total, err := s.count(ctx, s.db, res, c, from)
	return total, err
}

// count runs the compiled terms' count over from and returns the WHERE
// clause (with its keyword, or "") for the page query to reuse.
func (s *Store) count(ctx context.Context, db sqlx.QueryerContext, res *Resource, c *Compiled, from string) (where string, total int, err error) {
	if c.Where != "" {
		where = " WHERE " + c.Where
	}
	if err := sqlx.GetContext(ctx, db, &total, "SELECT count(*) FROM "+from+where, c.Args...); err != nil {
		return "", 0, fmt.Errorf("meta: count %s: %w", res.Name, err)
	}
	return where, total, nil
}
