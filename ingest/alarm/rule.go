package alarm

import (
	"bytes"
	"encoding/json"
	"math"
	"strconv"
	"strings"
	"time"

	"devicehub/schema"
)

// Severities, from the highest. A rule's severity is its base; a ladder
// step names a higher one.
const (
	SeverityCritical = "critical"
	SeverityMajor    = "major"
	SeverityMinor    = "minor"
	SeverityWarning  = "warning"
	SeverityInfo     = "info"
)

// severityRank orders severities: a higher rank is more severe; 0 is no
// severity.
var severityRank = map[string]uint8{
	SeverityInfo: 1, SeverityWarning: 2, SeverityMinor: 3, SeverityMajor: 4, SeverityCritical: 5,
}

var severityByRank = [...]string{"", SeverityInfo, SeverityWarning, SeverityMinor, SeverityMajor, SeverityCritical}

// Severities lists every severity from the highest.
func Severities() []string {
	return []string{SeverityCritical, SeverityMajor, SeverityMinor, SeverityWarning, SeverityInfo}
}

// Trigger kinds.
const (
	TriggerProperty = "property" // conditions on reported properties
	TriggerEvent    = "event"    // a thing-model event, optionally with conditions on its fields
	TriggerOffline  = "offline"  // offline for at least For
	TriggerNoData   = "nodata"   // no report (of Property, or of anything) for For
)

// Clear kinds.
const (
	ClearTrigger   = "trigger"   // the trigger no longer holds (for For, if set); the default
	ClearCondition = "condition" // the clear's own condition holds (hysteresis)
	ClearManual    = "manual"    // only by hand
)

// Operators of a condition.
const (
	OpGT      = "gt"
	OpGE      = "ge"
	OpLT      = "lt"
	OpLE      = "le"
	OpEQ      = "eq"
	OpNE      = "ne"
	OpBetween = "between" // value is [low, high], both included
	OpChanged = "changed" // the property's value differs from its previous one
)

// What a condition compares (Condition.Of).
const (
	OfValue  = "value"  // the reported value (the default)
	OfChange = "change" // the value minus the previous value
	OfRate   = "rate"   // the change per second since the previous value
)

// Limits of a rule, so that a rule's state stays small.
const (
	MaxConditions = 32   // leaves in one group, nested ones included
	MaxLadder     = 4    // ladder steps
	MaxRepeat     = 1000 // Repeat.Count
	MaxNameLen    = 128
	MaxIDLen      = 64
)

// Rule is an alarm rule of a product: its JSON form is the API's and the
// export's.
type Rule struct {
	ID          string   `json:"id"`
	Name        string   `json:"name"`
	ProductID   string   `json:"productId"`
	Description string   `json:"description,omitempty"`
	Severity    string   `json:"severity"`
	Enabled     bool     `json:"enabled"`
	Trigger     Trigger  `json:"trigger"`
	Duration    Duration `json:"duration,omitempty"` // the trigger holds this long before the alarm is raised
	Repeat      *Repeat  `json:"repeat,omitempty"`   // or is met Count times within Within
	Clear       Clear    `json:"clear"`
	Ladder      []Step   `json:"ladder,omitempty"` // stricter conditions for higher severities
}

// Trigger is what raises an alarm.
type Trigger struct {
	Type string `json:"type"`
	Group
	Event    string   `json:"event,omitempty"`    // event: the event's id
	For      Duration `json:"for,omitempty"`      // offline, nodata: D
	Property string   `json:"property,omitempty"` // nodata: the property ("" any report)
}

// Group is a combination of conditions: every one of All or any one of
// Any (exactly one of them is set). An element may itself be a group of
// leaves (one level of nesting).
type Group struct {
	All []Condition `json:"all,omitempty"`
	Any []Condition `json:"any,omitempty"`
}

func (g *Group) empty() bool { return len(g.All) == 0 && len(g.Any) == 0 }

// Condition is a leaf (Property set) or a nested group (All or Any set).
type Condition struct {
	Property string          `json:"property,omitempty"`
	Op       string          `json:"op,omitempty"`
	Of       string          `json:"of,omitempty"`
	Value    json.RawMessage `json:"value,omitempty"`
	// Ref names a value of the device the threshold is read from:
	// "property.<id>" (its latest report of that property), "tag.<key>"
	// (the value of the device's tag with that key) or "config.<key>" (a
	// top-level key of the device's configuration). Value, if set too, is
	// the threshold while the device has none. A device without the value
	// and a rule without such a default: the rule is not evaluated for
	// that device on that message (it neither raises, repeats nor clears;
	// its state stays), and the evaluator counts it (Evaluator.Lacking,
	// the metric devicehub_alarm_threshold_missing_total). In a ladder
	// step or a clear condition, a missing threshold does not hold.
	Ref string `json:"ref,omitempty"`
	Group
}

