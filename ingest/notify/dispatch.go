package notify

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"devicehub/ingest/leader"
	"devicehub/meta"
)

// lockKey elects the scheduler's one owner among instances (its writes
// are idempotent; the lock only saves the others the work).
const lockKey = 0x6e6f74696679 // "notify"

// Options configure a Dispatcher. DefaultOptions has every default.
type Options struct {
	Workers     int           // concurrent deliveries on this instance (4)
	Poll        time.Duration // how often an idle worker looks for due rows (200ms)
	Tick        time.Duration // how often the scheduler enqueues escalations and reminders (500ms)
	MaxAttempts int           // attempts before a dead letter (10)
	BackoffBase time.Duration // the first retry's delay; doubled each attempt (1s)
	BackoffMax  time.Duration // the longest retry delay (10m)
	Retention   time.Duration // delivered rows kept this long (168h); 0 keeps them
	// DSN of the database (lib/pq form): when set, workers are woken by
	// the outbox trigger's announcement (LISTEN devicehub_notify) instead
	// of waiting for their next poll.
	DSN        string
	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

// DefaultOptions are the defaults of every option.
func DefaultOptions() Options {
	return Options{Workers: 4, Poll: 200 * time.Millisecond, Tick: 500 * time.Millisecond, MaxAttempts: 10,
		BackoffBase: time.Second, BackoffMax: 10 * time.Minute, Retention: 7 * 24 * time.Hour}
}

// Dispatcher delivers the outbox (on every instance that runs it) and,
// on the one that holds the scheduler's lock, enqueues escalations and
// reminders.
type Dispatcher struct {
	ms    *meta.Store
	store *Store
	opt   Options
	log   *slog.Logger
	m     *metrics
	wake  chan struct{}
}

// NewDispatcher is a Dispatcher over ms's database.
func NewDispatcher(ms *meta.Store, opt Options) *Dispatcher {
	def := DefaultOptions()
	if opt.Workers <= 0 {
		opt.Workers = def.Workers
	}
	if opt.Poll <= 0 {
		opt.Poll = def.Poll
	}
	if opt.Tick <= 0 {
		opt.Tick = def.Tick
	}
	if opt.MaxAttempts <= 0 {
		opt.MaxAttempts = def.MaxAttempts
	}
	if opt.BackoffBase <= 0 {
		opt.BackoffBase = def.BackoffBase
	}
	if opt.BackoffMax <= 0 {
		opt.BackoffMax = def.BackoffMax
	}
	if opt.Logger == nil {
		opt.Logger = slog.New(slog.DiscardHandler)
	}
	return &Dispatcher{ms: ms, store: NewStore(ms), opt: opt, log: opt.Logger, m: newMetrics(opt.Registerer), wake: make(chan struct{}, opt.Workers)}
}

// Run delivers and schedules until ctx ends.
func (d *Dispatcher) Run(ctx context.Context) {
	var wg sync.WaitGroup
	for range d.opt.Workers {
		wg.Add(1)
		go func() { defer wg.Done(); d.work(ctx) }()
	}
	wg.Add(2)
	go func() { defer wg.Done(); d.schedule(ctx) }()
	go func() { defer wg.Done(); d.gauge(ctx) }()
	if d.opt.DSN != "" {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := meta.Listen(d.opt.DSN, []string{wakeChannel}, meta.ListenHandler{
				Notify: func(string, string) { d.Wake() }, Listening: d.Wake}, ctx.Done())
			if err != nil {
				d.log.Warn("notify: listen (workers poll instead)", "err", err)
			}
		}()
	}
	wg.Wait()
}

// wakeChannel is announced by the outbox trigger and by a replay.
const wakeChannel = "devicehub_notify"

// Wake makes an idle worker look for due rows now. One is enough: a
// worker that takes a row wakes another before it sends (deliverOne), so
// a backlog has every worker on it, and one announcement does not send
// every worker to the claim at once to find a single row.
func (d *Dispatcher) Wake() {
	select {
	case d.wake <- struct{}{}:
	default: // as many wake-ups pending as workers: enough
	}
}

