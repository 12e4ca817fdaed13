package forward

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

// Store is the PostgreSQL side: the rules and their status.
type Store struct {
	db      *sqlx.DB
	timeout time.Duration
}

// NewStore is a Store on ms's database.
func NewStore(ms *meta.Store) *Store { return &Store{db: ms.DB(), timeout: 10 * time.Second} }

func (s *Store) ctx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.timeout)
}

func newID() string { return strings.ToLower(rand.Text()[:16]) }

type ruleRow struct {
	ID         string         `db:"id"`
	Name       string         `db:"name"`
	ProductID  string         `db:"product_id"`
	DeviceIDs  pq.StringArray `db:"device_ids"`
	Types      pq.StringArray `db:"types"`
	Properties pq.StringArray `db:"properties"`
	Kind       string         `db:"kind"`
	Sink       []byte         `db:"sink"`
	Secret     string         `db:"secret"`
	Enabled    bool           `db:"enabled"`
	CreatorID  string         `db:"creator_id"`
	CreateTime time.Time      `db:"create_time"`
	ModifyTime time.Time      `db:"modify_time"`
	// forward_status, when joined
	Owner        sql.NullString `db:"owner"`
	LagMs        sql.NullInt64  `db:"lag_ms"`
	Pending      sql.NullInt64  `db:"pending"`
	SpooledBytes sql.NullInt64  `db:"spooled_bytes"`
	Dropped      sql.NullInt64  `db:"dropped"`
	Sent         sql.NullInt64  `db:"sent"`
	Failed       sql.NullInt64  `db:"failed"`
	LastError    sql.NullString `db:"last_error"`
	UpdateTime   sql.NullTime   `db:"update_time"`
}

func (r ruleRow) rule() (Rule, error) {
	out := Rule{ID: r.ID, Name: r.Name, ProductID: r.ProductID, DeviceIDs: nonNil(r.DeviceIDs), Types: nonNil(r.Types),
		Properties: nonNil(r.Properties), Kind: r.Kind, Secret: r.Secret, HasSecret: r.Secret != "", Enabled: r.Enabled,
		CreatorID: r.CreatorID, CreateTime: r.CreateTime.UnixMilli(), ModifyTime: r.ModifyTime.UnixMilli()}
	var dst any
	switch r.Kind {
	case KindWebhook:
		out.Webhook = &WebhookSink{}
		dst = out.Webhook
	case KindMQTT:
		out.MQTT = &MQTTSink{}
		dst = out.MQTT
	default:
		return out, fmt.Errorf("forward: rule %s: kind %q", r.ID, r.Kind)
	}
	if err := json.Unmarshal(r.Sink, dst); err != nil {
		return out, fmt.Errorf("forward: rule %s: %w", r.ID, err)
	}
	if r.Owner.Valid {
		out.Status = &Status{Owner: r.Owner.String, LagMs: r.LagMs.Int64, Pending: r.Pending.Int64, SpooledBytes: r.SpooledBytes.Int64,
			Dropped: r.Dropped.Int64, Sent: r.Sent.Int64, Failed: r.Failed.Int64, LastError: r.LastError.String,
			UpdateTime: r.UpdateTime.Time.UnixMilli()}
	}
	return out, nil
}

func nonNil(xs []string) []string {
	if xs == nil {
		return []string{}
	}
	return xs
}

func (r Rule) sink() []byte {
	var b []byte
	if r.Kind == KindWebhook {
		b, _ = json.Marshal(r.Webhook)
	} else {
		b, _ = json.Marshal(r.MQTT)
	}
	return b
}

const ruleSelect = `SELECT r.id, r.name, r.product_id, r.device_ids, r.types, r.properties, r.kind, r.sink, r.secret, r.enabled,
	r.creator_id, r.create_time, r.modify_time, s.owner, s.lag_ms, s.pending, s.spooled_bytes, s.dropped, s.sent, s.failed,
	s.last_error, s.update_time
	FROM forward_rules r LEFT JOIN forward_status s ON s.rule_id = r.id`

