package tsdb

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"time"
)

// Warming the kept months. A new instance keeps nothing: until a question
// has asked for a product's month, the question loads it (three queries,
// daycounts.go) and waits. A dashboard fleet reaching a fresh instance
// asks for hundreds of product-months at once, and the first seconds'
// questions queue behind those loads (measured in the mixed bench: the
// first seconds answered 100-200 req/s, p99 0.7-0.9 s, where the kept
// path answers 12,000). Warm loads them before anybody asks,
// off the request path: the months with rows of the current window,
// newest first, one at a time, through the same checked load a question
// uses (so what it keeps is exact by the same argument, and a question
// asking for a month under way shares its load). It stops at half of a
// keeper's byte bound, leaving the rest to what questions ask for.

// WarmStats says what Warm loaded.
type WarmStats struct {
	Chunks  int           // months of a product (or a product's property) loaded
	Skipped int           // already kept, or unsettled (left to questions)
	Took    time.Duration // from the call to the end
}

// Warm loads the closed months of message counts and of product-wide
// property aggregates that the current window's totals count rows in,
// newest month first, until each keeper holds half its byte bound or ctx
// ends (then it returns ctx's error with what it loaded). With the result
// cache off (ResultTTL <= 0) nothing is kept and it returns at once.
// cmd/devicehub runs it in the background at start.
func (db *DB) Warm(ctx context.Context) (WarmStats, error) {
	start := time.Now()
	var st WarmStats
	if db.opt.ResultTTL <= 0 {
		return st, nil
	}
	cut := dayNumber(start, db.loc)
	if err := db.days.warm(ctx, totalsKey{cut - daySeriesDays, cut}, maxDayChunkBytes/2, &st); err != nil {
		st.Took = time.Since(start)
		return st, err
	}
	if !db.opt.NoRollup {
		cut = dayNumber(start, time.UTC)
		if err := db.props.warm(ctx, totalsKey{cut - daySeriesDays, cut}, maxPropChunkBytes/2, &st); err != nil {
			st.Took = time.Since(start)
			return st, err
		}
	}
	st.Took = time.Since(start)
	return st, nil
}

// warm loads the chunks of the months the totals of tk count rows in,
// newest first, until the kept chunks reach maxBytes.
func (k *keeper[V]) warm(ctx context.Context, tk totalsKey, maxBytes int, st *WarmStats) error {
	t, err := k.totals.get(ctx, tk, time.Now(), k.loadTotals)
	if err != nil {
		return err
	}
	type want struct {
		key  chunkKey
		rows uint64
	}
	wants := make([]want, 0, len(t.closed))
	for key, n := range t.closed {
		if n > 0 {
			wants = append(wants, want{key, n})
		}
	}
	slices.SortFunc(wants, func(a, b want) int {
		return cmp.Or(cmp.Compare(b.key.month, a.key.month), cmp.Compare(a.key.product, b.key.product))
	})
	for _, w := range wants {
		if k.chunks.Bytes() >= maxBytes {
			return nil
		}
		if c, ok := k.chunks.Peek(w.key); ok && c.total == w.rows {
			st.Skipped++
			continue
		}
		switch _, err := k.chunk(ctx, w.key, tk.cut, w.rows); {
		case errors.Is(err, errChunkUnsettled):
			st.Skipped++ // a question reads ClickHouse for it
		case err != nil:
			return err
		default:
			st.Chunks++
		}
	}
	return nil
}
