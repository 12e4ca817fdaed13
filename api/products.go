package api

import (
	"context"

	"github.com/gofiber/fiber/v2"

	"devicehub/meta"
)

// ProductStore is what the product endpoints need.
type ProductStore interface {
	QueryProducts(ctx context.Context, q *meta.Query) (meta.Page[meta.Product], error)
	CountProducts(ctx context.Context, q *meta.Query) (int, error)
	GetProduct(ctx context.Context, id string) (meta.Product, error)
	CreateProduct(ctx context.Context, n meta.NewProduct, creatorID string) (meta.Product, error)
	PatchProduct(ctx context.Context, p meta.ProductPatch, modifierID string) error
	SetProductState(ctx context.Context, id string, state int, modifierID string) error
	DeleteProduct(ctx context.Context, id string) (meta.Product, error)
}

// queryBody decodes the common query body; an empty body is the empty query.
func queryBody(c *fiber.Ctx) (*meta.Query, error) {
	return meta.DecodeQuery(c.Body())
}

// queryProducts is endpoint 1: POST /api/device-product/_query/.
func (s *Server) queryProducts(c *fiber.Ctx) error {
	q, err := queryBody(c)
	if err != nil {
		return err
	}
	page, err := s.deps.Products.QueryProducts(c.UserContext(), q)
	if err != nil {
		return err
	}
	return okPage(c, &page, appendProduct)
}

// getProduct is endpoint 2: GET /api/device-product/{id}.
func (s *Server) getProduct(c *fiber.Ctx) error {
	p, err := s.deps.Products.GetProduct(c.UserContext(), c.Params("id"))
	if err != nil {
		return err
	}
	return okItem(c, &p, appendProduct)
}

// createProduct is endpoint 3: POST /api/device/product.
func (s *Server) createProduct(c *fiber.Ctx) error {
	// A new product is outside every product list: creating one needs
	// product:write on every product.
	if all, _ := currentUser(c).Scope(permProductWrite); !all {
		return accessDeniedError("access denied: creating a product needs permission " +
			string(permProductWrite) + " on every product")
	}
	var n meta.NewProduct
	if err := decodeJSON(c, &n); err != nil {
		return err
	}
	p, err := s.deps.Products.CreateProduct(c.UserContext(), n, currentUser(c).ID)
	if err != nil {
		return err
	}
	return okItem(c, &p, appendProduct)
}

// patchProduct is endpoint 4: PATCH /api/device-product.
func (s *Server) patchProduct(c *fiber.Ctx) error {
	var p meta.ProductPatch
	if err := decodeJSON(c, &p); err != nil {
		return err
	}
	if err := s.deps.Products.PatchProduct(c.UserContext(), p, currentUser(c).ID); err != nil {
		return err
	}
	return ok(c, nil)
}

// deleteProduct is endpoint 5: DELETE /api/device-product/{id}.
func (s *Server) deleteProduct(c *fiber.Ctx) error {
	p, err := s.deps.Products.DeleteProduct(c.UserContext(), c.Params("id"))
	if err != nil {
		return err
	}
	return okItem(c, &p, appendProduct)
}

// countProducts is endpoint 6: POST /api/device-product/_count.
func (s *Server) countProducts(c *fiber.Ctx) error {
	q, err := queryBody(c)
	if err != nil {
		return err
	}
	n, err := s.deps.Products.CountProducts(c.UserContext(), q)
	if err != nil {
		return err
	}
	return ok(c, n)
}

// deployProduct is POST /api/device-product/{id}/deploy (state 1).
func (s *Server) deployProduct(c *fiber.Ctx) error { return s.setProductState(c, 1) }

// undeployProduct is POST /api/device-product/{id}/undeploy (state 0).
func (s *Server) undeployProduct(c *fiber.Ctx) error { return s.setProductState(c, 0) }

func (s *Server) setProductState(c *fiber.Ctx, state int) error {
	if err := s.deps.Products.SetProductState(c.UserContext(), c.Params("id"), state, currentUser(c).ID); err != nil {
		return err
	}
	return ok(c, true)
}
