package meta

import (
	"errors"
	"fmt"
)

// Sentinel errors of the metadata store. The api package maps them to
// envelope codes in one place; nothing here knows about HTTP.
var (
	// ErrNotFound is returned when a product, device, user or token does not exist.
	ErrNotFound = errors.New("not found")
	// ErrDuplicateKey is returned when an id is already taken.
	ErrDuplicateKey = errors.New("duplicate key")
	// ErrConflict is returned when a write names the version it was based
	// on (modifyTime) and the stored row has changed since: another write
	// came first, and applying this one would lose it.
	ErrConflict = errors.New("changed since modifyTime")
	// ErrIllegalArgument is the root of every input error; see ArgError.
	ErrIllegalArgument = errors.New("illegal argument")
)

// ArgError is an input error that names the offending field, so that a
// client can tell which part of its request to fix.
type ArgError struct {
	Field string // e.g. "terms[0].column", "name"
	Msg   string // e.g. "unknown column \"foo\""
}

func (e *ArgError) Error() string {
	if e.Field == "" {
		return e.Msg
	}
	return e.Field + ": " + e.Msg
}

// Unwrap makes errors.Is(err, ErrIllegalArgument) true for every ArgError.
func (e *ArgError) Unwrap() error { return ErrIllegalArgument }

// Invalid returns an *ArgError for field with a formatted message.
func Invalid(field, format string, args ...any) error {
	return &ArgError{Field: field, Msg: fmt.Sprintf(format, args...)}
}
