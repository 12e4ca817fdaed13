package tsdb

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
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
type resultCache struct {
	ttl time.Duration
	gen atomic.Uint64 // bumped after every insert or drop through the DB

	mu     sync.Mutex
	m      map[string]*cacheEntry
	values int // size of the finished entries in m
}

// cacheEntry is one query's answer, or its flight while it runs.
type cacheEntry struct {
	start time.Time // before the ClickHouse query was sent
	gen   uint64    // the generation the query ran under
	done  chan struct{}
	val   any
	size  int // buckets held, counted against maxCacheValues
	err   error
}

// Bounds of the cache: entries, and the buckets they hold (about 40 bytes
// each). Entries expire after the TTL and are swept when a bound is
// reached; a query that finds the cache full after the sweep runs uncached.
const (
	maxCacheEntries = 4096
	maxCacheValues  = 1 << 20
)

func newResultCache(ttl time.Duration) *resultCache {
	return &resultCache{ttl: ttl, m: make(map[string]*cacheEntry)}
}

// invalidate makes every answer computed so far unservable.
func (c *resultCache) invalidate() { c.gen.Add(1) }

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
// of an identical query in flight, or load's, run now (in the caller's
// goroutine, with its ctx). load returns the answer and its size in
// buckets. Answers are shared: callers must not modify them. A failed load
// is not kept; the callers that waited for it get its error.
func (c *resultCache) get(ctx context.Context, key string, now time.Time, load func(context.Context) (any, int, error)) (any, error) {
	if c.ttl <= 0 {
		v, _, err := load(ctx)
		return v, err
	}
	gen := c.gen.Load()
	c.mu.Lock()
	if e, ok := c.m[key]; ok {
		if e.gen == gen && now.Sub(e.start) < c.ttl {
			c.mu.Unlock()
			select {
			case <-e.done:
				return e.val, e.err
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		c.removeLocked(key, e)
	}
	if len(c.m) >= maxCacheEntries || c.values >= maxCacheValues {
		c.sweepLocked(now, gen)
	}
	if len(c.m) >= maxCacheEntries || c.values >= maxCacheValues {
		c.mu.Unlock()
		v, _, err := load(ctx)
		return v, err
	}
	e := &cacheEntry{start: now, gen: gen, done: make(chan struct{})}
	c.m[key] = e
	c.mu.Unlock()

	finished := false
	defer func() {
		if !finished { // load panicked: fail the waiters, not the process's other requests
			e.err = fmt.Errorf("tsdb: query of %s panicked", key)
			c.finish(key, e)
		}
	}()
	e.val, e.size, e.err = load(ctx)
	finished = true
	c.finish(key, e)
	return e.val, e.err
}

// finish publishes e's answer and keeps it, unless it failed.
func (c *resultCache) finish(key string, e *cacheEntry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	close(e.done)
	if c.m[key] != e {
		return // replaced by a newer flight, or swept
	}
	if e.err != nil {
		delete(c.m, key)
		return
	}
	c.values += e.size
}

// removeLocked forgets key's entry e; c.mu is held.
func (c *resultCache) removeLocked(key string, e *cacheEntry) {
	if c.m[key] != e {
		return
	}
	delete(c.m, key)
	select {
	case <-e.done:
		c.values -= e.size
	default: // in flight: its size was never counted
	}
}

// sweepLocked forgets the entries that can no longer be served; c.mu is
// held.
func (c *resultCache) sweepLocked(now time.Time, gen uint64) {
	for k, e := range c.m {
		if e.gen != gen || now.Sub(e.start) >= c.ttl {
			c.removeLocked(k, e)
		}
	}
}
