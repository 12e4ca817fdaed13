// Package tsdb is the time-series store of devicehub: device messages and
// property values in ClickHouse, the batching Writer that ingest feeds, and
// the columnar queries behind the dashboard (message counts and property
// aggregates per bucket, property history, latest or over a range, with
// the result cache of cache.go) plus partition-based retention. Bucket
// edges and date math, in the platform time zone, live here only
// (buckets.go, datemath.go). The queries take typed arguments (CountQuery,
// AggQuery with a Range from NewRange, HistoryQuery, ExportQuery); the
// request's policy, its parameters' names, defaults and bounds, is
// api/dashboard's, and no request field name appears here.
//
// It speaks the native protocol only and keeps to SQL that runs on
// ClickHouse 18.16 as on current releases (no TTL, DateTime64,
// toStartOfInterval or JSON functions; explicit column lists in every
// INSERT). Per-column codecs and LowCardinality appear only in
// device_property's layout, chosen in one place (layout.go) by the server
// version read at Open. The DDL lives in schema.ClickHouse; a layout
// change that needs the rows copied (schema 00006) is done by convert.go,
// resumable month by month, by one instance at a time under the caller's
// lock (Options.ConvertLock). Options.Cluster
// spreads the tables over a ClickHouse cluster, replicated and sharded by
// device behind Distributed tables (cluster.go).
//
// It must not import api, ingest or meta; callers declare the small
// interfaces they need (the Writer itself only needs an Inserter).
package tsdb
