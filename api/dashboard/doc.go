// Package dashboard answers endpoint 14 (POST /api/dashboard/_multi) and
// its exports (POST /api/dashboard/_export): the one home of a dashboard
// query from the request's bytes to the tsdb call and back to the
// answer's bytes. api's handlers (api/dashboard.go) check the body and
// call Service.Run or Service.PlanExport; this package does the rest:
//
//   - decode (decode.go): the _multi body without reflection where it can
//     tell that encoding/json decodes the same;
//   - plan (plan.go, time.go, alarms.go): the request's policy, the
//     parameters' names, defaults and bounds (limits.go) and the errors
//     naming them ([i].params.time), Java-style formats and date math
//     relative to Options.Clock, each query's buckets computed once
//     (tsdb.NewRange);
//   - resolve (dashboard.go, plan.go): the product or device each query
//     names, within the caller's products (Scope: api's cached lookups),
//     and its thing model;
//   - admit (gate.go): the one admission gate, a lane for endpoint 14's
//     requests and one for exports, refusing with a *BusyError;
//   - run (dashboard.go, export.go): one tsdb method per query kind
//     (Store), or the alarm counts of Deps.Alarms;
//   - encode (encode.go, export.go): the items of the answer, as
//     encoding/json would write them, and an export's CSV or JSON lines.
//
// Errors are typed, never HTTP: bad input is a *schema.ArgError naming the
// field, an object outside the caller's products meta.ErrNotFound, no
// slot a *BusyError; api's errors.go maps them to codes. tsdb takes typed
// arguments (tsdb.CountQuery, AggQuery, HistoryQuery, Range) and knows no
// request field name.
//
// It imports tsdb, meta (scope, device references, the cache type) and
// schema. It must not import fiber, fasthttp or net/http (api serves the
// HTTP, streams an export and ends it with its token), api, or anything
// under ingest (the alarm store is reached through AlarmCounter, which api
// adapts); TestImports holds it to that.
package dashboard
