// Package meta is the metadata store: products, devices, roles, users and
// access tokens in PostgreSQL (through sqlx and lib/pq), and the translation
// of the platform's common query body into parameterised SQL.
//
// It must not import api, ingest or tsdb; callers declare the small
// interfaces they need.
package meta
