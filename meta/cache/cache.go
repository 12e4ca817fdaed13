// Package cache is devicehub's one in-memory cache of slow answers: values
// kept by key for a TTL, one shared load per key (single flight),
// generations for invalidation, bounds in entries and in bytes, and an
// injected clock. The product and device pages and the estimated list
// totals (meta), the dashboard answers (tsdb), the API's lookups (api) and
// ingest's device statuses all keep their values in a Cache.
//
// It must not import devicehub packages: they import it, and it knows
// nothing of what it keeps.
//
// # A shared load and its cancellation
//
// A Get that finds no servable value loads one, and every Get of the same
// key that arrives while the load runs (and while its answer would be
// servable) waits for that load instead of starting its own. The load
// runs in a goroutine of its own on a context detached from any one
// caller: it keeps the first caller's values but not its deadline or
// cancellation, and Options.LoadTimeout bounds it. Each caller waits until
// the load ends or its own ctx ends, whichever comes first: the caller
// that started the load leaving does not fail the others. When the last
// caller still waiting leaves, the load's context is cancelled and its
// answer, if any, is not kept. A background refresh (Options.Stale) is
// wanted by the cache itself: no caller leaving cancels it. A load that
// panics is a failure (ErrPanicked) of every caller sharing it, not of the
// process.
//
// # What is served
//
// A value is served while less than Options.TTL has passed since its load
// started (since its Put), before its Options.Expiry, and while its
// generations are the ones read when its load started: Invalidate bumps
// them, so an answer loaded before an Invalidate is never served after it
// (it is still given to the callers already waiting for it). A failed load
// is not kept, and drops the value of its key.
package cache

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"
)

// Forever is a TTL under which values are kept until dropped (Delete,
// DeleteFunc, Invalidate, or the bounds). A cache with TTL Forever and no
// Expiry reads no clock.
const Forever time.Duration = 1<<63 - 1

// ErrPanicked is what the callers sharing a load that panicked get,
// wrapped with the panic's value.
var ErrPanicked = errors.New("cache: load panicked")

// Options configure a Cache. Start from DefaultOptions.
type Options[K comparable, V any] struct {
	// TTL is how long a value is served after its load started (after its
	// Put). Zero or negative: nothing is kept, Peek finds nothing, and Get
	// loads on the caller's context every time, unshared. Forever: values
	// go only when dropped.
	TTL time.Duration
	// Stale is how long past its TTL a value is still served while one
	// load refreshes it in the background; 0: not at all.
	Stale time.Duration
	// MaxEntries bounds the values kept; zero or negative: unbounded.
	MaxEntries int
	// MaxBytes bounds the sum of Size over the values kept; zero or
	// negative: unbounded. A value larger than MaxBytes is not kept.
	MaxBytes int
	// Size is the bytes a value holds; nil: values count nothing.
	Size func(K, V) int
	// Trim is the fraction of MaxEntries and MaxBytes a full cache is
	// brought down to before a value is added: first every value that can
	// no longer be served goes, then others in no particular order. 0
	// empties it.
	Trim float64
	// Expiry is the time after which a value must not be served, whatever
	// its TTL (a token's end); nil, or a zero time: only the TTL bounds it.
	Expiry func(V) time.Time
	// Tag names the group of a key for Invalidate (a list, a table); nil:
	// every key is in the group "". Tags are few: each has a generation.
	Tag func(K) string
	// CopyKey is applied to a key before the cache keeps it (a string that
	// aliases a reused buffer); nil: keys are kept as given.
	CopyKey func(K) K
	// LoadTimeout bounds a shared load; zero or negative: only the load
	// itself and the last caller waiting for it do.
	LoadTimeout time.Duration
	// Now is the clock.
	Now func() time.Time
}

// DefaultOptions returns the defaults of every option.
func DefaultOptions[K comparable, V any]() Options[K, V] {
	return Options[K, V]{
		TTL:         time.Second,      // short: answers of databases other programs write too
		Stale:       0,                // callers wait for a value past its TTL
		MaxEntries:  4096,             // a few thousand distinct questions
		MaxBytes:    64 << 20,         // with Size; devicehub's -memory-limit is 160 MiB
		Size:        nil,              // values count nothing against MaxBytes
		Trim:        0.75,             // a full cache keeps three quarters
		Expiry:      nil,              // the TTL alone bounds a value's age
		Tag:         nil,              // one group: Invalidate() drops everything
		CopyKey:     nil,              // keys are owned by the cache once given
		LoadTimeout: 10 * time.Second, // a stuck load fails its callers, then is retried
		Now:         time.Now,         // the wall clock
	}
}

