package tsdb

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// latestChunk is the most devices one LatestValues query names.
const latestChunk = 1000

// latestWindow is the look-back LatestValues tries first: devices report
// often, so nearly every latest value is in the last day, and a query
// bounded by time reads a few granules per device instead of all of them;
// what it does not find is looked for in the whole history.
const latestWindow = 24 * time.Hour

// LatestValues returns the latest stored value of each of properties of
// each of deviceIDs (devices of productID), in a query per 1,000 devices
// (and one more over the whole history for the pairs the last day does
// not hold). Pairs never reported are absent. It answers what
// PropertyHistory with n = 1 answers per device, for many devices at once
// (ingest/shadow's deltas of a bulk change or a storm of births).
func (db *DB) LatestValues(ctx context.Context, productID string, deviceIDs, properties []string) ([]PropertyValue, error) {
	if len(deviceIDs) == 0 || len(properties) == 0 {
		return nil, nil
	}
	ctx, cancel := db.ctx(ctx)
	defer cancel()
	var out []PropertyValue
	for lo := 0; lo < len(deviceIDs); lo += latestChunk {
		chunk := deviceIDs[lo:min(lo+latestChunk, len(deviceIDs))]
		recent, err := db.latest(ctx, productID, chunk, properties, time.Now().Add(-latestWindow))
		if err != nil {
			return nil, err
		}
		out = append(out, recent...)
		found := make(map[string]int, len(chunk))
		for _, v := range recent {
			found[v.DeviceID]++
		}
		var older []string
		for _, id := range chunk {
			if found[id] < len(properties) {
				older = append(older, id)
			}
		}
		if len(older) == 0 {
			continue
		}
		all, err := db.latest(ctx, productID, older, properties, time.Time{})
		if err != nil {
			return nil, err
		}
		seen := make(map[[2]string]bool, len(recent))
		for _, v := range recent {
			seen[[2]string{v.DeviceID, v.Property}] = true
		}
		for _, v := range all {
			if !seen[[2]string{v.DeviceID, v.Property}] {
				out = append(out, v)
			}
		}
	}
	return out, nil
}

func (db *DB) latest(ctx context.Context, productID string, deviceIDs, properties []string, since time.Time) ([]PropertyValue, error) {
	sql := "SELECT ts, product_id, device_id, property, toString(value_type), num_value, str_value" +
		" FROM device_property WHERE product_id = ? AND device_id IN (" + placeholders(len(deviceIDs)) + ")" +
		" AND property IN (" + placeholders(len(properties)) + ")"
	args := make([]any, 0, 2+len(deviceIDs)+len(properties))
	args = append(args, productID)
	for _, id := range deviceIDs {
		args = append(args, id)
	}
	for _, p := range properties {
		args = append(args, p)
	}
	if !since.IsZero() {
		w, r := db.tsRange(since.Truncate(time.Second).UnixMilli(), 0, true, false)
		sql += w
		args = append(args, r...)
	}
	sql += " ORDER BY device_id, property, ts DESC LIMIT 1 BY device_id, property"
	rows, err := db.conn.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("tsdb: latest values: %w", err)
	}
	defer rows.Close()
	var out []PropertyValue
	for rows.Next() {
		var (
			v  PropertyValue
			ts int64
		)
		if err := rows.Scan(&ts, &v.ProductID, &v.DeviceID, &v.Property, &v.ValueType, &v.Num, &v.Str); err != nil {
			return nil, fmt.Errorf("tsdb: latest values: %w", err)
		}
		v.Time = time.UnixMilli(ts).In(db.loc)
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("tsdb: latest values: %w", err)
	}
	return out, nil
}

func placeholders(n int) string { return strings.TrimSuffix(strings.Repeat("?, ", n), ", ") }
