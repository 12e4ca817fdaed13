package meta

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// ModelPolicy is the thing model in force for a product's devices (or for
// one device with a model of its own) and what its product does with
// values outside it: what ingest checks reported values against.
type ModelPolicy struct {
	Metadata string // the thing model, as stored
	Policy   string // OutsideKeep or OutsideDrop
}

// ModelPolicy reads, in one query, the thing model and outside-model
// policy of product productID or, with deviceID set, those in force for
// that device (its own model, or its product's). ErrNotFound when there is
// no such product or device (or it is outside ctx's products).
func (s *Store) ModelPolicy(ctx context.Context, productID, deviceID string) (ModelPolicy, error) {
	ctx, cancel := s.timeout(ctx)
	defer cancel()
	var r struct {
		ProductID string `db:"product_id"`
		ModelPolicy
	}
	var err error
	if deviceID == "" {
		err = s.db.QueryRowxContext(ctx, `SELECT id, metadata, outside_model_policy FROM products WHERE id = $1`, productID).
			Scan(&r.ProductID, &r.Metadata, &r.Policy)
	} else {
		err = s.db.QueryRowxContext(ctx, `SELECT p.id, COALESCE(d.metadata, p.metadata), p.outside_model_policy
			FROM devices d JOIN products p ON p.id = d.product_id WHERE d.id = $1`, deviceID).
			Scan(&r.ProductID, &r.Metadata, &r.Policy)
	}
	if errors.Is(err, sql.ErrNoRows) || err == nil && !ProductAllowed(ctx, r.ProductID) {
		return ModelPolicy{}, fmt.Errorf("model of product %q device %q: %w", truncate(productID, 80), truncate(deviceID, 80), ErrNotFound)
	}
	if err != nil {
		return ModelPolicy{}, fmt.Errorf("meta: model policy: %w", err)
	}
	return r.ModelPolicy, nil
}
