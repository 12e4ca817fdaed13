// Package api serves the platform's REST API with Fiber: the response
// envelope, the mapping of errors to codes (errors.go, the one place), token
// authentication, and thin handlers that call the stores through the small
// interfaces declared here. Every route is listed in routes.go.
//
// The stores return rows; api writes every response body. The rule: each
// meta row a response holds (pages, products, devices and device details,
// roles, users, keys, audit entries, bulk results, meta.Enum as {text,
// value}, meta.Permission likewise, meta.Millis as epoch milliseconds) is
// written by its encoder in json.go, which alone defines its JSON: the row
// type has no json tags and no MarshalJSON (TestEncoders, TestRowEncoders
// hold each encoder to the bytes encoding/json wrote from the tags). The
// json tags left in meta are those of request bodies, and of the JSON meta
// stores in its own columns. A page of meta's page cache is shared by the
// requests that read it: okPage writes its JSON once and keeps it with the
// page (meta.Page.Memo, which holds it without knowing what it is).
//
// Endpoint 14 and exports are api/dashboard's (decode, plan, resolve,
// admission, run, encode): their handlers (dashboard.go) check the body,
// hand in the caller's scope, and serve and stream what it answers; its
// typed errors are mapped to codes here (errors.go).
//
// It imports meta, tsdb, ingest/link (commands) and schema for their
// types; none of them imports api. It does not import the ingest pipeline.
package api