// scoped: products nil is every product; else the rule's product must be
// among them.
const scoped = ` ($2::text[] IS NULL OR r.product_id = ANY($2)) `

func productsArg(products []string) any {
	if products == nil {
		return nil
	}
	return pq.StringArray(products)
}

// Rule returns one rule with its status and secret, if its product is
// among products (nil: any).
func (s *Store) Rule(ctx context.Context, id string, products []string) (Rule, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	return getRule(ctx, s.db, id, products)
}

func getRule(ctx context.Context, q sqlx.QueryerContext, id string, products []string) (Rule, error) {
	var r ruleRow
	err := sqlx.GetContext(ctx, q, &r, ruleSelect+` WHERE r.id = $1 AND`+scoped, id, productsArg(products))
	if errors.Is(err, sql.ErrNoRows) {
		return Rule{}, fmt.Errorf("forwarding rule %q: %w", clip(id), meta.ErrNotFound)
	}
	if err != nil {
		return Rule{}, fmt.Errorf("forward: rule: %w", err)
	}
	return r.rule()
}

// Rules lists the rules of products (nil: all) by name, with their
// status and secrets.
func (s *Store) Rules(ctx context.Context, products []string) ([]Rule, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	var rows []ruleRow
	if err := s.db.SelectContext(ctx, &rows, ruleSelect+` WHERE $1::text IS NULL AND`+scoped+` ORDER BY r.name, r.id`,
		nil, productsArg(products)); err != nil {
		return nil, fmt.Errorf("forward: rules: %w", err)
	}
	out := make([]Rule, 0, len(rows))
	for _, row := range rows {
		r, err := row.rule()
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// SaveRule creates r (create; an empty ID gets a new one) or replaces the
// rule r.ID (its product among products, nil: any); an empty Secret keeps
// the stored one. It returns the rule saved.
func (s *Store) SaveRule(ctx context.Context, r Rule, by string, create bool, products []string) (Rule, error) {
	if err := r.Normalize(); err != nil {
		return Rule{}, err
	}
	if products != nil && !containsString(products, r.ProductID) {
		return Rule{}, schema.Invalid("productId", "no product %q among the caller's", clip(r.ProductID))
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	var err error
	if create {
		if r.ID == "" {
			r.ID = newID()
		}
		if len(r.ID) > 64 || strings.ContainsAny(r.ID, "/ ") {
			return Rule{}, schema.Invalid("id", "at most 64 characters, no / or space")
		}
		_, err = s.db.ExecContext(ctx, `INSERT INTO forward_rules (id, name, product_id, device_ids, types, properties, kind, sink,
			secret, enabled, creator_id, modifier_id) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $11)`,
			r.ID, r.Name, r.ProductID, pq.StringArray(r.DeviceIDs), pq.StringArray(r.Types), pq.StringArray(r.Properties),
			r.Kind, r.sink(), r.Secret, r.Enabled, by)
		if isCode(err, "23505") {
			return Rule{}, schema.Invalid("id", "a forwarding rule %q exists", clip(r.ID))
		}
	} else {
		var res sql.Result
		res, err = s.db.ExecContext(ctx, `UPDATE forward_rules r SET name = $3, product_id = $4, device_ids = $5, types = $6,
			properties = $7, kind = $8, sink = $9, secret = CASE WHEN $10 = '' THEN secret ELSE $10 END, enabled = $11,
			modifier_id = $12, modify_time = now() WHERE id = $1 AND`+scoped,
			r.ID, productsArg(products), r.Name, r.ProductID, pq.StringArray(r.DeviceIDs), pq.StringArray(r.Types),
			pq.StringArray(r.Properties), r.Kind, r.sink(), r.Secret, r.Enabled, by)
		if err == nil {
			if n, _ := res.RowsAffected(); n == 0 {
				return Rule{}, fmt.Errorf("forwarding rule %q: %w", clip(r.ID), meta.ErrNotFound)
			}
		}
	}
	if isCode(err, "23503") {
		return Rule{}, schema.Invalid("productId", "no product %q", clip(r.ProductID))
	}
	if err != nil {
		return Rule{}, fmt.Errorf("forward: save rule: %w", err)
	}
	return getRule(ctx, s.db, r.ID, nil)
}

// SetEnabled enables or disables a rule. A disabled rule takes no new
// messages; what its spool holds waits there for it.
func (s *Store) SetEnabled(ctx context.Context, id string, enabled bool, by string, products []string) (Rule, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	res, err := s.db.ExecContext(ctx, `UPDATE forward_rules r SET enabled = $3, modifier_id = $4, modify_time = now()
		WHERE id = $1 AND`+scoped, id, productsArg(products), enabled, by)
	if err != nil {
		return Rule{}, fmt.Errorf("forward: enable rule: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return Rule{}, fmt.Errorf("forwarding rule %q: %w", clip(id), meta.ErrNotFound)
	}
	return getRule(ctx, s.db, id, nil)
}

// DeleteRule deletes a rule; the forwarder's owner removes its spool.
func (s *Store) DeleteRule(ctx context.Context, id string, products []string) error {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	res, err := s.db.ExecContext(ctx, `DELETE FROM forward_rules r WHERE id = $1 AND`+scoped, id, productsArg(products))
	if err != nil {
		return fmt.Errorf("forward: delete rule: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("forwarding rule %q: %w", clip(id), meta.ErrNotFound)
	}
	return nil
}

// writeStatus records the owner's view of its rules.
func (s *Store) writeStatus(ctx context.Context, owner string, sts map[string]Status) error {
	if len(sts) == 0 {
		return nil
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	var ids []string
	var lag, pending, bytes, dropped, sent, failed []int64
	var errs []string
	for id, st := range sts {
		ids = append(ids, id)
		lag, pending, bytes = append(lag, st.LagMs), append(pending, st.Pending), append(bytes, st.SpooledBytes)
		dropped, sent, failed = append(dropped, st.Dropped), append(sent, st.Sent), append(failed, st.Failed)
		errs = append(errs, st.LastError)
	}
	// Only rules that still exist (a deleted one's status goes with it).
	_, err := s.db.ExecContext(ctx, `INSERT INTO forward_status (rule_id, owner, lag_ms, pending, spooled_bytes, dropped, sent,
		failed, last_error, update_time)
		SELECT u.id, $1, u.lag, u.pending, u.bytes, u.dropped, u.sent, u.failed, u.err, now()
		FROM unnest($2::text[], $3::bigint[], $4::bigint[], $5::bigint[], $6::bigint[], $7::bigint[], $8::bigint[], $9::text[])
			AS u(id, lag, pending, bytes, dropped, sent, failed, err)
		JOIN forward_rules r ON r.id = u.id
		ON CONFLICT (rule_id) DO UPDATE SET owner = EXCLUDED.owner, lag_ms = EXCLUDED.lag_ms, pending = EXCLUDED.pending,
			spooled_bytes = EXCLUDED.spooled_bytes, dropped = EXCLUDED.dropped, sent = EXCLUDED.sent, failed = EXCLUDED.failed,
			last_error = EXCLUDED.last_error, update_time = now()`,
		owner, pq.StringArray(ids), pq.Int64Array(lag), pq.Int64Array(pending), pq.Int64Array(bytes), pq.Int64Array(dropped),
		pq.Int64Array(sent), pq.Int64Array(failed), pq.StringArray(errs))
	if err != nil {
		return fmt.Errorf("forward: write status: %w", err)
	}
	return nil
}

func containsString(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

func isCode(err error, code string) bool {
	var pe *pq.Error
	return errors.As(err, &pe) && string(pe.Code) == code
}
