package alarm

import (
	"container/heap"
	"encoding/json"
	"fmt"
	"hash/maphash"
	"iter"
	"slices"
	"strings"
	"time"

	"devicehub/schema"
)

// Transition kinds: what happened to a (rule, device)'s alarm.
const (
	KindRaised      = "raised"
	KindRepeated    = "repeated" // the trigger was met again while active: count, last value, last time
	KindEscalated   = "escalated"
	KindDeescalated = "deescalated"
	KindCleared     = "cleared"
	KindAcked       = "acknowledged" // by hand only (Store.Ack)
)

// Transition is one change of an alarm, as the evaluator decided it.
type Transition struct {
	Kind      string
	RuleID    string
	RuleName  string
	ProductID string
	DeviceID  string
	Severity  string
	At        time.Time
	// Value says what caused it: "temp=31.5", "event fault",
	// "offline since ...", "no data since ...".
	Value string
}

// MsgKind is the kind of a device message the evaluator takes.
type MsgKind uint8

// Message kinds.
const (
	MsgReport MsgKind = iota + 1
	MsgEvent
	MsgOnline
	MsgOffline
)

// Prop is one reported property value.
type Prop struct {
	ID    string
	Value Value
}

// Message is one device message, decoded.
type Message struct {
	Kind      MsgKind
	ProductID string
	DeviceID  string
	At        time.Time // the message's time (its own timestamp, or arrival)
	// Arrived is when the evaluator received it (zero: At). Durations,
	// windows, timers and transitions run on it, so that a device whose
	// clock lags, or that sends buffered readings, is not judged by its
	// clock; At orders a device's reports and times the change in rate.
	Arrived time.Time
	// Key identifies the message for redelivery: its messageId, or a hash
	// of its payload when it has none. KeyUnique says the key is the
	// device's own id (or the broker marked the message a redelivery):
	// only then is a message whose key was applied recently skipped.
	Key       string
	KeyUnique bool
	Props     []Prop           // MsgReport
	Event     string           // MsgEvent: the event id
	Fields    map[string]Value // MsgEvent: the fields of its data object
}

// Refs gives device values that thresholds name (kind RefTag or
// RefConfig, and the key); nil gives none. Property refs are the device's
// own latest reports.
type Refs func(deviceID, kind, id string) (Value, bool)

// recentKeys is how many message keys per device are kept to recognise a
// redelivery: the messages of the last few batches, those whose acks may
// not have reached the broker. Only the keys a time cannot replace are
// kept: those of the reports and events at the device's latest time
// (LastAt: an older one is skipped by its time, so its key is dropped
// once a later one is applied), and those of births and wills (prefixed
// "p"), which have no such order. Most devices thus keep one key.
const recentKeys = 32

// Evaluator evaluates rules over device messages and timers. It is pure:
// time comes from the messages and from Tick's now; it does no I/O and
// starts no goroutine, and it is not safe for concurrent use. Its state
// is read back with Dirty and restored with Restore.
type Evaluator struct {
	rules     map[string]*compiled   // by id
	byProduct map[string][]*compiled // enabled rules by product
	devices   map[string]*devState
	timers    timerHeap
	refs      Refs
	out       []Transition
	alarmDevs map[*devState]struct{} // the devices of out's transitions that are not repeats
	dirtyDev  map[*devState]struct{}
	names     map[string]string // the property ids the rules read, interned: a device's values share them
	entries   []ruleEntry       // Dirty's scratch: a row's rule states
	sorted    []*devState       // Dirty's scratch: the dirty devices by id
	rowSize   int               // Dirty: the bytes of a row, as last written (its buffer's estimate)
	evals     uint64
	lacking   uint64 // rule evaluations skipped: a threshold's device value missing
}

// Lacking is how many times a rule was not evaluated for a device because
// a threshold names a value the device lacks and gives no default
// (Condition.Ref).
func (e *Evaluator) Lacking() uint64 { return e.lacking }

// RefKeys lists, by product, the device values ("tag.<key>",
// "config.<key>") its enabled rules' thresholds name: what Refs is asked.
func (e *Evaluator) RefKeys() map[string][]string {
	out := map[string][]string{}
	for p, rules := range e.byProduct {
		seen := map[string]bool{}
		for _, c := range rules {
			visit := func(l *leaf) {
				if l.refKind != "" && l.refKind != RefProperty && !seen[l.refKind+"."+l.refID] {
					seen[l.refKind+"."+l.refID] = true
					out[p] = append(out[p], l.refKind+"."+l.refID)
				}
			}
			c.trigger.leaves(visit)
			c.clear.leaves(visit)
			for i := range c.ladder {
				c.ladder[i].g.leaves(visit)
			}
		}
	}
	return out
}

