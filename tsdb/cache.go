package tsdb

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"devicehub/meta/cache"
)

// The result cache of the dashboard queries (MessageCounts,
// PropertyAggregates). Dashboards poll: many clients ask the same
// question again and again, and the answer only changes when rows are
// stored. The cache keeps each answer for a short TTL (Options.ResultTTL,
// default 1 s) and lets identical queries that arrive while one is running
// wait for it instead of asking ClickHouse again (single flight).
//
// Why this is exact within the TTL, also for rows stored by another
// instance sharing the database: an answer is served only while less than
// the TTL has passed since its ClickHouse query *started*, and a query sees
// every row whose INSERT was acknowledged before it started. So a row
// acknowledged at time T shows in every answer given after T + TTL: such
// an answer comes from a query started after T. Rows stored through this
// DB (Insert, InsertBatch, the Writer) and partitions it drops show at
// once: each bumps a generation, and an answer computed under an older
// generation is not served again.
//
// Checking a per-day "last insert" marker in ClickHouse before serving a
// cached answer was the alternative; it costs a ClickHouse round trip per
// request, which is most of what the cache saves on 18.16 (about 0.5 ms
// of server time for the smallest query), so the cache would not lift the
// ceiling of concurrent dashboard requests. Closed periods would be served
// from memory for longer, but a dashboard always asks for the current
// bucket too, which changes with every insert.
//
// Rows written around the DB (Conn().Exec, another program) are covered by
// the TTL only.
//
// The answers are kept in a meta/cache Cache, whose rules are the ones
// above: it serves an answer while less than the TTL has passed since its
// load started and its generation is current, and identical queries join
// a load under way only on the same terms. A shared load runs on a context
// detached from the caller that started it (Options.QueryTimeout bounds
// it); it is cancelled when no caller waits for it any more.
type resultCache struct {
	c *cache.Cache[string, sizedAnswer]
}

// sizedAnswer is an answer and the buckets it holds.
type sizedAnswer struct {
	val     any
	buckets int
}

// Bounds of the cache: entries, and the buckets they hold (about
// bucketBytes each). A full cache drops the answers that can no longer be
// served, then others, down to three quarters of its bounds.
const (
	maxCacheEntries = 4096
	maxCacheValues  = 1 << 20
	bucketBytes     = 40
)

func newResultCache(ttl time.Duration) *resultCache {
	o := cache.DefaultOptions[string, sizedAnswer]()
	o.TTL = ttl
	o.MaxEntries = maxCacheEntries
	o.MaxBytes = maxCacheValues * bucketBytes
	o.Size = func(_ string, a sizedAnswer) int { return a.buckets * bucketBytes }
	o.LoadTimeout = 0 // the query's own (Options.QueryTimeout)
	return &resultCache{c: cache.New(o)}
}

// invalidate makes every answer computed so far unservable.
func (c *resultCache) invalidate() { c.c.Invalidate() }

// invalidate makes every dashboard answer computed so far unservable:
// rows were stored or dropped. (The message count totals of daycounts.go
// are patched by inserts and dropped by drops on their own.)
func (db *DB) invalidate() {
	db.cache.invalidate()
}

// cacheKey joins the parts that identify a query.
func cacheKey(parts ...any) string {
	var b strings.Builder
	for _, p := range parts {
		switch v := p.(type) {
		case string:
			b.WriteString(strconv.Quote(v))
		case int:
			b.WriteString(strconv.Itoa(v))
		case int64:
			b.WriteString(strconv.FormatInt(v, 10))
		default:
			panic(fmt.Sprintf("tsdb: cache key part %T", p))
		}
		b.WriteByte(',')
	}
	return b.String()
}

// get returns the answer of the query key: a servable cached one, the one
// of an identical query in flight, or load's. load returns the answer and
// its size in buckets. Answers are shared: callers must not modify them. A
// failed load is not kept; the callers that waited for it get its error.
func (c *resultCache) get(ctx context.Context, key string, load func(context.Context) (any, int, error)) (any, error) {
	if a, ok := c.c.Peek(key); ok { // a hit allocates no loader
		return a.val, nil
	}
	a, err := c.c.Get(ctx, key, func(ctx context.Context, _ string) (sizedAnswer, error) {
		v, n, err := load(ctx)
		return sizedAnswer{v, n}, err
	})
	return a.val, err
}
