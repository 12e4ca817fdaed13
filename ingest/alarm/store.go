package alarm

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"devicehub/meta"
	"devicehub/schema"
)

// Store keeps rules, alarm records, their transitions and the evaluator's
// state in PostgreSQL (schema/postgres/00019_alarms.sql; the state a row
// per device, 00034_alarm_state.sql). Reads and writes
// of rules and records see only the products of ctx
// (meta.LimitProducts): others are meta.ErrNotFound, as if absent.
type Store struct {
	ms      *meta.Store
	db      *sqlx.DB
	timeout time.Duration

	statements atomic.Uint64 // sent by Write, BEGIN and COMMIT apart (BenchmarkRunner)
	afterLock  func()        // tests: Write has locked the active records
	// tests: ActiveCounts is about to read
	beforeCounts func()
}

// NewStore is a store over ms's database.
func NewStore(ms *meta.Store) *Store {
	return &Store{ms: ms, db: ms.DB(), timeout: 10 * time.Second}
}

// ErrNotOwner: another instance became the evaluator's owner; this one's
// writes are refused (its epoch is stale).
var ErrNotOwner = errors.New("alarm: no longer the evaluator's owner")

// Actor is who acts by hand.
type Actor struct {
	ID, Name string
}

// StoredRule is a rule with its bookkeeping.
type StoredRule struct {
	Rule
	CreatorID  string
	ModifierID string
	CreateTime time.Time
	ModifyTime time.Time
}

type ruleRow struct {
	Body       []byte    `db:"body"`
	Enabled    bool      `db:"enabled"`
	CreatorID  string    `db:"creator_id"`
	ModifierID string    `db:"modifier_id"`
	CreateTime time.Time `db:"create_time"`
	ModifyTime time.Time `db:"modify_time"`
}

func (r *ruleRow) rule() StoredRule {
	var out StoredRule
	_ = json.Unmarshal(r.Body, &out.Rule) // written by this package from a valid rule
	out.Enabled = r.Enabled
	out.CreatorID, out.ModifierID, out.CreateTime, out.ModifyTime = r.CreatorID, r.ModifierID, r.CreateTime, r.ModifyTime
	return out
}

const ruleColumns = "r.body, r.enabled, r.creator_id, r.modifier_id, r.create_time, r.modify_time"

// RuleResource is the list engine's view of rules: terms on id, name,
// productId, severity, enabled, createTime, modifyTime.
var RuleResource = &meta.Resource{
	Name: "alarm rule",
	Columns: map[string]meta.Column{
		"id":         {Expr: "r.id", Kind: meta.KindText},
		"name":       {Expr: "r.name", Kind: meta.KindText},
		"productId":  {Expr: "r.product_id", Kind: meta.KindText},
		"severity":   {Expr: "r.severity", Kind: meta.KindText},
		"enabled":    {Expr: "r.enabled", Kind: meta.KindBool},
		"createTime": {Expr: "r.create_time", Kind: meta.KindTime},
		"modifyTime": {Expr: "r.modify_time", Kind: meta.KindTime},
	},
	Sorts: map[string]string{
		"id": meta.Natural("r.id"), "name": meta.Natural("r.name"), "productId": "r.product_id", "severity": "r.severity",
		"createTime": "r.create_time", "modifyTime": "r.modify_time",
	},
	DefaultSort: "r.create_time DESC, r.id",
	TieBreak:    meta.Natural("r.id"),
}

// QueryRules answers a query body over the rules of ctx's products.
func (s *Store) QueryRules(ctx context.Context, q *meta.Query) (meta.Page[StoredRule], error) {
	return ruleList.Query(ctx, s.ms, q, nil)
}

// ruleList is the rules' list statement.
var ruleList = meta.NewList(RuleResource, meta.ListSQL{
	Select: ruleColumns,
	From:   "alarm_rules r",
	Where:  []string{"r.product_id = ANY(@products)"},
}, (*ruleRow).rule)

func (s *Store) ctx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.timeout)
}

// GetRule returns rule id, meta.ErrNotFound when absent or outside ctx's
// products.
func (s *Store) GetRule(ctx context.Context, id string) (StoredRule, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	var row ruleRow
	err := s.db.GetContext(ctx, &row, "SELECT "+ruleColumns+" FROM alarm_rules r WHERE r.id = $1", id)
	if errors.Is(err, sql.ErrNoRows) {
		return StoredRule{}, fmt.Errorf("alarm rule %q: %w", id, meta.ErrNotFound)
	}
	if err != nil {
		return StoredRule{}, fmt.Errorf("alarm: get rule: %w", err)
	}
	r := row.rule()
	if !meta.ProductAllowed(ctx, r.ProductID) {
		return StoredRule{}, fmt.Errorf("alarm rule %q: %w", id, meta.ErrNotFound)
	}
	return r, nil
}

// AllRules returns every rule (the runner's; no product limit).
func (s *Store) AllRules(ctx context.Context) ([]Rule, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	var rows []ruleRow
	if err := s.db.SelectContext(ctx, &rows, "SELECT "+ruleColumns+" FROM alarm_rules r ORDER BY r.id"); err != nil {
		return nil, fmt.Errorf("alarm: rules: %w", err)
	}
	out := make([]Rule, len(rows))
	for i := range rows {
		out[i] = rows[i].rule().Rule
	}
	return out, nil
}

