package api

import (
	"context"

	"github.com/gofiber/fiber/v2"

	"devicehub/meta"
)

// RoleStore is what the role endpoint needs.
type RoleStore interface {
	QueryRoles(ctx context.Context, q *meta.Query) (meta.Page[meta.Role], error)
}

// queryRoles is endpoint 13: POST /api/role/_query/.
func (s *Server) queryRoles(c *fiber.Ctx) error {
	q, err := queryBody(c)
	if err != nil {
		return err
	}
	page, err := s.deps.Roles.QueryRoles(c.UserContext(), q)
	if err != nil {
		return err
	}
	return ok(c, page)
}
