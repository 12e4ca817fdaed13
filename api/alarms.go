package api

import (
	"context"
	"encoding/json"
	"errors"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"

	"devicehub/ingest/alarm"
	"devicehub/meta"
	"devicehub/schema"
	"devicehub/schema/jsonw"
)

// Alarms (ingest/alarm): rules per product at /api/alarm/config, records
// at /api/alarm/record. Rules are validated against their product's thing
// model here; the store keeps them, and the evaluator's owner reads them.
// Every route is product-scoped: a rule or record of a product outside
// the caller's is 404, as if absent; lists cover the caller's products.

// AlarmStore is what the alarm routes need; *alarm.Store is one.
type AlarmStore interface {
	QueryRules(ctx context.Context, q *meta.Query) (meta.Page[alarm.StoredRule], error)
	GetRule(ctx context.Context, id string) (alarm.StoredRule, error)
	PutRule(ctx context.Context, r alarm.Rule, create bool, by alarm.Actor) (alarm.StoredRule, error)
	SetEnabled(ctx context.Context, id string, enabled bool, by alarm.Actor) (alarm.StoredRule, error)
	DeleteRule(ctx context.Context, id string, by alarm.Actor) (alarm.StoredRule, error)
	ProductRules(ctx context.Context, product string) ([]alarm.Rule, error)
	ImportRules(ctx context.Context, product string, m *schema.ThingModel, rules []alarm.Rule, by alarm.Actor) error
	QueryRecords(ctx context.Context, q *meta.Query) (meta.Page[alarm.Record], error)
	GetRecord(ctx context.Context, id int64) (alarm.Record, error)
	Transitions(ctx context.Context, id int64) ([]alarm.TransitionRow, error)
	Ack(ctx context.Context, id int64, by alarm.Actor, comment string) (alarm.Record, error)
	ClearByHand(ctx context.Context, id int64, by alarm.Actor, comment string) (alarm.Record, error)
	ActiveCounts(ctx context.Context) (map[string]int64, error)
	Counts(ctx context.Context, q alarm.CountQuery) ([]uint64, error)
}

var errNoAlarms = errors.New("api: no alarm store")

func (s *Server) alarms() (AlarmStore, error) {
	if s.deps.Alarms == nil {
		return nil, errNoAlarms
	}
	return s.deps.Alarms, nil
}

func actor(c *fiber.Ctx) alarm.Actor {
	u := currentUser(c)
	name := u.Username
	if name == "" {
		name = u.Name
	}
	return alarm.Actor{ID: u.ID, Name: name}
}

// ruleJSON is a rule as the API writes it: the rule and its bookkeeping.
type ruleJSON struct {
	alarm.Rule
	CreatorID  string `json:"creatorId"`
	ModifierID string `json:"modifierId"`
	CreateTime int64  `json:"createTime"`
	ModifyTime int64  `json:"modifyTime"`
}

func ruleView(r *alarm.StoredRule) ruleJSON {
	return ruleJSON{Rule: r.Rule, CreatorID: r.CreatorID, ModifierID: r.ModifierID,
		CreateTime: r.CreateTime.UnixMilli(), ModifyTime: r.ModifyTime.UnixMilli()}
}

func appendRule(r *alarm.StoredRule, b []byte) []byte {
	j, _ := json.Marshal(ruleView(r)) // a stored, valid rule: cannot fail
	return append(b, j...)
}

// recordJSON is a record as the API writes it, times in epoch ms (0: not
// yet).
type recordJSON struct {
	alarm.Record
	RaisedTime   int64 `json:"raisedTime"`
	LastTime     int64 `json:"lastTime"`
	ClearedTime  int64 `json:"clearedTime"`
	AckedTime    int64 `json:"acknowledgedTime"`
	SeverityRank int   `json:"severityRank"` // 5 critical .. 1 info, for sorting by hand
}

func recordView(r *alarm.Record) recordJSON {
	ms := func(t *time.Time) int64 {
		if t == nil {
			return 0
		}
		return t.UnixMilli()
	}
	rank := 0
	for i, sev := range alarm.Severities() {
		if sev == r.Severity {
			rank = 5 - i
		}
	}
	return recordJSON{Record: *r, RaisedTime: r.RaisedTime.UnixMilli(), LastTime: r.LastTime.UnixMilli(),
		ClearedTime: ms(r.ClearedTime), AckedTime: ms(r.AckedTime), SeverityRank: rank}
}