// New returns an evaluator with no rules.
func New(refs Refs) *Evaluator {
	return &Evaluator{
		rules:     map[string]*compiled{},
		byProduct: map[string][]*compiled{},
		devices:   map[string]*devState{},
		refs:      refs,
		dirtyDev:  map[*devState]struct{}{},
		alarmDevs: map[*devState]struct{}{},
		names:     map[string]string{},
		rowSize:   256,
	}
}

// devState is a device's part: the last message applied, recent message
// keys, the latest values of the properties its rules read, and its rule
// states.
type devState struct {
	id, product string
	D           devData
	rules       []*ruleState // a few: a slice costs less heap than a map (100,000s of devices)
	saved       uint64       // hash of the row last written (or restored); 0: none
}

// rule is the device's state of rule id, nil when it has none.
func (d *devState) rule(id string) *ruleState {
	for _, st := range d.rules {
		if st.rule.ID == id {
			return st
		}
	}
	return nil
}

// devRow is a device's stored row: its part and, under "r", the states of
// its rules that hold something, by rule id. It is read with
// json.Unmarshal and written by appendRow (row.go).
type devRow struct {
	devData
	Rules map[string]*stateData `json:"r,omitempty"`
}

type devData struct {
	LastAt int64    `json:"t,omitempty"` // ms of the latest report or event applied
	Keys   []string `json:"k,omitempty"` // recent message keys, oldest first
	Props  props    `json:"p,omitempty"`
}

// props are a device's latest values of the properties its rules read,
// sorted by id, inline in one slice (not a map of pointers: the
// evaluator's heap, and what the collector scans, grow with the devices);
// stored as a JSON object by id (appendJSON, UnmarshalJSON).
type props []propData

type propData struct {
	ID      string // interned (Evaluator.names)
	Cur     value
	At      int64
	Prev    value // if hasPrev
	PrevAt  int64
	hasPrev bool
	inMsg   bool // carried by the message being evaluated
}

// propJSON is a propData's stored form.
type propJSON struct {
	Cur    value  `json:"c"`
	At     int64  `json:"t"`
	Prev   *value `json:"p,omitempty"`
	PrevAt int64  `json:"q,omitempty"`
}

func (ps *props) UnmarshalJSON(b []byte) error {
	var m map[string]*propJSON
	if err := json.Unmarshal(b, &m); err != nil {
		return err
	}
	out := make(props, 0, len(m))
	for id, j := range m {
		if j == nil {
			continue
		}
		p := propData{ID: id, Cur: j.Cur, At: j.At, PrevAt: j.PrevAt}
		if j.Prev != nil {
			p.Prev, p.hasPrev = *j.Prev, true
		}
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b propData) int { return strings.Compare(a.ID, b.ID) })
	*ps = out
	return nil
}

// find is property id's entry, nil when none. The pointer is good until
// the next add.
func (ps props) find(id string) *propData {
	for i := range ps {
		if ps[i].ID == id {
			return &ps[i]
		}
	}
	return nil
}

// add inserts an entry for id (not there yet) in order and returns it.
func (ps *props) add(id string) *propData {
	i, _ := slices.BinarySearchFunc(*ps, id, func(p propData, id string) int { return strings.Compare(p.ID, id) })
	*ps = slices.Insert(*ps, i, propData{ID: id})
	return &(*ps)[i]
}

// ruleState is the state of one rule for one device.
type ruleState struct {
	rule *compiled
	dev  *devState
	S    stateData
	idx  int // in the timer heap, -1 when not there
}

type stateData struct {
	Since      int64   `json:"s,omitempty"` // trigger holding since (ms), for duration and offline
	Hits       []int64 `json:"h,omitempty"` // times the trigger was met within the repeat window
	Active     bool    `json:"a,omitempty"`
	Sev        uint8   `json:"v,omitempty"` // severity rank while active
	ClearSince int64   `json:"c,omitempty"` // clear condition holding since (ms)
	Deadline   int64   `json:"d,omitempty"` // the timer (ms), 0 none
	Offline    bool    `json:"o,omitempty"`
	LastSeen   int64   `json:"l,omitempty"` // nodata: the latest report
	RaisedAt   int64   `json:"r,omitempty"` // the active alarm's raise (its record's raised time)
}

// zero reports whether s holds nothing: no row is needed for it.
func (s *stateData) zero() bool {
	return s.Since == 0 && len(s.Hits) == 0 && !s.Active && s.Sev == 0 && s.ClearSince == 0 && s.Deadline == 0 &&
		!s.Offline && s.LastSeen == 0 && s.RaisedAt == 0
}

// rowSeed keys rowHash: a row's hash is compared only with hashes made
// by the same process (devState.saved), never stored.
var rowSeed = maphash.MakeSeed()

// rowHash identifies a written row, never 0 (0 is no row).
func rowHash(b []byte) uint64 {
	return max(maphash.Bytes(rowSeed, b), 1)
}

