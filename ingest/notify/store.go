package notify

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"devicehub/meta"
	"devicehub/schema"
)

// Store is the PostgreSQL side: channels, subscriptions and the outbox.
type Store struct {
	ms      *meta.Store
	db      *sqlx.DB
	timeout time.Duration
}

// NewStore is a Store on ms's database.
func NewStore(ms *meta.Store) *Store {
	return &Store{ms: ms, db: ms.DB(), timeout: 10 * time.Second}
}

func (s *Store) ctx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.timeout)
}

func newID() string { return strings.ToLower(rand.Text()[:16]) }

type channelRow struct {
	ID         string    `db:"id"`
	Name       string    `db:"name"`
	Kind       string    `db:"kind"`
	Config     []byte    `db:"config"`
	Secret     string    `db:"secret"`
	CreatorID  string    `db:"creator_id"`
	CreateTime time.Time `db:"create_time"`
	ModifyTime time.Time `db:"modify_time"`
}

func (r channelRow) channel() (Channel, error) {
	c := Channel{ID: r.ID, Name: r.Name, Kind: r.Kind, Secret: r.Secret, HasSecret: r.Secret != "",
		CreatorID: r.CreatorID, CreateTime: r.CreateTime.UnixMilli(), ModifyTime: r.ModifyTime.UnixMilli()}
	var dst any
	switch r.Kind {
	case KindWebhook:
		c.Webhook = &Webhook{}
		dst = c.Webhook
	case KindEmail:
		c.Email = &Email{}
		dst = c.Email
	case KindMQTT:
		c.MQTT = &MQTT{}
		dst = c.MQTT
	default:
		return c, fmt.Errorf("notify: channel %s: kind %q", r.ID, r.Kind)
	}
	if err := json.Unmarshal(r.Config, dst); err != nil {
		return c, fmt.Errorf("notify: channel %s: %w", r.ID, err)
	}
	return c, nil
}

func (c Channel) config() []byte {
	var b []byte
	switch c.Kind {
	case KindWebhook:
		b, _ = json.Marshal(c.Webhook)
	case KindEmail:
		b, _ = json.Marshal(c.Email)
	default:
		b, _ = json.Marshal(c.MQTT)
	}
	return b
}

// Public is c as the API shows it: without its secret.
func (c Channel) Public() Channel {
	c.Secret = ""
	return c
}

const channelCols = `id, name, kind, config, secret, creator_id, create_time, modify_time`

// Channel returns one channel, its secret included.
func (s *Store) Channel(ctx context.Context, id string) (Channel, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	return getChannel(ctx, s.db, id)
}

func getChannel(ctx context.Context, q sqlx.QueryerContext, id string) (Channel, error) {
	var r channelRow
	err := sqlx.GetContext(ctx, q, &r, `SELECT `+channelCols+` FROM notify_channels WHERE id = $1`, id)
	if errors.Is(err, sql.ErrNoRows) {
		return Channel{}, fmt.Errorf("channel %q: %w", clipID(id), meta.ErrNotFound)
	}
	if err != nil {
		return Channel{}, fmt.Errorf("notify: channel: %w", err)
	}
	return r.channel()
}

func clipID(id string) string {
	if len(id) > 80 {
		return id[:80]
	}
	return id
}

