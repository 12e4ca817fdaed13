// Package api serves the platform's REST API with Fiber: the response
// envelope, the mapping of errors to codes (errors.go, the one place), token
// authentication, and thin handlers that call the stores through the small
// interfaces declared here. Every route is listed in routes.go.
//
// It imports meta, tsdb, ingest/link (commands) and schema for their
// types; none of them imports api. It does not import the ingest pipeline.
package api
