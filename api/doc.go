// Package api serves the platform's REST API with Fiber: the response
// envelope, the mapping of errors to codes (errors.go, the one place), token
// authentication, and thin handlers that call the stores through the small
// interfaces declared here. Every route is listed in routes.go.
//
// The stores return rows; api writes every response body. The rule: a meta
// row with an encoder in json.go (pages, products, device list items,
// meta.Enum as {text, value}, meta.Millis as epoch milliseconds) is written
// by that encoder, which alone defines its JSON: the row type has no json
// tags. A row with no encoder here (device detail, roles, users, keys,
// audit entries, bulk results) is written by encoding/json from its json
// tags, meta.Enum and meta.Millis by their MarshalJSON, which write the
// bytes of appendEnum and appendMillis (TestEncoders). A page of meta's
// page cache keeps its JSON, made once by okPage (meta.Page.Kept).
//
// It imports meta, tsdb, ingest/link (commands) and schema for their
// types; none of them imports api. It does not import the ingest pipeline.
package api
