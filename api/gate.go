package api

import (
	"context"
	"runtime"
	"time"
)

// gate is the admission of heavy requests: it bounds how many run at
// once, so that they leave CPU, memory and ClickHouse to the other
// endpoints; one waits a while for a slot, then is refused (503). The
// server has one for dashboard requests (endpoint 14) and one for
// exports.
type gate struct {
	slots chan struct{}
	wait  time.Duration
}

// newGate admits n requests at once (0: twice the cores), each waiting at
// most wait (0: 2 s) for its slot.
func newGate(n int, wait time.Duration) *gate {
	if n <= 0 {
		n = 2 * runtime.GOMAXPROCS(0)
	}
	if wait <= 0 {
		wait = defaultDashboardWait
	}
	return &gate{slots: make(chan struct{}, n), wait: wait}
}

// acquire takes a slot, waiting at most the gate's wait; false when none
// came free (or ctx ended) in that time.
func (g *gate) acquire(ctx context.Context) bool {
	select {
	case g.slots <- struct{}{}:
		return true
	default:
	}
	t := time.NewTimer(g.wait)
	defer t.Stop()
	select {
	case g.slots <- struct{}{}:
		return true
	case <-t.C:
	case <-ctx.Done():
	}
	return false
}

func (g *gate) release() { <-g.slots }
