package api

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"devicehub/bench/testkit"
	"devicehub/meta"
	"devicehub/meta/metatest"
)

// syncBuffer is a log's output, read while it is written.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}

func auditRows(t *testing.T, store *meta.Store) int {
	t.Helper()
	var n int
	if err := store.DB().Get(&n, `SELECT count(*) FROM audit`); err != nil {
		t.Fatal(err)
	}
	return n
}

func entryN(i int) meta.AuditEntry {
	return meta.AuditEntry{Time: meta.Millis(time.Now()), UserID: "admin", Username: "admin", Method: "DELETE",
		Route: "/api/device/instance/:id", ObjectID: fmt.Sprint("d", i), Status: 200}
}

// gatedStore is the real store, whose inserts wait until released.
type gatedStore struct {
	*meta.Store
	entered chan struct{}
	release chan struct{}
}

func (g *gatedStore) InsertAudit(ctx context.Context, entries []meta.AuditEntry) error {
	select {
	case g.entered <- struct{}{}:
	default:
	}
	<-g.release
	return g.Store.InsertAudit(ctx, entries)
}

// TestAuditLogBounded: while the store is busy, past AuditQueue buffered
// entries more are dropped, counted and logged; close stores what is
// buffered.
func TestAuditLogBounded(t *testing.T) {
	t.Parallel()
	store := &gatedStore{Store: metatest.NewStore(t), entered: make(chan struct{}, 1), release: make(chan struct{})}
	var out syncBuffer
	opts := DefaultOptions()
	opts.AuditBatch, opts.AuditQueue, opts.AuditFlushInterval = 10, 10, time.Hour
	a := newAuditLog(store, opts, slog.New(slog.NewTextHandler(&out, nil)), prometheus.NewRegistry())
	for i := range 10 {
		a.record(entryN(i))
	}
	<-store.entered // the full batch woke the writer, which holds it
	for i := range 15 {
		a.record(entryN(10 + i))
	}
	if d := counterValue(a.dropped); d != 5 {
		t.Fatalf("dropped %v, want 5 (10 being written, 10 buffered)", d)
	}
	close(store.release)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a.close(ctx)
	if w, n := counterValue(a.written), auditRows(t, store.Store); w != 20 || n != 20 {
		t.Fatalf("written %v, stored %d; want 20", w, n)
	}
	if !strings.Contains(out.String(), "audit: entries dropped") || !strings.Contains(out.String(), "dropped=5") {
		t.Fatalf("the drops are not logged: %s", out.String())
	}
}

// TestAuditLogDatabaseDown: while PostgreSQL is away the entries wait
// (nothing lost); they are stored when it is back. At close, what cannot
// be stored is counted as dropped.
func TestAuditLogDatabaseDown(t *testing.T) {
	t.Parallel()
	store, px := metatest.NewStoreBehindProxy(t)
	var out syncBuffer
	opts := DefaultOptions()
	opts.AuditFlushInterval = 20 * time.Millisecond
	a := newAuditLog(store, opts, slog.New(slog.NewTextHandler(&out, nil)), prometheus.NewRegistry())
	px.Down()
	for i := range 3 {
		a.record(entryN(i))
	}
	testkit.Eventually(t, 10*time.Second, "a failed flush logged", func() bool { return strings.Contains(out.String(), "audit: store entries") })
	px.Up()
	testkit.Eventually(t, 10*time.Second, "3 entries written", func() bool { return counterValue(a.written) == 3 })
	if n := auditRows(t, store); n != 3 || counterValue(a.dropped) != 0 {
		t.Fatalf("%d stored, %v dropped; want 3 and 0", n, counterValue(a.dropped))
	}
	px.Down()
	a.record(entryN(3))
	a.record(entryN(4))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	a.close(ctx)
	if d := counterValue(a.dropped); d != 2 {
		t.Fatalf("dropped %v at close with the database away, want 2", d)
	}
	if !strings.Contains(out.String(), "dropped=2") {
		t.Fatalf("the drops at close are not logged: %s", out.String())
	}
}
