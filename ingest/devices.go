package ingest

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"devicehub/meta"
	"devicehub/meta/cache"
)

// Devices looks devices up; *meta.Store is one.
type Devices interface {
	// DeviceStatuses returns the status of each of ids that exists.
	DeviceStatuses(ctx context.Context, ids []string) (map[string]meta.DeviceStatus, error)
}

// DeviceWatcher is a Devices that announces changes of the statuses it
// returns (*meta.Store: WatchDevices): with the ids changed, as they are
// committed, and with none when any may have changed (once listening,
// and after every reconnection). It returns when ctx ends.
type DeviceWatcher interface {
	WatchDevices(ctx context.Context, changed func(ids ...string)) error
}

// StateApplier writes connection state; *meta.Store is one.
type StateApplier interface {
	ApplyStateChanges(ctx context.Context, changes []meta.StateChange) (int, error)
}

// refreshChunk bounds the ids of one refresh query.
const refreshChunk = 10000

// maxCachedDevices bounds the device cache (about 150 bytes an entry:
// 150 MB at the bound); a full cache forgets a quarter of its devices, in
// no particular order, which are looked up again on their next message.
const maxCachedDevices = 1 << 20

// deviceCache keeps the status of the devices ingest hears from, so that a
// message costs no PostgreSQL query. A device's first message looks it up
// (concurrent misses of one id share the lookup). Every TTL, the devices
// unused for keep TTLs in a row are forgotten. The others are re-read when
// they change: a source that is a DeviceWatcher announces each change, and
// the cached devices among them are re-read at once, many to a query
// (runChanges); every device cached is re-read only when announcements
// may have been missed (the watch starting or reconnecting) and, as a
// safety net, every fullRefresh TTLs. Without announcements (another
// source, or none heard yet) every device cached is re-read every TTL, in
// one query per 10,000. A deploy, undeploy or delete thus takes effect
// within moments, or without announcements within about one TTL, and
// PostgreSQL answers a few queries instead of one per device (500
// queries/s at 1000 devices and 2s, about a tenth of the ingester's CPU).
// Re-reading every device every TTL cost, at 100,000 devices reporting
// every 10 s, a quarter of devicehub's CPU and 50,000 rows a second of
// PostgreSQL's (bench alarms' profile). All re-reads run on one
// goroutine, so an older read never replaces a newer one; a first lookup
// that raced an announcement of its device is re-read after it (gen).
// keep spares a quiet device
// a lookup per message: with keep 0 (forgotten when unused for one TTL),
// 5,000 devices reporting every 10 s cost PostgreSQL 1,000 single-device
// queries a second, one per report (bench fleet-connect). While PostgreSQL
// is down the statuses known stay in use; only devices not seen before
// wait for it.
//
// The statuses are kept in a meta/cache Cache, which never expires them
// (refresh forgets the unused ones) and shares the first lookups: a shared
// lookup runs on a context detached from the worker that started it
// (meta's QueryTimeout bounds it) and is cancelled when no worker waits
// for it any more.
type deviceCache struct {
	src     Devices
	ttl     time.Duration
	keep    int // refreshes an unused entry survives
	log     *slog.Logger
	entries *cache.Cache[string, *cacheEntry]
	failing bool // the last refresh failed (logged once)

	// Announced changes (DeviceWatcher) waiting for runChanges: the ids,
	// or all (any may have changed); watched once the watch listens; gen
	// counts announcements (a lookup that saw it move re-reads).
	chMu    sync.Mutex
	chIDs   map[string]struct{}
	chAll   bool
	chKick  chan struct{}
	watched atomic.Bool
	gen     atomic.Uint64
	full    int // fullRefresh; tests raise it

	// Devices not cached whose messages are on their way to a worker
	// (hint) are looked up many to a query ahead of the workers
	// (runHints), and a worker that misses one of them waits for that
	// query instead of sending its own: a storm of new devices does not
	// cost a query each. hintNext gathers, a batch of at most refreshChunk
	// ids after another (a storm of 100,000 births hints more than one
	// query's worth before runHints gets to them), hintOf maps each id
	// gathered or in flight to its batch, hinted signals the first id of
	// a gathering; mu guards them.
	mu       sync.Mutex
	hintNext []*hintBatch
	hintOf   map[string]*hintBatch
	hinted   chan struct{}
}

type hintBatch struct {
	ids  []string
	done chan struct{} // closed once looked up (or failed)
}

// cacheEntry is a device's entry; the cache shares it.
type cacheEntry struct {
	st   atomic.Pointer[deviceStatus] // replaced by refresh
	used atomic.Bool                  // since the last refresh
	idle int                          // refreshes in a row without a use; refresh's own
}

type deviceStatus struct {
	status meta.DeviceStatus
	found  bool
}

