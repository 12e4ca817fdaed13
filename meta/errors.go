package meta

import "errors"

// Sentinel errors of the metadata store. The api package maps them to
// envelope codes in one place; nothing here knows about HTTP. Input errors
// are schema's (schema.Invalid, schema.ErrIllegalArgument), shared with api
// and tsdb.
var (
	// ErrNotFound is returned when a product, device, user or token does not exist.
	ErrNotFound = errors.New("not found")
	// ErrDuplicateKey is returned when an id is already taken.
	ErrDuplicateKey = errors.New("duplicate key")
	// ErrConflict is returned when a write names the version it was based
	// on (modifyTime) and the stored row has changed since: another write
	// came first, and applying this one would lose it.
	ErrConflict = errors.New("changed since modifyTime")
)
