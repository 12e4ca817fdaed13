package devauth

import (
	"context"
	"testing"
	"time"

	"devicehub/bench/testkit"
	"devicehub/meta"
)

func TestWaiters(t *testing.T) {
	lc := func(id string, v int64) meta.LoginChange { return meta.LoginChange{ID: id, Version: v} }
	// wait starts an await and returns its result channel.
	wait := func(w *waiters, ctx context.Context, changes ...meta.LoginChange) chan error {
		done := make(chan error, 1)
		go func() { done <- w.await(ctx, changes) }()
		return done
	}
	pending := func(w *waiters) int {
		w.mu.Lock()
		defer w.mu.Unlock()
		n := 0
		for _, ws := range w.byID {
			n += len(ws)
		}
		return n
	}
	// registered waits until n waiters are registered: await has
	// reached its select.
	registered := func(t *testing.T, w *waiters, n int) {
		t.Helper()
		if !testkit.Within(5*time.Second, func() bool { return pending(w) == n }) {
			t.Fatalf("%d waiters registered, want %d", pending(w), n)
		}
	}

	t.Run("released by the same or a later version only", func(t *testing.T) {
		w := newWaiters()
		done := wait(w, context.Background(), lc("a", 5), lc("b", 7))
		registered(t, w, 2)
		w.applied([]meta.LoginChange{lc("a", 4), lc("b", 9)}) // a's is older
		select {
		case err := <-done:
			t.Fatalf("released before a's version 5 was applied (%v)", err)
		default:
		}
		registered(t, w, 1)
		w.applied([]meta.LoginChange{lc("a", 5)})
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if n := pending(w); n != 0 {
			t.Fatalf("%d waiters left", n)
		}
	})

	t.Run("applied before the writer waits", func(t *testing.T) {
		w := newWaiters()
		w.applied([]meta.LoginChange{lc("a", 5)})
		if err := w.await(context.Background(), []meta.LoginChange{lc("a", 5)}); err != nil {
			t.Fatal(err)
		}
		if err := w.await(context.Background(), []meta.LoginChange{lc("a", 3)}); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("timeout leaves nothing behind", func(t *testing.T) {
		w := newWaiters()
		ctx, cancel := context.WithCancel(context.Background())
		done := wait(w, ctx, lc("a", 5), lc("b", 5))
		registered(t, w, 2)
		w.applied([]meta.LoginChange{lc("b", 5)})
		registered(t, w, 1)
		cancel()
		if err := <-done; err != context.Canceled {
			t.Fatalf("err %v, want context.Canceled", err)
		}
		if n := pending(w); n != 0 {
			t.Fatalf("%d waiters left", n)
		}
		w.applied([]meta.LoginChange{lc("a", 5)}) // no waiter: no panic
	})

	t.Run("two writers of one device", func(t *testing.T) {
		w := newWaiters()
		first, second := wait(w, context.Background(), lc("a", 5)), wait(w, context.Background(), lc("a", 6))
		registered(t, w, 2)
		w.applied([]meta.LoginChange{lc("a", 5)})
		if err := <-first; err != nil {
			t.Fatal(err)
		}
		registered(t, w, 1)
		w.applied([]meta.LoginChange{lc("a", 6)})
		if err := <-second; err != nil {
			t.Fatal(err)
		}
	})

	t.Run("recent versions are kept one to two spans", func(t *testing.T) {
		w := newWaiters()
		now := time.Now()
		w.now = func() time.Time { return now }
		w.since = now
		w.applied([]meta.LoginChange{lc("a", 5)})
		now = now.Add(recentSpan)
		w.applied([]meta.LoginChange{lc("b", 1)}) // rotates: a is older
		w.mu.Lock()
		kept := w.appliedAt("a")
		w.mu.Unlock()
		if kept != 5 {
			t.Fatalf("a's version %d after one span, want 5", kept)
		}
		now = now.Add(recentSpan)
		w.applied([]meta.LoginChange{lc("b", 2)}) // rotates again: a is gone
		w.mu.Lock()
		kept = w.appliedAt("a")
		w.mu.Unlock()
		if kept != 0 {
			t.Fatalf("a's version %d after two spans, want forgotten", kept)
		}
	})
}
