package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"devicehub/api"
	"devicehub/meta"
	"devicehub/tsdb"
	"devicehub/tsdb/tsdbtest"
)

func historyQuery(group string, params map[string]any) map[string]any {
	return map[string]any{"dashboard": "device", "object": "dp", "measurement": "properties", "dimension": "history",
		"group": group, "params": params}
}

func countQuery(params map[string]any) map[string]any {
	return map[string]any{"dashboard": "device", "object": "message", "measurement": "quantity", "dimension": "agg",
		"group": "g", "params": params}
}

func propertyIDs(n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("p%d", i)
	}
	return ids
}

// refused requires a 400 illegal_argument whose message names field and
// holds limit.
func refused(t *testing.T, e *env, body any, field, limit string) {
	t.Helper()
	r := e.call("POST", "/api/dashboard/_multi", body)
	if r.HTTPStatus != 400 || r.Code != "illegal_argument" || !strings.Contains(r.Message, field) || !strings.Contains(r.Message, limit) {
		t.Fatalf("got %d %q %q, want 400 illegal_argument naming %s and %s", r.HTTPStatus, r.Code, r.Message, field, limit)
	}
}

func TestDashboardLimitQueries(t *testing.T) {
	t.Parallel()
	e, _ := dashEnv(t)
	var body []map[string]any
	for range 33 {
		body = append(body, countQuery(map[string]any{"limit": 1}))
	}
	refused(t, e, body, "body", "32")
	e.ok("POST", "/api/dashboard/_multi", body[:32], nil)
}

func TestDashboardLimitHistory(t *testing.T) {
	t.Parallel()
	e, _ := dashEnv(t)
	refused(t, e, []any{historyQuery("h", map[string]any{"deviceId": "dd", "history": 1001, "properties": []string{"temp"}})},
		"[0].params.history", "1000")
	e.ok("POST", "/api/dashboard/_multi", []any{historyQuery("h", map[string]any{"deviceId": "dd", "history": 1000, "properties": []string{"temp"}})}, nil)
}

func TestDashboardLimitProperties(t *testing.T) {
	t.Parallel()
	e, _ := dashEnv(t)
	refused(t, e, []any{historyQuery("h", map[string]any{"deviceId": "dd", "properties": propertyIDs(101)})},
		"[0].params.properties", "100")
	e.ok("POST", "/api/dashboard/_multi", []any{historyQuery("h", map[string]any{"deviceId": "dd", "properties": propertyIDs(100)})}, nil)
}

// "All properties" of a device counts as its thing model's properties.
func TestDashboardLimitAllProperties(t *testing.T) {
	t.Parallel()
	e, _ := dashEnv(t)
	var props []string
	for _, id := range propertyIDs(101) {
		props = append(props, fmt.Sprintf(`{"id":%q,"name":%q,"valueType":{"type":"int"}}`, id, id))
	}
	p := e.createProduct("wide", "Wide product", nil)
	p["metadata"] = `{"properties":[` + strings.Join(props, ",") + `]}`
	e.ok("PATCH", "/api/device-product", p, nil)
	e.ok("POST", "/api/device/instance", map[string]any{"id": "wd", "name": "Wide device", "productId": "wide"}, nil)
	q := historyQuery("h", map[string]any{"deviceId": "wd"})
	q["object"] = "wide"
	refused(t, e, []any{q}, "[0].params.properties", "100")
	q["params"] = map[string]any{"deviceId": "wd", "properties": propertyIDs(100)}
	e.ok("POST", "/api/dashboard/_multi", []any{q}, nil)
}

func TestDashboardLimitHistoryValues(t *testing.T) {
	t.Parallel()
	e, _ := dashEnv(t)
	q := historyQuery("h", map[string]any{"deviceId": "dd", "history": 1000, "properties": propertyIDs(100)})
	e.ok("POST", "/api/dashboard/_multi", []any{q}, nil) // 100,000 values
	refused(t, e, []any{q, historyQuery("h", map[string]any{"deviceId": "dd", "properties": []string{"temp"}})},
		"[1].params", "100000 history values")
}

