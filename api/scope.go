package api

import (
	"context"
	"fmt"
	"time"

	"devicehub/meta"
	"devicehub/schema"
	"devicehub/tsdb"
)

// Product scope (meta/scope.go). need(p) puts the products the caller
// holds p on onto the request's context (meta.LimitProducts); the store's
// lists, counts, details and writes see only those, and so do the device
// and product lookups of commands, endpoint 14, exports (deviceRef,
// productModel) and the live stream: an object outside them is 404
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

// messageCounts answers a message-count query (endpoint 14's and an
// export's) within ctx's products: a product outside is not_found; every
// product (q.ProductID "") is every product of the limit, one query of
// that set (tsdb sums their counts per bucket, cached per set); a caller
// limited to no product gets no buckets.
func (s *Server) messageCounts(ctx context.Context, q tsdb.CountQuery) ([]tsdb.Bucket, error) {
	all, products := meta.ProductsOf(ctx)
	if q.ProductID != "" {
		if err := productVisible(ctx, q.ProductID); err != nil {
			return nil, err
		}
	} else if !all {
		if len(products) == 0 {
			return nil, nil
		}
		q.Products = products
	}
	return s.deps.Dashboard.MessageCounts(ctx, q)
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