// Cache keeps values of type V by keys of type K. Values are shared by
// every caller that gets them: they must not be modified. The zero Cache
// is not usable; New makes one.
type Cache[K comparable, V any] struct {
	o        Options[K, V]
	window   time.Duration // TTL + Stale: how long a value may be served at all
	timeless bool          // TTL Forever and no Expiry: no clock is read

	// mu is read-locked by Peek, a Get served a fresh value, Range, Len,
	// Bytes and Loads, and write-locked by the rest. A cache on a hot
	// path (ingest's device statuses, read for every message by every
	// broker connection's callback and every worker) is read far more
	// than written, and on a machine whose cores are all busy a plain
	// mutex there convoyed its readers, each waiting to be scheduled for
	// its turn (bench fleet-connect).
	mu      sync.RWMutex
	m       map[K]*entry[V]
	flights map[K]*flight[V] // the load of each key under way, at most one
	bytes   int              // Size of the values in m
	all     uint64           // generation of every key: Invalidate()
	tags    map[string]*uint64
}

// stamp is the generations a load started under.
type stamp struct {
	all uint64
	tag *uint64 // its tag's generation counter
	gen uint64  // *tag then
}

type entry[V any] struct {
	val   V
	start time.Time // when its load started
	until time.Time // Expiry; zero: none
	stamp stamp
	size  int
}

type flight[V any] struct {
	start   time.Time
	stamp   stamp
	done    chan struct{} // closed once val and err are set
	val     V
	err     error
	waiters int // callers waiting, plus one for a background refresh
	cancel  context.CancelFunc
}

// New returns an empty cache configured by o.
func New[K comparable, V any](o Options[K, V]) *Cache[K, V] {
	if o.Now == nil {
		o.Now = time.Now
	}
	o.Trim = min(max(o.Trim, 0), 1)
	window := o.TTL + max(o.Stale, 0)
	if window < o.TTL { // overflow: Forever
		window = Forever
	}
	return &Cache[K, V]{o: o, window: window, timeless: o.TTL == Forever && o.Expiry == nil,
		m: make(map[K]*entry[V]), flights: make(map[K]*flight[V]), tags: make(map[string]*uint64)}
}

// now reads the clock; a timeless cache's values are all of the zero time.
func (c *Cache[K, V]) now() time.Time {
	if c.timeless {
		return time.Time{}
	}
	return c.o.Now()
}

// Get returns the value of key: a servable kept one, the answer of the
// load of key under way, or load's. load gets the key as kept (see
// CopyKey). A value past its TTL but within Stale is returned at once
// while one load refreshes it.
func (c *Cache[K, V]) Get(ctx context.Context, key K, load func(ctx context.Context, key K) (V, error)) (V, error) {
	if c.o.TTL <= 0 {
		return load(ctx, key)
	}
	now := c.now()
	if v, ok := c.peekAt(key, now); ok {
		return v, nil // the usual case, under the read lock
	}
	c.mu.Lock()
	if e, ok := c.m[key]; ok {
		switch c.ageLocked(e, now) {
		case fresh:
			v := e.val
			c.mu.Unlock()
			return v, nil
		case stale:
			if c.flights[key] == nil {
				c.startLocked(ctx, key, now, load, true)
			}
			v := e.val
			c.mu.Unlock()
			return v, nil
		}
		c.dropLocked(key, e)
	}
	f := c.flights[key]
	if f == nil || !c.currentLocked(f.stamp) || now.Sub(f.start) >= c.o.TTL {
		f = c.startLocked(ctx, key, now, load, false)
	}
	f.waiters++
	c.mu.Unlock()
	select {
	case <-f.done:
		return f.val, f.err
	case <-ctx.Done():
	}
	c.mu.Lock()
	if f.waiters--; f.waiters == 0 {
		select {
		case <-f.done:
		default: // nobody wants it any more
			f.cancel()
			if c.flights[key] == f {
				delete(c.flights, key)
			}
		}
	}
	c.mu.Unlock()
	var zero V
	return zero, ctx.Err()
}

