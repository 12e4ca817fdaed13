// Package notify owns notifications of alarms: channels (a webhook, an
// SMTP mailbox, a topic on another MQTT broker), subscriptions (which
// alarms, which transitions, an escalation chain of channels, reminders,
// a quiet time), the outbox of notifications to send and its delivery
// (workers, retries with backoff, dead letters and their replay), and the
// scheduler that enqueues escalations and reminders.
//
// It must not import api (api talks to it through the Store's methods) nor
// ingest/alarm: it reads the alarm tables (alarm_records,
// alarm_transitions) through SQL only, and the outbox is written by a
// PostgreSQL trigger on alarm_transitions (schema/postgres/00023), so the
// alarm evaluator knows nothing of notifications. It uses meta for the
// database handle and the advisory lock (the scheduler's turns through
// ingest/leader's Loop), and ingest/link's MQTT helpers
// to dial another broker.
//
// # Why a notification is neither lost nor doubled beyond its key
//
// Written with its cause. The trigger inserts the outbox rows of an alarm
// transition in the transaction that inserts the transition: both commit
// or neither does. No process has to be alive between the two, so no
// crash can lose the notification of a committed transition. The quiet
// rule is decided in the same statement sequence, on a row keyed by
// (subscription, rule, device), updated only when the quiet time has
// passed: concurrent transactions serialize on that row.
//
// Enqueued once per cause. Every outbox row carries its cause as step:
// the transition ('t' and its id), an escalation level ('e1', 'e2', ...)
// or a reminder's number ('r1', 'r2', ...: whole reminder periods since
// the alarm was raised). (record, subscription, step) is unique and every
// insert is ON CONFLICT DO NOTHING, so the scheduler, which runs on the
// holder of an advisory lock but would be harmless on two instances at
// once, a restarted scheduler, or a replayed tick never enqueue a cause
// twice.
//
// On the server's clock. An alarm's times are its device's; the quiet
// time and the escalation clock (notify_active.since, written by the
// trigger) use the database's now(), so a device's clock cannot silence
// or hurry a notification.
//
// Delivered at least once, with one key. A worker takes a due row with
// SELECT ... FOR UPDATE SKIP LOCKED in a transaction it holds while
// sending, and marks the row delivered (or schedules its retry, or makes
// it a dead letter) in that same transaction. Two workers, on one
// instance or two, never hold one row. A worker that dies mid-send
// (SIGKILL, lost connection) leaves its transaction uncommitted: the row
// is still pending and is sent again, with the same idempotency key (the
// row's id, in the Idempotency-Key header and the body), so a receiver
// that has seen the key can drop the duplicate. Only a 2xx answer (an
// SMTP server's acceptance, an MQTT PUBACK) marks a row delivered.
//
// Woken, not only polled. The trigger announces (pg_notify, sent at
// commit) and one worker of every instance LISTENing wakes; a worker that
// takes a row wakes another, so a burst has every worker on it. The poll
// (Options.Poll) covers a lost announcement, so a missed wake-up delays a
// notification and never loses it.
//
// In order per alarm and channel. A row is taken only when no earlier
// pending row exists for the same alarm record and channel (the claim's
// NOT EXISTS); a row whose retry is scheduled is still pending, so the
// later rows of its alarm wait for it. A dead letter no longer blocks (it
// waits for a person); its replay is sent after what followed it.
package notify