// appendRecord appends r as encoding/json writes recordView(r)
// (TestAppendRecord compares them), without reflection.
func appendRecord(r *alarm.Record, b []byte) []byte {
	v := recordView(r)
	b = append(b, '{')
	b = jsonw.String(appendField(b, "id", true), strconv.FormatInt(r.ID, 10))
	b = appendStringField(b, "ruleId", r.RuleID)
	b = appendStringField(b, "ruleName", r.RuleName)
	b = appendStringField(b, "productId", r.ProductID)
	b = appendStringField(b, "deviceId", r.DeviceID)
	b = appendStringField(b, "severity", r.Severity)
	b = appendStringField(b, "state", r.State)
	b = appendIntField(b, "count", r.Count)
	b = appendStringField(b, "firstValue", r.FirstValue)
	b = appendStringField(b, "lastValue", r.LastValue)
	for _, f := range [...]struct{ name, v string }{{"clearedBy", r.ClearedBy}, {"clearValue", r.ClearValue}} {
		if f.v != "" {
			b = appendStringField(b, f.name, f.v)
		}
	}
	b = appendBoolField(b, "acknowledged", r.Acked)
	for _, f := range [...]struct{ name, v string }{{"acknowledgedBy", r.AckedBy}, {"ackComment", r.AckComment}} {
		if f.v != "" {
			b = appendStringField(b, f.name, f.v)
		}
	}
	b = appendIntField(b, "raisedTime", v.RaisedTime)
	b = appendIntField(b, "lastTime", v.LastTime)
	b = appendIntField(b, "clearedTime", v.ClearedTime)
	b = appendIntField(b, "acknowledgedTime", v.AckedTime)
	b = appendIntField(b, "severityRank", int64(v.SeverityRank))
	return append(b, '}')
}

func (s *Server) queryAlarmRules(c *fiber.Ctx) error {
	store, err := s.alarms()
	if err != nil {
		return err
	}
	return queryPage(c, store.QueryRules, appendRule)
}

// queryPage answers a list query: the query body, decoded, run by query
// within the request's products, the page written item by item.
func queryPage[T any](c *fiber.Ctx, query func(context.Context, *meta.Query) (meta.Page[T], error), item func(*T, []byte) []byte) error {
	q, err := queryBody(c)
	if err != nil {
		return err
	}
	page, err := query(c.UserContext(), q)
	if err != nil {
		return err
	}
	return okPage(c, &page, item)
}

// ruleAction answers a route of one rule: act, given the request's
// context and the store, does what the route does and returns the rule,
// which is written back.
func (s *Server) ruleAction(c *fiber.Ctx, act func(context.Context, AlarmStore) (alarm.StoredRule, error)) error {
	store, err := s.alarms()
	if err != nil {
		return err
	}
	r, err := act(c.UserContext(), store)
	if err != nil {
		return err
	}
	return okItem(c, &r, appendRule)
}

func (s *Server) getAlarmRule(c *fiber.Ctx) error {
	return s.ruleAction(c, func(ctx context.Context, store AlarmStore) (alarm.StoredRule, error) {
		return store.GetRule(ctx, c.Params("id"))
	})
}

// alarmProductModel is the thing model of product (meta.ErrNotFound outside
// the caller's products).
func (s *Server) alarmProductModel(ctx context.Context, product string) (*schema.ThingModel, error) {
	p, err := s.deps.Products.GetProduct(ctx, product)
	if err != nil {
		return nil, err
	}
	if strings.TrimSpace(p.Metadata) == "" {
		return schema.EmptyThingModel(), nil
	}
	return schema.ParseThingModelString(p.Metadata)
}

// ruleBody reads and validates a rule against its product's thing model.
func (s *Server) ruleBody(c *fiber.Ctx) (alarm.Rule, error) {
	body, err := checkedBody(c)
	if err != nil {
		return alarm.Rule{}, err
	}
	r, err := alarm.ParseRule(body)
	if err != nil {
		return alarm.Rule{}, err
	}
	if r.ProductID == "" {
		return alarm.Rule{}, schema.Invalid("productId", "required")
	}
	m, err := s.alarmProductModel(c.UserContext(), r.ProductID)
	if err != nil {
		return alarm.Rule{}, err
	}
	if err := r.Validate(m); err != nil {
		return alarm.Rule{}, err
	}
	return r, nil
}

func (s *Server) createAlarmRule(c *fiber.Ctx) error { return s.putAlarmRule(c, true) }
func (s *Server) updateAlarmRule(c *fiber.Ctx) error { return s.putAlarmRule(c, false) }

