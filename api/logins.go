package api

import (
	"context"
	"errors"
	"fmt"

	"devicehub/meta"
)

// LoginWaiter confirms that the broker holds device login changes
// (ingest/devauth implements it).
type LoginWaiter interface {
	// Await returns once the broker holds every change of changes, or a
	// later one of the same device, or ctx's error.
	Await(ctx context.Context, changes []meta.LoginChange) error
}

// errBrokerTimeout: a device write is stored, but the broker has not
// confirmed its login change within Options.LoginWait.
var errBrokerTimeout = errors.New("broker has not confirmed the login change")

// awaitLogins returns once the broker holds the login changes a device
// write made (zero changes are skipped), so that a device can connect the
// moment its deploy call returns and a rotated or undeployed device's
// session is cut before it does. Past Options.LoginWait it is
// errBrokerTimeout: the change is stored and the broker gets it when it
// answers.
func (s *Server) awaitLogins(ctx context.Context, changes ...meta.LoginChange) error {
	if s.deps.Logins == nil {
		return nil
	}
	pending := changes[:0:0]
	for _, c := range changes {
		if c.Version != 0 {
			pending = append(pending, c)
		}
	}
	if len(pending) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.opts.LoginWait)
	defer cancel()
	if err := s.deps.Logins.Await(ctx, pending); err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("%w within %s; it is stored and the broker applies it once it answers", errBrokerTimeout, s.opts.LoginWait)
		}
		return err
	}
	return nil
}
