package api

import (
	"context"
	"errors"

	"github.com/gofiber/fiber/v2"

	"devicehub/ingest/forward"
)

// Forwarding rules (ingest/forward) under /api/notify/forward, needing
// notify:admin: a product's telemetry to a webhook or another broker. A
// caller limited to products sees, creates, changes and deletes only the
// rules of its products (notifyScope). Each rule carries its status
// (lag, pending, spooled bytes, dropped, sent, failed) as the forwarder's
// owner last wrote it. Every write is audited (the /api group's audited).

// ForwardStore is what the forwarding routes need; *forward.Store is one.
type ForwardStore interface {
	Rule(ctx context.Context, id string, products []string) (forward.Rule, error)
	Rules(ctx context.Context, products []string) ([]forward.Rule, error)
	SaveRule(ctx context.Context, r forward.Rule, by string, create bool, products []string) (forward.Rule, error)
	SetEnabled(ctx context.Context, id string, enabled bool, by string, products []string) (forward.Rule, error)
	DeleteRule(ctx context.Context, id string, products []string) error
}

var errNoForward = errors.New("api: forwarding is not configured")

func (s *Server) forwardStore() (ForwardStore, error) {
	if s.deps.Forward == nil {
		return nil, errNoForward
	}
	return s.deps.Forward, nil
}

// createForward is POST /api/notify/forward.
func (s *Server) createForward(c *fiber.Ctx) error { return s.saveForward(c, true) }

// updateForward is PUT /api/notify/forward/{id}: the whole rule; an empty
// secret keeps the stored one.
func (s *Server) updateForward(c *fiber.Ctx) error { return s.saveForward(c, false) }

func (s *Server) saveForward(c *fiber.Ctx, create bool) error {
	store, err := s.forwardStore()
	if err != nil {
		return err
	}
	r := forward.Rule{Enabled: true} // absent: enabled
	if err := decodeJSON(c, &r); err != nil {
		return err
	}
	if !create {
		r.ID = c.Params("id")
	}
	r.Status = nil
	saved, err := store.SaveRule(c.UserContext(), r, currentUser(c).ID, create, notifyScope(c))
	if err != nil {
		return err
	}
	return ok(c, saved.Public())
}

// getForward is GET /api/notify/forward/{id}: the rule and its status.
func (s *Server) getForward(c *fiber.Ctx) error {
	store, err := s.forwardStore()
	if err != nil {
		return err
	}
	r, err := store.Rule(c.UserContext(), c.Params("id"), notifyScope(c))
	if err != nil {
		return err
	}
	return ok(c, r.Public())
}

// queryForwards is POST /api/notify/forward/_query: the rules of the
// caller's products, by name, each with its status.
func (s *Server) queryForwards(c *fiber.Ctx) error {
	store, err := s.forwardStore()
	if err != nil {
		return err
	}
	rs, err := store.Rules(c.UserContext(), notifyScope(c))
	if err != nil {
		return err
	}
	for i := range rs {
		rs[i] = rs[i].Public()
	}
	return ok(c, notifyList[forward.Rule]{Total: len(rs), Data: rs})
}

// enableForward is POST /api/notify/forward/{id}/_enable.
func (s *Server) enableForward(c *fiber.Ctx) error { return s.setForward(c, true) }

// disableForward is POST /api/notify/forward/{id}/_disable: no new
// messages are taken; what the spool holds waits for _enable.
func (s *Server) disableForward(c *fiber.Ctx) error { return s.setForward(c, false) }

func (s *Server) setForward(c *fiber.Ctx, enabled bool) error {
	store, err := s.forwardStore()
	if err != nil {
		return err
	}
	r, err := store.SetEnabled(c.UserContext(), c.Params("id"), enabled, currentUser(c).ID, notifyScope(c))
	if err != nil {
		return err
	}
	return ok(c, r.Public())
}

// deleteForward is DELETE /api/notify/forward/{id}; the owner removes its
// spool.
func (s *Server) deleteForward(c *fiber.Ctx) error {
	store, err := s.forwardStore()
	if err != nil {
		return err
	}
	if err := store.DeleteRule(c.UserContext(), c.Params("id"), notifyScope(c)); err != nil {
		return err
	}
	return ok(c, c.Params("id"))
}