// putAlarmRule creates a rule, or replaces the rule of the path (whose
// body may leave its id out, or must name the same).
func (s *Server) putAlarmRule(c *fiber.Ctx, create bool) error {
	return s.ruleAction(c, func(ctx context.Context, store AlarmStore) (alarm.StoredRule, error) {
		if !create {
			if err := pathRuleID(c); err != nil {
				return alarm.StoredRule{}, err
			}
		}
		r, err := s.ruleBody(c)
		if err != nil {
			return alarm.StoredRule{}, err
		}
		return store.PutRule(ctx, r, create, actor(c))
	})
}

// pathRuleID puts the path's rule id into a body that leaves it out, and
// refuses one that names another.
func pathRuleID(c *fiber.Ctx) error {
	var probe struct {
		ID string `json:"id"`
	}
	if err := decodeJSON(c, &probe); err != nil {
		return err
	}
	id := c.Params("id")
	if probe.ID == "" {
		var raw map[string]json.RawMessage
		_ = json.Unmarshal(c.Body(), &raw)
		raw["id"], _ = json.Marshal(id)
		b, _ := json.Marshal(raw)
		c.Request().SetBody(b)
	} else if probe.ID != id {
		return schema.Invalid("id", "%q is not the rule of the path, %q", probe.ID, id)
	}
	return nil
}

// deleteAlarmRule deletes a rule; its active alarms are cleared ("rule
// deleted", by the caller).
func (s *Server) deleteAlarmRule(c *fiber.Ctx) error {
	return s.ruleAction(c, func(ctx context.Context, store AlarmStore) (alarm.StoredRule, error) {
		return store.DeleteRule(ctx, c.Params("id"), actor(c))
	})
}

func (s *Server) enableAlarmRule(c *fiber.Ctx) error  { return s.setAlarmRuleEnabled(c, true) }
func (s *Server) disableAlarmRule(c *fiber.Ctx) error { return s.setAlarmRuleEnabled(c, false) }

// setAlarmRuleEnabled enables or disables a rule; disabling clears its
// active alarms ("rule disabled", by the caller).
func (s *Server) setAlarmRuleEnabled(c *fiber.Ctx, enabled bool) error {
	return s.ruleAction(c, func(ctx context.Context, store AlarmStore) (alarm.StoredRule, error) {
		return store.SetEnabled(ctx, c.Params("id"), enabled, actor(c))
	})
}

// ruleDocument is a product's rules as one document (export, import).
type ruleDocument struct {
	ProductID string       `json:"productId,omitempty"`
	Rules     []alarm.Rule `json:"rules"`
}

func (s *Server) exportAlarmRules(c *fiber.Ctx) error {
	store, err := s.alarms()
	if err != nil {
		return err
	}
	product := c.Params("productId")
	if _, err := s.deps.Products.GetProduct(c.UserContext(), product); err != nil {
		return err
	}
	rules, err := store.ProductRules(c.UserContext(), product)
	if err != nil {
		return err
	}
	return ok(c, ruleDocument{ProductID: product, Rules: rules})
}

// importError is one rule's refusal in an import's result.
type importError struct {
	Index   int    `json:"index"`
	Field   string `json:"field,omitempty"`
	Message string `json:"message"`
}

// importRefused refuses an import: the refused rules, in index order, the
// first of which the message names (errors.go: 400 illegal_argument with
// every refused rule as the result).
type importRefused []importError

func (r importRefused) Error() string {
	return "rules[" + strconv.Itoa(r[0].Index) + "]." + r[0].Field + ": " + safeText(r[0].Message) + " (nothing imported)"
}

// importAlarmRules validates a document's rules as one set against the
// product's thing model and writes all of them (into this product) or
// none: a refusal is 400 with each refused rule's index, field and
// message.
func (s *Server) importAlarmRules(c *fiber.Ctx) error {
	store, err := s.alarms()
	if err != nil {
		return err
	}
	product := c.Params("productId")
	body, err := checkedBody(c)
	if err != nil {
		return err
	}
	var doc struct {
		Rules []json.RawMessage `json:"rules"`
	}
	if err := json.Unmarshal(body, &doc); err != nil {
		return schema.Invalid("body", "a document {\"rules\": [...]}")
	}
	m, err := s.alarmProductModel(c.UserContext(), product)
	if err != nil {
		return err
	}
	rules := make([]alarm.Rule, len(doc.Rules))
	var refused []importError
	for i, raw := range doc.Rules {
		r, err := alarm.ParseRule(raw)
		if err != nil {
			refused = append(refused, refusal(i, err))
			continue
		}
		rules[i] = r
	}
	if len(refused) == 0 {
		err = store.ImportRules(c.UserContext(), product, m, rules, actor(c))
		var ie *alarm.ImportError
		if errors.As(err, &ie) {
			for i, e := range ie.Errors {
				refused = append(refused, refusal(i, e))
			}
		} else if err != nil {
			return err
		}
	}
	if len(refused) > 0 {
		sort.Slice(refused, func(a, b int) bool { return refused[a].Index < refused[b].Index })
		return importRefused(refused)
	}
	return ok(c, map[string]int{"imported": len(rules)})
}

