// Package forward owns forwarding telemetry to other systems: forwarding
// rules (a product's property reports, events and online/offline
// changes, narrowed by device, message type and property; model.go,
// store.go), the spool on disk that buffers each rule's messages for its
// sink (spool.go), the sinks (a webhook taking batches as JSON lines, a
// topic on another MQTT broker; sink.go, mqttclient.go) and the
// forwarder that runs them on one instance (forwarder.go).
//
// It must not import api (api talks to it through a small interface,
// ForwardStore), ingest (the storage pipeline knows nothing of it) nor
// ingest/alarm or ingest/notify. It uses meta for the database handle,
// the installation id and the advisory lock, ingest/leader for the turns
// taken under that lock, ingest/mqttconn to set up and dial its MQTT
// clients (its intake is an mqttconn.Subscriber), ingest/wire to decode
// uplinks and schema/backoff for the sink's retry schedule.
//
// # How messages reach the spool, and why ingest never waits
//
// Not through a tap in ingest: the forwarder reads the uplinks on a
// persistent MQTT session of its own (an mqttconn.Subscriber, as
// ingest/alarm's runner does: clean session false, QoS 1, acknowledged
// by hand, one client id every owner shares:
// "devicehub-forward-<installation id>").
// A sink that is down, slow or refusing therefore touches neither
// ingest's sessions nor its acknowledgements: the broker gives ingest
// its copy whatever the forwarder does, and the forwarder itself only
// appends to local files, which it does far faster than ingest stores.
// Subscriptions follow the enabled rules' products (Subscriber.SetFilters
// at each reload, subscribed again after a reconnect); with no rule the
// session subscribes to nothing.
//
// # Why a message is neither lost nor doubled beyond at-least-once
//
// Spooled, then acknowledged. A message taken from the broker is
// appended to the spool of every enabled rule it matches; every
// FlushInterval the spools are written and fsynced, and only then are
// the broker messages of that flush acknowledged, in order. A crash
// before the fsync loses the unsynced appends and their acks alike:
// the broker delivers those messages again to the session (to this
// owner once it comes back, or to the next; the Subscriber's Close
// acknowledges nothing and keeps the session, mqttconn's
// TestSubscriberRedelivers). A crash after the spool's write and
// before the acks reach the broker (or acks lost with the connection)
// brings back messages already spooled: they are spooled again and
// forwarded twice, with new seqs, the only repeats on the intake
// side. A killed process's writes survive in the page cache, so for a
// process (not a machine) the window opens at the write, not the
// fsync's end: it holds the messages of one flush, those that arrived
// in a FlushInterval and while the previous flush wrote and fsynced
// (on a loaded machine an fsync of tens of milliseconds makes that a
// few hundred messages at a few thousand a second), plus acks queued
// and not yet on the wire. The broker delivers them again with the
// DUP flag, and the forwarder counts every DUP it takes
// (devicehub_forward_redelivered_total, and a log line "the broker
// delivered messages again" once a poll): the repeats with a new seq
// are at most that count (TestForwardCrash, TestForwardSigkill). The
// count may be larger: a DUP the killed owner had not spooled is
// forwarded once.
//
// Sent, then the cursor. A rule's sender reads synced messages after
// its cursor, in spool order. A webhook's sends them as a batch until
// the sink accepts it (only a 2xx answer); only then is the cursor
// moved past the batch and saved (written to a temporary file,
// synced, renamed over). An MQTT sink's is pipelined: it publishes
// each message at QoS 1 while fewer than the rule's batchSize
// publishes await their PUBACK (the window; no round trip between
// batches), and moves the cursor past the longest prefix of publishes
// that were all acknowledged, never past one that was not; it saves
// the cursor once half a window was acknowledged since the last save
// and whenever nothing is in flight. A publish that fails or waits
// longer than timeoutMs for its PUBACK, or a lost connection, drops
// the connection with everything in flight, and the next connection
// publishes again from the cursor (nothing is published on a new
// connection while publishes of the old one are in flight). A stop (or
// a changed rule, or a lost lock) waits for a webhook's batch in
// flight, or an MQTT sink's publishes in flight, at most the sink's
// timeout, and saves the cursor past what was accepted, so that a
// handover to the next owner sends nothing twice
// (TestForwardTwoInstances, TestForwardMQTTHandover). A crash
// between the acceptance and the save sends those messages again (a
// webhook's batch; an MQTT sink's publishes in flight and those
// acknowledged since the last save, at most one and a half windows),
// with the same seq in every line: (ruleId, seq) is the receiver's
// key to drop a repeat. Segments wholly behind the cursor are deleted
// once it is saved; a torn last line (a crash inside a write) is cut
// on open, and its message was not acknowledged to the broker.
//
// In order per device. A device's messages come from one broker
// connection in order (paho's OrderMatters; the Subscriber hands them
// on from one goroutine per connection, a full queue holding the
// broker's flow), are appended in that order, and one sender per rule
// sends them in spool order: a webhook's one batch at a time,
// retrying a batch before anything after it; an MQTT sink's on one
// connection, whose broker delivers QoS 1 messages in the order it
// received them (MQTT 3.1.1, 4.6: each topic ordered), and after a
// failure from the cursor, the first unacknowledged message, again in
// order. The old connection's publishes the broker took are a prefix
// of the same sequence, so the first arrivals stay in order and what
// comes again comes with its seq. Repeats follow the order of first
// arrivals: a redelivered message comes after the newer ones already
// forwarded, never instead of them.
//
// One owner among instances. Of all instances, one forwards: the holder
// of a PostgreSQL advisory lock (meta.Store.Lock, waited for and led by
// ingest/leader's Loop, as ingest/alarm's runner is elected); the others
// wait for it. The broker session is
// shared through its client id, so a new owner resumes what the old one
// had not acknowledged. The spools are the owner's files in Options.Dir:
// what a failed owner had spooled and not yet sent waits in its
// directory until an owner runs with that directory again (the same
// instance restarted, or a successor given the same volume). Running two
// instances for forwarding failover therefore needs the spool directory
// on storage both can reach; with per-machine directories, a machine
// lost for good takes its unsent backlog (at most what its sinks had
// not accepted) with it. Partitioning per instance (ingest's share
// groups) was not chosen: a share group splits a device's messages
// between instances, and their order with them.
//
// At the bound. Each rule's spool is bounded (Options.MaxBytes): when an
// append takes it past the bound, its oldest segments are deleted
// unsent and their messages counted (Status.Dropped,
// devicehub_forward_dropped_total); intake is never refused, so a dead
// sink never stops the session's acknowledgements nor grows the
// broker's queue. A batch being retried drops the messages the bound
// took meanwhile, and an MQTT sink's acknowledged prefix counts as
// sent only what the bound had not taken, so sent plus dropped is
// every message taken.
//
// TestForwardCrash breaks this on purpose: the owner killed with
// appends not yet synced, between a sync and its acks (twice), and
// between a sink's acceptance and the cursor's save (twice), each
// time coming back to its spools and its session; every message
// arrives, the first arrivals in order per device, and the repeats
// are at most the messages unacknowledged at the crashes.
// Acknowledging a message on receipt instead of after the sync loses
// messages there (seen failing). TestForwardSigkill (cmd/devicehub)
// does it to the binary with SIGKILL; TestMQTTSinkBrokerRestart stops
// an MQTT sink's broker with a window in flight (counting a failed
// publish acknowledged loses messages there, seen failing);
// TestForwardTwoInstances checks that only the lock's holder forwards
// and that a successor continues the same spool.
//
// Lag is the age of the oldest message not yet accepted by the sink
// (devicehub_forward_lag_seconds and Status.LagMs, 0 when caught up).
// The owner writes each rule's status to PostgreSQL about every
// PollInterval, which is what every instance's API answers.
package forward
