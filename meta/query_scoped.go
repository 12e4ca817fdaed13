package meta

import "context"

// QueryScoped answers a query body over res, a table another package owns
// (ingest/alarm's rules and records), with the list engine the store's own
// lists use: terms and sorts over res's whitelist, paging, total; limited
// to ctx's products through res.Product (LimitProducts). columns are
// selected from from into R rows, which conv turns into items.
func QueryScoped[R any, T any](ctx context.Context, s *Store, res *Resource, q *Query, columns, from string, conv func(*R) T) (Page[T], error) {
	c, err := res.Compile(q)
	if err != nil {
		return Page[T]{}, err
	}
	limitWhere(ctx, c, res.Product)
	return queryCompiled(ctx, s, res, q, c, columns, from, conv)
}