// Peek returns the value of key if one is kept and within its TTL.
func (c *Cache[K, V]) Peek(key K) (V, bool) {
	if c.o.TTL <= 0 {
		var zero V
		return zero, false
	}
	return c.peekAt(key, c.now())
}

// peekAt is Peek at now.
func (c *Cache[K, V]) peekAt(key K, now time.Time) (V, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if e, ok := c.m[key]; ok && c.ageLocked(e, now) == fresh {
		return e.val, true
	}
	var zero V
	return zero, false
}

// Put keeps v as the value of key, loaded now. A load of key under way
// replaces it when it ends.
func (c *Cache[K, V]) Put(key K, v V) {
	if c.o.TTL <= 0 {
		return
	}
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.o.CopyKey != nil {
		key = c.o.CopyKey(key)
	}
	c.keepLocked(key, v, now, c.stampLocked(key), now)
}

// Delete forgets the value of key; the load of key under way, if any, is
// not kept (its callers still get its answer).
func (c *Cache[K, V]) Delete(key K) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.m[key]; ok {
		c.dropLocked(key, e)
	}
	delete(c.flights, key)
}

// DeleteFunc forgets every value for which f returns true. f runs with
// the cache locked: it must not call the cache. The lock is let go after
// every lockBatch values, so that a cache of 100,000 values does not
// hold its readers back for the whole walk; a value kept meanwhile may
// or may not be visited.
func (c *Cache[K, V]) DeleteFunc(f func(K, V) bool) {
	c.mu.Lock()
	n := 0
	for k, e := range c.m {
		if f(k, e.val) {
			c.dropLocked(k, e)
		}
		if n++; n%lockBatch == 0 {
			c.mu.Unlock()
			runtime.Gosched()
			c.mu.Lock()
		}
	}
	c.mu.Unlock()
}

// Range calls f for every value kept, servable or not, until f returns
// false. f runs with the cache read-locked: it must not call the cache.
// As DeleteFunc, Range lets the lock go after every lockBatch values.
func (c *Cache[K, V]) Range(f func(K, V) bool) {
	c.mu.RLock()
	n := 0
	for k, e := range c.m {
		if !f(k, e.val) {
			break
		}
		if n++; n%lockBatch == 0 {
			c.mu.RUnlock()
			runtime.Gosched()
			c.mu.RLock()
		}
	}
	c.mu.RUnlock()
}

// lockBatch is how many values DeleteFunc and Range visit under one hold
// of the lock: tens of microseconds.
const lockBatch = 1024

// Invalidate bumps the generation of each of tags, or with none of every
// key: no value loaded before, nor any load under way, is served after it.
func (c *Cache[K, V]) Invalidate(tags ...string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(tags) == 0 {
		c.all++
		clear(c.m)
		c.bytes = 0
		return
	}
	for _, t := range tags {
		if g := c.tags[t]; g != nil {
			*g++
		}
	}
}

// Len returns the values kept, servable or not.
func (c *Cache[K, V]) Len() int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return len(c.m)
}

// Bytes returns the Size of the values kept.
func (c *Cache[K, V]) Bytes() int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.bytes
}

// Loads returns the loads under way whose answer may be kept.
func (c *Cache[K, V]) Loads() int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return len(c.flights)
}

type age int

const (
	fresh age = iota // within the TTL
	stale            // within TTL + Stale: served while refreshed
	dead             // never served again
)

// ageLocked tells whether e may be served at now; c.mu is held.
func (c *Cache[K, V]) ageLocked(e *entry[V], now time.Time) age {
	if !c.currentLocked(e.stamp) || (!e.until.IsZero() && !now.Before(e.until)) {
		return dead
	}
	switch d := now.Sub(e.start); {
	case d < c.o.TTL:
		return fresh
	case d < c.window:
		return stale
	}
	return dead
}

func (c *Cache[K, V]) stampLocked(key K) stamp {
	var tag string
	if c.o.Tag != nil {
		tag = c.o.Tag(key)
	}
	g := c.tags[tag]
	if g == nil {
		g = new(uint64)
		c.tags[tag] = g
	}
	return stamp{all: c.all, tag: g, gen: *g}
}

