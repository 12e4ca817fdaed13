// Package tsdb is the time-series store of devicehub: device messages and
// property values in ClickHouse, the batching Writer that ingest feeds, and
// the columnar queries behind the dashboard (message counts per bucket,
// property history) plus partition-based retention.
//
// It speaks the native protocol only and keeps to SQL that runs on
// ClickHouse 18.16 as on current releases (no CODEC, TTL, DateTime64,
// LowCardinality, toStartOfInterval or JSON functions; explicit column lists
// in every INSERT). The DDL lives in schema.ClickHouse.
//
// It must not import api, ingest or meta; callers declare the small
// interfaces they need (the Writer itself only needs an Inserter).
package tsdb
