package api_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"devicehub/bench/testkit"
	"devicehub/ingest/forward"
	"devicehub/meta"
)

// Forwarding rules through HTTP: defaults filled, the secret never read
// back (and kept by an update without one), bad input 400 naming the
// field, _enable/_disable, the status the owner wrote, product scoping,
// writes audited.
func TestForwardAPI(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, p := range []string{"fw-a", "fw-b"} {
		e.createProduct(p, p, nil)
	}
	var r forward.Rule
	e.ok("POST", "/api/notify/forward", map[string]any{"id": "to-lake", "name": "To the lake", "productId": "fw-b", "secret": "k",
		"types": []string{"property", "event"}, "properties": []string{"temp"},
		"webhook": map[string]any{"url": "http://127.0.0.1:1/in", "headers": map[string]string{"X-Team": "data"}}}, &r)
	if r.ID != "to-lake" || r.Kind != "webhook" || !r.HasSecret || r.Secret != "" || !r.Enabled || r.Webhook.BatchSize != forward.DefaultBatchSize ||
		r.Webhook.BatchMs != forward.DefaultBatchMs || !slicesEq(r.DeviceIDs, []string{}) || r.Status != nil {
		t.Fatalf("created %+v", r)
	}
	for _, c := range []struct {
		body  map[string]any
		field string
	}{
		{map[string]any{"productId": "fw-a", "webhook": map[string]any{"url": "http://x/"}}, "name:"},
		{map[string]any{"name": "n", "productId": "nope", "webhook": map[string]any{"url": "http://x/"}}, "productId:"},
		{map[string]any{"name": "n", "productId": "fw-a", "webhook": map[string]any{"url": "ftp://x/"}}, "webhook.url:"},
		{map[string]any{"name": "n", "productId": "fw-a", "webhook": map[string]any{"url": "http://x/", "batchSize": 100000}}, "webhook.batchSize:"},
		{map[string]any{"name": "n", "productId": "fw-a", "types": []string{"reply"}, "webhook": map[string]any{"url": "http://x/"}}, "types[0]:"},
		{map[string]any{"name": "n", "productId": "fw-a", "deviceIds": []string{"a/b"}, "webhook": map[string]any{"url": "http://x/"}}, "deviceIds[0]:"},
		{map[string]any{"name": "n", "productId": "fw-a", "mqtt": map[string]any{"broker": "tcp://h:1883", "topic": "a/#"}}, "mqtt.topic:"},
		{map[string]any{"name": "n", "productId": "fw-a"}, "kind:"},
		{map[string]any{"id": "to-lake", "name": "n", "productId": "fw-a", "webhook": map[string]any{"url": "http://x/"}}, "id:"},
	} {
		res := e.fails("POST", "/api/notify/forward", c.body, 400, "illegal_argument")
		if !strings.HasPrefix(res.Message, c.field) {
			t.Errorf("%v: message %q, want %s", c.body, res.Message, c.field)
		}
	}
	e.fails("PUT", "/api/notify/forward/nope", map[string]any{"name": "n", "productId": "fw-a", "webhook": map[string]any{"url": "http://x/"}}, 404, "not_found")
	e.ok("PUT", "/api/notify/forward/to-lake", map[string]any{"name": "Lake", "productId": "fw-b", "mqtt": map[string]any{"broker": "tcp://127.0.0.1:1"}}, &r)
	if !r.HasSecret || r.Kind != "mqtt" || r.MQTT.Topic != forward.DefaultTopic || !r.Enabled {
		t.Fatalf("updated %+v", r)
	}
	e.ok("POST", "/api/notify/forward/to-lake/_disable", nil, &r)
	if r.Enabled {
		t.Fatal("still enabled")
	}
	e.ok("POST", "/api/notify/forward/to-lake/_enable", nil, &r)
	if !r.Enabled {
		t.Fatal("not enabled")
	}
	// The status the forwarder's owner writes is what GET and _query show.
	db := e.store.DB()
	db.MustExec(`INSERT INTO forward_status (rule_id, owner, lag_ms, pending, spooled_bytes, dropped, sent, failed) VALUES ('to-lake', 'host-1', 1500, 7, 4096, 3, 100, 2)`)
	e.ok("GET", "/api/notify/forward/to-lake", nil, &r)
	if st := r.Status; st == nil || st.LagMs != 1500 || st.Pending != 7 || st.SpooledBytes != 4096 || st.Dropped != 3 || st.Sent != 100 || st.Failed != 2 || st.Owner != "host-1" {
		t.Fatalf("status %+v", r.Status)
	}

	// A caller limited to product A sees and changes only A's rules.
	e.ok("POST", "/api/role", map[string]any{"id": "fw-role-a", "name": "Forward A", "permissions": []meta.Permission{meta.PermNotifyAdmin}, "products": []string{"fw-a"}}, nil)
	_, lim := e.addUser("lim-forward", "fw-role-a")
	as := func(method, path string, body any) response { return e.do(method, path, body, lim) }
	if res := as("POST", "/api/notify/forward", map[string]any{"name": "B", "productId": "fw-b", "webhook": map[string]any{"url": "http://x/"}}); res.HTTPStatus != 400 || !strings.HasPrefix(res.Message, "productId:") {
		t.Fatalf("a rule of another's product: %d %s", res.HTTPStatus, res.Message)
	}
	if res := as("POST", "/api/notify/forward", map[string]any{"id": "mine", "name": "A", "productId": "fw-a", "webhook": map[string]any{"url": "http://x/"}}); res.HTTPStatus != 200 {
		t.Fatalf("own rule: %d %s", res.HTTPStatus, res.Message)
	}
	var list struct {
		Total int            `json:"total"`
		Data  []forward.Rule `json:"data"`
	}
	if res := as("POST", "/api/notify/forward/_query", nil); res.HTTPStatus != 200 || json.Unmarshal(res.Result, &list) != nil || list.Total != 1 || list.Data[0].ID != "mine" {
		t.Fatalf("limited list: %s", res.Result)
	}
	for _, c := range []struct{ method, path string }{{"GET", "/api/notify/forward/to-lake"}, {"PUT", "/api/notify/forward/to-lake"},
		{"DELETE", "/api/notify/forward/to-lake"}, {"POST", "/api/notify/forward/to-lake/_disable"}} {
		if res := as(c.method, c.path, map[string]any{"name": "B", "productId": "fw-a", "webhook": map[string]any{"url": "http://x/"}}); res.HTTPStatus != 404 {
			t.Fatalf("%s another's rule: %d %s", c.method, res.HTTPStatus, res.Message)
		}
	}
	e.ok("POST", "/api/notify/forward/_query", nil, &list)
	if list.Total != 2 || list.Data[1].Secret != "" || list.Data[1].Status == nil {
		t.Fatalf("rules %+v", list)
	}
	e.ok("DELETE", "/api/notify/forward/to-lake", nil, nil)
	e.fails("GET", "/api/notify/forward/to-lake", nil, 404, "not_found")

	testkit.Eventually(t, 5*time.Second, "audit entries", func() bool {
		var n int
		_ = db.Get(&n, `SELECT count(*) FROM audit WHERE route LIKE '/api/notify/forward%' AND route NOT LIKE '%_query' AND method <> 'GET'`)
		return n >= 16
	})
}
