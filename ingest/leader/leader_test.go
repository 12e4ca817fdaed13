package leader_test

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"devicehub/bench/testkit"
	"devicehub/ingest/leader"
	"devicehub/meta/metatest"
)

func TestMain(m *testing.M) { testkit.MainNoLeaks(m) }

type gauge struct{ v atomic.Int64 }

func (g *gauge) Set(v float64) { g.v.Store(int64(v)) }

// instance is one Loop of the role and its turns.
type instance struct {
	name  string
	owner atomic.Bool
	gauge gauge
	fail  chan struct{} // ends the current turn with an error
	done  chan struct{} // Run returned
}

// TestLoop: two instances of a role on the real PostgreSQL lock. One
// leads at a time (the other's Owner false meanwhile); a turn that fails
// is logged, releases the lock and the other instance leads; a lost lock
// (the database cut) ends the turn, the lock is waited for (logged) and
// retried every Retry until the database is back; the context's end stops
// both, owners and gauges back to 0.
func TestLoop(t *testing.T) {
	ms, px := metatest.NewStoreBehindProxy(t)
	var logs testkit.LogBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	key := rand.Int64N(1 << 31)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	started := make(chan *instance, 8)
	var overlap atomic.Bool
	insts := []*instance{{name: "a"}, {name: "b"}}
	for i, in := range insts {
		in.fail, in.done = make(chan struct{}), make(chan struct{})
		other := insts[1-i]
		l := leader.Loop{Locker: ms, Key: key, Retry: 100 * time.Millisecond, Log: log.With("instance", in.name),
			Waiting: "role: waiting for the lock", SteppedDown: "role: stepped down", Owner: &in.owner, Gauge: &in.gauge}
		go func() {
			defer close(in.done)
			l.Run(ctx, func(ctx context.Context, lost <-chan struct{}) error {
				if !in.owner.Load() || in.gauge.v.Load() != 1 {
					t.Errorf("%s leads, not marked the owner", in.name)
				}
				if other.owner.Load() {
					overlap.Store(true)
				}
				started <- in
				select {
				case <-ctx.Done():
					return nil
				case <-lost:
					return errors.New("lock lost")
				case <-in.fail:
					return errors.New("turn failed")
				}
			})
		}()
	}
	next := func(what string) *instance {
		t.Helper()
		select {
		case in := <-started:
			return in
		case <-time.After(20 * time.Second):
			t.Fatalf("no turn: %s", what)
			return nil
		}
	}

	first := next("the first")
	first.fail <- struct{}{}
	second := next("after a failed turn")
	if second == first {
		t.Fatal("the instance that failed led again while the other waited for the lock")
	}
	if first.owner.Load() || first.gauge.v.Load() != 0 {
		t.Error("an instance that stepped down is still marked the owner")
	}
	if n := logs.Count("role: stepped down"); n != 1 {
		t.Errorf("stepped down logged %d times, want 1", n)
	}

	px.Down() // the lock's session is cut, and no new one can be opened
	testkit.Eventually(t, 20*time.Second, "the lost lock's turn ended and the lock retried", func() bool {
		return logs.Count("role: stepped down") == 2 && logs.Count("role: waiting for the lock") >= 2
	})
	if second.owner.Load() || first.owner.Load() {
		t.Error("an owner without the lock")
	}
	px.Up()
	next("the database back")

	cancel()
	for _, in := range insts {
		select {
		case <-in.done:
		case <-time.After(20 * time.Second):
			t.Fatalf("%s's Run did not return", in.name)
		}
		if in.owner.Load() || in.gauge.v.Load() != 0 {
			t.Errorf("%s is marked the owner after Run", in.name)
		}
	}
	if overlap.Load() {
		t.Error("two instances led at once")
	}
}

// TestSessionID: every owner of a role gets the same id, built from the
// installation's; while the database is away it is retried (logged), and
// a context's end gives "".
func TestSessionID(t *testing.T) {
	ms, px := metatest.NewStoreBehindProxy(t)
	var logs testkit.LogBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	ctx := context.Background()
	inst, err := ms.InstallationID(ctx)
	if err != nil {
		t.Fatal(err)
	}
	px.Down()
	got := make(chan string, 1)
	go func() { got <- leader.SessionID(ctx, ms, "role", 50*time.Millisecond, log) }()
	testkit.Eventually(t, 20*time.Second, "the failed read logged", func() bool {
		return logs.Count("role: reading the installation id failed; retrying") >= 2
	})
	px.Up()
	select {
	case id := <-got:
		if want := "devicehub-role-" + inst; id != want {
			t.Fatalf("SessionID %q, want %q", id, want)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("SessionID did not return once the database was back")
	}
	if again := leader.SessionID(ctx, ms, "role", time.Second, log); again != "devicehub-role-"+inst {
		t.Fatalf("a second owner's SessionID %q", again)
	}
	done, cancel := context.WithCancel(ctx)
	cancel()
	if id := leader.SessionID(done, ms, "role", time.Second, log); id != "" {
		t.Fatalf("SessionID with an ended context %q", id)
	}
}