func (c *Cache[K, V]) currentLocked(s stamp) bool { return s.all == c.all && *s.tag == s.gen }

// startLocked starts the load of key and makes it the one callers join;
// c.mu is held. A refresh is wanted by the cache: its waiters leaving do
// not cancel it.
func (c *Cache[K, V]) startLocked(ctx context.Context, key K, now time.Time, load func(context.Context, K) (V, error), refresh bool) *flight[V] {
	if c.o.CopyKey != nil {
		key = c.o.CopyKey(key)
	}
	lctx := context.WithoutCancel(ctx)
	var cancel context.CancelFunc
	if c.o.LoadTimeout > 0 {
		lctx, cancel = context.WithTimeout(lctx, c.o.LoadTimeout)
	} else {
		lctx, cancel = context.WithCancel(lctx)
	}
	f := &flight[V]{start: now, stamp: c.stampLocked(key), done: make(chan struct{}), cancel: cancel}
	if refresh {
		f.waiters = 1
	}
	c.flights[key] = f
	go c.run(lctx, key, f, load)
	return f
}

// run runs f's load and keeps its answer if f is still the load of key
// and its generations are current.
func (c *Cache[K, V]) run(ctx context.Context, key K, f *flight[V], load func(context.Context, K) (V, error)) {
	defer f.cancel()
	v, err := func() (v V, err error) {
		defer func() {
			if r := recover(); r != nil {
				err = fmt.Errorf("%w: %v", ErrPanicked, r)
			}
		}()
		return load(ctx, key)
	}()
	c.mu.Lock()
	defer c.mu.Unlock()
	f.val, f.err = v, err
	close(f.done)
	if c.flights[key] != f {
		return // replaced, deleted, or nobody waits for it
	}
	delete(c.flights, key)
	if err != nil {
		if e, ok := c.m[key]; ok {
			c.dropLocked(key, e)
		}
		return
	}
	c.keepLocked(key, v, f.start, f.stamp, c.now())
}

// keepLocked keeps v, loaded at start under s, as key's value if it can
// still be served, trimming a full cache first; c.mu is held.
func (c *Cache[K, V]) keepLocked(key K, v V, start time.Time, s stamp, now time.Time) {
	if e, ok := c.m[key]; ok {
		c.dropLocked(key, e)
	}
	e := &entry[V]{val: v, start: start, stamp: s}
	if c.o.Expiry != nil {
		e.until = c.o.Expiry(v)
	}
	if c.o.Size != nil {
		e.size = c.o.Size(key, v)
	}
	if c.ageLocked(e, now) == dead || (c.o.MaxBytes > 0 && e.size > c.o.MaxBytes) {
		return
	}
	c.trimLocked(now, e.size)
	c.m[key] = e
	c.bytes += e.size
}

// trimLocked makes room for a value of size bytes if the cache is full:
// it drops the values that can no longer be served, then others until
// the cache is down to Trim of its bounds; c.mu is held.
func (c *Cache[K, V]) trimLocked(now time.Time, size int) {
	full := func(entries, bytes int) bool {
		return (c.o.MaxEntries > 0 && len(c.m) >= entries) || (c.o.MaxBytes > 0 && c.bytes+size > bytes)
	}
	if !full(c.o.MaxEntries, c.o.MaxBytes) {
		return
	}
	for k, e := range c.m {
		if c.ageLocked(e, now) == dead {
			c.dropLocked(k, e)
		}
	}
	if !full(c.o.MaxEntries, c.o.MaxBytes) {
		return
	}
	// Down to Trim of the bounds; len(c.m) <= entries-1 leaves room for one.
	entries := int(c.o.Trim*float64(c.o.MaxEntries)) + 1
	bytes := int(c.o.Trim * float64(c.o.MaxBytes))
	for k, e := range c.m {
		if !full(entries, bytes) {
			return
		}
		c.dropLocked(k, e)
	}
}

// dropLocked forgets key's value e; c.mu is held.
func (c *Cache[K, V]) dropLocked(key K, e *entry[V]) {
	delete(c.m, key)
	c.bytes -= e.size
}
