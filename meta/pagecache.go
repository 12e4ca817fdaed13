package meta

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"devicehub/meta/cache"
)

// The page cache of the product and device lists (endpoints 1 and 7).
// Consoles and dashboards poll the same pages again and again, and a page
// costs PostgreSQL about 1 ms of CPU (planning, a trigram scan, the
// count); the tables change far less often than they are read. So a page
// is kept, under its terms, order and position, until a table it reads
// changes, and identical queries that arrive while one runs wait for it
// instead of asking PostgreSQL again.
//
// Why a kept page is never older than the tables, whoever writes them:
//   - Every statement that changes products, devices or
//     product_device_counts announces the table on channel devicehub_lists
//     as it commits (schema/postgres/00008_list_changes.sql), whoever
//     wrote it: this instance, another one, psql. A watcher LISTENs and,
//     per announcement, bumps the generation of each list that reads the
//     table. A page is served only while its list's generation is the one
//     read before its query started: a change committed before the query's
//     snapshot is in the page; one committed after it bumps the generation
//     (PostgreSQL delivers an announcement once its transaction is visible
//     to new snapshots), and the page is not served again.
//   - This instance's own writes bump the generations themselves once
//     committed, before they return (changed), so a client reads its own
//     write on the next request. A write through another instance shows
//     here as soon as its announcement arrives (well under a millisecond
//     on one host).
//   - While the watcher is not listening (not yet connected, PostgreSQL
//     unreachable, reconnecting) announcements are lost: pages are neither
//     served nor kept, and every generation is bumped when it listens
//     again. A connection that died silently is found by a ping every 5 s;
//     Options.PageCacheTTL bounds a page's age in any case.
//
// The pages are kept in a meta/cache Cache tagged by list: a change of a
// table bumps the generation of each list that reads it. A shared query
// runs on a context detached from the request that started it
// (Options.QueryTimeout bounds it) and is cancelled when no request waits
// for it any more.
type pageCache struct {
	ttl   time.Duration
	dsn   string
	pages *cache.Cache[pageID, sizedPage]
	live  atomic.Bool // the watcher listens

	start  sync.Once     // the watcher starts with the first cached list query
	stop   chan struct{} // closed by close
	closed sync.WaitGroup

	syncMu sync.Mutex
	syncs  map[string]chan struct{} // SyncLists calls, by their announcement
}

// pageID is a page's key in the cache: its list (its tag) and pageKey.
type pageID struct{ list, key string }

// sizedPage is a page (a Page[T]; shared, never modified but for what a
// caller makes of it, once: Page.Memo) and its size in bytes as load gave
// it.
type sizedPage struct {
	val   any
	bytes int
}

// Bounds of the cache: entries, their keys, and the bytes their pages
// hold (items and what callers keep with them, Page.Memo). A query whose
// key is longer runs uncached; a full
// cache drops the pages that can no longer be served, then others, down to
// three quarters of its bounds.
const (
	maxPageEntries = 4096
	maxPageKey     = 4096
	maxPageBytes   = 48 << 20 // 1,400 pages of 25 devices; -memory-limit is 160 MiB
)

// listChannel is where every change of a listed table is announced; its
// payload is the table's name (schema/postgres/00008_list_changes.sql).
const listChannel = "devicehub_lists"

// listTables are the tables each list reads; a change of any of them
// makes its cached pages unservable.
var listTables = map[string][]string{
	"product": {"products", "product_device_counts"},
	"device":  {"devices", "products"},
}

func newPageCache(dsn string, ttl time.Duration) *pageCache {
	o := cache.DefaultOptions[pageID, sizedPage]()
	o.TTL = ttl
	o.MaxEntries = maxPageEntries
	o.MaxBytes = maxPageBytes
	o.Size = func(_ pageID, p sizedPage) int { return p.bytes }
	o.Tag = func(id pageID) string { return id.list }
	o.LoadTimeout = 0 // the query's own (Options.QueryTimeout)
	return &pageCache{ttl: ttl, dsn: dsn, pages: cache.New(o), stop: make(chan struct{}), syncs: map[string]chan struct{}{}}
}

// changed makes every page that reads one of tables unservable; with no
// table, every page. The writes of this Store call it once they have
// committed.
func (c *pageCache) changed(tables ...string) {
	if c == nil {
		return
	}
	if len(tables) == 0 {
		c.pages.Invalidate()
		return
	}
	var lists []string
	for list, read := range listTables {
		if overlaps(read, tables) {
			lists = append(lists, list)
		}
	}
	if len(lists) > 0 {
		c.pages.Invalidate(lists...)
	}
}

