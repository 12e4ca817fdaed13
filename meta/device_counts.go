package meta

import (
	"context"
	"fmt"
	"strings"
)

// deviceCountColumns are the columns of product_device_counts (schema
// 00007, 00015) that count the devices of each state.
var deviceCountColumns = map[string]string{
	StateOnline:    "online",
	StateOffline:   "offline",
	StateNotActive: "not_active",
}

// deviceTotal answers the number of devices matching c from the product
// counts, exactly and without counting devices, when c's terms are none,
// eq on state, eq on productId or both (in either order, joined by and);
// ok is false for other terms, which the list counts (or estimates).
func deviceTotal(ctx context.Context, s *Store, c *Compiled) (n int, ok bool, err error) {
	where := c.Where
	if strings.HasPrefix(where, "(") && strings.HasSuffix(where, ")") {
		where = where[1 : len(where)-1]
	}
	var state, product any
	switch where {
	case "":
	case "d.state = $1":
		state = c.Args[0]
	case "d.product_id = $1":
		product = c.Args[0]
	case "d.state = $1 AND d.product_id = $2":
		state, product = c.Args[0], c.Args[1]
	case "d.product_id = $1 AND d.state = $2":
		product, state = c.Args[0], c.Args[1]
	default:
		return 0, false, nil
	}
	col := "devices"
	if state != nil {
		st, _ := state.(string)
		if col, ok = deviceCountColumns[st]; !ok {
			return 0, false, nil // a state no device is given: the list finds whether one has it
		}
	}
	ctx, cancel := s.timeout(ctx)
	defer cancel()
	q := "SELECT COALESCE(sum(" + col + "), 0) FROM product_device_counts"
	var args []any
	if product != nil {
		q += " WHERE product_id = $1"
		args = append(args, product)
	}
	if err := s.db.QueryRowContext(ctx, q, args...).Scan(&n); err != nil {
		return 0, false, fmt.Errorf("meta: count devices: %w", err)
	}
	return n, true, nil
}
