// Package meta is the metadata store: products, devices, roles, users and
// access tokens in PostgreSQL (through sqlx and lib/pq), and the translation
// of the platform's common query body into parameterised SQL.
//
// Its methods take typed arguments and return typed rows (structs,
// Page[T]); api writes the responses' JSON. The common query body is
// decoded here (DecodeQuery, query.go) because it is input that the
// query engine defines: its columns, terms and paging are checked against
// the Resource whitelists beside the SQL they compile to, and every list
// reads it: one engine (List, list.go) runs them all, the store's
// (products, devices, roles, users, keys, audit) and the paged lists of
// other packages over their own tables (ingest/alarm, ingest/firmware,
// ingest/notify), each list's statement written whole in its entity's
// file. The rows have no json tags and no MarshalJSON (api/json.go writes
// each); the input types (NewDevice, ProductPatch...) carry the tags they
// are decoded with, and Enum and Permission decode from a request
// (UnmarshalJSON). A page of the page cache may keep what a caller makes
// of it (Page.Memo: api keeps its JSON), opaque to meta.
//
// It must not import api, ingest or tsdb; callers declare the small
// interfaces they need.
package meta
