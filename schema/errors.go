package schema

import (
	"errors"
	"fmt"
)

// ErrIllegalArgument is the root of every input error: what a client sent
// (a query body, a field, a date expression, a thing model) cannot be
// used. It has this one home so that api, meta and tsdb raise the same
// error, and api/errors.go answers every one of them 400
// illegal_argument in one place.
var ErrIllegalArgument = errors.New("illegal argument")

// ArgError is an input error that names the offending field, so that a
// client can tell which part of its request to fix.
type ArgError struct {
	Field string // e.g. "terms[0].column", "[0].params.time"
	Msg   string // e.g. "unknown column \"foo\""
	// Allowed, where the field takes one of a set (a column, a sort),
	// is the whole set: the answer carries it whole in its result, where
	// the message may be cut.
	Allowed []string
}

func (e *ArgError) Error() string {
	if e.Field == "" {
		return e.Msg
	}
	return e.Field + ": " + e.Msg
}

// Unwrap makes errors.Is(err, ErrIllegalArgument) true for every ArgError.
func (e *ArgError) Unwrap() error { return ErrIllegalArgument }

// InvalidChoice returns an *ArgError for field, which takes one of
// allowed, with a formatted message.
func InvalidChoice(field string, allowed []string, format string, args ...any) error {
	return &ArgError{Field: field, Msg: fmt.Sprintf(format, args...), Allowed: allowed}
}

// Invalid returns an *ArgError for field with a formatted message.
func Invalid(field, format string, args ...any) error {
	return &ArgError{Field: field, Msg: fmt.Sprintf(format, args...)}
}

// Truncate cuts s, a client's value quoted in an error message, to n
// bytes followed by "...", so that a long id or name does not make the
// message long; a shorter s is returned whole.
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
