package api

import (
	"context"
	"strconv"
	"unicode/utf8"

	"github.com/gofiber/fiber/v2"

	"devicehub/meta"
	"devicehub/schema"
)

// DeviceStore is what the device endpoints need.
type DeviceStore interface {
	QueryDevices(ctx context.Context, q *meta.Query) (meta.Page[meta.Device], error)
	QueryDevicesWithModels(ctx context.Context, q *meta.Query) (meta.Page[meta.Device], error)
	GetDeviceDetail(ctx context.Context, id string) (meta.DeviceDetail, error)
	CreateDevice(ctx context.Context, n meta.NewDevice, creator meta.User) (meta.DeviceDetail, error)
	UpdateDevice(ctx context.Context, id string, p meta.DevicePatch, modifier meta.User) (meta.DeviceDetail, error)
	DeleteDevice(ctx context.Context, id string) (meta.DeviceDetail, error)
	DeployDevice(ctx context.Context, id string, modifier meta.User) (meta.DeviceDetail, error)
	UndeployDevice(ctx context.Context, id string, modifier meta.User) (meta.DeviceDetail, error)
	RotateDeviceSecret(ctx context.Context, id string, modifier meta.User) (meta.DeviceDetail, error)
	SetDeviceMetadata(ctx context.Context, id, metadata string, modifier meta.User) error
	ResetDeviceMetadata(ctx context.Context, id string, modifier meta.User) error
}

// queryDevices is endpoint 7: POST /api/device-instance/_query/
// [?deviceMetadata=true]. Its rows carry a device's own thing model
// (deviceMetadata, optional in the spec's row) only when asked for: a
// model may be 256 KiB, a page 10,000 rows (REFERENCE.md "Thing models").
func (s *Server) queryDevices(c *fiber.Ctx) error {
	models := false
	if v := c.Query("deviceMetadata"); v != "" {
		var err error
		if models, err = strconv.ParseBool(v); err != nil {
			return schema.Invalid("deviceMetadata", "must be true or false (got %q)", safeText(v))
		}
	}
	q, err := queryBody(c)
	if err != nil {
		return err
	}
	list := s.deps.Devices.QueryDevices
	if models {
		list = s.deps.Devices.QueryDevicesWithModels
	}
	page, err := list(c.UserContext(), q)
	if err != nil {
		return err
	}
	return okPage(c, &page, appendDevice)
}

// getDevice is endpoint 8: GET /api/device/instance/{id}/detail (and the
// same without /detail).
func (s *Server) getDevice(c *fiber.Ctx) error {
	d, err := s.deps.Devices.GetDeviceDetail(c.UserContext(), c.Params("id"))
	if err != nil {
		return err
	}
	return okItem(c, &d, appendDeviceDetail)
}

// setDeviceMetadata is endpoint 9: PUT /api/device/instance/{id}/metadata.
// The body is the thing model object itself; the store validates it and
// keeps it normalised as the device's own model.
func (s *Server) setDeviceMetadata(c *fiber.Ctx) error {
	body := c.Body()
	if len(body) == 0 {
		return schema.Invalid("body", "a JSON body (the thing model) is required")
	}
	if !utf8.Valid(body) {
		return schema.Invalid("body", "must be UTF-8")
	}
	if err := s.deps.Devices.SetDeviceMetadata(c.UserContext(), c.Params("id"), string(body), currentUser(c)); err != nil {
		return err
	}
	return ok(c, nil)
}

// resetDeviceMetadata is DELETE /api/device/instance/{id}/metadata: the
// product's thing model is in force again.
func (s *Server) resetDeviceMetadata(c *fiber.Ctx) error {
	if err := s.deps.Devices.ResetDeviceMetadata(c.UserContext(), c.Params("id"), currentUser(c)); err != nil {
		return err
	}
	return ok(c, nil)
}