// SetRules replaces the rules: rules are compiled against their
// product's thing model (models by product id). The state of a rule that
// stays (same id) is kept; the state of a rule that goes is dropped (its
// device's row is written without it by the next Dirty). Rules must be
// valid (Rule.Validate).
func (e *Evaluator) SetRules(rules []Rule, models map[string]*schema.ThingModel) {
	next := map[string]*compiled{}
	byProduct := map[string][]*compiled{}
	for _, r := range rules {
		if !r.Enabled {
			continue
		}
		c := compile(r, models[r.ProductID])
		next[r.ID] = c
		byProduct[r.ProductID] = append(byProduct[r.ProductID], c)
		for p := range c.props {
			if _, ok := e.names[p]; !ok {
				e.names[p] = p
			}
		}
	}
	for _, d := range e.devices {
		n := len(d.rules)
		d.rules = slices.DeleteFunc(d.rules, func(st *ruleState) bool {
			c, ok := next[st.rule.ID]
			if !ok || c.ProductID != d.product || c.Trigger.Type != st.rule.Trigger.Type {
				e.timers.remove(st)
				return true
			}
			st.rule = c
			return false
		})
		if len(d.rules) != n {
			e.dirtyDev[d] = struct{}{}
		}
	}
	e.rules, e.byProduct = next, byProduct
}

// touches reports whether a report carrying props can change c's
// outcome: its trigger's, clear's or ladder's properties.
func (c *compiled) touches(has func(string) bool) bool {
	if c.trigger.touches(has) || c.clear.touches(has) {
		return true
	}
	for i := range c.ladder {
		if c.ladder[i].g.touches(has) {
			return true
		}
	}
	return false
}

// Rules is the number of enabled rules.
func (e *Evaluator) Rules() int { return len(e.rules) }

// Evaluations is how many (rule, message or timer) evaluations ran.
func (e *Evaluator) Evaluations() uint64 { return e.evals }

