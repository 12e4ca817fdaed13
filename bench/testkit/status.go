package testkit

import (
	"errors"
	"fmt"
)

// StatusError is an answer other than 200 to Try.
type StatusError struct {
	Method, Path string
	Response
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("%s %s: %d %.2000s", e.Method, e.Path, e.HTTPStatus, e.Raw)
}

// StatusOf is the HTTP status of err's answer, or 0 if err is not one.
func StatusOf(err error) int {
	var se *StatusError
	if errors.As(err, &se) {
		return se.HTTPStatus
	}
	return 0
}
