package main

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"devicehub/bench/testkit"
	"devicehub/ingest/mqtttest"
	"devicehub/tsdb/tsdbtest"
)

// TestNotifySigkill queues 1,000 alarm notifications, SIGKILLs devicehub
// while it delivers them to a real HTTP receiver, and starts it again:
// every notification arrives, in order per alarm, and a duplicate only
// with the key and body it had. (Seen failing with the outbox row marked
// delivered before it is sent: an alarm's later notification overtook
// an earlier one.)
func TestNotifySigkill(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	type hit struct {
		key, body string
		record    float64
		trans     float64
	}
	var hits []hit
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		var n struct {
			Key   string         `json:"idempotencyKey"`
			Alarm map[string]any `json:"alarm"`
		}
		_ = json.Unmarshal(b, &n)
		time.Sleep(2 * time.Millisecond) // a receiver that takes its time
		mu.Lock()
		rec, _ := n.Alarm["recordId"].(float64)
		tr, _ := n.Alarm["transitionId"].(float64)
		hits = append(hits, hit{key: r.Header.Get("Idempotency-Key"), body: string(b), record: rec, trans: tr})
		mu.Unlock()
	}))
	defer rcv.Close()
	received := func() []hit { mu.Lock(); defer mu.Unlock(); return append([]hit(nil), hits...) }

	broker := mqtttest.StartBroker(t)
	env, chDB, _ := testEnv(t, broker.URL(), "notify")
	var dsn string
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "DEVICEHUB_POSTGRES_DSN="); ok {
			dsn = v
		}
	}
	bin := testkit.Devicehub(t)
	first := startServer(t, bin, env, "notify-1")
	tsdbtest.OpenDB(t, chDB, nil)
	token := login(t, first.base)
	first.call(t, token, "POST", "/api/notify/channel", map[string]any{"id": "hook", "name": "Hook", "webhook": map[string]any{"url": rcv.URL}})
	first.call(t, token, "POST", "/api/notify/subscription", map[string]any{"name": "All", "products": []string{"p"},
		"kinds": []string{"raised", "cleared"}, "channels": []string{"hook"}})

	db, err := sqlx.Open("postgres", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	const alarms = 500 // raised and cleared: 1,000 notifications
	tx := db.MustBegin()
	for i := range alarms {
		var id int64
		if err := tx.Get(&id, `INSERT INTO alarm_records (rule_id, rule_name, product_id, device_id, severity, state, raised_time, last_time)
			VALUES ('r', 'R', 'p', 'd' || $1::text, 'major', 'cleared', now(), now()) RETURNING id`, i); err != nil {
			t.Fatal(err)
		}
		tx.MustExec(`INSERT INTO alarm_transitions (record_id, time, kind, severity) VALUES ($1, now(), 'raised', 'major'), ($1, now(), 'cleared', 'major')`, id)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if !testkit.Within(30*time.Second, func() bool { return len(received()) >= 150 }) {
		var rows []string
		_ = db.Select(&rows, `SELECT state || ' ' || attempts || ' ' || last_error FROM notify_outbox ORDER BY id LIMIT 3`)
		t.Fatalf("no deliveries under way: %d received; outbox %v\n%s", len(received()), rows, first.logTail())
	}
	first.signal(syscall.SIGKILL)
	first.wait(10 * time.Second)
	var pending int
	if err := db.Get(&pending, `SELECT count(*) FROM notify_outbox WHERE state = 'pending'`); err != nil {
		t.Fatal(err)
	}
	if pending == 0 {
		t.Fatal("everything delivered before the kill")
	}
	t.Logf("killed with %d of %d pending, %d requests received", pending, 2*alarms, len(received()))

	second := startServer(t, bin, env, "notify-2")
	t.Cleanup(func() { second.signal(syscall.SIGTERM); second.wait(15 * time.Second) })
	testkit.Eventually(t, 60*time.Second, "every notification delivered", func() bool {
		var n int
		_ = db.Get(&n, `SELECT count(*) FROM notify_outbox WHERE state = 'delivered'`)
		return n == 2*alarms
	})
	got := received()
	byKey := map[string]string{}
	last := map[float64]float64{}
	for _, h := range got {
		if b, seen := byKey[h.key]; seen {
			if b != h.body {
				t.Fatalf("key %s with two bodies", h.key)
			}
			continue
		}
		byKey[h.key] = h.body
		if h.trans <= last[h.record] {
			t.Fatalf("record %v: transition %v after %v", h.record, h.trans, last[h.record])
		}
		last[h.record] = h.trans
	}
	if len(byKey) != 2*alarms {
		t.Fatalf("%d distinct keys, want %d", len(byKey), 2*alarms)
	}
	t.Logf("%d requests for %d notifications: %d duplicates, each with its key", len(got), 2*alarms, len(got)-2*alarms)
}