func newCacheEntry(st meta.DeviceStatus, found, used bool) *cacheEntry {
	e := &cacheEntry{}
	e.st.Store(&deviceStatus{st, found})
	e.used.Store(used)
	return e
}

// use marks e used and returns its status.
func (e *cacheEntry) use() (meta.DeviceStatus, bool) {
	if !e.used.Load() {
		e.used.Store(true)
	}
	s := e.st.Load()
	return s.status, s.found
}

func newDeviceCache(src Devices, ttl time.Duration, keep int, log *slog.Logger) *deviceCache {
	o := cache.DefaultOptions[string, *cacheEntry]()
	o.TTL = cache.Forever
	o.MaxEntries = maxCachedDevices
	o.LoadTimeout = 0 // the store's own (meta's QueryTimeout)
	return &deviceCache{src: src, ttl: ttl, keep: max(keep, 0), log: log, entries: cache.New(o),
		hintOf: make(map[string]*hintBatch), hinted: make(chan struct{}, 1),
		chIDs: make(map[string]struct{}), chKick: make(chan struct{}, 1), full: fullRefresh}
}

// fullRefresh: with announcements heard, every device cached is still
// re-read every fullRefresh TTLs (a minute at the default 2 s).
const fullRefresh = 30

// changed takes an announcement: ids changed, or any may have (none).
func (c *deviceCache) changed(ids ...string) {
	c.gen.Add(1)
	c.chMu.Lock()
	if len(ids) == 0 {
		c.chAll = true
		c.watched.Store(true)
	}
	for _, id := range ids {
		c.chIDs[id] = struct{}{}
	}
	c.chMu.Unlock()
	select {
	case c.chKick <- struct{}{}:
	default:
	}
}

// hint says a message of the device is queued for a worker: if it is not
// cached, runHints looks it up with others before the worker gets there
// (a worker that gets there first looks it up itself, as before).
func (c *deviceCache) hint(id string) {
	if _, ok := c.entries.Peek(id); ok {
		return
	}
	c.mu.Lock()
	first := false
	if c.hintOf[id] == nil {
		first = len(c.hintNext) == 0
		if first || len(c.hintNext[len(c.hintNext)-1].ids) >= refreshChunk {
			c.hintNext = append(c.hintNext, &hintBatch{done: make(chan struct{})})
		}
		b := c.hintNext[len(c.hintNext)-1]
		b.ids = append(b.ids, id)
		c.hintOf[id] = b
	}
	c.mu.Unlock()
	if first {
		select {
		case c.hinted <- struct{}{}:
		default:
		}
	}
}

// hintWindow is how long runHints gathers hints after the first.
const hintWindow = 5 * time.Millisecond

// runHints looks the hinted devices up, one query per batch, until ctx
// ends. A failed lookup is left to the workers.
func (c *deviceCache) runHints(ctx context.Context) {
	t := time.NewTimer(0)
	<-t.C
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.hinted:
		}
		t.Reset(hintWindow)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		c.mu.Lock()
		batches := c.hintNext
		c.hintNext = nil
		c.mu.Unlock()
		for _, b := range batches {
			_, _ = c.prefetch(ctx, b.ids)
			c.mu.Lock()
			for _, id := range b.ids {
				delete(c.hintOf, id)
			}
			c.mu.Unlock()
			close(b.done)
		}
	}
}

// get returns the device's status and whether it exists; err is a lookup
// failure (database down), which is not cached.
func (c *deviceCache) get(ctx context.Context, id string) (meta.DeviceStatus, bool, error) {
	if e, ok := c.entries.Peek(id); ok {
		st, found := e.use()
		return st, found, nil
	}
	c.mu.Lock()
	b := c.hintOf[id]
	c.mu.Unlock()
	if b != nil { // looked up with others right now: wait for that
		select {
		case <-b.done:
		case <-ctx.Done():
			return meta.DeviceStatus{}, false, ctx.Err()
		}
		if e, ok := c.entries.Peek(id); ok {
			st, found := e.use()
			return st, found, nil
		}
		// That lookup failed: on our own.
	}
	g := c.gen.Load()
	e, err := c.entries.Get(ctx, id, c.lookup)
	if err != nil {
		return meta.DeviceStatus{}, false, err
	}
	if c.gen.Load() != g {
		c.changed(id) // looked up before an announcement of it, perhaps: read again, now that it is cached
	}
	st, found := e.use()
	return st, found, nil
}

// lookup reads a device not cached yet.
func (c *deviceCache) lookup(ctx context.Context, id string) (*cacheEntry, error) {
	m, err := c.src.DeviceStatuses(ctx, []string{id})
	if err != nil {
		return nil, err
	}
	st, found := m[id]
	return newCacheEntry(st, found, true), nil
}

