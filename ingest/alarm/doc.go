// Package alarm owns alarm rules and their evaluation: the rule model and
// its validation against a product's thing model (rule.go), a pure,
// deterministic evaluator (compile.go, eval.go), the PostgreSQL store of
// rules, rule state, alarm records and their transitions (store.go), and
// the runner that feeds the evaluator from MQTT and makes it exact across
// restarts and instances (runner.go).
//
// It must not import api (api talks to it through a small interface
// declared in api); it uses meta only for the advisory lock and the
// database handle, ingest/link for devicehub's MQTT login and helpers,
// ingest/wire to decode uplinks, and schema for the thing model.
//
// # Semantics
//
// A rule belongs to a product. Its trigger is one of: conditions on
// reported properties (gt ge lt le eq ne between changed, against the
// value or its change or rate since the previous report; all/any nested
// one level; thresholds may name another property of the device or a
// tag); a thing-model event (optional conditions on its fields); offline
// for at least D; no report (of a property, or of anything) for D. The
// alarm is raised when the trigger is met, or once it has held for
// duration, or once it was met repeat.count times within repeat.within.
// While active, each further time the trigger is met updates the record
// (count, last value, last time) and recomputes the severity from the
// ladder (the highest step that holds, else the rule's severity):
// escalations and de-escalations stay one alarm. It clears when the
// trigger stops holding (optionally for clear.for), when its own clear
// condition holds (hysteresis: raise above 30, clear below 28), or only
// by hand; an event alarm clears when no such event came for clear.for.
// A cleared alarm is never reused: the next raise is a new record.
//
// The evaluator follows a device's latest values: a report older than the
// latest one applied for the device is stored by ingest but not evaluated.
//
// # Exactness
//
// (Filled in with the runner.)
package alarm
