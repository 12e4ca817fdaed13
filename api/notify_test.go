package api_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"devicehub/bench/testkit"
	"devicehub/ingest/notify"
	"devicehub/meta"
)

// Notification channels, subscriptions and dead letters through HTTP:
// the secret never read back, bad input 400 naming the field, _test
// answering what a real receiver said, product scoping of subscriptions
// and dead letters, channels changed only on every product, writes
// audited.
func TestNotifyAPI(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var mu sync.Mutex
	status := http.StatusNotFound
	var heard []*http.Request
	var bodies []string
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		heard, bodies = append(heard, r), append(bodies, string(b))
		w.WriteHeader(status)
		_, _ = w.Write([]byte("no hook here"))
	}))
	defer rcv.Close()

	var ch notify.Channel
	e.ok("POST", "/api/notify/channel", map[string]any{"id": "hook", "name": "Ops hook", "secret": "s3cret",
		"webhook": map[string]any{"url": rcv.URL + "/h", "headers": map[string]string{"X-Team": "ops"}}}, &ch)
	if ch.ID != "hook" || ch.Kind != "webhook" || !ch.HasSecret || ch.Secret != "" || ch.Webhook.Method != "POST" {
		t.Fatalf("created %+v", ch)
	}
	r := e.fails("POST", "/api/notify/channel", map[string]any{"name": "Bad", "webhook": map[string]any{"url": rcv.URL, "template": "{{.Alarm.nope}}"}}, 400, "illegal_argument")
	if !strings.HasPrefix(r.Message, "webhook.template:") {
		t.Fatalf("message %q", r.Message)
	}
	e.fails("POST", "/api/notify/channel", map[string]any{"id": "hook", "name": "Again", "webhook": map[string]any{"url": rcv.URL}}, 400, "illegal_argument")
	e.fails("PUT", "/api/notify/channel/nope", map[string]any{"name": "N", "webhook": map[string]any{"url": rcv.URL}}, 404, "not_found")
	// An update without a secret keeps it.
	e.ok("PUT", "/api/notify/channel/hook", map[string]any{"name": "Ops hook 2", "webhook": map[string]any{"url": rcv.URL + "/h"}}, &ch)
	if !ch.HasSecret || ch.Name != "Ops hook 2" {
		t.Fatalf("updated %+v", ch)
	}
	var list struct {
		Total int              `json:"total"`
		Data  []notify.Channel `json:"data"`
	}
	e.ok("POST", "/api/notify/channel/_query", nil, &list)
	if list.Total != 1 || list.Data[0].Secret != "" {
		t.Fatalf("channels %+v", list)
	}

	// _test: what the receiver said, a 404 not delivered; then a 2xx.
	var tr struct {
		Delivered bool   `json:"delivered"`
		Status    int    `json:"status"`
		Answer    string `json:"answer"`
		Key       string `json:"idempotencyKey"`
	}
	e.ok("POST", "/api/notify/channel/hook/_test", nil, &tr)
	if tr.Delivered || tr.Status != 404 || tr.Answer != "no hook here" {
		t.Fatalf("test of a 404: %+v", tr)
	}
	mu.Lock()
	status = http.StatusOK
	mu.Unlock()
	e.ok("POST", "/api/notify/channel/hook/_test", nil, &tr)
	mu.Lock()
	last, body := heard[len(heard)-1], bodies[len(bodies)-1]
	mu.Unlock()
	if !tr.Delivered || tr.Status != 200 || last.Header.Get("Idempotency-Key") != tr.Key ||
		last.Header.Get("X-Devicehub-Signature") != notify.Sign("s3cret", []byte(body)) || last.Header.Get("X-Team") != "" {
		t.Fatalf("test: %+v, headers %v", tr, last.Header)
	}

	// Subscriptions; a caller limited to product A.
	for _, p := range []string{"np-a", "np-b"} {
		e.createProduct(p, p, nil)
	}
	var sub notify.Subscription
	e.ok("POST", "/api/notify/subscription", map[string]any{"id": "s-b", "name": "B", "products": []string{"np-b"}, "channels": []string{"hook"}}, &sub)
	if !sub.Enabled || sub.MinSeverity != "info" || len(sub.Kinds) != 1 || !slicesEq(sub.Rules, []string{}) {
		t.Fatalf("subscription %+v", sub)
	}
	r = e.fails("POST", "/api/notify/subscription", map[string]any{"name": "X", "products": []string{"np-a"}, "channels": []string{"hook", "hook"}}, 400, "illegal_argument")
	if !strings.HasPrefix(r.Message, "escalateMs:") {
		t.Fatalf("message %q", r.Message)
	}
	e.fails("DELETE", "/api/notify/channel/hook", nil, 409, "conflict")
	e.ok("POST", "/api/role", map[string]any{"id": "notify-a", "name": "Notify A", "permissions": []meta.Permission{meta.PermNotifyAdmin}, "products": []string{"np-a"}}, nil)
	_, lim := e.addUser("lim-notify", "notify-a")
	as := func(method, path string, body any) response { return e.do(method, path, body, lim) }
	if r := as("POST", "/api/notify/subscription", map[string]any{"name": "Mine", "products": []string{"np-a", "np-b"}, "channels": []string{"hook"}}); r.HTTPStatus != 400 || !strings.HasPrefix(r.Message, "products[1]:") {
		t.Fatalf("a subscription naming another's product: %d %s", r.HTTPStatus, r.Message)
	}
	if r := as("POST", "/api/notify/subscription", map[string]any{"id": "s-a", "name": "Mine", "products": []string{"np-a"}, "channels": []string{"hook"}}); r.HTTPStatus != 200 {
		t.Fatalf("own subscription: %d %s", r.HTTPStatus, r.Message)
	}
	var subs struct {
		Total int                   `json:"total"`
		Data  []notify.Subscription `json:"data"`
	}
	if r := as("POST", "/api/notify/subscription/_query", nil); r.HTTPStatus != 200 || json.Unmarshal(r.Result, &subs) != nil || subs.Total != 1 || subs.Data[0].ID != "s-a" {
		t.Fatalf("limited list: %s", r.Result)
	}
	for _, c := range []struct{ method, path string }{{"PUT", "/api/notify/subscription/s-b"}, {"DELETE", "/api/notify/subscription/s-b"}} {
		if r := as(c.method, c.path, map[string]any{"name": "B", "products": []string{"np-a"}, "channels": []string{"hook"}}); r.HTTPStatus != 404 {
			t.Fatalf("%s another's subscription: %d %s", c.method, r.HTTPStatus, r.Message)
		}
	}
	for _, c := range []struct{ method, path string }{{"POST", "/api/notify/channel"}, {"PUT", "/api/notify/channel/hook"}, {"DELETE", "/api/notify/channel/hook"}} {
		if r := as(c.method, c.path, map[string]any{"name": "Mine", "webhook": map[string]any{"url": rcv.URL}}); r.HTTPStatus != 403 || r.Code != "access_denied" {
			t.Fatalf("%s %s by a limited caller: %d %s", c.method, c.path, r.HTTPStatus, r.Code)
		}
	}

	// Dead letters: one of each product's alarms.
	db := e.store.DB()
	for _, p := range []string{"np-a", "np-b"} {
		db.MustExec(`INSERT INTO notify_outbox (record_id, subscription_id, channel_id, step, kind, payload, state, attempts, done_time, last_error)
			VALUES (1, 's', 'hook', $1, 'raised', jsonb_build_object('productId', $1::text, 'deviceId', 'd'), 'dead', 10, now(), 'refused: 404')`, p)
	}
	var dead struct {
		Total int           `json:"total"`
		Data  []notify.Dead `json:"data"`
	}
	if r := as("POST", "/api/notify/dead/_query", nil); r.HTTPStatus != 200 || json.Unmarshal(r.Result, &dead) != nil || dead.Total != 1 || dead.Data[0].Alarm["productId"] != "np-a" {
		t.Fatalf("limited dead letters: %s", r.Result)
	}
	e.ok("POST", "/api/notify/dead/_query", map[string]any{"pageSize": 1}, &dead)
	if dead.Total != 2 || len(dead.Data) != 1 {
		t.Fatalf("dead letters %+v", dead)
	}
	e.fails("POST", "/api/notify/dead/_query", map[string]any{"pageSize": 5000}, 400, "illegal_argument")
	var deadB int64
	if err := db.Get(&deadB, `SELECT id FROM notify_outbox WHERE step = 'np-b'`); err != nil {
		t.Fatal(err)
	}
	if r := as("POST", "/api/notify/dead/"+itoa(deadB)+"/_replay", nil); r.HTTPStatus != 404 {
		t.Fatalf("replay of another's dead letter: %d", r.HTTPStatus)
	}
	e.fails("POST", "/api/notify/dead/abc/_replay", nil, 404, "not_found")
	e.ok("POST", "/api/notify/dead/"+itoa(deadB)+"/_replay", nil, nil)
	var state string
	if err := db.Get(&state, `SELECT state FROM notify_outbox WHERE id = $1`, deadB); err != nil || state != "pending" {
		t.Fatalf("replayed row %q %v", state, err)
	}
	e.ok("DELETE", "/api/notify/subscription/s-b", nil, nil)

	// Audited: the writes, not the queries.
	testkit.Eventually(t, 5*time.Second, "audit entries", func() bool {
		var n int
		_ = db.Get(&n, `SELECT count(*) FROM audit WHERE route LIKE '/api/notify/%' AND route NOT LIKE '%_query'`)
		return n >= 10
	})
	var queries int
	_ = db.Get(&queries, `SELECT count(*) FROM audit WHERE route LIKE '/api/notify/%_query'`)
	if queries != 0 {
		t.Fatalf("%d queries audited", queries)
	}
}

func slicesEq(a, b []string) bool {
	return strings.Join(a, "\x00") == strings.Join(b, "\x00") && len(a) == len(b)
}

func itoa(n int64) string { b, _ := json.Marshal(n); return string(b) }