// prefetch reads the statuses of ids (the devices stored as online, at
// start) in chunks and caches them, so that a restarted instance does not
// send PostgreSQL one query per device as the fleet's messages come in.
// Entries that are never used go after keep refreshes.
func (c *deviceCache) prefetch(ctx context.Context, ids []string) (int, error) {
	n := 0
	for len(ids) > 0 {
		chunk := ids[:min(len(ids), refreshChunk)]
		ids = ids[len(chunk):]
		g := c.gen.Load()
		m, err := c.src.DeviceStatuses(ctx, chunk)
		if err != nil {
			return n, err
		}
		var put []string
		for _, id := range chunk {
			if _, ok := c.entries.Peek(id); ok {
				continue
			}
			st, found := m[id]
			c.entries.Put(id, newCacheEntry(st, found, false))
			put = append(put, id)
			n++
		}
		if len(put) > 0 && c.gen.Load() != g {
			c.changed(put...) // read before an announcement of theirs, perhaps
		}
	}
	return n, nil
}

// sweep forgets the devices unused for more than keep TTLs and returns
// the ids of the others.
func (c *deviceCache) sweep() []string {
	var ids []string
	c.entries.DeleteFunc(func(id string, e *cacheEntry) bool {
		if e.used.Swap(false) {
			e.idle = 0
		} else if e.idle++; e.idle > c.keep {
			return true
		}
		ids = append(ids, id)
		return false
	})
	return ids
}

// refresh is one TTL: sweep, then re-read every device cached.
func (c *deviceCache) refresh(ctx context.Context) error {
	return c.reread(ctx, c.sweep())
}

// reread reads ids again, in chunks of refreshChunk, and updates those
// still cached.
func (c *deviceCache) reread(ctx context.Context, ids []string) error {
	for len(ids) > 0 {
		chunk := ids[:min(len(ids), refreshChunk)]
		ids = ids[len(chunk):]
		m, err := c.src.DeviceStatuses(ctx, chunk)
		if err != nil {
			return err
		}
		for _, id := range chunk {
			if e, ok := c.entries.Peek(id); ok {
				st, found := m[id]
				e.st.Store(&deviceStatus{st, found})
			}
		}
	}
	return nil
}

// cachedIDs returns the ids of devices cached.
func (c *deviceCache) cachedIDs() []string {
	var ids []string
	c.entries.Range(func(id string, _ *cacheEntry) bool {
		ids = append(ids, id)
		return true
	})
	return ids
}

// run keeps the cache (the type's doc) and looks hinted devices up, until
// ctx ends.
func (c *deviceCache) run(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Add(1)
	go func() {
		defer wg.Done()
		c.runHints(ctx)
	}()
	if w, ok := c.src.(DeviceWatcher); ok {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := w.WatchDevices(ctx, c.changed); err != nil && ctx.Err() == nil {
				c.log.Warn("device status announcements not heard; every status is re-read each refresh", "err", err)
			}
		}()
	}
	c.runChanges(ctx)
}

// runChanges re-reads, on one goroutine: the devices announced changed,
// as they come; and every TTL, after the sweep, every device cached
// (without announcements, or every fullRefresh TTLs, or when any may have
// changed). A failed re-read is tried again at the next TTL, whole.
func (c *deviceCache) runChanges(ctx context.Context) {
	var tick <-chan time.Time
	if c.ttl > 0 {
		t := time.NewTicker(c.ttl)
		defer t.Stop()
		tick = t.C
	}
	retry, ttls := false, 0
	report := func(err error) {
		switch {
		case err != nil && ctx.Err() == nil && !c.failing:
			c.failing = true
			c.log.Warn("device status refresh failed; using the statuses known", "err", err)
		case err == nil && c.failing:
			c.failing = false
			c.log.Info("device status refresh recovered")
		}
		retry = err != nil
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick:
			ttls++
			ids := c.sweep()
			c.chMu.Lock()
			all := c.chAll || retry || !c.watched.Load() || ttls%c.full == 0
			if all {
				c.chAll, c.chIDs = false, make(map[string]struct{})
			}
			c.chMu.Unlock()
			if all {
				report(c.reread(ctx, ids))
			}
		case <-c.chKick:
			c.chMu.Lock()
			all, changed := c.chAll, c.chIDs
			c.chAll, c.chIDs = false, make(map[string]struct{})
			c.chMu.Unlock()
			var ids []string
			if all {
				ids = c.cachedIDs()
			} else {
				for id := range changed {
					if _, ok := c.entries.Peek(id); ok {
						ids = append(ids, id)
					}
				}
			}
			report(c.reread(ctx, ids))
		}
	}
}

// len returns the devices cached.
func (c *deviceCache) len() int { return c.entries.Len() }