// ProductRules returns product's rules, by id.
func (s *Store) ProductRules(ctx context.Context, product string) ([]Rule, error) {
	if !meta.ProductAllowed(ctx, product) {
		return nil, fmt.Errorf("product %q: %w", product, meta.ErrNotFound)
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	var rows []ruleRow
	if err := s.db.SelectContext(ctx, &rows, "SELECT "+ruleColumns+" FROM alarm_rules r WHERE r.product_id = $1 ORDER BY r.id", product); err != nil {
		return nil, fmt.Errorf("alarm: rules: %w", err)
	}
	out := make([]Rule, len(rows))
	for i := range rows {
		out[i] = rows[i].rule().Rule
	}
	return out, nil
}

// RulesVersion changes whenever a rule is created, changed or deleted:
// the runner reloads its rules when it does.
func (s *Store) RulesVersion(ctx context.Context) (string, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	var v string
	err := s.db.GetContext(ctx, &v, `SELECT count(*)::text || '/' || coalesce(max(modify_time)::text, '') || '/' ||
		coalesce(sum(hashtext(id || enabled::text || modify_time::text))::text, '') FROM alarm_rules`)
	if err != nil {
		return "", fmt.Errorf("alarm: rules version: %w", err)
	}
	return v, nil
}

// PutRule creates r (create true: meta.ErrDuplicateKey if its id is
// taken) or replaces it (meta.ErrNotFound if absent). r must be valid;
// its product must be within ctx's products, and on update so must the
// stored rule's.
func (s *Store) PutRule(ctx context.Context, r Rule, create bool, by Actor) (StoredRule, error) {
	if !meta.ProductAllowed(ctx, r.ProductID) {
		return StoredRule{}, fmt.Errorf("product %q: %w", r.ProductID, meta.ErrNotFound)
	}
	tx, err := s.db.BeginTxx(ctx, nil)
	if err != nil {
		return StoredRule{}, fmt.Errorf("alarm: put rule: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	if err := putRule(ctx, tx, r, create, by); err != nil {
		return StoredRule{}, err
	}
	if err := tx.Commit(); err != nil {
		return StoredRule{}, fmt.Errorf("alarm: put rule: %w", err)
	}
	return s.GetRule(ctx, r.ID)
}

func putRule(ctx context.Context, tx *sqlx.Tx, r Rule, create bool, by Actor) error {
	body, err := json.Marshal(r)
	if err != nil {
		return err
	}
	if create {
		_, err := tx.ExecContext(ctx, `INSERT INTO alarm_rules (id, product_id, name, severity, enabled, body, creator_id, modifier_id)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $7)`, r.ID, r.ProductID, r.Name, r.Severity, r.Enabled, body, by.ID)
		var pe *pq.Error
		if errors.As(err, &pe) && pe.Code == "23505" {
			return fmt.Errorf("alarm rule %q: %w", r.ID, meta.ErrDuplicateKey)
		}
		if err != nil {
			return fmt.Errorf("alarm: create rule: %w", err)
		}
		return nil
	}
	var old string
	err = tx.GetContext(ctx, &old, "SELECT product_id FROM alarm_rules WHERE id = $1 FOR UPDATE", r.ID)
	if errors.Is(err, sql.ErrNoRows) || err == nil && !meta.ProductAllowed(ctx, old) {
		return fmt.Errorf("alarm rule %q: %w", r.ID, meta.ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("alarm: update rule: %w", err)
	}
	_, err = tx.ExecContext(ctx, `UPDATE alarm_rules SET product_id = $2, name = $3, severity = $4, enabled = $5, body = $6,
		modifier_id = $7, modify_time = clock_timestamp() WHERE id = $1`, r.ID, r.ProductID, r.Name, r.Severity, r.Enabled, body, by.ID)
	if err != nil {
		return fmt.Errorf("alarm: update rule: %w", err)
	}
	if !r.Enabled {
		return clearRuleAlarms(ctx, tx, r.ID, by, ReasonRuleDisabled)
	}
	return nil
}

// What a rule's active alarms are cleared with when the rule goes: the
// cleared transition's value and the record's clear_value.
const (
	ReasonRuleDisabled = "rule disabled"
	ReasonRuleDeleted  = "rule deleted"
)

// clearRuleAlarms clears rule's active alarms, by by with reason, each
// with a cleared transition (so its notifications follow, as for any
// clear). A rule disabled or deleted watches nothing: an alarm it left
// active would never clear by a value, and an operator would have to find
// and clear each by hand (ThingBoard and JetLinks users expect the
// alarms of a rule that is turned off to end with it). The rule's row is
// locked first (the caller updated or deleted it), as Store.Write locks
// it before writing the rule's transitions: the evaluator's batch either
// committed before (its alarms are cleared here) or is refused the rule's
// transitions after.
func clearRuleAlarms(ctx context.Context, tx *sqlx.Tx, rule string, by Actor, reason string) error {
	_, err := tx.ExecContext(ctx, `WITH c AS (
			UPDATE alarm_records SET state = 'cleared', cleared_time = now(), cleared_by = $2, clear_value = $3
			WHERE rule_id = $1 AND state = 'active' RETURNING id, severity)
		INSERT INTO alarm_transitions (record_id, time, kind, severity, value, user_id, username)
		SELECT id, now(), 'cleared', severity, $3, $4, $2 FROM c ORDER BY id`, rule, by.Name, reason, by.ID)
	if err != nil {
		return fmt.Errorf("alarm: clear the alarms of rule %q: %w", rule, err)
	}
	return nil
}

// SetEnabled enables or disables rule id. Disabling clears its active
// alarms (ReasonRuleDisabled, by by) in the same transaction.
func (s *Store) SetEnabled(ctx context.Context, id string, enabled bool, by Actor) (StoredRule, error) {
	r, err := s.GetRule(ctx, id)
	if err != nil {
		return StoredRule{}, err
	}
	r.Enabled = enabled
	return s.PutRule(ctx, r.Rule, false, by)
}

// DeleteRule deletes rule id and clears its active alarms
// (ReasonRuleDeleted, by by) in one transaction; its records stay (they
// are history, kept for the retention), and the evaluator's owner drops
// the rule's state at its next reload (within a second).
func (s *Store) DeleteRule(ctx context.Context, id string, by Actor) (StoredRule, error) {
	r, err := s.GetRule(ctx, id)
	if err != nil {
		return StoredRule{}, err
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	tx, err := s.db.BeginTxx(ctx, nil)
	if err != nil {
		return StoredRule{}, fmt.Errorf("alarm: delete rule: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, "DELETE FROM alarm_rules WHERE id = $1", id); err != nil {
		return StoredRule{}, fmt.Errorf("alarm: delete rule: %w", err)
	}
	if err := clearRuleAlarms(ctx, tx, id, by, ReasonRuleDeleted); err != nil {
		return StoredRule{}, err
	}
	if err := tx.Commit(); err != nil {
		return StoredRule{}, fmt.Errorf("alarm: delete rule: %w", err)
	}
	return r, nil
}

// ImportError is a refused import: the errors of each rule, by index.
type ImportError struct {
	Errors map[int]error
}

func (e *ImportError) Error() string {
	idx := slices.Sorted(maps.Keys(e.Errors))
	parts := make([]string, len(idx))
	for n, i := range idx {
		parts[n] = fmt.Sprintf("rules[%d].%v", i, e.Errors[i])
	}
	return strings.Join(parts, "; ")
}

// Unwrap makes an ImportError an illegal argument.
func (e *ImportError) Unwrap() error { return schema.ErrIllegalArgument }

// ImportRules validates rules as one set against m and writes them all
// or none into product (their productId is set to it): an id taken by
// another product's rule is an error of that rule; one of product's
// replaces it.
func (s *Store) ImportRules(ctx context.Context, product string, m *schema.ThingModel, rules []Rule, by Actor) error {
	if !meta.ProductAllowed(ctx, product) {
		return fmt.Errorf("product %q: %w", product, meta.ErrNotFound)
	}
	errs := map[int]error{}
	seen := map[string]int{}
	for i := range rules {
		rules[i].ProductID = product
		if err := rules[i].Validate(m); err != nil {
			errs[i] = err
			continue
		}
		if j, ok := seen[rules[i].ID]; ok {
			errs[i] = schema.Invalid("id", "the same id as rules[%d]", j)
		}
		seen[rules[i].ID] = i
	}
	tx, err := s.db.BeginTxx(ctx, nil)
	if err != nil {
		return fmt.Errorf("alarm: import: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	ids := make([]string, len(rules))
	for i := range rules {
		ids[i] = rules[i].ID
	}
	var owners []struct {
		ID      string `db:"id"`
		Product string `db:"product_id"`
	}
	if err := tx.SelectContext(ctx, &owners, "SELECT id, product_id FROM alarm_rules WHERE id = ANY($1) FOR UPDATE", pq.StringArray(ids)); err != nil {
		return fmt.Errorf("alarm: import: %w", err)
	}
	exists := map[string]bool{}
	for _, o := range owners {
		if o.Product != product {
			if i, ok := seen[o.ID]; ok && errs[i] == nil {
				errs[i] = schema.Invalid("id", "taken by a rule of another product")
			}
			continue
		}
		exists[o.ID] = true
	}
	if len(errs) > 0 {
		return &ImportError{Errors: errs}
	}
	for _, r := range rules {
		if err := putRule(ctx, tx, r, !exists[r.ID], by); err != nil {
			return err
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("alarm: import: %w", err)
	}
	return nil
}

// Record is an alarm record.
type Record struct {
	ID          int64      `db:"id" json:"id,string"`
	RuleID      string     `db:"rule_id" json:"ruleId"`
	RuleName    string     `db:"rule_name" json:"ruleName"`
	ProductID   string     `db:"product_id" json:"productId"`
	DeviceID    string     `db:"device_id" json:"deviceId"`
	Severity    string     `db:"severity" json:"severity"`
	State       string     `db:"state" json:"state"`
	Count       int64      `db:"count" json:"count"`
	FirstValue  string     `db:"first_value" json:"firstValue"`
	LastValue   string     `db:"last_value" json:"lastValue"`
	RaisedTime  time.Time  `db:"raised_time" json:"-"`
	LastTime    time.Time  `db:"last_time" json:"-"`
	ClearedTime *time.Time `db:"cleared_time" json:"-"`
	ClearedBy   string     `db:"cleared_by" json:"clearedBy,omitempty"`
	ClearValue  string     `db:"clear_value" json:"clearValue,omitempty"`
	Acked       bool       `db:"acked" json:"acknowledged"`
	AckedTime   *time.Time `db:"acked_time" json:"-"`
	AckedBy     string     `db:"acked_by" json:"acknowledgedBy,omitempty"`
	AckComment  string     `db:"ack_comment" json:"ackComment,omitempty"`
}

// Record states.
const (
	StateActive  = "active"
	StateCleared = "cleared"
)

const recordColumns = `a.id, a.rule_id, a.rule_name, a.product_id, a.device_id, a.severity, a.state, a.count,
	a.first_value, a.last_value, a.raised_time, a.last_time, a.cleared_time, a.cleared_by, a.clear_value,
	a.acked, a.acked_time, a.acked_by, a.ack_comment`

// RecordResource: terms on state, severity, productId, deviceId, ruleId,
// acknowledged and the times; newest first.
var RecordResource = &meta.Resource{
	Name: "alarm record",
	Columns: map[string]meta.Column{
		"id":           {Expr: "a.id", Kind: meta.KindInt},
		"state":        {Expr: "a.state", Kind: meta.KindText},
		"severity":     {Expr: "a.severity", Kind: meta.KindText},
		"productId":    {Expr: "a.product_id", Kind: meta.KindText},
		"deviceId":     {Expr: "a.device_id", Kind: meta.KindText},
		"ruleId":       {Expr: "a.rule_id", Kind: meta.KindText},
		"acknowledged": {Expr: "a.acked", Kind: meta.KindBool},
		"raisedTime":   {Expr: "a.raised_time", Kind: meta.KindTime},
		"lastTime":     {Expr: "a.last_time", Kind: meta.KindTime},
		"clearedTime":  {Expr: "a.cleared_time", Kind: meta.KindTime},
	},
	Sorts: map[string]string{
		"raisedTime": "a.raised_time", "lastTime": "a.last_time", "severity": "a.severity", "count": "a.count",
	},
	DefaultSort: "a.raised_time DESC, a.id DESC",
	TieBreak:    "a.id",
}

func recordConv(r *Record) Record { return *r }

// QueryRecords answers a query body over the records of ctx's products,
// newest first.
func (s *Store) QueryRecords(ctx context.Context, q *meta.Query) (meta.Page[Record], error) {
	return recordList.Query(ctx, s.ms, q, nil)
}

// recordList is the records' list statement.
var recordList = meta.NewList(RecordResource, meta.ListSQL{
	Select: recordColumns,
	From:   "alarm_records a",
	Where:  []string{"a.product_id = ANY(@products)"},
}, recordConv)

// GetRecord returns record id (meta.ErrNotFound outside ctx's products).
func (s *Store) GetRecord(ctx context.Context, id int64) (Record, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	var r Record
	err := s.db.GetContext(ctx, &r, "SELECT "+recordColumns+" FROM alarm_records a WHERE a.id = $1", id)
	if errors.Is(err, sql.ErrNoRows) || err == nil && !meta.ProductAllowed(ctx, r.ProductID) {
		return Record{}, fmt.Errorf("alarm record %d: %w", id, meta.ErrNotFound)
	}
	if err != nil {
		return Record{}, fmt.Errorf("alarm: record: %w", err)
	}
	return r, nil
}

// TransitionRow is a stored transition.
type TransitionRow struct {
	ID       int64     `db:"id" json:"id,string"`
	RecordID int64     `db:"record_id" json:"recordId,string"`
	Time     time.Time `db:"time" json:"-"`
	Kind     string    `db:"kind" json:"kind"`
	Severity string    `db:"severity" json:"severity"`
	Value    string    `db:"value" json:"value,omitempty"`
	UserID   string    `db:"user_id" json:"userId,omitempty"`
	Username string    `db:"username" json:"username,omitempty"`
	Comment  string    `db:"comment" json:"comment,omitempty"`
}

// Transitions returns record id's transitions, oldest first.
func (s *Store) Transitions(ctx context.Context, id int64) ([]TransitionRow, error) {
	if _, err := s.GetRecord(ctx, id); err != nil {
		return nil, err
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	out := []TransitionRow{}
	err := s.db.SelectContext(ctx, &out, "SELECT id, record_id, time, kind, severity, value, user_id, username, comment FROM alarm_transitions WHERE record_id = $1 ORDER BY id", id)
	if err != nil {
		return nil, fmt.Errorf("alarm: transitions: %w", err)
	}
	return out, nil
}

// ErrNotActive: a clear of an alarm that is cleared already.
var ErrNotActive = fmt.Errorf("alarm is not active: %w", schema.ErrIllegalArgument)

// Ack acknowledges record id (again: the latest ack's who and comment
// win; each is a transition).
func (s *Store) Ack(ctx context.Context, id int64, by Actor, comment string) (Record, error) {
	return s.byHand(ctx, id, by, comment, KindAcked)
}

// ClearByHand clears active record id. The evaluator's owner learns of it
// within a second (HandClears) and raises a new alarm the next time the
// trigger is met.
func (s *Store) ClearByHand(ctx context.Context, id int64, by Actor, comment string) (Record, error) {
	return s.byHand(ctx, id, by, comment, KindCleared)
}

func (s *Store) byHand(ctx context.Context, id int64, by Actor, comment, kind string) (Record, error) {
	if _, err := s.GetRecord(ctx, id); err != nil {
		return Record{}, err
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	tx, err := s.db.BeginTxx(ctx, nil)
	if err != nil {
		return Record{}, fmt.Errorf("alarm: %s: %w", kind, err)
	}
	defer func() { _ = tx.Rollback() }()
	var q string
	if kind == KindAcked {
		q = `UPDATE alarm_records SET acked = true, acked_time = now(), acked_by = $2, ack_comment = $3 WHERE id = $1 RETURNING severity`
	} else {
		q = `UPDATE alarm_records SET state = 'cleared', cleared_time = now(), cleared_by = $2, clear_value = $3
			WHERE id = $1 AND state = 'active' RETURNING severity`
	}
	var sev string
	err = tx.GetContext(ctx, &sev, q, id, by.Name, comment)
	if errors.Is(err, sql.ErrNoRows) {
		return Record{}, fmt.Errorf("alarm record %d: %w", id, ErrNotActive)
	}
	if err != nil {
		return Record{}, fmt.Errorf("alarm: %s: %w", kind, err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO alarm_transitions (record_id, time, kind, severity, user_id, username, comment)
		VALUES ($1, now(), $2, $3, $4, $5, $6)`, id, kind, sev, by.ID, by.Name, comment); err != nil {
		return Record{}, fmt.Errorf("alarm: %s: %w", kind, err)
	}
	if err := tx.Commit(); err != nil {
		return Record{}, fmt.Errorf("alarm: %s: %w", kind, err)
	}
	return s.GetRecord(ctx, id)
}

// HandClear is a (rule, device) whose alarm a user cleared; RaisedAt
// names that alarm (zero: the one active now).
type HandClear struct {
	RuleID, DeviceID string
	RaisedAt         time.Time
}

// HandClears returns the clears by hand after transition id since, and
// the id to ask from next.
func (s *Store) HandClears(ctx context.Context, since int64) ([]HandClear, int64, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	var rows []struct {
		ID     int64     `db:"id"`
		Rule   string    `db:"rule_id"`
		Device string    `db:"device_id"`
		Raised time.Time `db:"raised_time"`
	}
	err := s.db.SelectContext(ctx, &rows, `SELECT t.id, a.rule_id, a.device_id, a.raised_time FROM alarm_transitions t
		JOIN alarm_records a ON a.id = t.record_id
		WHERE t.kind = 'cleared' AND t.user_id <> '' AND t.id > $1 ORDER BY t.id`, since)
	if err != nil {
		return nil, since, fmt.Errorf("alarm: hand clears: %w", err)
	}
	out := make([]HandClear, len(rows))
	for i, r := range rows {
		out[i] = HandClear{r.Rule, r.Device, r.Raised}
		since = r.ID
	}
	return out, since, nil
}

// LastTransitionID is where HandClears starts for a new owner: the state
// it loads already says what earlier hand clears did (Load applies them).
func (s *Store) LastTransitionID(ctx context.Context) (int64, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	var id int64
	err := s.db.GetContext(ctx, &id, "SELECT coalesce(max(id), 0) FROM alarm_transitions")
	return id, err
}

// Claim makes the caller the evaluator's owner: it returns the new epoch,
// which every later Write names. A previous owner's writes fail with
// ErrNotOwner from then on.
func (s *Store) Claim(ctx context.Context) (int64, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	var epoch int64
	err := s.db.GetContext(ctx, &epoch, "UPDATE alarm_owner SET epoch = epoch + 1 WHERE id = 1 RETURNING epoch")
	if err != nil {
		return 0, fmt.Errorf("alarm: claim: %w", err)
	}
	return epoch, nil
}

// Load reads the evaluator's persisted state, a row per device. Rule
// states whose alarm a hand cleared (the state says active, no record
// is) come back inactive.
func (s *Store) Load(ctx context.Context) ([]DeviceRow, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	var active []struct {
		Rule   string `db:"rule_id"`
		Device string `db:"device_id"`
	}
	if err := s.db.SelectContext(ctx, &active, "SELECT rule_id, device_id FROM alarm_records WHERE state = 'active'"); err != nil {
		return nil, fmt.Errorf("alarm: load: %w", err)
	}
	isActive := make(map[HandClear]bool, len(active))
	for _, a := range active {
		isActive[HandClear{RuleID: a.Rule, DeviceID: a.Device}] = true
	}
	rows, err := s.db.QueryxContext(ctx, "SELECT device_id, product_id, data FROM alarm_state")
	if err != nil {
		return nil, fmt.Errorf("alarm: load: %w", err)
	}
	defer rows.Close()
	var out []DeviceRow
	for rows.Next() {
		var d DeviceRow
		if err := rows.Scan(&d.DeviceID, &d.ProductID, &d.Data); err != nil {
			return nil, fmt.Errorf("alarm: load: %w", err)
		}
		var row devRow
		if json.Unmarshal(d.Data, &row) == nil {
			cleared := false
			for id, sd := range row.Rules {
				if sd != nil && sd.Active && !isActive[HandClear{RuleID: id, DeviceID: d.DeviceID}] {
					sd.Active, sd.Sev, sd.ClearSince, sd.Deadline = false, 0, 0, 0
					cleared = true
				}
			}
			if cleared {
				d.Data = row.appendJSON(nil)
			}
		}
		out = append(out, d)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("alarm: load: %w", err)
	}
	return out, nil
}

// Write stores one batch in one transaction: the transitions the
// evaluator decided (records raised, updated, cleared; transition rows;
// the notify outbox's rows, by its trigger) and its changed state. It
// fails with ErrNotOwner when epoch is no longer the owner's, writing
// nothing.
//
// Its statements do not grow with the number of alarms it raises,
// escalates or clears: one checks the epoch, locks the rules and writes
// the touched devices' state rows (owned; the rows past stateChunk, a
// rule disabled, in writeState's statements at the end), one locks the
// active records and adds the repeats, then one per round writes the
// records and their transition rows (writeTransitions: one round unless
// an alarm changes twice in the batch: raised, then repeated or
// cleared). Each is a round trip (meta.Store.OneTrip), as are BEGIN and
// COMMIT; a batch with no transition (most of the batch lane's) is one
// statement and no transaction (writeRows).
//
// A hand may have cleared an alarm the evaluator still holds active: a
// repeat of it then raises a new alarm (the trigger met again after the
// hand's clear), returned in Reraised with its raise time; an escalation
// or clear of it is dropped, and the (rule, device) returned in Gone. The
// caller tells its evaluator (Forget, Reraised).
func (s *Store) Write(ctx context.Context, epoch int64, trs []Transition, devs []DeviceRow) (WriteResult, error) {
	// The bound of a batch grows with its rows: a rule disabled rewrites
	// the row of every device that had its state.
	ctx, cancel := context.WithTimeout(ctx, s.timeout+time.Duration(len(devs)+len(trs))*time.Millisecond)
	defer cancel()
	if len(trs) == 0 && len(devs) <= stateChunk {
		return WriteResult{}, s.writeRows(ctx, epoch, devs)
	}
	// One round trip a statement (meta.Store.OneTrip): Write passes no
	// []byte parameter, its arrays go as text.
	stx, err := s.ms.OneTrip().BeginTxx(ctx, nil)
	if err != nil {
		return WriteResult{}, fmt.Errorf("alarm: write: %w", err)
	}
	defer func() { _ = stx.Rollback() }()
	tx := writeTx{stx, s}
	first, rest := devs, []DeviceRow(nil)
	if len(devs) > stateChunk {
		first, rest = devs[:stateChunk], devs[stateChunk:]
	}
	if trs, err = owned(ctx, tx, epoch, trs, first); err != nil {
		return WriteResult{}, err
	}
	res, err := writeTransitions(ctx, tx, trs)
	if err != nil {
		return WriteResult{}, err
	}
	if err := writeState(ctx, tx, rest); err != nil {
		return WriteResult{}, err
	}
	if err := tx.Commit(); err != nil {
		return WriteResult{}, fmt.Errorf("alarm: write: %w", err)
	}
	return res, nil
}

// writeTx is Write's transaction; it counts the statements it sends.
type writeTx struct {
	*sqlx.Tx
	s *Store
}

func (t writeTx) ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error) {
	t.s.statements.Add(1)
	return t.Tx.ExecContext(ctx, q, args...)
}

func (t writeTx) GetContext(ctx context.Context, dest any, q string, args ...any) error {
	t.s.statements.Add(1)
	return t.Tx.GetContext(ctx, dest, q, args...)
}

func (t writeTx) SelectContext(ctx context.Context, dest any, q string, args ...any) error {
	t.s.statements.Add(1)
	return t.Tx.SelectContext(ctx, dest, q, args...)
}

// owned fails with ErrNotOwner unless epoch is the owner's, its row
// locked (FOR SHARE) until the batch commits: a Claim waits for it. It
// keeps the transitions of rules that exist and are enabled, their rows
// locked (FOR SHARE) as well: a rule disabled or deleted meanwhile (its
// alarms cleared with it, clearRuleAlarms) raises or repeats nothing,
// and one disabled after waits for the batch and clears what it raised.
// In the same statement it writes devs (at most stateChunk), the batch's
// state rows: nothing else writes alarm_state, so they take no lock
// another transaction could hold while it waits for the owner's or the
// rules' rows; and a failed check rolls them back with the transaction.
func owned(ctx context.Context, tx writeTx, epoch int64, trs []Transition, devs []DeviceRow) ([]Transition, error) {
	seen := map[string]bool{}
	ids := []string{}
	for _, t := range trs {
		if !seen[t.RuleID] {
			seen[t.RuleID] = true
			ids = append(ids, t.RuleID)
		}
	}
	slices.Sort(ids) // one lock order for every writer
	var row struct {
		Epoch int64          `db:"epoch"`
		Live  pq.StringArray `db:"live"`
	}
	err := tx.GetContext(ctx, &row, `WITH w AS (`+upsertState("true")+`)
		SELECT (SELECT epoch FROM alarm_owner WHERE id = 1 FOR SHARE) AS epoch,
		ARRAY(SELECT id FROM alarm_rules WHERE id = ANY($4) AND enabled ORDER BY id FOR SHARE) AS live`,
		append(stateArgs(devs), pq.StringArray(ids))...)
	if err != nil {
		return nil, fmt.Errorf("alarm: write: %w", err)
	}
	if row.Epoch != epoch {
		return nil, ErrNotOwner
	}
	if len(row.Live) == len(ids) {
		return trs, nil
	}
	ok := make(map[string]bool, len(row.Live))
	for _, id := range row.Live {
		ok[id] = true
	}
	return slices.DeleteFunc(trs, func(t Transition) bool { return !ok[t.RuleID] }), nil
}

// stateChunk bounds the rows of one statement of writeState.
const stateChunk = 10000

// upsertState writes devices' state rows if cond holds: $1 their ids,
// $2 their products, $3 the rows (JSON), as arrays (stateArgs).
func upsertState(cond string) string {
	return `INSERT INTO alarm_state (device_id, product_id, data)
	SELECT x.d, x.p, x.j FROM unnest($1::text[], $2::text[], $3::json[]) AS x(d, p, j) WHERE ` + cond + `
	ON CONFLICT (device_id) DO UPDATE SET product_id = EXCLUDED.product_id, data = EXCLUDED.data`
}

// stateArgs are upsertState's $1, $2 and $3 for devs.
func stateArgs(devs []DeviceRow) []any {
	return []any{
		textArray(devs, func(d *DeviceRow) string { return d.DeviceID }),
		textArray(devs, func(d *DeviceRow) string { return d.ProductID }),
		textArray(devs, func(d *DeviceRow) []byte { return d.Data }),
	}
}

// writeRows writes a batch of state rows and no transition (at most
// stateChunk) in one statement, outside a transaction: it checks the
// epoch (the owner's row locked FOR SHARE, as owned does) and writes the
// rows only if it is the owner's, so that they commit together or not
// at all. ErrNotOwner: nothing was written.
func (s *Store) writeRows(ctx context.Context, epoch int64, devs []DeviceRow) error {
	s.statements.Add(1)
	var got int64
	err := s.ms.OneTrip().GetContext(ctx, &got, `WITH o AS (SELECT epoch FROM alarm_owner WHERE id = 1 FOR SHARE),
		w AS (`+upsertState("(SELECT epoch FROM o) = $4")+`)
		SELECT coalesce((SELECT epoch FROM o), 0)`,
		append(stateArgs(devs), epoch)...)
	if err != nil {
		return fmt.Errorf("alarm: write state: %w", err)
	}
	if got != epoch {
		return ErrNotOwner
	}
	return nil
}

// writeState writes the touched devices' rows (their rule states in
// them): one statement per stateChunk rows (a rule disabled rewrites
// the rows of all the devices that had its state).
func writeState(ctx context.Context, tx writeTx, devs []DeviceRow) error {
	for chunk := range slices.Chunk(devs, stateChunk) {
		_, err := tx.ExecContext(ctx, upsertState("true"), stateArgs(chunk)...)
		if err != nil {
			return fmt.Errorf("alarm: write state: %w", err)
		}
	}
	return nil
}

// textArray is a column of rows as a PostgreSQL array literal, each
// element quoted ({"a","b\"c"}): what pq.StringArray sends, written in
// one pass (pq.StringArray copies each element twice, and the whole once).
func textArray[T string | []byte](rows []DeviceRow, col func(*DeviceRow) T) string {
	n := 2 + 3*len(rows)
	for i := range rows {
		n += len(col(&rows[i])) * 5 / 4 // a row's JSON: about one byte in six a quote to escape
	}
	b := make([]byte, 0, n)
	b = append(b, '{')
	for i := range rows {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '"')
		v := col(&rows[i])
		start := 0
		for j := 0; j < len(v); j++ {
			if c := v[j]; c == '"' || c == '\\' {
				b = append(append(b, v[start:j]...), '\\')
				start = j
			}
		}
		b = append(append(b, v[start:]...), '"')
	}
	return string(append(b, '}'))
}

// WriteResult says what a Write found cleared by hand.
type WriteResult struct {
	Gone     []HandClear // alarms a hand cleared: forget them
	Reraised []HandClear // new alarms raised by a repeat of one a hand cleared
	// Written is every transition the write stored (raised, escalated,
	// de-escalated, cleared; repeats are counts, not among them), in the
	// order they were written: what was announced must be what was
	// stored, which differs from what the evaluator decided where a hand
	// cleared an alarm meanwhile (a repeat stored as a new raise; a clear,
	// an escalation of the hand-cleared alarm dropped).
	Written []Transition
}

// writeTransitions applies trs, in order per (rule, device), with a
// number of statements that does not grow with the number of alarms the
// batch raises, escalates or clears: one that locks the active records
// of the alarms with such a change in the batch (and adds the repeats of
// the others: repeats are the bulk of a batch, every report meeting an
// active alarm's trigger), then one per round (plan): as many as the
// most changes one alarm has in the batch, one in most batches.
//
// Which alarms are active is all a batch's outcome depends on, and the
// lock fixes it: records are inserted only by the owner (the epoch) and
// changed otherwise only by a hand (a clear, an acknowledgement: they
// wait for the lock) or a rule's disabling (it waits for the rule rows
// owned locked). So the plan is decided here, as the statements one
// transition at a time would decide it, and run as few statements.
func writeTransitions(ctx context.Context, tx writeTx, trs []Transition) (WriteResult, error) {
	if len(trs) == 0 {
		return WriteResult{}, nil
	}
	changed := map[HandClear]bool{} // alarms with a transition other than a repeat
	for _, t := range trs {
		if t.Kind != KindRepeated {
			changed[HandClear{RuleID: t.RuleID, DeviceID: t.DeviceID}] = true
		}
	}
	// The repeats of the other alarms, folded: n of them, the last value
	// and time.
	only := map[HandClear]*repeats{}
	var onlyOrder []*repeats
	for _, t := range trs {
		k := HandClear{RuleID: t.RuleID, DeviceID: t.DeviceID}
		if changed[k] {
			continue
		}
		if r := only[k]; r != nil {
			r.n, r.last = r.n+1, t
			continue
		}
		only[k] = &repeats{first: t, last: t, n: 1}
		onlyOrder = append(onlyOrder, only[k])
	}
	lock := make([]HandClear, 0, len(changed))
	for _, t := range trs {
		if k := (HandClear{RuleID: t.RuleID, DeviceID: t.DeviceID}); changed[k] {
			lock = append(lock, k)
			changed[k] = false // listed
		}
	}
	for _, k := range lock {
		changed[k] = true
	}
	active, err := lockRecords(ctx, tx, onlyOrder, lock)
	if err != nil {
		return WriteResult{}, err
	}
	if tx.s.afterLock != nil {
		tx.s.afterLock()
	}
	p, res := plan(trs, changed, active)
	for _, round := range p {
		if err := writeRound(ctx, tx, round); err != nil {
			return WriteResult{}, err
		}
	}
	return res, nil
}

// repeats are n repeats of one alarm in a batch.
type repeats struct {
	first, last Transition
	n           int
}

// lockRecords adds the repeats of reps to their active records and locks
// the active records of keys (FOR UPDATE: a hand's clear or
// acknowledgement of one waits for the batch), in one statement. It
// returns which of both have an active record.
func lockRecords(ctx context.Context, tx writeTx, reps []*repeats, keys []HandClear) (map[HandClear]bool, error) {
	rules, devs, vals := make([]string, len(reps)), make([]string, len(reps)), make([]string, len(reps))
	ns, ats := make([]int64, len(reps)), make([]string, len(reps))
	for i, r := range reps {
		rules[i], devs[i], vals[i] = r.last.RuleID, r.last.DeviceID, r.last.Value
		ns[i], ats[i] = int64(r.n), r.last.At.UTC().Format(time.RFC3339Nano)
	}
	lrules, ldevs := make([]string, len(keys)), make([]string, len(keys))
	for i, k := range keys {
		lrules[i], ldevs[i] = k.RuleID, k.DeviceID
	}
	var found []struct {
		Rule   string `db:"rule_id"`
		Device string `db:"device_id"`
	}
	err := tx.SelectContext(ctx, &found, `WITH rep AS (
			UPDATE alarm_records a SET count = a.count + x.n, last_value = x.v, last_time = greatest(a.last_time, x.t)
			FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[], $5::timestamptz[]) AS x(r, d, n, v, t)
			WHERE a.rule_id = x.r AND a.device_id = x.d AND a.state = 'active'
			RETURNING a.rule_id, a.device_id),
		lk AS (
			SELECT a.rule_id, a.device_id FROM alarm_records a, unnest($6::text[], $7::text[]) AS y(r, d)
			WHERE a.rule_id = y.r AND a.device_id = y.d AND a.state = 'active'
			FOR UPDATE OF a)
		SELECT rule_id, device_id FROM rep UNION ALL SELECT rule_id, device_id FROM lk`,
		pq.StringArray(rules), pq.StringArray(devs), pq.Int64Array(ns), pq.StringArray(vals), pq.StringArray(ats),
		pq.StringArray(lrules), pq.StringArray(ldevs))
	if err != nil {
		return nil, fmt.Errorf("alarm: write: lock records: %w", err)
	}
	out := make(map[HandClear]bool, len(found))
	for _, f := range found {
		out[HandClear{RuleID: f.Rule, DeviceID: f.Device}] = true
	}
	return out, nil
}

// change is what one statement does to one alarm's record: insert it
// (a raise), or update the active one (repeats folded: n, the last value
// and time; an escalation's severity and time; a clear), with at most
// one transition row, its last piece.
type change struct {
	k      HandClear // the alarm: (rule, device)
	insert bool
	t      Transition // the transition (a raise, for an insert)
	tr     bool       // a transition row is written (t)
	n      int64      // repeats: count + n, last value v
	v      string
	lt     time.Time // last_time = greatest(last_time, lt); zero: none
	sev    string    // the record's new severity; "": unchanged
	clear  bool      // cleared at t.At with t.Value
	seq    int       // the order the statements one at a time would have written it
}

// plan decides, in the order trs came, what each alarm's record goes
// through, given which alarms had an active record when locked (active)
// (the repeats of the alarms with no other transition were added by
// lockRecords where it found the record). It is the order of statements one
// transition at a time would run, cut into rounds: round i holds each
// alarm's i-th change, so that no statement changes a record twice, and
// a record's transition row is the last of its changes in its statement.
// The outbox's trigger (ingest/notify, 00023_notify.sql) reads the
// record when the statement that inserted the transition row ends: it
// thus reads what it read when each transition had its own statements
// (the count, last value and state of the record then), and repeats
// after a transition go in a later round. Most batches are one round;
// an alarm raised, then repeated or cleared in one batch makes it two or
// more.
func plan(trs []Transition, changed, active map[HandClear]bool) ([][]change, WriteResult) {
	var res WriteResult
	byKey := map[HandClear][]change{}
	var keys []HandClear
	seq := 0
	add := func(k HandClear, c change) {
		seq++
		c.k, c.seq = k, seq
		cs := byKey[k]
		if len(cs) == 0 {
			keys = append(keys, k)
		}
		if n := len(cs); n > 0 && !cs[n-1].insert && !cs[n-1].tr && !c.insert {
			// Repeats before this change of the same record: one update.
			p := &cs[n-1]
			p.n += c.n
			if c.n > 0 {
				p.v = c.v
			}
			if c.lt.After(p.lt) {
				p.lt = c.lt
			}
			p.t, p.tr, p.sev, p.clear, p.seq = c.t, c.tr, c.sev, c.clear, c.seq
			return
		}
		byKey[k] = append(cs, c)
	}
	// reraise: n repeats found no active record (a hand cleared it): the
	// trigger met again is a new alarm, raised by the first.
	reraise := func(k HandClear, r *repeats) {
		first := r.first
		first.Kind = KindRaised
		add(k, change{insert: true, t: first, tr: true})
		active[k] = true
		if r.n > 1 {
			add(k, change{n: int64(r.n - 1), v: r.last.Value, lt: r.last.At})
		}
		res.Reraised = append(res.Reraised, HandClear{RuleID: first.RuleID, DeviceID: first.DeviceID, RaisedAt: first.At})
	}
	lost := map[HandClear]bool{}
	pending := map[HandClear]*repeats{}
	var order []HandClear
	flush := func(k HandClear) {
		r := pending[k]
		if r == nil {
			return
		}
		delete(pending, k)
		switch {
		case !changed[k]:
			if !active[k] { // lockRecords added them where it found the record
				reraise(k, r)
			}
		case active[k]:
			add(k, change{n: int64(r.n), v: r.last.Value, lt: r.last.At})
		default:
			reraise(k, r)
		}
	}
	for _, t := range trs {
		k := HandClear{RuleID: t.RuleID, DeviceID: t.DeviceID}
		if t.Kind == KindRepeated {
			if lost[k] {
				continue
			}
			if r := pending[k]; r != nil {
				r.n, r.last = r.n+1, t
			} else {
				pending[k] = &repeats{first: t, last: t, n: 1}
				order = append(order, k)
			}
			continue
		}
		flush(k)
		switch t.Kind {
		case KindRaised:
			delete(lost, k)
			if active[k] { // one active already (the state was lost or rebuilt): a repeat of it
				add(k, change{n: 1, v: t.Value, lt: t.At})
				continue
			}
			add(k, change{insert: true, t: t, tr: true})
			active[k] = true
		case KindEscalated, KindDeescalated, KindCleared:
			if lost[k] {
				continue
			}
			if !active[k] {
				lost[k] = true
				res.Gone = append(res.Gone, k)
				continue
			}
			c := change{t: t, tr: true}
			if t.Kind == KindCleared {
				c.clear = true
				active[k] = false
			} else {
				c.sev, c.lt = t.Severity, t.At
			}
			add(k, c)
		}
	}
	for _, k := range order {
		flush(k)
	}
	var rounds [][]change
	for _, k := range keys {
		for i, c := range byKey[k] {
			if i == len(rounds) {
				rounds = append(rounds, nil)
			}
			rounds[i] = append(rounds[i], c)
		}
	}
	for _, r := range rounds {
		slices.SortFunc(r, func(a, b change) int { return a.seq - b.seq })
	}
	var written []change
	for _, k := range keys {
		for _, c := range byKey[k] {
			if c.tr {
				written = append(written, c)
			}
		}
	}
	slices.SortFunc(written, func(a, b change) int { return a.seq - b.seq })
	for _, c := range written {
		res.Written = append(res.Written, c.t)
	}
	return rounds, res
}

// writeRound runs one round of changes, each of another record, in one
// statement: the records inserted, those updated, then the transition
// rows, in the order they would have been written one at a time (the
// outbox's rows follow it).
func writeRound(ctx context.Context, tx writeTx, cs []change) error {
	n := len(cs)
	var (
		seqs, counts                             = make([]int64, n), make([]int64, n)
		inserts, clears, trows                   = make([]bool, n), make([]bool, n), make([]bool, n)
		rules, names, products, devs, vals, sevs = make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		lts, kinds, tsevs, tvals, tats           = make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		wantIns, wantUpd, wantTr                 int64
	)
	for i, c := range cs {
		seqs[i], counts[i], inserts[i], clears[i], trows[i] = int64(c.seq), c.n, c.insert, c.clear, c.tr
		rules[i], names[i], products[i], devs[i] = c.k.RuleID, c.t.RuleName, c.t.ProductID, c.k.DeviceID
		vals[i], sevs[i] = c.v, c.sev
		lts[i] = "-infinity"
		if !c.lt.IsZero() {
			lts[i] = c.lt.UTC().Format(time.RFC3339Nano)
		}
		kinds[i], tsevs[i], tvals[i], tats[i] = c.t.Kind, c.t.Severity, c.t.Value, c.t.At.UTC().Format(time.RFC3339Nano)
		if c.insert {
			wantIns++
		} else {
			wantUpd++
		}
		if c.tr {
			wantTr++
		}
	}
	var got struct {
		Ins int64 `db:"ins"`
		Upd int64 `db:"upd"`
		Tr  int64 `db:"tr"`
	}
	err := tx.GetContext(ctx, &got, `WITH x AS (
			SELECT * FROM unnest($1::bigint[], $2::bool[], $3::text[], $4::text[], $5::text[], $6::text[],
				$7::bigint[], $8::text[], $9::timestamptz[], $10::text[], $11::bool[],
				$12::bool[], $13::text[], $14::text[], $15::text[], $16::timestamptz[])
				AS x(seq, ins, r, rn, p, d, n, v, lt, sev, clr, tr, tk, ts, tv, ta)),
		ins AS (
			INSERT INTO alarm_records (rule_id, rule_name, product_id, device_id, severity, state,
				count, first_value, last_value, raised_time, last_time)
			SELECT r, rn, p, d, ts, 'active', 1, tv, tv, ta, ta FROM x WHERE ins ORDER BY seq
			RETURNING id, rule_id, device_id),
		upd AS (
			UPDATE alarm_records a SET count = a.count + x.n,
				last_value = CASE WHEN x.n > 0 THEN x.v ELSE a.last_value END,
				last_time = greatest(a.last_time, x.lt),
				severity = CASE WHEN x.sev = '' THEN a.severity ELSE x.sev END,
				state = CASE WHEN x.clr THEN 'cleared' ELSE a.state END,
				cleared_time = CASE WHEN x.clr THEN x.ta ELSE a.cleared_time END,
				clear_value = CASE WHEN x.clr THEN x.tv ELSE a.clear_value END
			FROM x WHERE NOT x.ins AND a.rule_id = x.r AND a.device_id = x.d AND a.state = 'active'
			RETURNING a.id, a.rule_id, a.device_id),
		tr AS (
			INSERT INTO alarm_transitions (record_id, time, kind, severity, value)
			SELECT coalesce(ins.id, upd.id), x.ta, x.tk, x.ts, x.tv FROM x
				LEFT JOIN ins ON ins.rule_id = x.r AND ins.device_id = x.d
				LEFT JOIN upd ON upd.rule_id = x.r AND upd.device_id = x.d
			WHERE x.tr ORDER BY x.seq
			RETURNING 1)
		SELECT (SELECT count(*) FROM ins) AS ins, (SELECT count(*) FROM upd) AS upd, (SELECT count(*) FROM tr) AS tr`,
		pq.Int64Array(seqs), pq.BoolArray(inserts), pq.StringArray(rules), pq.StringArray(names), pq.StringArray(products), pq.StringArray(devs),
		pq.Int64Array(counts), pq.StringArray(vals), pq.StringArray(lts), pq.StringArray(sevs), pq.BoolArray(clears),
		pq.BoolArray(trows), pq.StringArray(kinds), pq.StringArray(tsevs), pq.StringArray(tvals), pq.StringArray(tats))
	if err != nil {
		return fmt.Errorf("alarm: write: records: %w", err)
	}
	if got.Ins != wantIns || got.Upd != wantUpd || got.Tr != wantTr {
		// The lock makes this impossible; said rather than written wrong.
		return fmt.Errorf("alarm: write: records changed under the batch (inserted %d of %d, updated %d of %d)", got.Ins, wantIns, got.Upd, wantUpd)
	}
	return nil
}

// Purge deletes cleared records cleared before before (retention), with
// their transitions; it returns how many.
func (s *Store) Purge(ctx context.Context, before time.Time) (int64, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	res, err := s.db.ExecContext(ctx, "DELETE FROM alarm_records WHERE state = 'cleared' AND cleared_time < $1", before)
	if err != nil {
		return 0, fmt.Errorf("alarm: purge: %w", err)
	}
	return res.RowsAffected()
}

// ActiveCounts is the number of active alarms by severity within ctx's
// products.
func (s *Store) ActiveCounts(ctx context.Context) (map[string]int64, error) {
	if s.beforeCounts != nil {
		s.beforeCounts()
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	all, products := meta.ProductsOf(ctx)
	var arg any
	if !all {
		arg = pq.StringArray(products)
	}
	var rows []struct {
		Severity string `db:"severity"`
		N        int64  `db:"n"`
	}
	err := s.db.SelectContext(ctx, &rows, `SELECT severity, count(*) AS n FROM alarm_records
		WHERE state = 'active' AND ($1::text[] IS NULL OR product_id = ANY($1::text[])) GROUP BY severity`, arg)
	if err != nil {
		return nil, fmt.Errorf("alarm: active counts: %w", err)
	}
	out := map[string]int64{}
	for _, s := range Severities() {
		out[s] = 0
	}
	for _, r := range rows {
		out[r.Severity] = r.N
	}
	return out, nil
}

// CountQuery counts alarms raised in buckets: Starts are the buckets'
// starts, newest first, End the end of the newest; the other fields narrow
// it when set. The product limit comes from ctx.
type CountQuery struct {
	Starts    []time.Time
	End       time.Time
	ProductID string
	DeviceID  string
	Severity  string
	State     string
}

// Counts returns the number of alarms raised in each bucket of q, newest
// first (endpoint 14's alarm counts), within ctx's products.
func (s *Store) Counts(ctx context.Context, q CountQuery) ([]uint64, error) {
	out := make([]uint64, len(q.Starts))
	if len(q.Starts) == 0 {
		return out, nil
	}
	all, products := meta.ProductsOf(ctx)
	var limit any
	if !all {
		limit = pq.StringArray(products)
	}
	asc := make([]string, len(q.Starts))
	for i, t := range q.Starts {
		asc[len(asc)-1-i] = t.UTC().Format(time.RFC3339Nano)
	}
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	var rows []struct {
		B int   `db:"b"`
		N int64 `db:"n"`
	}
	err := s.db.SelectContext(ctx, &rows, `SELECT width_bucket(raised_time, $1::timestamptz[]) AS b, count(*) AS n
		FROM alarm_records
		WHERE raised_time >= $2 AND raised_time < $3
			AND ($4 = '' OR product_id = $4) AND ($5 = '' OR device_id = $5)
			AND ($6 = '' OR severity = $6) AND ($7 = '' OR state = $7)
			AND ($8::text[] IS NULL OR product_id = ANY($8::text[]))
		GROUP BY b`, pq.StringArray(asc), q.Starts[len(q.Starts)-1], q.End, q.ProductID, q.DeviceID, q.Severity, q.State, limit)
	if err != nil {
		return nil, fmt.Errorf("alarm: counts: %w", err)
	}
	for _, r := range rows {
		if i := len(out) - r.B; r.B >= 1 && i >= 0 {
			out[i] = uint64(r.N)
		}
	}
	return out, nil
}

// DeviceValues reads, of the devices of products changed after since
// (zero: all of them), the tag values and configuration keys thresholds
// may name (Condition.Ref): by device id, keyed "tag.<key>" and
// "config.<key>", only the keys in want. It returns the latest
// modification time it read (since when none), from which the next call
// asks.
func (s *Store) DeviceValues(ctx context.Context, products []string, want map[string]bool, since time.Time) (map[string]map[string]Value, time.Time, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	rows, err := s.db.QueryxContext(ctx, `SELECT id, configuration, tags, modify_time FROM devices
		WHERE product_id = ANY($1) AND modify_time > $2`, pq.StringArray(products), since)
	if err != nil {
		return nil, since, fmt.Errorf("alarm: device values: %w", err)
	}
	defer rows.Close()
	out := map[string]map[string]Value{}
	for rows.Next() {
		var id string
		var conf, tags []byte
		var mt time.Time
		if err := rows.Scan(&id, &conf, &tags, &mt); err != nil {
			return nil, since, fmt.Errorf("alarm: device values: %w", err)
		}
		if mt.After(since) {
			since = mt
		}
		vals := map[string]Value{}
		var cm map[string]json.RawMessage
		if json.Unmarshal(conf, &cm) == nil {
			for k, raw := range cm {
				if want[RefConfig+"."+k] {
					if v, ok := scalarValue(raw); ok {
						vals[RefConfig+"."+k] = v
					}
				}
			}
		}
		var tl []struct {
			Key   string          `json:"key"`
			Value json.RawMessage `json:"value"`
		}
		if json.Unmarshal(tags, &tl) == nil {
			for _, t := range tl {
				if want[RefTag+"."+t.Key] {
					if v, ok := scalarValue(t.Value); ok {
						vals[RefTag+"."+t.Key] = v
					}
				}
			}
		}
		out[id] = vals
	}
	if err := rows.Err(); err != nil {
		return nil, since, fmt.Errorf("alarm: device values: %w", err)
	}
	return out, since, nil
}

// scalarValue is a JSON number, string or boolean as a Value; a string
// holding a number is that number (tags are text).
func scalarValue(raw json.RawMessage) (Value, bool) {
	txt, ok := scalarText(raw)
	if !ok {
		return Value{}, false
	}
	if f, err := strconv.ParseFloat(strings.TrimSpace(txt), 64); err == nil {
		return NumberValue(f), true
	}
	if raw[0] == 't' || raw[0] == 'f' {
		return BoolValue(raw[0] == 't'), true
	}
	return StringValue(txt), true
}