// createDevice is POST /api/device/instance.
func (s *Server) createDevice(c *fiber.Ctx) error {
	var n meta.NewDevice
	if err := decodeJSON(c, &n); err != nil {
		return err
	}
	secret := currentUser(c).CanProduct(permDeviceSecret, n.ProductID)
	if n.Configuration != nil && n.Configuration.SecureKey != nil && !secret {
		return accessDenied(c, permDeviceSecret) // choosing a device's key is knowing it
	}
	d, err := s.deps.Devices.CreateDevice(c.UserContext(), n, currentUser(c))
	if err != nil {
		return err
	}
	if !secret {
		d.Configuration.SecureKey = meta.MaskSecret(d.Configuration.SecureKey) // the generated key: device:secret only
	}
	return okItem(c, &d, appendDeviceDetail)
}

// updateDevice is PUT /api/device/instance/{id}.
func (s *Server) updateDevice(c *fiber.Ctx) error {
	var p meta.DevicePatch
	if err := decodeJSON(c, &p); err != nil {
		return err
	}
	if p.Configuration != nil && p.Configuration.SecureKey != nil {
		if held, err := s.holdsOnDevice(c, permDeviceSecret); err != nil {
			return err
		} else if !held {
			return accessDenied(c, permDeviceSecret) // choosing a device's key is knowing it
		}
	}
	d, err := s.deps.Devices.UpdateDevice(c.UserContext(), c.Params("id"), p, currentUser(c))
	if err != nil {
		return err
	}
	if err := s.awaitLogins(c.UserContext(), d.Login); err != nil {
		return err
	}
	return okItem(c, &d, appendDeviceDetail)
}

// deleteDevice is DELETE /api/device/instance/{id}; only an undeployed
// device may be deleted.
func (s *Server) deleteDevice(c *fiber.Ctx) error {
	d, err := s.deps.Devices.DeleteDevice(c.UserContext(), c.Params("id"))
	if err != nil {
		return err
	}
	return okItem(c, &d, appendDeviceDetail)
}

// deployDevice is POST /api/device/instance/{id}/deploy.
func (s *Server) deployDevice(c *fiber.Ctx) error {
	d, err := s.deps.Devices.DeployDevice(c.UserContext(), c.Params("id"), currentUser(c))
	if err != nil {
		return err
	}
	if err := s.awaitLogins(c.UserContext(), d.Login); err != nil {
		return err
	}
	return okItem(c, &d, appendDeviceDetail)
}

// undeployDevice is POST /api/device/instance/{id}/undeploy.
func (s *Server) undeployDevice(c *fiber.Ctx) error {
	d, err := s.deps.Devices.UndeployDevice(c.UserContext(), c.Params("id"), currentUser(c))
	if err != nil {
		return err
	}
	if err := s.awaitLogins(c.UserContext(), d.Login); err != nil {
		return err
	}
	return okItem(c, &d, appendDeviceDetail)
}

// rotateDeviceSecret is POST /api/device/instance/{id}/secret: a new
// random secureKey, shown in this response only (like the one given at
// creation). The broker drops the device's sessions that used the old key.
func (s *Server) rotateDeviceSecret(c *fiber.Ctx) error {
	d, err := s.deps.Devices.RotateDeviceSecret(c.UserContext(), c.Params("id"), currentUser(c))
	if err != nil {
		return err
	}
	if err := s.awaitLogins(c.UserContext(), d.Login); err != nil {
		return err
	}
	return okItem(c, &d, appendDeviceDetail)
}

// holdsOnDevice reports whether the caller holds p on the product of
// the device of the path's :id (found within the products of the route's
// own permission: else not_found).
func (s *Server) holdsOnDevice(c *fiber.Ctx, p meta.Permission) (bool, error) {
	u := currentUser(c)
	if all, _ := u.Scope(p); all || !u.Can(p) {
		return all, nil
	}
	dev, err := s.deviceRef(c.UserContext(), c.Params("id"))
	if err != nil {
		return false, err
	}
	return u.CanProduct(p, dev.ProductID), nil
}