// Kinds of device values a threshold may name (Condition.Ref).
const (
	RefProperty = "property"
	RefTag      = "tag"
	RefConfig   = "config"
)

// Repeat raises when the trigger is met Count times within Within.
type Repeat struct {
	Count  int      `json:"count"`
	Within Duration `json:"within"`
}

// Clear is how an active alarm ends without a hand.
type Clear struct {
	Type string `json:"type,omitempty"`
	Group
	For Duration `json:"for,omitempty"`
}

// Step is a rung of the severity ladder: while its condition holds, the
// alarm has its severity.
type Step struct {
	Severity string `json:"severity"`
	Group
}

// Duration is a time.Duration written as Go writes it ("30s", "5m0s");
// JSON numbers are read as milliseconds.
type Duration time.Duration

// D is d as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// MarshalJSON writes "1m30s".
func (d Duration) MarshalJSON() ([]byte, error) {
	return []byte(strconv.Quote(time.Duration(d).String())), nil
}

// badDuration marks a duration that could not be read: Validate refuses
// it naming its field, which a decoding error could not.
const badDuration = Duration(-1)

// UnmarshalJSON reads "90s" or 90000 (milliseconds); anything else, or a
// negative duration, becomes badDuration.
func (d *Duration) UnmarshalJSON(b []byte) error {
	*d = badDuration
	if len(b) > 0 && b[0] == '"' {
		var s string
		if json.Unmarshal(b, &s) != nil {
			return nil
		}
		if v, err := time.ParseDuration(s); err == nil && v >= 0 {
			*d = Duration(v)
		}
		return nil
	}
	var ms float64
	if json.Unmarshal(b, &ms) != nil || ms < 0 || ms > float64(math.MaxInt64/int64(time.Millisecond)) {
		return nil
	}
	*d = Duration(time.Duration(ms) * time.Millisecond)
	return nil
}

// checkDurations refuses durations that could not be read.
func (r *Rule) checkDurations() error {
	for _, f := range []struct {
		name string
		d    Duration
	}{{"duration", r.Duration}, {"trigger.for", r.Trigger.For}, {"clear.for", r.Clear.For}} {
		if f.d < 0 {
			return schema.Invalid(f.name, "a duration like \"30s\", \"5m\" or milliseconds")
		}
	}
	if r.Repeat != nil && r.Repeat.Within < 0 {
		return schema.Invalid("repeat.within", "a duration like \"30s\", \"5m\" or milliseconds")
	}
	return nil
}

// ParseRule decodes one rule. Unknown fields are refused so that a typo
// ("treshold") is not silently ignored; the error names the field.
func ParseRule(data []byte) (Rule, error) {
	var r Rule
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return Rule{}, decodeError("", err)
	}
	return r, nil
}

// decodeError turns a JSON decoding error into an *schema.ArgError
// naming the field where it can.
func decodeError(prefix string, err error) error {
	var te *json.UnmarshalTypeError
	if e, ok := err.(*json.UnmarshalTypeError); ok {
		te = e
	}
	if te != nil && te.Field != "" {
		return schema.Invalid(prefix+te.Field, "must be a JSON %s", te.Type.Kind())
	}
	msg := err.Error()
	if f, ok := strings.CutPrefix(msg, "json: unknown field "); ok {
		return schema.Invalid(prefix+strings.Trim(f, `"`), "unknown field")
	}
	return schema.Invalid(strings.TrimSuffix(prefix, "."), "invalid JSON: %s", strings.TrimPrefix(msg, "json: "))
}