func overlaps(a, b []string) bool {
	for _, x := range a {
		for _, y := range b {
			if x == y {
				return true
			}
		}
	}
	return false
}

// get returns the page of list under key: a servable kept one, the one of
// an identical query in flight, or load's. load returns the page and its
// size in bytes; keep tells it whether the page may be kept (and so may
// keep what callers make of it, Page.Memo). A failed load is not kept;
// the callers that waited for it get its error.
func (c *pageCache) get(ctx context.Context, list, key string, load func(ctx context.Context, keep bool) (any, int, error)) (any, error) {
	if c == nil || c.ttl <= 0 || len(key) > maxPageKey {
		v, _, err := load(ctx, false)
		return v, err
	}
	c.start.Do(c.watch)
	if !c.live.Load() {
		v, _, err := load(ctx, false)
		return v, err
	}
	p, err := c.pages.Get(ctx, pageID{list, key}, func(ctx context.Context, _ pageID) (sizedPage, error) {
		v, n, err := load(ctx, true)
		return sizedPage{v, n}, err
	})
	return p.val, err
}

// pageKey names a page: its list, the terms with their values, the order
// and the page's position.
func pageKey(list string, c *Compiled, size, offset int) string {
	k := totalKey(list, c)
	b := make([]byte, 0, len(k)+len(c.OrderBy)+24)
	b = append(append(append(b, k...), 0), c.OrderBy...)
	b = strconv.AppendInt(append(b, 0), int64(size), 10)
	b = strconv.AppendInt(append(b, ','), int64(offset), 10)
	return string(b)
}

// watch starts the watcher: it listens on listChannel for as long as the
// cache is open, reconnecting as needed, and keeps live and the
// generations in step with what it hears.
func (c *pageCache) watch() {
	c.closed.Add(1)
	go func() {
		defer c.closed.Done()
		defer c.live.Store(false)
		// A refused LISTEN returns at once: pages stay uncached.
		_ = Listen(c.dsn, []string{listChannel}, ListenHandler{
			Lost: func() {
				c.live.Store(false)
				c.changed()
			},
			Listening: func() { // announcements were lost while not listening
				c.changed()
				c.live.Store(true)
			},
			Notify: func(_, payload string) {
				if strings.HasPrefix(payload, syncPrefix) {
					c.synced(payload)
				} else {
					c.changed(payload)
				}
			},
		}, c.stop)
	}()
}

// syncPrefix starts the announcements of SyncLists, which name no table.
const syncPrefix = "sync "

// SyncLists returns once the page cache has heard of every change to the
// listed tables committed before it was called, whoever committed it: a
// page read after it reflects them. PostgreSQL delivers announcements in
// commit order, so it announces a token of its own and waits to hear it.
// A write through this Store needs no SyncLists: it is reflected when it
// returns. If the cache's watcher is not listening yet, SyncLists starts
// it and gives it a second to listen; pages are not kept without it.
func (s *Store) SyncLists(ctx context.Context) error {
	c := s.pages
	if c == nil || c.ttl <= 0 {
		return nil
	}
	c.start.Do(c.watch)
	for wait := time.Now().Add(time.Second); !c.live.Load(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(wait) || ctx.Err() != nil {
			return ctx.Err() // nothing is served from the cache now
		}
	}
	token := syncPrefix + newSecret()
	heard := make(chan struct{})
	c.syncMu.Lock()
	c.syncs[token] = heard
	c.syncMu.Unlock()
	defer func() {
		c.syncMu.Lock()
		delete(c.syncs, token)
		c.syncMu.Unlock()
	}()
	if _, err := s.db.ExecContext(ctx, `SELECT pg_notify($1, $2)`, listChannel, token); err != nil {
		return err
	}
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-heard:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
			if !c.live.Load() {
				return nil // not listening: nothing is served until every list is bumped
			}
		}
	}
}

// synced tells the SyncLists call that announced token, if it is this
// instance's, that its announcement arrived.
func (c *pageCache) synced(token string) {
	c.syncMu.Lock()
	defer c.syncMu.Unlock()
	if ch, ok := c.syncs[token]; ok {
		close(ch)
		delete(c.syncs, token)
	}
}

// close stops the watcher.
func (c *pageCache) close() {
	if c == nil {
		return
	}
	c.start.Do(func() {}) // a cache never used starts no watcher now
	select {
	case <-c.stop:
	default:
		close(c.stop)
	}
	c.closed.Wait()
}
