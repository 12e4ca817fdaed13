package bench

import (
	"context"
	"sync"
	"sync/atomic"
)

// forEach calls f(ctx, i) for every i in [0, n), conc at a time (at most
// n goroutines, each taking the next i), until every i is done, ctx ends
// or f returns an error. The first error stops the others (the ctx they
// get is cancelled) and is returned; else ctx's error, if it ended.
func forEach(ctx context.Context, n, conc int, f func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(conc, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := f(ctx, i); err != nil {
					cancel(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	return context.Cause(ctx)
}