// Products lists the products with an enabled rule, sorted.
func (e *Evaluator) Products() []string {
	out := make([]string, 0, len(e.byProduct))
	for p := range e.byProduct {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

// HasRules reports whether product has an enabled rule.
func (e *Evaluator) HasRules(product string) bool { return len(e.byProduct[product]) > 0 }

func (e *Evaluator) device(product, id string) *devState {
	d := e.devices[id]
	if d == nil || d.product != product {
		if d != nil { // the device moved to another product: start over
			e.dropDevice(d)
		}
		d = &devState{id: id, product: product}
		e.devices[id] = d
	}
	return d
}

// dropDevice forgets d: its row is the one of the device that replaces
// it (another product's), written by the next Dirty.
func (e *Evaluator) dropDevice(d *devState) {
	for _, st := range d.rules {
		e.timers.remove(st)
	}
	delete(e.dirtyDev, d)
	delete(e.devices, d.id)
}

func (e *Evaluator) state(d *devState, c *compiled) *ruleState {
	st := d.rule(c.ID)
	if st == nil {
		st = &ruleState{rule: c, dev: d, idx: -1}
		d.rules = append(d.rules, st)
	}
	return st
}

// Apply evaluates one message. It returns false when the message was
// skipped: a redelivery of one applied already, or a report older than
// the latest applied (the evaluator follows a device's latest values).
func (e *Evaluator) Apply(m Message) bool {
	rules := e.byProduct[m.ProductID]
	if len(rules) == 0 {
		return true
	}
	d := e.device(m.ProductID, m.DeviceID)
	timed := m.Kind == MsgReport || m.Kind == MsgEvent
	key := m.Key
	if key != "" && !timed {
		key = "p" + key
	}
	if key != "" && m.KeyUnique && slices.Contains(d.D.Keys, key) {
		return false
	}
	mt := m.At.UnixMilli()
	if timed && mt < d.D.LastAt {
		return false
	}
	at := mt
	if !m.Arrived.IsZero() {
		at = m.Arrived.UnixMilli()
	}
	if timed && mt > d.D.LastAt {
		// Reports and events before mt are skipped by their time now:
		// their keys are no longer needed.
		d.D.Keys = slices.DeleteFunc(d.D.Keys, func(k string) bool { return !strings.HasPrefix(k, "p") })
	}
	if key != "" {
		if len(d.D.Keys) == recentKeys {
			d.D.Keys = append(d.D.Keys[:0], d.D.Keys[1:]...)
		}
		d.D.Keys = append(d.D.Keys, key)
	}
	if timed {
		d.D.LastAt = mt
	}
	e.dirtyDev[d] = struct{}{}
	switch m.Kind {
	case MsgReport:
		e.report(d, rules, at, mt, m.Props)
	case MsgEvent:
		e.event(d, rules, at, m)
	case MsgOnline, MsgOffline:
		for _, c := range rules {
			if c.Trigger.Type == TriggerOffline {
				e.evals++
				e.presence(e.state(d, c), at, m.Kind == MsgOffline)
			}
		}
	}
	return true
}

// report updates the device's values and evaluates its rules.
func (e *Evaluator) report(d *devState, rules []*compiled, at, mt int64, props []Prop) {
	wanted := func(id string) bool {
		for _, c := range rules {
			if c.props[id] {
				return true
			}
		}
		return false
	}
	for _, p := range props {
		if !wanted(p.ID) {
			continue
		}
		pd := d.D.Props.find(p.ID)
		if pd == nil {
			name, ok := e.names[p.ID]
			if !ok {
				name = p.ID
			}
			pd = d.D.Props.add(name)
		} else {
			pd.Prev, pd.PrevAt, pd.hasPrev = pd.Cur, pd.At, true
		}
		pd.Cur, pd.At, pd.inMsg = p.Value.v, mt, true
	}
	defer func() {
		for i := range d.D.Props {
			d.D.Props[i].inMsg = false
		}
	}()
	has := func(id string) bool {
		pd := d.D.Props.find(id)
		return pd != nil && pd.inMsg
	}
	ev := &reportEnv{e: e, d: d}
	for _, c := range rules {
		switch c.Trigger.Type {
		case TriggerProperty:
			if !c.touches(has) {
				continue
			}
			e.evals++
			ev.lacked = false
			met, fresh := c.trigger.eval(ev), c.trigger.touches(has)
			if ev.lacked {
				e.lacking++ // a threshold the device lacks: not evaluated (Condition.Ref)
				continue
			}
			if d.rule(c.ID) == nil && !(met && fresh) {
				continue // no state and nothing to start: none is made (most reports of most devices)
			}
			e.step(e.state(d, c), at, met, fresh, ev)
		case TriggerNoData:
			if c.Trigger.Property != "" && !has(c.Trigger.Property) {
				continue
			}
			if c.Trigger.Property == "" && len(props) == 0 {
				continue
			}
			e.evals++
			e.data(e.state(d, c), at)
		}
	}
}

// event evaluates the event rules of m.Event.
func (e *Evaluator) event(d *devState, rules []*compiled, at int64, m Message) {
	ev := &fieldEnv{e: e, d: d, f: m.Fields}
	for _, c := range rules {
		if c.Trigger.Type != TriggerEvent || c.Trigger.Event != m.Event {
			continue
		}
		e.evals++
		ev.lacked = false
		met := len(c.trigger.items) == 0 || c.trigger.eval(ev)
		if ev.lacked {
			e.lacking++
			continue
		}
		if !met {
			continue
		}
		st := e.state(d, c)
		if !st.S.Active {
			e.meet(st, at, ev)
		} else {
			e.repeat(st, at, ev)
		}
		if st.S.Active && c.Clear.Type != ClearManual {
			e.setTimer(st, at+int64(c.Clear.For.D()/time.Millisecond)) // quiet for clear.for
		}
	}
}

// step is a property evaluation: met says whether the trigger holds,
// fresh whether this report carries one of the trigger's properties (only
// then is the trigger met again: a report of a ladder's or a clear's
// property alone re-evaluates those).
func (e *Evaluator) step(st *ruleState, at int64, met, fresh bool, ev env) {
	c := st.rule
	s := &st.S
	e.markDirty(st)
	if !s.Active {
		if met && fresh {
			e.meet(st, at, ev)
		} else if !met && s.Since != 0 {
			s.Since = 0
			e.setTimer(st, 0)
		}
		return
	}
	if met && fresh {
		e.repeat(st, at, ev)
	} else if met {
		e.regrade(st, at, ev)
	}
	var clear bool
	switch c.Clear.Type {
	case "", ClearTrigger:
		clear = !met
	case ClearCondition:
		clear = c.clear.eval(ev)
	}
	e.clearing(st, at, clear, ev)
}

// clearing follows the clear condition: cleared at once, or once it has
// held for clear.for.
func (e *Evaluator) clearing(st *ruleState, at int64, clear bool, ev env) {
	s := &st.S
	forMs := int64(st.rule.Clear.For.D() / time.Millisecond)
	switch {
	case !clear:
		if s.ClearSince != 0 {
			s.ClearSince = 0
			e.setTimer(st, 0)
		}
	case forMs == 0:
		e.clearNow(st, at, ev)
	case s.ClearSince == 0:
		s.ClearSince = at
		e.setTimer(st, at+forMs)
	case at-s.ClearSince >= forMs:
		e.clearNow(st, s.ClearSince+forMs, ev)
	}
}

// meet is the trigger met while no alarm is active: raise now, or once
// it has held for duration, or once met repeat.count times within
// repeat.within.
func (e *Evaluator) meet(st *ruleState, at int64, ev env) {
	c := st.rule
	s := &st.S
	e.markDirty(st)
	switch {
	case c.Duration > 0:
		dur := int64(c.Duration.D() / time.Millisecond)
		if s.Since == 0 {
			s.Since = at
			e.setTimer(st, at+dur)
			return
		}
		if at-s.Since < dur {
			return
		}
		e.raise(st, s.Since+dur, ev)
	case c.Repeat != nil:
		w := int64(c.Repeat.Within.D() / time.Millisecond)
		keep := s.Hits[:0]
		for _, h := range s.Hits {
			if h > at-w {
				keep = append(keep, h)
			}
		}
		s.Hits = append(keep, at)
		if len(s.Hits) < c.Repeat.Count {
			return
		}
		e.raise(st, at, ev)
	default:
		e.raise(st, at, ev)
	}
}

func (e *Evaluator) raise(st *ruleState, at int64, ev env) {
	s := &st.S
	s.Active, s.Hits, s.ClearSince, s.RaisedAt = true, nil, 0, at
	if st.rule.Trigger.Type != TriggerOffline {
		s.Since = 0 // an offline alarm keeps the time the device went
	}
	s.Sev = e.severity(st, ev)
	e.setTimer(st, 0)
	e.markDirty(st)
	e.emit(st, KindRaised, at, ev)
}

// repeat is the trigger met again while active: the record's count and
// last value, and the severity ladder.
func (e *Evaluator) repeat(st *ruleState, at int64, ev env) {
	e.markDirty(st)
	e.emit(st, KindRepeated, at, ev)
	e.regrade(st, at, ev)
}

// regrade moves an active alarm along the severity ladder.
func (e *Evaluator) regrade(st *ruleState, at int64, ev env) {
	s := &st.S
	e.markDirty(st)
	if sev := e.severity(st, ev); sev != s.Sev {
		kind := KindEscalated
		if sev < s.Sev {
			kind = KindDeescalated
		}
		s.Sev = sev
		e.emit(st, kind, at, ev)
	}
}

func (e *Evaluator) clearNow(st *ruleState, at int64, ev env) {
	s := &st.S
	s.Active, s.ClearSince, s.Since, s.Hits, s.RaisedAt = false, 0, 0, nil, 0
	e.setTimer(st, 0)
	e.markDirty(st)
	e.emit(st, KindCleared, at, ev)
	s.Sev = 0
}

// severity is the highest ladder step that holds, else the base.
func (e *Evaluator) severity(st *ruleState, ev env) uint8 {
	c := st.rule
	sev := c.base
	if ev == nil {
		return sev
	}
	for i := range c.ladder {
		if c.ladder[i].g.eval(ev) {
			sev = c.ladder[i].rank
		}
	}
	return sev
}

// presence is a birth (offline false) or will for an offline rule.
func (e *Evaluator) presence(st *ruleState, at int64, offline bool) {
	s := &st.S
	c := st.rule
	if offline == s.Offline {
		return // a repeated birth or will changes nothing (idempotent)
	}
	e.markDirty(st)
	s.Offline = offline
	if offline {
		s.Since = at
		s.ClearSince = 0
		if !s.Active {
			e.setTimer(st, at+int64(c.Trigger.For.D()/time.Millisecond))
		} else {
			e.setTimer(st, 0)
			e.emit(st, KindRepeated, at, nil)
		}
		return
	}
	s.Since = 0
	if !s.Active {
		e.setTimer(st, 0)
		return
	}
	if c.Clear.Type != ClearManual {
		e.clearing(st, at, true, nil)
	}
}

// data is a report for a nodata rule.
func (e *Evaluator) data(st *ruleState, at int64) {
	s := &st.S
	c := st.rule
	if at <= s.LastSeen {
		return
	}
	s.LastSeen = at
	e.markDirty(st)
	if s.Active {
		if c.Clear.Type != ClearManual {
			e.clearNow(st, at, nil)
			e.setTimer(st, at+int64(c.Trigger.For.D()/time.Millisecond))
		}
		return
	}
	e.setTimer(st, at+int64(c.Trigger.For.D()/time.Millisecond))
}

// Tick fires the timers due at now: durations held, clears held, offline
// and no data for D, event alarms quiet for clear.for. It returns how
// many fired.
func (e *Evaluator) Tick(now time.Time) int {
	ms := now.UnixMilli()
	n := 0
	for len(e.timers) > 0 && e.timers[0].S.Deadline <= ms {
		st := e.timers[0]
		at := st.S.Deadline
		e.setTimer(st, 0)
		n++
		e.evals++
		e.fire(st, at)
	}
	return n
}

// NextDeadline is the earliest timer, zero when none.
func (e *Evaluator) NextDeadline() time.Time {
	if len(e.timers) == 0 {
		return time.Time{}
	}
	return time.UnixMilli(e.timers[0].S.Deadline)
}

func (e *Evaluator) fire(st *ruleState, at int64) {
	s := &st.S
	c := st.rule
	e.markDirty(st)
	ev := env(&reportEnv{e: e, d: st.dev})
	switch c.Trigger.Type {
	case TriggerProperty:
		switch {
		case !s.Active && s.Since != 0:
			e.raise(st, at, ev)
		case s.Active && s.ClearSince != 0:
			e.clearNow(st, at, ev)
		}
	case TriggerEvent:
		if s.Active {
			e.clearNow(st, at, nil)
		}
	case TriggerOffline:
		switch {
		case !s.Active && s.Offline:
			e.raise(st, at, nil)
		case s.Active && !s.Offline && s.ClearSince != 0:
			e.clearNow(st, at, nil)
		}
	case TriggerNoData:
		if !s.Active {
			e.raise(st, at, nil)
		}
	}
}

func (e *Evaluator) markDirty(st *ruleState) { e.dirtyDev[st.dev] = struct{}{} }

func (e *Evaluator) setTimer(st *ruleState, at int64) {
	st.S.Deadline = at
	if at == 0 {
		e.timers.remove(st)
		return
	}
	if st.idx >= 0 {
		heap.Fix(&e.timers, st.idx)
		return
	}
	heap.Push(&e.timers, st)
}

func (e *Evaluator) emit(st *ruleState, kind string, at int64, ev env) {
	c := st.rule
	sev := st.S.Sev
	if sev == 0 {
		sev = c.base
	}
	if kind != KindRepeated {
		e.alarmDevs[st.dev] = struct{}{}
	}
	e.out = append(e.out, Transition{
		Kind: kind, RuleID: c.ID, RuleName: c.Name, ProductID: st.dev.product, DeviceID: st.dev.id,
		Severity: severityByRank[sev], At: time.UnixMilli(at), Value: e.describe(st, ev),
	})
}

// describe says what caused a transition.
func (e *Evaluator) describe(st *ruleState, ev env) string {
	c := st.rule
	switch c.Trigger.Type {
	case TriggerOffline:
		if st.S.Offline {
			return "offline since " + time.UnixMilli(st.S.Since).UTC().Format(time.RFC3339Nano)
		}
		return "online"
	case TriggerNoData:
		if st.S.LastSeen == 0 {
			return "no data"
		}
		return "no data since " + time.UnixMilli(st.S.LastSeen).UTC().Format(time.RFC3339Nano)
	case TriggerEvent:
		if fe, ok := ev.(*fieldEnv); ok {
			var b strings.Builder
			b.WriteString("event " + c.Trigger.Event)
			c.trigger.leaves(func(l *leaf) {
				if v, ok := fe.current(l.prop); ok {
					fmt.Fprintf(&b, " %s=%s", l.prop, v.text())
				}
			})
			return b.String()
		}
		return "no event " + c.Trigger.Event + " for " + c.Clear.For.D().String()
	}
	if ev == nil {
		return ""
	}
	var parts []string
	seen := map[string]bool{}
	add := func(l *leaf) {
		if seen[l.prop] {
			return
		}
		seen[l.prop] = true
		if v, ok := ev.current(l.prop); ok {
			parts = append(parts, l.prop+"="+v.text())
		}
	}
	c.trigger.leaves(add)
	c.clear.leaves(add)
	return strings.Join(parts, " ")
}

// Transitions returns and forgets the transitions decided since the last
// call, in order.
func (e *Evaluator) Transitions() []Transition {
	out := e.out
	e.out = nil
	clear(e.alarmDevs)
	return out
}

// Alarming reports whether a transition users are told of (raised,
// escalated, de-escalated, cleared: not a repeat) is among those not yet
// taken by Transitions.
func (e *Evaluator) Alarming() bool { return len(e.alarmDevs) > 0 }

// AlarmingDevices yields the devices of the transitions users are told
// of among those not yet taken, each once.
func (e *Evaluator) AlarmingDevices() iter.Seq[string] {
	return func(yield func(string) bool) {
		for d := range e.alarmDevs {
			if !yield(d.id) {
				return
			}
		}
	}
}

// TakeDevices returns and forgets what was decided for the devices ids
// since the last Transitions and Dirty: their transitions, in order, and
// their rows (as Dirty gives them). The other devices' stay for the next
// call. The runner's express lane (runner.go) writes an alarm's device
// ahead of the rest with it.
func (e *Evaluator) TakeDevices(ids map[string]struct{}) ([]Transition, []DeviceRow) {
	return e.take(func(id string) bool { _, ok := ids[id]; return ok })
}

// TakeOthers is Transitions and Dirty but for the devices ids, whose
// transitions and rows stay for a later call: the runner's batch while an
// express batch of those devices is written.
func (e *Evaluator) TakeOthers(ids map[string]struct{}) ([]Transition, []DeviceRow) {
	if len(ids) == 0 {
		return e.Transitions(), e.Dirty()
	}
	return e.take(func(id string) bool { _, ok := ids[id]; return !ok })
}

// take returns and forgets the transitions and rows of the devices in
// in; the others' stay.
func (e *Evaluator) take(in func(id string) bool) ([]Transition, []DeviceRow) {
	var trs []Transition
	keep := e.out[:0]
	for _, t := range e.out {
		if in(t.DeviceID) {
			trs = append(trs, t)
			continue
		}
		keep = append(keep, t)
	}
	for d := range e.alarmDevs {
		if in(d.id) {
			delete(e.alarmDevs, d)
		}
	}
	clear(e.out[len(keep):])
	e.out = keep
	ds := e.sorted[:0]
	for d := range e.dirtyDev {
		if in(d.id) {
			ds = append(ds, d)
		}
	}
	for _, d := range ds {
		delete(e.dirtyDev, d)
	}
	return trs, e.rows(ds)
}

// Changed reports whether there is anything for Transitions or Dirty.
func (e *Evaluator) Changed() bool {
	return len(e.out)+len(e.dirtyDev) > 0
}

// Untaken tells, of the transitions decided since the last call of
// Transitions, whether any is of (rule, device), and whether one of them
// raises or clears it.
func (e *Evaluator) Untaken(ruleID, deviceID string) (touched, raiseOrClear bool) {
	for _, t := range e.out {
		if t.RuleID == ruleID && t.DeviceID == deviceID {
			touched = true
			if t.Kind == KindRaised || t.Kind == KindCleared {
				return true, true
			}
		}
	}
	return touched, false
}

// DeviceRow is a device's persisted state: its part and its rule states
// in one row (devRow, compact JSON).
type DeviceRow struct {
	DeviceID, ProductID string
	Data                []byte
}

// Dirty returns the rows of the devices touched since the last call and
// forgets them: a row holds the device's part and the states of its rules
// that hold something (a rule state back to zero, nothing held and no
// timer, leaves the row and memory; so does the state of a rule that
// went). A row equal to the one last written is not returned (a message
// that changed nothing). The rows come sorted by device id; their Data
// share one array (each slice capped at its end).
func (e *Evaluator) Dirty() []DeviceRow {
	if len(e.dirtyDev) == 0 {
		return nil
	}
	ds := e.sorted[:0]
	for d := range e.dirtyDev {
		ds = append(ds, d)
	}
	clear(e.dirtyDev)
	return e.rows(ds)
}

// rows encodes the rows of ds, dirty devices no longer in dirtyDev, for
// Dirty and TakeDevices. ds is e.sorted's array, or a slice of its own.
func (e *Evaluator) rows(ds []*devState) []DeviceRow {
	// The rows are written one after another into one buffer (sized by
	// the previous call's rows), each sliced out of it at the end.
	buf := make([]byte, 0, len(ds)*e.rowSize)
	var devs []DeviceRow
	var ends []int
	slices.SortFunc(ds, func(a, b *devState) int { return strings.Compare(a.id, b.id) })
	for _, d := range ds {
		d.rules = slices.DeleteFunc(d.rules, func(st *ruleState) bool { return st.S.zero() && st.idx < 0 })
		if len(d.rules) == 0 {
			d.rules = nil
		}
		es := e.entries[:0]
		for _, st := range d.rules {
			es = append(es, ruleEntry{st.rule.ID, &st.S})
		}
		sortEntries(es)
		e.entries = es
		start := len(buf)
		buf = appendRow(buf, &d.D, es)
		if h := rowHash(buf[start:]); h != d.saved {
			d.saved = h
			devs = append(devs, DeviceRow{DeviceID: d.id, ProductID: d.product})
			ends = append(ends, len(buf))
		} else {
			buf = buf[:start]
		}
	}
	clear(e.entries[:cap(e.entries)])
	clear(ds)
	e.sorted = ds[:0]
	start := 0
	for i, end := range ends {
		devs[i].Data = buf[start:end:end]
		start = end
	}
	if len(devs) > 0 {
		e.rowSize = len(buf)/len(devs) + 16
	}
	return devs
}

// Restore loads persisted rows (after SetRules): the states of rules that
// are gone (or of another product now) are dropped, and their devices'
// rows written without them by the next Dirty; timers are rebuilt.
// Timers already due fire at the next Tick.
func (e *Evaluator) Restore(devs []DeviceRow) error {
	for _, r := range devs {
		var row devRow
		if err := json.Unmarshal(r.Data, &row); err != nil {
			return fmt.Errorf("alarm: device %s state: %w", r.DeviceID, err)
		}
		d := e.device(r.ProductID, r.DeviceID)
		d.D = row.devData
		for i := range d.D.Props {
			if name, ok := e.names[d.D.Props[i].ID]; ok {
				d.D.Props[i].ID = name
			}
		}
		d.saved = rowHash(r.Data)
		for id, sd := range row.Rules {
			c := e.rules[id]
			if c == nil || c.ProductID != d.product || sd == nil {
				e.dirtyDev[d] = struct{}{}
				continue
			}
			st := e.state(d, c)
			st.S = *sd
			if st.S.Deadline != 0 {
				heap.Push(&e.timers, st)
			}
		}
	}
	return nil
}

// Forget marks (rule, device)'s alarm as no longer active: it was cleared
// by hand. The next time the trigger is met raises a new alarm. A
// non-zero raisedAt names the alarm the hand cleared: a later one (raised
// since) is kept.
func (e *Evaluator) Forget(ruleID, deviceID string, raisedAt time.Time) {
	d := e.devices[deviceID]
	if d == nil {
		return
	}
	st := d.rule(ruleID)
	if st == nil || !st.S.Active || !raisedAt.IsZero() && raisedAt.UnixMilli() != st.S.RaisedAt {
		return
	}
	st.S.Active, st.S.Sev, st.S.ClearSince, st.S.RaisedAt = false, 0, 0, 0
	st.S.Since, st.S.Hits = 0, nil
	e.setTimer(st, 0) // a nodata rule's next deadline starts at the next report
	if st.rule.Trigger.Type == TriggerOffline && st.S.Offline {
		st.S.Offline = false // raised again only after a new birth and will
	}
	e.markDirty(st)
}

// Reraised records that (rule, device)'s active alarm is a new one raised
// at at (the store found the one the evaluator held cleared by hand).
func (e *Evaluator) Reraised(ruleID, deviceID string, at time.Time) {
	if d := e.devices[deviceID]; d != nil {
		if st := d.rule(ruleID); st != nil && st.S.Active {
			st.S.RaisedAt = at.UnixMilli()
			e.markDirty(st)
		}
	}
}

// Active reports whether (rule, device) has an active alarm, and its
// severity.
func (e *Evaluator) Active(ruleID, deviceID string) (bool, string) {
	d := e.devices[deviceID]
	if d == nil || d.rule(ruleID) == nil {
		return false, ""
	}
	s := d.rule(ruleID).S
	return s.Active, severityByRank[s.Sev]
}

// reportEnv reads a device's latest property values.
type reportEnv struct {
	e      *Evaluator
	d      *devState
	lacked bool
}

func (r *reportEnv) lack() { r.lacked = true }

func (r *reportEnv) current(prop string) (value, bool) {
	pd := r.d.D.Props.find(prop)
	if pd == nil {
		return value{}, false
	}
	return pd.Cur, true
}

func (r *reportEnv) fresh(prop string) (cur, prev value, dt float64, ok, hasPrev bool) {
	pd := r.d.D.Props.find(prop)
	if pd == nil || !pd.inMsg {
		return value{}, value{}, 0, false, false
	}
	if !pd.hasPrev {
		return pd.Cur, value{}, 0, true, false
	}
	return pd.Cur, pd.Prev, float64(pd.At-pd.PrevAt) / 1000, true, true
}

func (r *reportEnv) ref(kind, id string) (value, bool) {
	if kind == RefProperty {
		return r.current(id)
	}
	if r.e.refs == nil {
		return value{}, false
	}
	v, ok := r.e.refs(r.d.id, kind, id)
	return v.v, ok
}

// fieldEnv reads an event's fields.
type fieldEnv struct {
	e      *Evaluator
	d      *devState
	f      map[string]Value
	lacked bool
}

func (f *fieldEnv) lack() { f.lacked = true }

func (f *fieldEnv) current(prop string) (value, bool) {
	v, ok := f.f[prop]
	return v.v, ok
}

func (f *fieldEnv) fresh(string) (cur, prev value, dt float64, ok, hasPrev bool) {
	return value{}, value{}, 0, false, false
}

func (f *fieldEnv) ref(kind, id string) (value, bool) {
	if kind == RefProperty || f.e.refs == nil {
		return value{}, false
	}
	v, ok := f.e.refs(f.d.id, kind, id)
	return v.v, ok
}

// timerHeap orders rule states by deadline; each state is in it at most
// once (idx), so a device reporting often moves its entry instead of
// adding one.
type timerHeap []*ruleState

func (h timerHeap) Len() int { return len(h) }
func (h timerHeap) Less(i, j int) bool {
	return h[i].S.Deadline < h[j].S.Deadline
}
func (h timerHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].idx, h[j].idx = i, j
}
func (h *timerHeap) Push(x any) {
	st := x.(*ruleState)
	st.idx = len(*h)
	*h = append(*h, st)
}
func (h *timerHeap) Pop() any {
	old := *h
	st := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	st.idx = -1
	return st
}

func (h *timerHeap) remove(st *ruleState) {
	if st.idx >= 0 {
		heap.Remove(h, st.idx)
	}
}
