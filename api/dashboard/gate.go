package dashboard

import (
	"context"
	"fmt"
	"runtime"
	"time"
)

// The one admission of this package's requests: it bounds how many run
// at once, so that they leave CPU, memory and ClickHouse to the other
// endpoints; one more waits a while for a slot, then is refused with a
// *BusyError (api answers 503 too_many_requests with Retry-After). Its
// two lanes keep their own slots: endpoint 14's requests take theirs for
// the time of a request (Options.Concurrency), an export for up to an
// hour (maxExports), so that exports never hold the dashboards' slots.

const (
	defaultWait = 2 * time.Second
	retryAfterS = 1 // Retry-After, seconds, of a refused request
	// maxExports bounds the exports running at once in the process; one
	// more waits up to exportWait for a slot, then is refused. An export
	// takes a core's worth of formatting while it runs (a few seconds per
	// million values), so two cores serve a few at a time.
	maxExports = 4
	exportWait = 2 * time.Second
)

// BusyError refuses a request that found no slot in time.
type BusyError struct {
	What       string // "dashboard requests" or "exports"
	RetryAfter int    // seconds
}

func (e *BusyError) Error() string {
	return fmt.Sprintf("too many %s in progress; retry later", e.What)
}

// gate is the admission: a lane for endpoint 14's requests, one for
// exports.
type gate struct {
	queries, exports lane
}

// lane is a bounded set of slots and how long one waits for one.
type lane struct {
	what  string
	slots chan struct{}
	wait  time.Duration
}

// newGate admits n dashboard requests at once (0: twice the cores), each
// waiting at most wait (0: 2 s) for its slot, and maxExports exports.
func newGate(n int, wait time.Duration) *gate {
	if n <= 0 {
		n = 2 * runtime.GOMAXPROCS(0)
	}
	if wait <= 0 {
		wait = defaultWait
	}
	return &gate{
		queries: lane{what: "dashboard requests", slots: make(chan struct{}, n), wait: wait},
		exports: lane{what: "exports", slots: make(chan struct{}, maxExports), wait: exportWait},
	}
}

// admit takes a slot of l, waiting at most its wait; a *BusyError when
// none came free (or ctx ended) in that time.
func (g *gate) admit(ctx context.Context, l *lane) error {
	select {
	case l.slots <- struct{}{}:
		return nil
	default:
	}
	t := time.NewTimer(l.wait)
	defer t.Stop()
	select {
	case l.slots <- struct{}{}:
		return nil
	case <-t.C:
	case <-ctx.Done():
	}
	return &BusyError{What: l.what, RetryAfter: retryAfterS}
}

func (g *gate) release(l *lane) { <-l.slots }