func (d *Dispatcher) work(ctx context.Context) {
	t := time.NewTicker(d.opt.Poll)
	defer t.Stop()
	for ctx.Err() == nil {
		took, err := d.deliverOne(ctx)
		if err != nil && ctx.Err() == nil {
			d.log.Warn("notify: delivery", "err", err)
		}
		if took && err == nil {
			continue
		}
		select {
		case <-ctx.Done():
		case <-t.C:
		case <-d.wake:
		}
	}
}

type outboxRow struct {
	ID             int64  `db:"id"`
	RecordID       int64  `db:"record_id"`
	SubscriptionID string `db:"subscription_id"`
	ChannelID      string `db:"channel_id"`
	Step           string `db:"step"`
	Kind           string `db:"kind"`
	Payload        []byte `db:"payload"`
	Attempts       int    `db:"attempts"`
	// The channel, read by the same statement (one round trip less before
	// the send); HasChannel false: it was deleted.
	HasChannel    bool   `db:"has_channel"`
	ChannelName   string `db:"channel_name"`
	ChannelKind   string `db:"channel_kind"`
	ChannelConfig []byte `db:"channel_config"`
	ChannelSecret string `db:"channel_secret"`
}

// channel is the row's channel, or the error of a deleted one.
func (r outboxRow) channel() (Channel, error) {
	if !r.HasChannel {
		return Channel{}, fmt.Errorf("channel %q: %w", clipID(r.ChannelID), meta.ErrNotFound)
	}
	return channelRow{ID: r.ChannelID, Name: r.ChannelName, Kind: r.ChannelKind, Config: r.ChannelConfig, Secret: r.ChannelSecret}.channel()
}

// claim takes the earliest due row whose alarm has no earlier pending row
// on its channel, and that no other worker holds, with its channel.
const claim = `SELECT o.id, o.record_id, o.subscription_id, o.channel_id, o.step, o.kind, o.payload, o.attempts,
	  c.id IS NOT NULL AS has_channel, coalesce(c.name, '') AS channel_name, coalesce(c.kind, '') AS channel_kind,
	  coalesce(c.config, '{}') AS channel_config, coalesce(c.secret, '') AS channel_secret
	FROM notify_outbox o LEFT JOIN notify_channels c ON c.id = o.channel_id
	WHERE o.state = 'pending' AND o.due_time <= now()
	  AND NOT EXISTS (SELECT 1 FROM notify_outbox p WHERE p.record_id = o.record_id AND p.channel_id = o.channel_id
	                  AND p.state = 'pending' AND p.id < o.id)
	ORDER BY o.due_time, o.id LIMIT 1
	FOR UPDATE OF o SKIP LOCKED`

// deliverOne sends one due row in the transaction that holds it, and
// records the outcome in that transaction. took: a row was taken.
func (d *Dispatcher) deliverOne(ctx context.Context) (took bool, err error) {
	tx, err := d.ms.DB().BeginTxx(ctx, nil)
	if err != nil {
		return false, err
	}
	defer func() { _ = tx.Rollback() }()
	var r outboxRow
	if err := tx.GetContext(ctx, &r, claim); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return false, nil
		}
		return false, err
	}
	d.Wake() // another worker for the next due row, if any
	n := Notification{ID: r.ID, IdempotencyKey: strconv.FormatInt(r.ID, 10), Kind: r.Kind, Step: r.Step,
		SubscriptionID: r.SubscriptionID, ChannelID: r.ChannelID, Attempt: r.Attempts + 1}
	if err := json.Unmarshal(r.Payload, &n.Alarm); err != nil {
		return true, err
	}
	ch, err := r.channel()
	var sendErr error
	start := time.Now()
	if err != nil {
		sendErr = err // deleted: retried (it may come back), then dead
	} else {
		_, sendErr = Send(ctx, ch, n)
	}
	if ctx.Err() != nil {
		return true, ctx.Err() // stopping: the row stays pending, sent again with its key
	}
	d.m.latency.WithLabelValues(r.ChannelID).Observe(time.Since(start).Seconds())
	if sendErr == nil {
		if _, err := tx.ExecContext(ctx, `UPDATE notify_outbox SET state = 'delivered', attempts = attempts + 1, done_time = now(),
			last_error = '' WHERE id = $1`, r.ID); err != nil {
			return true, err
		}
		if err := tx.Commit(); err != nil {
			return true, err
		}
		d.m.sent.WithLabelValues(r.ChannelID).Inc()
		return true, nil
	}
	d.m.failed.WithLabelValues(r.ChannelID).Inc()
	msg := sendErr.Error()
	if len(msg) > 1000 {
		msg = msg[:1000]
	}
	attempts := r.Attempts + 1
	if attempts >= d.opt.MaxAttempts {
		_, err = tx.ExecContext(ctx, `UPDATE notify_outbox SET state = 'dead', attempts = $2, done_time = now(), last_error = $3 WHERE id = $1`,
			r.ID, attempts, msg)
		if err == nil {
			err = tx.Commit()
		}
		if err == nil {
			d.m.dead.WithLabelValues(r.ChannelID).Inc()
			d.log.Warn("notify: dead letter", "id", r.ID, "channel", r.ChannelID, "attempts", attempts, "err", msg)
		}
		return true, err
	}
	delay := d.backoff(attempts)
	_, err = tx.ExecContext(ctx, `UPDATE notify_outbox SET attempts = $2, due_time = now() + make_interval(secs => $3), last_error = $4 WHERE id = $1`,
		r.ID, attempts, delay.Seconds(), msg)
	if err == nil {
		err = tx.Commit()
	}
	if err == nil {
		d.m.retried.WithLabelValues(r.ChannelID).Inc()
	}
	return true, err
}

