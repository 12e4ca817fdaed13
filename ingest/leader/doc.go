// Package leader is how a role of devicehub that runs on one instance at a
// time (the alarm evaluator, the forwarder, the firmware engine, the
// device-login syncer, the notification scheduler) takes its turns: Loop
// waits for the role's PostgreSQL advisory lock, marks this
// instance the owner (a flag and a gauge), leads a turn until the lock is
// lost, the turn fails or the context ends, releases the lock, and after a
// failure waits Retry before it waits for the lock again. SessionID is
// what successive owners of a role share besides the lock: the client id
// of the role's persistent MQTT session, which a new owner resumes.
//
// The lock itself is meta's (meta.Store.Lock: a session-level
// pg_advisory_lock on a connection of its own, pinged so that a lost
// session is told on the lost channel); Loop takes it through the Locker
// interface. What makes a role's turn exact when two instances overlap
// (an epoch claimed at each turn's start and checked by every write) is
// the role's own, said in its package doc.
//
// It imports the standard library only, nothing of the project: meta
// satisfies Locker and Installation without being imported, and every
// ingest package may use it.
package leader
