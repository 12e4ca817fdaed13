package api

import (
	"context"
	"fmt"
	"time"

	"devicehub/meta"
	"devicehub/schema"
)

// Product scope (meta/scope.go). need(p) puts the products the caller
// holds p on onto the request's context (meta.LimitProducts); the store's
// lists, counts, details and writes see only those, and so do the device
// and product lookups of commands, endpoint 14, exports (deviceRef,
// productModel, handed to api/dashboard as its Scope) and the live stream: an object outside them is 404
// not_found, as if it did not exist. A missing permission is 403.

// productVisible is nil when ctx may reach product id, else the not_found
// an unknown product gets.
func productVisible(ctx context.Context, id string) error {
	if meta.ProductAllowed(ctx, id) {
		return nil
	}
	return fmt.Errorf("product %q: %w", schema.Truncate(id, 80), meta.ErrNotFound)
}

// deviceVisible is nil when ctx may reach dev, else the not_found an
// unknown device gets.
func deviceVisible(ctx context.Context, dev meta.DeviceRef) error {
	if meta.ProductAllowed(ctx, dev.ProductID) {
		return nil
	}
	return fmt.Errorf("device %q: %w", schema.Truncate(dev.ID, 80), meta.ErrNotFound)
}

// productModel looks up a product's thing model through the server's
// short-lived cache (cleared by every product or device change through
// this instance, at most DeviceCacheTTL old), as deviceRef does devices.
func (s *Server) productModel(ctx context.Context, id string) (string, error) {
	if err := productVisible(ctx, id); err != nil { // the cache is shared by every caller
		return "", err
	}
	return s.models.get(ctx, id, func(ctx context.Context, id string) (string, time.Time, error) {
		p, err := s.deps.Products.GetProduct(ctx, id)
		return p.Metadata, time.Time{}, err
	})
}

// deviceRef looks a device up through the server's short-lived cache of
// device references (the one commands use: cleared by every product or
// device change through this instance, at most DeviceCacheTTL old).
func (s *Server) deviceRef(ctx context.Context, id string) (meta.DeviceRef, error) {
	ref, err := s.refs.get(ctx, id, func(ctx context.Context, id string) (meta.DeviceRef, time.Time, error) {
		ref, err := s.deps.Models.GetDeviceRef(ctx, id)
		return ref, time.Time{}, err
	})
	if err != nil {
		return meta.DeviceRef{}, err
	}
	// The cache is shared by every caller: the caller's products are
	// checked on each use.
	return ref, deviceVisible(ctx, ref)
}