// Validate checks r against its product's thing model m; the error is a
// *schema.ArgError naming the field (e.g. "trigger.all[1].value").
func (r *Rule) Validate(m *schema.ThingModel) error {
	if err := checkID("id", r.ID); err != nil {
		return err
	}
	if strings.TrimSpace(r.Name) == "" {
		return schema.Invalid("name", "required")
	}
	if len(r.Name) > MaxNameLen {
		return schema.Invalid("name", "longer than %d bytes", MaxNameLen)
	}
	if r.ProductID == "" {
		return schema.Invalid("productId", "required")
	}
	if severityRank[r.Severity] == 0 {
		return schema.Invalid("severity", "must be one of %s", strings.Join(Severities(), ", "))
	}
	if m == nil {
		m = schema.EmptyThingModel()
	}
	if err := r.checkDurations(); err != nil {
		return err
	}
	t := &r.Trigger
	switch t.Type {
	case TriggerProperty:
		if t.empty() {
			return schema.Invalid("trigger.all", "a property trigger needs conditions (all or any)")
		}
		if err := checkGroup("trigger", &t.Group, m.Properties, true); err != nil {
			return err
		}
		if err := noFields("trigger", t.Event != "", "event", t.For != 0, "for", t.Property != "", "property"); err != nil {
			return err
		}
	case TriggerEvent:
		if t.Event == "" {
			return schema.Invalid("trigger.event", "required")
		}
		ev := findEvent(m, t.Event)
		if ev == nil {
			return schema.Invalid("trigger.event", "no event %q in the thing model", t.Event)
		}
		if !t.empty() {
			if ev.ValueType.Type != schema.TypeObject {
				return schema.Invalid("trigger.all", "event %q has no fields (its valueType is %q)", t.Event, ev.ValueType.Type)
			}
			if err := checkGroup("trigger", &t.Group, ev.ValueType.Properties, false); err != nil {
				return err
			}
		}
		if err := noFields("trigger", t.For != 0, "for", t.Property != "", "property"); err != nil {
			return err
		}
		if r.Duration != 0 {
			return schema.Invalid("duration", "an event has no duration; use repeat")
		}
	case TriggerOffline, TriggerNoData:
		if t.For <= 0 {
			return schema.Invalid("trigger.for", "required: how long (e.g. \"5m\")")
		}
		if !t.empty() {
			return schema.Invalid("trigger.all", "a %s trigger has no conditions", t.Type)
		}
		if err := noFields("trigger", t.Event != "", "event"); err != nil {
			return err
		}
		if t.Type == TriggerOffline && t.Property != "" {
			return schema.Invalid("trigger.property", "an offline trigger names no property")
		}
		if t.Property != "" {
			if _, ok := m.Property(t.Property); !ok {
				return schema.Invalid("trigger.property", "no property %q in the thing model", t.Property)
			}
		}
		if r.Duration != 0 || r.Repeat != nil {
			return schema.Invalid("duration", "a %s trigger's duration is trigger.for", t.Type)
		}
	case "":
		return schema.Invalid("trigger.type", "required: property, event, offline or nodata")
	default:
		return schema.Invalid("trigger.type", "must be property, event, offline or nodata, not %q", t.Type)
	}
	if r.Repeat != nil {
		if r.Duration != 0 {
			return schema.Invalid("repeat", "either duration or repeat, not both")
		}
		if r.Repeat.Count < 1 || r.Repeat.Count > MaxRepeat {
			return schema.Invalid("repeat.count", "must be 1..%d", MaxRepeat)
		}
		if r.Repeat.Within <= 0 {
			return schema.Invalid("repeat.within", "required: a window (e.g. \"1m\")")
		}
	}
	c := &r.Clear
	switch c.Type {
	case "", ClearTrigger:
		if !c.empty() {
			return schema.Invalid("clear.all", "a trigger clear has no conditions; use type condition")
		}
		if t.Type == TriggerEvent && c.For <= 0 {
			return schema.Invalid("clear.for", "an event alarm clears when no such event came for this long; required")
		}
	case ClearCondition:
		if t.Type != TriggerProperty {
			return schema.Invalid("clear.type", "a condition clear needs a property trigger")
		}
		if c.empty() {
			return schema.Invalid("clear.all", "a condition clear needs conditions (all or any)")
		}
		if err := checkGroup("clear", &c.Group, m.Properties, true); err != nil {
			return err
		}
	case ClearManual:
		if !c.empty() || c.For != 0 {
			return schema.Invalid("clear.type", "a manual clear has no conditions or duration")
		}
	default:
		return schema.Invalid("clear.type", "must be trigger, condition or manual, not %q", c.Type)
	}
	if len(r.Ladder) > MaxLadder {
		return schema.Invalid("ladder", "at most %d steps", MaxLadder)
	}
	if len(r.Ladder) > 0 && t.Type != TriggerProperty && t.Type != TriggerEvent {
		return schema.Invalid("ladder", "a ladder needs a property or event trigger")
	}
	prev := severityRank[r.Severity]
	for i := range r.Ladder {
		s := &r.Ladder[i]
		path := "ladder[" + strconv.Itoa(i) + "]"
		rank := severityRank[s.Severity]
		if rank == 0 {
			return schema.Invalid(path+".severity", "must be one of %s", strings.Join(Severities(), ", "))
		}
		if rank <= prev {
			return schema.Invalid(path+".severity", "must be higher than the severity before it")
		}
		prev = rank
		if s.empty() {
			return schema.Invalid(path+".all", "a step needs conditions (all or any)")
		}
		var err error
		if t.Type == TriggerEvent {
			ev := findEvent(m, t.Event)
			if ev.ValueType.Type != schema.TypeObject {
				return schema.Invalid(path+".all", "event %q has no fields", t.Event)
			}
			err = checkGroup(path, &s.Group, ev.ValueType.Properties, false)
		} else {
			err = checkGroup(path, &s.Group, m.Properties, true)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func checkID(field, id string) error {
	if id == "" {
		return schema.Invalid(field, "required")
	}
	if len(id) > MaxIDLen {
		return schema.Invalid(field, "longer than %d bytes", MaxIDLen)
	}
	for _, c := range id {
		if !(c == '-' || c == '_' || c == '.' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
			return schema.Invalid(field, "letters, digits, '-', '_' and '.' only")
		}
	}
	return nil
}

// noFields refuses set fields a trigger type does not use: pairs of
// (set, name).
func noFields(prefix string, pairs ...any) error {
	for i := 0; i+1 < len(pairs); i += 2 {
		if pairs[i].(bool) {
			return schema.Invalid(prefix+"."+pairs[i+1].(string), "not used by this trigger type")
		}
	}
	return nil
}

func findEvent(m *schema.ThingModel, id string) *schema.Event {
	for i := range m.Events {
		if m.Events[i].ID == id {
			return &m.Events[i]
		}
	}
	return nil
}

func findProp(props []schema.Property, id string) *schema.Property {
	for i := range props {
		if props[i].ID == id {
			return &props[i]
		}
	}
	return nil
}

// checkGroup checks a group whose leaves name props; history allows
// changed, change and rate (reports have a previous value, event fields
// do not).
func checkGroup(path string, g *Group, props []schema.Property, history bool) error {
	if len(g.All) > 0 && len(g.Any) > 0 {
		return schema.Invalid(path+".any", "either all or any, not both")
	}
	n := 0
	list, name := g.All, "all"
	if len(g.Any) > 0 {
		list, name = g.Any, "any"
	}
	for i := range list {
		c := &list[i]
		p := path + "." + name + "[" + strconv.Itoa(i) + "]"
		if c.Property == "" && !c.empty() {
			if len(c.All) > 0 && len(c.Any) > 0 {
				return schema.Invalid(p+".any", "either all or any, not both")
			}
			sub, subName := c.All, "all"
			if len(c.Any) > 0 {
				sub, subName = c.Any, "any"
			}
			if c.Op != "" || c.Value != nil || c.Ref != "" || c.Of != "" {
				return schema.Invalid(p, "a nested group has only all or any")
			}
			for j := range sub {
				q := p + "." + subName + "[" + strconv.Itoa(j) + "]"
				if !sub[j].empty() {
					return schema.Invalid(q, "groups nest one level only")
				}
				if err := checkLeaf(q, &sub[j], props, history); err != nil {
					return err
				}
				n++
			}
			continue
		}
		if !c.empty() {
			return schema.Invalid(p, "a condition has a property or a nested group, not both")
		}
		if err := checkLeaf(p, c, props, history); err != nil {
			return err
		}
		n++
	}
	if n > MaxConditions {
		return schema.Invalid(path+"."+name, "more than %d conditions", MaxConditions)
	}
	return nil
}

func checkLeaf(path string, c *Condition, props []schema.Property, history bool) error {
	if c.Property == "" {
		return schema.Invalid(path+".property", "required")
	}
	p := findProp(props, c.Property)
	if p == nil {
		return schema.Invalid(path+".property", "no property %q in the thing model", c.Property)
	}
	vt := &p.ValueType
	switch c.Of {
	case "", OfValue:
	case OfChange, OfRate:
		if !history {
			return schema.Invalid(path+".of", "event fields have no previous value")
		}
		if !vt.IsNumeric() {
			return schema.Invalid(path+".of", "%s of %q: not a number (%s)", c.Of, c.Property, vt.Type)
		}
	default:
		return schema.Invalid(path+".of", "must be value, change or rate, not %q", c.Of)
	}
	numeric := vt.IsNumeric() || vt.Type == schema.TypeDate || c.Of == OfChange || c.Of == OfRate
	switch c.Op {
	case OpChanged:
		if !history {
			return schema.Invalid(path+".op", "event fields have no previous value")
		}
		if c.Of != "" && c.Of != OfValue {
			return schema.Invalid(path+".of", "changed compares the value itself")
		}
		if c.Value != nil || c.Ref != "" {
			return schema.Invalid(path+".value", "changed takes no value")
		}
		return nil
	case OpGT, OpGE, OpLT, OpLE, OpBetween:
		if !numeric {
			return schema.Invalid(path+".op", "%s needs a number; %q is %s", c.Op, c.Property, vt.Type)
		}
	case OpEQ, OpNE:
		switch vt.Type {
		case schema.TypeArray, schema.TypeObject, schema.TypeFile, schema.TypeGeoPoint, schema.TypePassword:
			return schema.Invalid(path+".op", "%q is %s: it cannot be compared", c.Property, vt.Type)
		}
	case "":
		return schema.Invalid(path+".op", "required: gt, ge, lt, le, eq, ne, between or changed")
	default:
		return schema.Invalid(path+".op", "must be gt, ge, lt, le, eq, ne, between or changed, not %q", c.Op)
	}
	if c.Ref != "" {
		if c.Op == OpBetween {
			return schema.Invalid(path+".ref", "between takes its two values from value")
		}
		kind, id, _ := strings.Cut(c.Ref, ".")
		switch kind {
		case RefProperty, RefTag, RefConfig:
		default:
			return schema.Invalid(path+".ref", "must be property.<id>, tag.<key> or config.<key>")
		}
		if id == "" {
			return schema.Invalid(path+".ref", "must be property.<id>, tag.<key> or config.<key>")
		}
		if !history && kind == RefProperty {
			return schema.Invalid(path+".ref", "an event condition takes a threshold from a tag or the configuration only")
		}
		if c.Value == nil {
			return nil
		}
	}
	if c.Value == nil {
		return schema.Invalid(path+".value", "required")
	}
	if c.Op == OpBetween {
		var pair []json.RawMessage
		if json.Unmarshal(c.Value, &pair) != nil || len(pair) != 2 {
			return schema.Invalid(path+".value", "between takes [low, high]")
		}
		lo, ok1 := jsonNumber(pair[0])
		hi, ok2 := jsonNumber(pair[1])
		if !ok1 || !ok2 {
			return schema.Invalid(path+".value", "between takes two numbers")
		}
		if lo > hi {
			return schema.Invalid(path+".value", "low %v is above high %v", lo, hi)
		}
		return nil
	}
	if numeric {
		if _, ok := jsonNumber(c.Value); !ok {
			return schema.Invalid(path+".value", "%q is %s: the value must be a number", c.Property, vt.Type)
		}
		return nil
	}
	switch vt.Type {
	case schema.TypeBoolean:
		if _, ok := boolValue(vt, c.Value); !ok {
			return schema.Invalid(path+".value", "%q is boolean: true, false or its true/false value", c.Property)
		}
	case schema.TypeEnum:
		txt, ok := scalarText(c.Value)
		if !ok {
			return schema.Invalid(path+".value", "must be one of the enum's values")
		}
		for i := range vt.Elements {
			if vt.Elements[i].ValueString() == txt {
				return nil
			}
		}
		return schema.Invalid(path+".value", "%q is not a value of the enum %q", txt, c.Property)
	default:
		if _, ok := scalarText(c.Value); !ok {
			return schema.Invalid(path+".value", "must be a string, number or boolean")
		}
	}
	return nil
}

func jsonNumber(raw json.RawMessage) (float64, bool) {
	var f float64
	if len(raw) == 0 || raw[0] == '"' || json.Unmarshal(raw, &f) != nil {
		return 0, false
	}
	return f, true
}

// scalarText is the text of a JSON string, number or boolean.
func scalarText(raw json.RawMessage) (string, bool) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return "", false
	}
	switch raw[0] {
	case '"':
		var s string
		if json.Unmarshal(raw, &s) != nil {
			return "", false
		}
		return s, true
	case 't', 'f':
		var b bool
		if json.Unmarshal(raw, &b) != nil {
			return "", false
		}
		return strconv.FormatBool(b), true
	case '{', '[', 'n':
		return "", false
	}
	f, ok := jsonNumber(raw)
	if !ok {
		return "", false
	}
	return strconv.FormatFloat(f, 'f', -1, 64), true
}

// boolValue reads a boolean condition value: JSON true/false, or the
// property's trueValue/falseValue.
func boolValue(vt *schema.ValueType, raw json.RawMessage) (bool, bool) {
	txt, ok := scalarText(raw)
	if !ok {
		return false, false
	}
	if t, ok := scalarText(vt.TrueValue); ok && t == txt {
		return true, true
	}
	if f, ok := scalarText(vt.FalseValue); ok && f == txt {
		return false, true
	}
	switch txt {
	case "true":
		return true, true
	case "false":
		return false, true
	}
	return false, false
}
