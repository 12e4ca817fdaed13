// Package alarm owns alarm rules and their evaluation: the rule model and
// its validation against a product's thing model (rule.go), a pure,
// deterministic evaluator (compile.go, eval.go), the PostgreSQL store of
// rules, rule state, alarm records and their transitions (store.go), and
// the runner that feeds the evaluator from MQTT (a session of its own, or
// ingest's through a Feed: feed.go) and makes it exact across restarts
// and instances (runner.go).
//
// It must not import api (api talks to it through a small interface
// declared in api, AlarmStore); it uses meta for the advisory lock, the
// database handle, the product limit of a request and the list engine
// (meta.List: ruleList and recordList in store.go), ingest/leader for the turns taken under that lock,
// ingest/mqttconn for its MQTT sessions (an mqttconn.Subscriber),
// ingest/wire to decode uplinks, ingest for the broker pool's will rule
// (ingest.BornAt) and the hook its Feed is (ingest.AlarmHook), and schema
// for the thing model. Nothing in ingest's
// storage pipeline depends on it: with alarms off, or no enabled rule,
// the pipeline runs as before and the evaluator subscribes to nothing.
//
// # Semantics
//
// A rule belongs to a product. Its trigger is one of: conditions on
// reported properties (gt ge lt le eq ne between changed, against the
// value or its change or rate since the previous report; all/any nested
// one level; thresholds may name another property of the device, a tag
// or a configuration key, the condition's value as default: a device
// lacking it, with no default, is not evaluated by the rule and is
// counted); a thing-model event (optional conditions on its fields); offline
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
// latest one applied for the device (by the device's own timestamps) is
// stored by ingest but not evaluated. Durations, windows and timers run on
// arrival (Message.Arrived), not on the device's clock.
//
// # Exactness: why an alarm is neither lost nor doubled
//
// One owner. Of all instances, one evaluates: the holder of a PostgreSQL
// advisory lock (meta.Store.Lock, as the devauth syncer is elected),
// waited for and led by ingest/leader's Loop. On
// taking it, the owner increments an epoch (Store.Claim); every write
// names its epoch and is refused once another owner claimed
// (ErrNotOwner), so a stale owner that has not yet noticed its lost lock
// writes nothing. Rule state thus lives in one place at a time: the
// evaluator's memory of the one owner, and PostgreSQL.
//
// One persistent session (with a share group; without, ingest's session:
// the next paragraph). The owner reads the uplinks (reports, events,
// births, wills) on its own MQTT session, an mqttconn.Subscriber: clean
// session false, QoS 1, acknowledged by hand, a client id every owner
// shares ("devicehub-alarms-<installation id>"), the products with an
// enabled rule subscribed (SetFilters when the rules change, again after
// a reconnect). The broker keeps that session while no owner is
// connected and a new owner resumes it: what the previous owner did not
// acknowledge (the Subscriber's Close acknowledges nothing), and what
// arrived between owners, is delivered to the next (mqttconn's
// TestSubscriberRedelivers). Ingest's storage pipeline is untouched: it
// has its own sessions. A device's messages come from one broker
// connection, in order, and are evaluated in that order by one goroutine.
//
// One session, or ingest's. Where ingest's session is the
// installation's one (ingest.NoShareGroup, the default: one instance
// ingests), the owner reads no session of its own. Ingest hands it what
// it reads (Feed, ingest's AlarmHook: the reports, events, births and
// wills of the known, active devices of the products with an enabled
// rule, once decoded, before storage) and acknowledges each to the
// broker only once its rows are stored and the evaluator's commit
// acknowledged it (the Feed's Ack is ingest's done). A session of its own
// cost the broker a second delivery of every report and devicehub a
// second read of it (BENCHMARKS.md, "Alarms"). Exact, because:
//   - a message is acknowledged to the broker only after the commit of
//     what it changed, as on the owner's own session: a SIGKILL before
//     that leaves it with the broker, which gives it again (DUP set) to
//     ingest's next connection, and so to the feed;
//   - a turn that ends (a failed write, a lost lock) leaves in the feed
//     every message it read and did not commit; the next turn of the
//     process reads them again from the oldest, in the order ingest
//     handed them, marked redeliveries (Duplicate), as the broker marks
//     what a session gives again, so the key check below applies
//     unchanged (TestRunnerFeedExact);
//   - a device's reports and events reach the feed in the broker's order:
//     ingest has one data connection without a share group, and one
//     worker per device; its births and wills come from ingest's presence
//     session, and only offline rules read them, which read nothing else;
//   - the session a run without the feed left (with a share group before,
//     or an earlier version) holds what its owner did not commit: the
//     first turn with a feed resumes it, reads it up to markers published
//     to the report topic of a product with a rule, then reads the feed,
//     and ends the session once what it read of it is committed. The
//     markers reach ingest's data session too, in the same broker order:
//     until ingest passed them (AlarmHook.Marked, once every message its
//     session took before them was handed over), what ingest hands the
//     feed may be in that backlog as well, and is read as a redelivery.
//     TestAlarmsFeedSIGKILL fails without each of these rules and without
//     ingest's wait for the commit.
//
// The price of the feed: ingest's acknowledgements wait for the
// evaluator. The feed holds at most DefaultFeedBound messages taken and
// not committed (10 s of 10,000 reports/s); past it ingest waits (its
// queues, then the broker, hold the rest). So while PostgreSQL is away
// for longer than that, ingest stores nothing new either, where with its
// own session the evaluator fell behind alone; nothing is lost either
// way. And only what ingest accepts is evaluated: not the messages of a
// device not deployed, or of another product than its topic names. With
// a share group each instance reads a share of the devices: the owner
// keeps its own session, and evaluates whatever the broker gives it for
// the products with a rule, those devices' messages too.
//
// Write, then acknowledge. Messages are evaluated in memory, in batches:
// what the evaluator decided since the previous batch (the transitions;
// each touched device's row, one a device: the latest message time, the
// keys of its recent messages, the latest values its rules read and the
// state of each of its rules) and the messages that led to it. Writer
// goroutines in two lanes (the batch lane's one, the express lane's
// three: runner.go, expressWriters) each write one batch at a time in ONE
// transaction (Store.Write: a few statements however many alarms it
// raises, escalates or clears; "One record" below) and, only after its
// commit, acknowledge its messages in order and announce its transitions
// as the store wrote them (OnTransitions, WriteResult.Written: the live
// feed; a repeat of an alarm a hand cleared meanwhile goes out as the
// new alarm's raise, and a clear or escalation of the hand-cleared one
// not at all, TestAlarmE2EHandClearRace; the notify outbox is filled by a
// trigger on the transition rows, in the same transaction):
//   - the batch lane is handed everything evaluated since its last batch
//     every FlushInterval, or at maxPending messages, while its writer is
//     idle;
//   - an idle writer of the express lane is handed, at once, the
//     devices of the changes users are told of (a raise, escalation,
//     de-escalation or clear: not a repeat), each with all it holds
//     pending (its transitions, row and messages), so that a raise
//     waits neither for the rows of every device touched while the
//     batch lane's write ran (at 100,000 devices, a row per report) nor,
//     unless every express writer is busy, for another alarm's write
//     (TestRunnerExpressWriters); while they are busy, the batch lane
//     leaves those devices pending for them
//     (devicehub_alarm_change_lag_seconds says, by lane, how long a
//     change took to its commit).
//
// Two lanes. No device is in two batches being written at once: an
// express writer takes only devices no batch being written holds
// anything of (no message, transition or row: the others wait for its
// commit), and the batch lane leaves pending the devices of the express
// batches being written. So a device's batches commit in the order they
// were evaluated, and so are its messages acknowledged; batches of other
// devices commit in any order, as nothing one writes is another's: a
// device's row, the records and transitions of its alarms (one per rule
// and device) and their outbox rows (in order per alarm). Otherwise a
// device's newer row, written by the express lane, could commit before
// the batch lane's older one and lie under it: TestRunnerExpress breaks
// the rule on purpose, and an alarm then never clears after a restart;
// or a device's clear, written by a second express writer, could commit
// before its raise and find nothing to clear (TestRunnerExpressOneDevice).
//
// Meanwhile the loop reads and evaluates the next batch on top of the
// ones being written. Each device is a pipeline of one: a batch holding
// it is handed only once the commit of the batch before that held it is
// reported (the batch lane's batch N+1 only once N's is); while N is
// written, N+1 grows (and the write takes it whole when it is done); past maxPending
// messages the loop reads no more (backpressure: the session's queue,
// then the broker, hold the rest). A failed write (an error, ErrNotOwner,
// a lost lock) stops its writer, which writes and acknowledges nothing
// after it, and ends the owner's turn: batch N+1 was evaluated on top of
// N's effects, and N+1's rows (the device's latest time and keys)
// committed over a lost N would make N's messages, when they come again,
// look already applied (TestRunnerPipelineFailure fails so without the
// rule: counts short). The other batches in flight hold other
// devices, evaluated on their committed state only: their commit, or
// their loss, is one of the cases below. The evaluator's memory goes with the turn;
// the next turn reloads what is stored (Store.Load) and
// the session gives again every message not acknowledged, those of N
// and of every batch after it. So:
//   - a crash (SIGKILL, a lost lock, a failed write) before a batch's
//     commit loses its effects and its acks alike, and those of the
//     batches after it (evaluated, never written nor acknowledged): the
//     messages come again, to a state that has not seen them, and are
//     evaluated once; an error whose commit did happen is the next case;
//   - a crash after the commit and before the acks (or acks lost with the
//     connection) brings back messages whose effects are stored. Each is
//     recognised: a report or event older than the device's latest applied
//     one is not evaluated (the evaluator follows latest values), and one
//     at the same time is skipped when its key is among the device's
//     recent keys: its messageId, or, for a device that sends none, a hash
//     of topic and payload trusted only when the broker marks the message
//     a redelivery (DUP). A birth or will applied twice changes nothing (a
//     state already offline stays offline since its first will);
//   - a timer that fired is part of the state written with the alarm it
//     raised; timers are restored from that state, and one past due fires
//     at the first tick once the sessions' backlogs are applied: a new
//     owner publishes a marker on each session (/{p}/$devicehub/online,
//     as ingest's sessions do) and checks no timer before it came back,
//     so a report queued while no owner ran moves its device's no-data
//     deadline before that deadline is looked at (TestRunnerNoDataRestart
//     fails without the wait); with a feed, before the left session's
//     markers came back, the feed's messages held at the turn's start
//     were read, and ingest applied its own sessions' backlogs
//     (Options.FeedReady).
//
// A device keeps the keys of its messages at its latest time only (and
// of its births and wills): a redelivered report or event older than
// that is skipped by its time already. A device's rule states are part
// of its row (alarm_state, 00034_alarm_state.sql): whatever a batch
// changed of a device, its rule states included, is written in the same
// statement as the rest of the batch's devices, and a rule state holding
// nothing is left out of the row. A flush writes the rows of the devices
// touched, but not a row equal to the one last handed to a writer: that
// one is committed by an earlier batch of the turn, or its write failed
// and the turn ended with the evaluator's memory.
//
// Rules that go. Disabling or deleting a rule clears its active alarms in
// the same transaction ("rule disabled", "rule deleted", a cleared
// transition each). Store.Write locks the rows of the rules it writes
// transitions of (FOR SHARE) and drops those of rules no longer enabled:
// a batch evaluated before the owner reloaded its rules raises nothing
// again, and a disable waiting for the batch clears what it raised
// (TestStoreRuleGone).
//
// One record. Whatever an evaluator believes, PostgreSQL holds at most one
// active alarm per (rule, device) (a partial unique index); a raise that
// meets an active one counts as a repeat of it.
//
// A batch is written set-wise. Its write first locks the active records
// of the alarms it changes (FOR UPDATE) and adds the repeats of the
// others (one statement; a repeat that finds no record is a new alarm,
// below). Which records are active is then all the batch's outcome
// depends on, and nobody else changes it before the commit: only the
// owner inserts records (the epoch), a hand's clear or acknowledgement
// waits for the lock (TestStoreWriteLocks), a rule's disabling for the
// rule rows. So the write decides in memory what statements one
// transition at a time would do, and runs it in rounds, one statement
// each: round i inserts or updates each alarm's record for its i-th
// change (repeats before it folded in) and inserts the transition rows,
// in the batch's order. The outbox's trigger reads a record when the
// statement that inserted its transition row ends, so a record's
// transition is its last change in a round and repeats after it go in
// the next: each notification says what it said when every transition
// had its own statements. Most batches are one round (TestStoreSetwise
// compares both writers, record, transition and outbox row by row,
// over random batches with hands between them).
//
// A clear by hand is seen by
// the owner within PollInterval, or at the next write that finds the
// record cleared; the next time the trigger is met is a new alarm. With
// a batch evaluated while the previous one is written, what a write or
// the poll finds cleared by hand is told to the evaluator only for the
// alarms no untaken transition is of (Evaluator.Untaken): one that is
// was evaluated on the alarm being active, and its own write finds the
// clear and says so; the poll reads the clears only while no writer
// writes a batch (while they are due, the batch lane is handed nothing,
// so all are soon idle). Otherwise the evaluator can forget an alarm the store
// has just raised anew, which then never clears
// (TestRunnerHandClearPipelined: each of the three rules seen failing
// without it).
//
// Acknowledged out of order, within a bound. The lanes commit, and so
// acknowledge, other devices' messages in any order. Mosquitto numbers
// a session's outgoing messages with a counter that wraps after 65,535
// and takes a PUBACK for the oldest message in flight with its id, so a
// message left unacknowledged while 65,535 later ones were acknowledged
// would be taken off the broker by one of theirs (ingest's ack order,
// whose parked messages have no such bound, holds those PUBACKs:
// ingest/ackorder.go). Here the messages read and not acknowledged are
// the pending ones (the loop reads no more past maxPending while a
// writer is busy) and those of the batches being written, each taken
// from what was pending: at most (2 + expressWriters) x maxPending,
// 50,000, and in practice the batch lane's one and a few (an express
// batch holds the messages of a few devices). That is under 65,535, so
// an acknowledgement never meets an older message with its id. With a
// feed, the acknowledgements are ingest's, in its connection's order
// (ingest/ackorder.go).
//
// TestRunnerExact breaks this on purpose: two runners sharing the work,
// the owner killed with a batch in memory, killed between a commit and its
// acks (twice), the broker restarted; 100 devices each end with one alarm
// whose count is exactly the number of their reports above the threshold.
// Without the key check the counts double; acknowledging before the
// write loses reports (both seen failing).
//
// Timers. Offline-for-D, no-data-for-D, durations and clear delays are
// deadlines in one heap per owner (each (rule, device) state in it at most
// once, moved in place when a report pushes its deadline), checked every
// TickInterval: never a goroutine or a query per device.
package alarm
