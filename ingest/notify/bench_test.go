package notify_test

import (
	"context"
	"fmt"
	"testing"

	"devicehub/ingest/notify"
)

// BenchmarkEnqueue is what the outbox trigger adds to an alarm's write,
// per alarm: a record and its raised transition, 100 alarms a
// transaction (the evaluator writes a batch in one), with no subscription,
// and with 10 subscriptions of other products and one matching (with a
// quiet time: its row is written too).
func BenchmarkEnqueue(b *testing.B) {
	g := newRig(b)
	ctx := context.Background()
	hook := g.webhook(b, "http://127.0.0.1:9/x", "")
	n := 0
	raise := func(b *testing.B, product string) {
		for b.Loop() {
			tx := g.ms.DB().MustBegin()
			for range 100 {
				n++
				var id int64
				if err := tx.Get(&id, `INSERT INTO alarm_records (rule_id, rule_name, product_id, device_id, severity, state, raised_time, last_time)
					VALUES ('r', 'r', $1, $2, 'major', 'active', now(), now()) RETURNING id`, product, fmt.Sprint("d", n)); err != nil {
					b.Fatal(err)
				}
				tx.MustExec(`INSERT INTO alarm_transitions (record_id, time, kind, severity) VALUES ($1, now(), 'raised', 'major')`, id)
			}
			if err := tx.Commit(); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*100), "µs/alarm")
	}
	b.Run("none", func(b *testing.B) { raise(b, "p-none") })
	for i := range 10 {
		if _, err := g.store.SaveSubscription(ctx, notify.Subscription{Name: "other", Products: []string{fmt.Sprint("other-", i)},
			Channels: []string{hook.ID}, Enabled: true}, "b", true, nil); err != nil {
			b.Fatal(err)
		}
	}
	g.subscribe(b, notify.Subscription{Products: []string{"p-one"}, Channels: []string{hook.ID}, QuietMs: 1000})
	b.Run("one of 11", func(b *testing.B) { raise(b, "p-one") })
}
