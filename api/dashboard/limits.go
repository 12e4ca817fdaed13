package dashboard

import (
	"sync/atomic"

	"devicehub/schema"
)

// Limits of one dashboard request (endpoint 14). Each is far above what a
// dashboard draws, and together they bound the work, memory and response
// size of a request; REFERENCE.md's Dashboard section lists them.
// The bounds of one query's properties are in plan.go (maxAggProperties,
// maxHistoryProperties: 100), of its buckets tsdb.MaxBuckets (10,000, per
// property); the admission of requests is the gate's (gate.go).
const (
	maxDashboardQueries = 32       // queries in one request
	maxHistory          = 1000     // params.history: values per property
	maxHistoryValues    = 100_000  // sum over history queries of properties x history
	maxRequestBuckets   = 50_000   // buckets of all bucketed queries together, properties x buckets
	maxDashboardResult  = 32 << 20 // bytes of the encoded items of one response
)

// budget counts what the queries of one request will return, in
// request order, and refuses the query that passes a per-request limit.
type budget struct {
	historyValues int
	buckets       int
}

func (b *budget) addHistory(at string, properties, n int) error {
	b.historyValues += properties * n
	if b.historyValues > maxHistoryValues {
		return schema.Invalid(at+".params", "%d properties x %d values brings the request to %d history values; at most %d history values per request",
			properties, n, b.historyValues, maxHistoryValues)
	}
	return nil
}

func (b *budget) addBuckets(at string, n int) error {
	b.buckets += n
	if b.buckets > maxRequestBuckets {
		return schema.Invalid(at+".params", "%d buckets bring the request to %d; at most %d buckets per request",
			n, b.buckets, maxRequestBuckets)
	}
	return nil
}

// resultBytes counts the encoded size of a response's items across the
// queries that build them concurrently.
type resultBytes struct{ n atomic.Int64 }

func (r *resultBytes) add(n int) error {
	if r.n.Add(int64(n)) > maxDashboardResult {
		return schema.Invalid("result", "at most %d MiB of items per response: ask for fewer values or buckets",
			maxDashboardResult>>20)
	}
	return nil
}