// backoff is the delay before attempt+1: base * 2^(attempt-1), at most
// max, with jitter (a uniform draw from its upper half), so receivers
// coming back are not hit by every sender at once.
func (d *Dispatcher) backoff(attempt int) time.Duration {
	b := d.opt.BackoffBase
	for i := 1; i < attempt && b < d.opt.BackoffMax; i++ {
		b *= 2
	}
	b = min(b, d.opt.BackoffMax)
	return b/2 + rand.N(b/2+1)
}

// schedule runs Tick while this instance holds the scheduler's lock.
func (d *Dispatcher) schedule(ctx context.Context) {
	leader.Loop{Locker: d.ms, Key: lockKey, Retry: time.Second, Log: d.log,
		Waiting: "notify: scheduler lock"}.Run(ctx, func(ctx context.Context, lost <-chan struct{}) error {
		d.lead(ctx, lost)
		return nil
	})
}

func (d *Dispatcher) lead(ctx context.Context, lost <-chan struct{}) {
	t := time.NewTicker(d.opt.Tick)
	defer t.Stop()
	var purged time.Time
	for {
		n, err := d.store.Tick(ctx)
		if err != nil && ctx.Err() == nil {
			d.log.Warn("notify: scheduler", "err", err)
		}
		if n > 0 {
			d.Wake()
		}
		if time.Since(purged) > time.Minute {
			purged = time.Now()
			var before time.Time // Retention 0: no delivered row is old enough
			if d.opt.Retention > 0 {
				before = time.Now().Add(-d.opt.Retention)
			}
			if err := d.store.Purge(ctx, before); err != nil && ctx.Err() == nil {
				d.log.Warn("notify: purge", "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-lost:
			return
		case <-t.C:
		}
	}
}

// subscribed joins the active, unacknowledged alarms a subscription
// covers, a.since when the trigger first saw one concern it (the
// server's clock: a device's clock does not move escalations).
const subscribed = `FROM notify_active a
	JOIN notify_subscriptions s ON s.id = a.subscription_id
	JOIN alarm_records r ON r.id = a.record_id AND r.state = 'active' AND NOT r.acked
	  AND notify_severity_rank(r.severity) >= s.min_severity`

// Tick enqueues the escalations and reminders due now; it returns how
// many rows it added. Idempotent: a step already enqueued is not again.
func (s *Store) Tick(ctx context.Context) (int64, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	// Escalation level i: channels[i+1], once escalate_ms[i] has passed.
	res, err := s.db.ExecContext(ctx, `INSERT INTO notify_outbox (record_id, subscription_id, channel_id, step, kind, payload)
		SELECT r.id, s.id, s.channels[e.i + 1], 'e' || e.i, 'escalation', notify_payload(r, 'escalation', r.severity, NULL::alarm_transitions)
		`+subscribed+`
		CROSS JOIN LATERAL generate_subscripts(s.escalate_ms, 1) AS e(i)
		WHERE s.enabled AND a.since + make_interval(secs => s.escalate_ms[e.i] / 1000.0) <= now()
		ORDER BY r.id, e.i
		ON CONFLICT (record_id, subscription_id, step) DO NOTHING`)
	if err != nil {
		return 0, fmt.Errorf("notify: escalations: %w", err)
	}
	n, _ := res.RowsAffected()
	// Reminder k (k whole periods since raised), to the chain's channel
	// reached by then; only the latest one: a scheduler that was away
	// sends one reminder, not the ones it missed.
	res, err = s.db.ExecContext(ctx, `INSERT INTO notify_outbox (record_id, subscription_id, channel_id, step, kind, payload)
		SELECT r.id, s.id,
		  s.channels[1 + (SELECT count(*) FROM unnest(s.escalate_ms) m WHERE a.since + make_interval(secs => m / 1000.0) <= now())::int],
		  'r' || k.n, 'reminder', notify_payload(r, 'reminder', r.severity, NULL::alarm_transitions)
		`+subscribed+`
		CROSS JOIN LATERAL (SELECT floor(extract(epoch FROM now() - a.since) * 1000 / s.remind_ms)::BIGINT AS n) k
		WHERE s.enabled AND s.remind_ms > 0 AND k.n >= 1
		ORDER BY r.id
		ON CONFLICT (record_id, subscription_id, step) DO NOTHING`)
	if err != nil {
		return n, fmt.Errorf("notify: reminders: %w", err)
	}
	m, _ := res.RowsAffected()
	return n + m, nil
}

// Purge deletes delivered rows done before before, the escalation
// clocks of alarms no longer active and unacknowledged, and quiet marks
// older than a day beyond their quiet time.
func (s *Store) Purge(ctx context.Context, before time.Time) error {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	if _, err := s.db.ExecContext(ctx, `DELETE FROM notify_active a WHERE NOT EXISTS (SELECT 1 FROM alarm_records r
		WHERE r.id = a.record_id AND r.state = 'active' AND NOT r.acked)`); err != nil {
		return fmt.Errorf("notify: purge: %w", err)
	}
	if _, err := s.db.ExecContext(ctx, `DELETE FROM notify_outbox WHERE state = 'delivered' AND done_time < $1`, before); err != nil {
		return fmt.Errorf("notify: purge: %w", err)
	}
	_, err := s.db.ExecContext(ctx, `DELETE FROM notify_quiet q WHERE q.last_time < now() - interval '1 day' - make_interval(secs =>
		coalesce((SELECT quiet_ms FROM notify_subscriptions s WHERE s.id = q.subscription_id), 0) / 1000.0)`)
	if err != nil {
		return fmt.Errorf("notify: purge: %w", err)
	}
	return nil
}

// Depth is the number of pending notifications per channel: every
// channel, with 0 when none is pending.
func (s *Store) Depth(ctx context.Context) (map[string]int64, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	var rows []struct {
		Channel string `db:"channel_id"`
		N       int64  `db:"n"`
	}
	// Every channel, 0 when none is pending (and a deleted channel's
	// notifications still pending).
	if err := s.db.SelectContext(ctx, &rows, `SELECT coalesce(c.id, o.channel_id) AS channel_id, coalesce(o.n, 0) AS n
		FROM notify_channels c FULL JOIN (SELECT channel_id, count(*) AS n FROM notify_outbox WHERE state = 'pending' GROUP BY channel_id) o
		ON o.channel_id = c.id`); err != nil {
		return nil, fmt.Errorf("notify: depth: %w", err)
	}
	out := make(map[string]int64, len(rows))
	for _, r := range rows {
		out[r.Channel] = r.N
	}
	return out, nil
}

// gauge keeps the queue depth metric current.
func (d *Dispatcher) gauge(ctx context.Context) {
	t := time.NewTicker(5 * time.Second)
	defer t.Stop()
	for {
		if depth, err := d.store.Depth(ctx); err == nil {
			d.m.depth.Reset()
			for ch, n := range depth {
				d.m.depth.WithLabelValues(ch).Set(float64(n))
				d.m.channel(ch)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