func refusal(i int, err error) importError {
	var ae *schema.ArgError
	if errors.As(err, &ae) {
		return importError{Index: i, Field: ae.Field, Message: ae.Msg}
	}
	return importError{Index: i, Message: err.Error()}
}

func (s *Server) queryAlarmRecords(c *fiber.Ctx) error {
	store, err := s.alarms()
	if err != nil {
		return err
	}
	return queryPage(c, store.QueryRecords, appendRecord)
}

// activeAlarms is the number of active alarms by severity, within the
// caller's products.
func (s *Server) activeAlarms(c *fiber.Ctx) error {
	store, err := s.alarms()
	if err != nil {
		return err
	}
	counts, err := store.ActiveCounts(c.UserContext())
	if err != nil {
		return err
	}
	return ok(c, counts)
}

// alarmRecord answers the start of a record's route: the alarm store and
// the record id the route names.
func (s *Server) alarmRecord(c *fiber.Ctx) (AlarmStore, int64, error) {
	store, err := s.alarms()
	if err != nil {
		return nil, 0, err
	}
	id, err := strconv.ParseInt(c.Params("id"), 10, 64)
	if err != nil || id <= 0 {
		return nil, 0, meta.ErrNotFound // no such record
	}
	return store, id, nil
}

func (s *Server) getAlarmRecord(c *fiber.Ctx) error {
	store, id, err := s.alarmRecord(c)
	if err != nil {
		return err
	}
	r, err := store.GetRecord(c.UserContext(), id)
	if err != nil {
		return err
	}
	trs, err := store.Transitions(c.UserContext(), id)
	if err != nil {
		return err
	}
	type transitionJSON struct {
		alarm.TransitionRow
		Time int64 `json:"time"`
	}
	out := struct {
		recordJSON
		Transitions []transitionJSON `json:"transitions"`
	}{recordJSON: recordView(&r), Transitions: []transitionJSON{}}
	for _, t := range trs {
		out.Transitions = append(out.Transitions, transitionJSON{TransitionRow: t, Time: t.Time.UnixMilli()})
	}
	return ok(c, out)
}

// MaxAlarmComment bounds an ack's or clear's comment.
const MaxAlarmComment = 1024

func (s *Server) ackAlarm(c *fiber.Ctx) error   { return s.handleAlarm(c, false) }
func (s *Server) clearAlarm(c *fiber.Ctx) error { return s.handleAlarm(c, true) }

func (s *Server) handleAlarm(c *fiber.Ctx, clear bool) error {
	store, id, err := s.alarmRecord(c)
	if err != nil {
		return err
	}
	var body struct {
		Comment string `json:"comment"`
	}
	if len(c.Body()) > 0 {
		if err := decodeJSON(c, &body); err != nil {
			return err
		}
	}
	if len(body.Comment) > MaxAlarmComment {
		return schema.Invalid("comment", "longer than %d bytes", MaxAlarmComment)
	}
	var r alarm.Record
	if clear {
		r, err = store.ClearByHand(c.UserContext(), id, actor(c), body.Comment)
	} else {
		r, err = store.Ack(c.UserContext(), id, actor(c), body.Comment)
	}
	if err != nil {
		return err
	}
	if s.deps.AlarmHandled != nil {
		s.deps.AlarmHandled(handledTransition(&r, clear))
	}
	return okItem(c, &r, appendRecord)
}

// handledTransition is the transition a hand made of r (acknowledged, or
// cleared), as the live feed announces it: its value the comment.
func handledTransition(r *alarm.Record, clear bool) alarm.Transition {
	t := alarm.Transition{Kind: alarm.KindAcked, RuleID: r.RuleID, RuleName: r.RuleName, ProductID: r.ProductID,
		DeviceID: r.DeviceID, Severity: r.Severity, Value: r.AckComment}
	switch {
	case clear && r.ClearedTime != nil:
		t.Kind, t.At, t.Value = alarm.KindCleared, *r.ClearedTime, r.ClearValue
	case !clear && r.AckedTime != nil:
		t.At = *r.AckedTime
	default:
		t.At = time.Now()
	}
	return t
}