// Channels lists the channels by name.
func (s *Store) Channels(ctx context.Context) ([]Channel, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	var rows []channelRow
	if err := s.db.SelectContext(ctx, &rows, `SELECT `+channelCols+` FROM notify_channels ORDER BY name, id`); err != nil {
		return nil, fmt.Errorf("notify: channels: %w", err)
	}
	out := make([]Channel, 0, len(rows))
	for _, r := range rows {
		c, err := r.channel()
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

// SaveChannel creates c (ID empty: a new one) or replaces the channel
// c.ID; an empty Secret keeps the stored one. It returns the channel
// saved.
func (s *Store) SaveChannel(ctx context.Context, c Channel, by string, create bool) (Channel, error) {
	if err := c.Normalize(); err != nil {
		return Channel{}, err
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	if create {
		if c.ID == "" {
			c.ID = newID()
		}
		_, err := s.db.ExecContext(ctx, `INSERT INTO notify_channels (id, name, kind, config, secret, creator_id, modifier_id)
			VALUES ($1, $2, $3, $4, $5, $6, $6)`, c.ID, c.Name, c.Kind, c.config(), c.Secret, by)
		if isUnique(err) {
			return Channel{}, schema.Invalid("id", "a channel %q exists", clipID(c.ID))
		}
		if err != nil {
			return Channel{}, fmt.Errorf("notify: create channel: %w", err)
		}
	} else {
		res, err := s.db.ExecContext(ctx, `UPDATE notify_channels SET name = $2, kind = $3, config = $4,
			secret = CASE WHEN $5 = '' THEN secret ELSE $5 END, modifier_id = $6, modify_time = now() WHERE id = $1`,
			c.ID, c.Name, c.Kind, c.config(), c.Secret, by)
		if err != nil {
			return Channel{}, fmt.Errorf("notify: update channel: %w", err)
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return Channel{}, fmt.Errorf("channel %q: %w", clipID(c.ID), meta.ErrNotFound)
		}
	}
	return getChannel(ctx, s.db, c.ID)
}

// ErrInUse: a channel a subscription names cannot be deleted.
var ErrInUse = errors.New("in use")

// DeleteChannel deletes a channel no subscription names.
func (s *Store) DeleteChannel(ctx context.Context, id string) error {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	var subs []string
	if err := s.db.SelectContext(ctx, &subs, `SELECT id FROM notify_subscriptions WHERE $1 = ANY(channels) ORDER BY id LIMIT 5`, id); err != nil {
		return fmt.Errorf("notify: delete channel: %w", err)
	}
	if len(subs) > 0 {
		return fmt.Errorf("channel %q is named by subscriptions %s: %w", clipID(id), strings.Join(subs, ", "), ErrInUse)
	}
	res, err := s.db.ExecContext(ctx, `DELETE FROM notify_channels WHERE id = $1`, id)
	if err != nil {
		return fmt.Errorf("notify: delete channel: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("channel %q: %w", clipID(id), meta.ErrNotFound)
	}
	return nil
}

func isUnique(err error) bool {
	var pe *pq.Error
	return errors.As(err, &pe) && pe.Code == "23505"
}

type subRow struct {
	ID          string         `db:"id"`
	Name        string         `db:"name"`
	Products    pq.StringArray `db:"products"`
	Rules       pq.StringArray `db:"rules"`
	MinSeverity int            `db:"min_severity"`
	Kinds       pq.StringArray `db:"kinds"`
	Channels    pq.StringArray `db:"channels"`
	EscalateMs  pq.Int64Array  `db:"escalate_ms"`
	RemindMs    int64          `db:"remind_ms"`
	QuietMs     int64          `db:"quiet_ms"`
	Enabled     bool           `db:"enabled"`
	CreatorID   string         `db:"creator_id"`
	CreateTime  time.Time      `db:"create_time"`
	ModifyTime  time.Time      `db:"modify_time"`
}

func (r subRow) subscription() Subscription {
	sev := ""
	if r.MinSeverity >= 1 && r.MinSeverity <= len(Severities) {
		sev = Severities[r.MinSeverity-1]
	}
	return Subscription{ID: r.ID, Name: r.Name, Products: r.Products, Rules: r.Rules, MinSeverity: sev, Kinds: r.Kinds,
		Channels: r.Channels, EscalateMs: r.EscalateMs, RemindMs: r.RemindMs, QuietMs: r.QuietMs, Enabled: r.Enabled,
		CreatorID: r.CreatorID, CreateTime: r.CreateTime.UnixMilli(), ModifyTime: r.ModifyTime.UnixMilli()}
}

const subCols = `id, name, products, rules, min_severity, kinds, channels, escalate_ms, remind_ms, quiet_ms, enabled, creator_id, create_time, modify_time`

// within is the SQL condition "every product of the subscription is one
// of $n" when products is not nil (a caller limited to products sees and
// changes only subscriptions wholly within them), else true.
func within(products []string, n int) (string, any) {
	if products == nil {
		return fmt.Sprintf("($%d::text[] IS NULL)", n), nil
	}
	return fmt.Sprintf("(products <@ $%d::text[])", n), pq.StringArray(products)
}

// Subscription returns one subscription within products (nil: any).
func (s *Store) Subscription(ctx context.Context, id string, products []string) (Subscription, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	cond, arg := within(products, 2)
	var r subRow
	err := s.db.GetContext(ctx, &r, `SELECT `+subCols+` FROM notify_subscriptions WHERE id = $1 AND `+cond, id, arg)
	if errors.Is(err, sql.ErrNoRows) {
		return Subscription{}, fmt.Errorf("subscription %q: %w", clipID(id), meta.ErrNotFound)
	}
	if err != nil {
		return Subscription{}, fmt.Errorf("notify: subscription: %w", err)
	}
	return r.subscription(), nil
}

// Subscriptions lists the subscriptions within products (nil: all) by name.
func (s *Store) Subscriptions(ctx context.Context, products []string) ([]Subscription, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	cond, arg := within(products, 1)
	var rows []subRow
	if err := s.db.SelectContext(ctx, &rows, `SELECT `+subCols+` FROM notify_subscriptions WHERE `+cond+` ORDER BY name, id`, arg); err != nil {
		return nil, fmt.Errorf("notify: subscriptions: %w", err)
	}
	out := make([]Subscription, 0, len(rows))
	for _, r := range rows {
		out = append(out, r.subscription())
	}
	return out, nil
}

// SaveSubscription creates sub (create) or replaces the subscription
// sub.ID, which must lie within products (nil: any) as must sub itself:
// the caller checks that sub's products are its own before. Its channels
// must exist.
func (s *Store) SaveSubscription(ctx context.Context, sub Subscription, by string, create bool, products []string) (Subscription, error) {
	if err := sub.Normalize(); err != nil {
		return Subscription{}, err
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	var known []string
	if err := s.db.SelectContext(ctx, &known, `SELECT id FROM notify_channels WHERE id = ANY($1)`, pq.StringArray(sub.Channels)); err != nil {
		return Subscription{}, fmt.Errorf("notify: save subscription: %w", err)
	}
	for i, c := range sub.Channels {
		found := false
		for _, k := range known {
			found = found || k == c
		}
		if !found {
			return Subscription{}, schema.Invalid(fmt.Sprintf("channels[%d]", i), "no channel %q", clipID(c))
		}
	}
	args := []any{sub.ID, sub.Name, pq.StringArray(sub.Products), pq.StringArray(sub.Rules), severityRank(sub.MinSeverity),
		pq.StringArray(sub.Kinds), pq.StringArray(sub.Channels), pq.Int64Array(sub.EscalateMs), sub.RemindMs, sub.QuietMs, sub.Enabled, by}
	if create {
		if sub.ID == "" {
			args[0] = newID()
			sub.ID = args[0].(string)
		}
		_, err := s.db.ExecContext(ctx, `INSERT INTO notify_subscriptions (id, name, products, rules, min_severity, kinds, channels,
			escalate_ms, remind_ms, quiet_ms, enabled, creator_id, modifier_id) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $12)`, args...)
		if isUnique(err) {
			return Subscription{}, schema.Invalid("id", "a subscription %q exists", clipID(sub.ID))
		}
		if err != nil {
			return Subscription{}, fmt.Errorf("notify: create subscription: %w", err)
		}
	} else {
		cond, arg := within(products, 13)
		res, err := s.db.ExecContext(ctx, `UPDATE notify_subscriptions SET name = $2, products = $3, rules = $4, min_severity = $5,
			kinds = $6, channels = $7, escalate_ms = $8, remind_ms = $9, quiet_ms = $10, enabled = $11, modifier_id = $12,
			modify_time = now() WHERE id = $1 AND `+cond, append(args, arg)...)
		if err != nil {
			return Subscription{}, fmt.Errorf("notify: update subscription: %w", err)
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return Subscription{}, fmt.Errorf("subscription %q: %w", clipID(sub.ID), meta.ErrNotFound)
		}
	}
	return s.Subscription(ctx, sub.ID, nil)
}

// DeleteSubscription deletes a subscription within products (nil: any).
// What it enqueued already is still delivered.
func (s *Store) DeleteSubscription(ctx context.Context, id string, products []string) error {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	cond, arg := within(products, 2)
	res, err := s.db.ExecContext(ctx, `DELETE FROM notify_subscriptions WHERE id = $1 AND `+cond, id, arg)
	if err != nil {
		return fmt.Errorf("notify: delete subscription: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("subscription %q: %w", clipID(id), meta.ErrNotFound)
	}
	return nil
}

// Dead is a dead letter: a notification given up on after the retry limit.
type Dead struct {
	ID             int64          `json:"id" db:"id"`
	RecordID       int64          `json:"recordId" db:"record_id"`
	SubscriptionID string         `json:"subscriptionId" db:"subscription_id"`
	ChannelID      string         `json:"channelId" db:"channel_id"`
	Step           string         `json:"step" db:"step"`
	Kind           string         `json:"kind" db:"kind"`
	Attempts       int            `json:"attempts" db:"attempts"`
	LastError      string         `json:"lastError" db:"last_error"`
	CreateTime     int64          `json:"createTime" db:"create_ms"`
	DeadTime       int64          `json:"deadTime" db:"done_ms"`
	Alarm          map[string]any `json:"alarm" db:"-"`
	Payload        []byte         `json:"-" db:"payload"`
}

// DeadQuery filters dead letters; products nil: any (else the alarm's
// product must be one of them).
type DeadQuery struct {
	ChannelID      string
	SubscriptionID string
	Products       []string
	Limit, Offset  int
}

// DeadLetters lists dead letters, the latest first, and their total.
func (s *Store) DeadLetters(ctx context.Context, q DeadQuery) ([]Dead, int, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	if q.Limit <= 0 || q.Limit > 1000 {
		q.Limit = 100
	}
	params := meta.Params{}
	if q.ChannelID != "" {
		params["channel"] = q.ChannelID
	}
	if q.SubscriptionID != "" {
		params["subscription"] = q.SubscriptionID
	}
	if q.Products != nil {
		params["within"] = pq.StringArray(q.Products)
	}
	rows, total, err := deadList.Range(ctx, s.ms, q.Offset, q.Limit, params)
	if err != nil {
		return nil, 0, fmt.Errorf("notify: dead letters: %w", err)
	}
	return rows, total, nil
}

// deadList is DeadLetters' statement, the latest first.
var deadList = meta.NewList(&meta.Resource{Name: "dead letter", DefaultSort: "done_time DESC, id DESC"}, meta.ListSQL{
	Select: `id, record_id, subscription_id, channel_id, step, kind, attempts, last_error, payload,
		(extract(epoch FROM create_time) * 1000)::BIGINT AS create_ms, (extract(epoch FROM done_time) * 1000)::BIGINT AS done_ms`,
	From: "notify_outbox",
	Where: []string{"state = 'dead'", "channel_id = @channel", "subscription_id = @subscription",
		"payload->>'productId' = ANY(@within)"},
}, func(d *Dead) Dead {
	_ = json.Unmarshal(d.Payload, &d.Alarm)
	return *d
})

// Replay makes dead letter id pending again, due now, its attempts
// counted afresh; same id, so the same idempotency key.
func (s *Store) Replay(ctx context.Context, id int64, products []string) error {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	var p any
	if products != nil {
		p = pq.StringArray(products)
	}
	res, err := s.db.ExecContext(ctx, `UPDATE notify_outbox SET state = 'pending', attempts = 0, due_time = now(), done_time = NULL
		WHERE id = $1 AND state = 'dead' AND ($2::text[] IS NULL OR payload->>'productId' = ANY($2))`, id, p)
	if err != nil {
		return fmt.Errorf("notify: replay: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("dead letter %d: %w", id, meta.ErrNotFound)
	}
	_, _ = s.db.ExecContext(ctx, `SELECT pg_notify('`+wakeChannel+`', '')`) // the poll is the fallback
	return nil
}
