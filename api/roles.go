package api

import (
	"context"

	"github.com/gofiber/fiber/v2"

	"devicehub/meta"
)

// RoleStore is what the role endpoints need.
type RoleStore interface {
	QueryRoles(ctx context.Context, q *meta.Query) (meta.Page[meta.Role], error)
	AddRole(ctx context.Context, in meta.RoleInput, creatorID, state string) (meta.Role, error)
	UpdateRole(ctx context.Context, id string, in meta.RoleInput) (meta.Role, error)
	DeleteRole(ctx context.Context, id string) (meta.Role, error)
}

// queryRoles is endpoint 13: POST /api/role/_query/: roles with the
// permissions they grant and their products (null: every product).
func (s *Server) queryRoles(c *fiber.Ctx) error {
	q, err := queryBody(c)
	if err != nil {
		return err
	}
	page, err := s.deps.Roles.QueryRoles(c.UserContext(), q)
	if err != nil {
		return err
	}
	return okPage(c, &page, appendRole)
}

// createRole is POST /api/role: {id?, name, description?, permissions,
// products?}; products null or absent grants the permissions on every
// product. An unknown permission or product is 400 naming the field.
func (s *Server) createRole(c *fiber.Ctx) error {
	var in meta.RoleInput
	if err := decodeJSON(c, &in); err != nil {
		return err
	}
	r, err := s.deps.Roles.AddRole(c.UserContext(), in, currentUser(c).ID, "")
	if err != nil {
		return err
	}
	return okItem(c, &r, appendRole)
}

// updateRole is PUT /api/role/{id}: {name?, description?, permissions?,
// products?}; absent fields stay, products null is every product. Its
// users' permissions are read again on every instance (their live
// streams end). The built-in role admin cannot be changed (400).
func (s *Server) updateRole(c *fiber.Ctx) error {
	var in meta.RoleInput
	if err := decodeJSON(c, &in); err != nil {
		return err
	}
	r, err := s.deps.Roles.UpdateRole(c.UserContext(), c.Params("id"), in)
	if err != nil {
		return err
	}
	return okItem(c, &r, appendRole)
}

// deleteRole is DELETE /api/role/{id}: a role held by users is not
// deleted (400 illegal_argument: take it from them first), nor the
// built-in admin.
func (s *Server) deleteRole(c *fiber.Ctx) error {
	r, err := s.deps.Roles.DeleteRole(c.UserContext(), c.Params("id"))
	if err != nil {
		return err
	}
	return okItem(c, &r, appendRole)
}
