// Package schema holds the versioned DDL of both databases, embedded in the
// binary, and the thing-model types with their validation.
//
// PostgreSQL migrations (postgres/NNNNN_*.sql) are goose migrations applied
// by meta.Migrate; ClickHouse DDL (clickhouse/NNNNN_*.sql) is applied in
// order, idempotently, by tsdb. It imports nothing of the project but its
// own JSON writer (schema/jsonw).
package schema

import "embed"

// Postgres holds the goose migrations of the metadata database.
//
//go:embed postgres/*.sql
var Postgres embed.FS

// ClickHouse holds the DDL of the time-series database, one file per
// version, valid on ClickHouse 18.16 as on current releases. Every file
// runs at each start: a statement is idempotent (IF NOT EXISTS) or, where
// 18.16 has no such form (DROP COLUMN), preceded by a "--@if <query>" line
// whose count says whether it still has work to do.
//
// The files are written for one server; in cluster mode tsdb rewrites each
// statement for the cluster (tsdb/cluster.go), so a statement must be one
// of the forms it knows: CREATE TABLE IF NOT EXISTS with a *MergeTree
// engine (sharded by device_id when the table has that column), CREATE
// MATERIALIZED VIEW IF NOT EXISTS ... TO a table of these files, ALTER
// TABLE with a "--@if" condition, or DROP TABLE IF EXISTS.
//
//go:embed clickhouse/*.sql
var ClickHouse embed.FS
