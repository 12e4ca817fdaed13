// Package backoff is the one retry schedule of devicehub: a delay that
// starts at Min, doubles with each failed attempt up to Max, optionally
// jittered, and starts over once an attempt succeeds. Every loop that
// retries a failing store or broker (the ingest pipeline's device lookup,
// state writer and parking, the shadow's answers) waits with it. Every is
// the fixed-period schedule of the loops that poll or refresh (the device
// cache, the command expiry, the advisory lock's ping, the bench's
// samplers): the ticker, its stop and its select written once.
//
// It lives below schema, the floor every package of the project may
// import (tsdb's writer as well as ingest), and imports nothing of the
// project. It holds no state beyond one loop's attempt count and acts on
// nothing: whether a retried operation is lost or doubled is its caller's
// argument.
package backoff