func TestDashboardLimitBuckets(t *testing.T) {
	t.Parallel()
	e, _ := dashEnv(t)
	refused(t, e, []any{countQuery(map[string]any{"time": "1h", "limit": 10001})}, "[0].params.limit", "10000")
	var body []any
	for range 5 {
		body = append(body, countQuery(map[string]any{"time": "1h", "limit": 10000}))
	}
	e.ok("POST", "/api/dashboard/_multi", body, nil) // 50,000 buckets
	// A range without limit counts its buckets: 2 days of hours.
	body = append(body, countQuery(map[string]any{"time": "1h", "from": "now-2d", "to": "now"}))
	refused(t, e, body, "[5].params", "50000 buckets")
}

// blockingStore holds every PropertyHistory call until release closes.
type blockingStore struct {
	api.DashboardStore
	entered chan struct{}
	release chan struct{}
}

func (b *blockingStore) PropertyHistory(ctx context.Context, productID, deviceID string, properties []string, n int) ([]tsdb.PropertyValue, error) {
	b.entered <- struct{}{}
	select {
	case <-b.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return b.DashboardStore.PropertyHistory(ctx, productID, deviceID, properties, n)
}

// With one dashboard request allowed in flight, a second one waits its
// bounded time and is refused with 503 too_many_requests and Retry-After,
// while other endpoints still answer.
func TestDashboardConcurrencyLimit(t *testing.T) {
	t.Parallel()
	db := tsdbtest.NewDB(t, shanghai)
	bs := &blockingStore{DashboardStore: db, entered: make(chan struct{}, 1), release: make(chan struct{})}
	opts := api.DefaultOptions()
	opts.DashboardConcurrency = 1
	opts.DashboardWait = 100 * time.Millisecond
	e := newEnvOpts(t, opts, func(store *meta.Store, deps *api.Deps) { deps.Dashboard, deps.Models = bs, store })
	e.createProduct("dp", "Dash product", nil)
	e.ok("POST", "/api/device/instance", map[string]any{"id": "dd", "name": "Dash device", "productId": "dp"}, nil)

	body := []any{historyQuery("h", map[string]any{"deviceId": "dd", "properties": []string{"temp"}})}
	first := make(chan response, 1)
	go func() { first <- e.call("POST", "/api/dashboard/_multi", body) }()
	<-bs.entered // the first request holds the only slot

	js, _ := json.Marshal(body)
	req, _ := http.NewRequest("POST", e.base+"/api/dashboard/_multi", bytes.NewReader(js))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Access-Token", e.token)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	r := e.envelope("POST", "/api/dashboard/_multi", res)
	if r.HTTPStatus != 503 || r.Code != "too_many_requests" || res.Header.Get("Retry-After") == "" {
		t.Errorf("second request: %d %q %q Retry-After %q, want 503 too_many_requests with Retry-After",
			r.HTTPStatus, r.Code, r.Message, res.Header.Get("Retry-After"))
	}
	e.ok("POST", "/api/device-product/_query/", map[string]any{}, nil) // other calls are not held

	close(bs.release)
	if r := <-first; r.HTTPStatus != 200 {
		t.Fatalf("first request: %d %q", r.HTTPStatus, r.Message)
	}
	// The slot is free again.
	e.ok("POST", "/api/dashboard/_multi", body, nil)
}

// A response's items are bounded in bytes, whatever their count: here a
// long group repeated in every bucket.
func TestDashboardLimitResultBytes(t *testing.T) {
	t.Parallel()
	e, _ := dashEnv(t)
	q := countQuery(map[string]any{"time": "1h", "limit": 10000})
	q["group"] = strings.Repeat("g", 4000)
	refused(t, e, []any{q}, "result", "32 MiB")
	q["group"] = strings.Repeat("g", 100)
	e.ok("POST", "/api/dashboard/_multi", []any{q}, nil)
}
