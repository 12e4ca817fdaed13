// Package live fans out what devices send, as it happens, to the
// subscribers of live updates (GET /api/live, api/live.go): every
// property value ingest accepts and every online/offline change of the devices each
// subscriber watches.
//
// Hub is fed by the ingest pipeline as it decodes each message, before
// storage (Decoded, through ingest's LiveFeed interface: events say
// "stored": false), and by the instance's presence view
// (PresenceChanged). Feeding never blocks: each subscriber
// has a bounded queue; when it is full the oldest event is dropped and
// counted, and the subscriber is told how many it missed. Memory is
// bounded by the queue limits times the subscriber limit, whatever the
// clients' speed.
//
// With several instances (REFERENCE.md "Scaling out") a value is decoded by the
// instance whose ingest took its message, while its subscriber may be on
// another. The relay (relay.go) carries it there: each instance announces
// the devices its subscribers watch on a Bus (PostgreSQL LISTEN/NOTIFY,
// pgbus.go), and an instance that decodes a value of a device watched
// elsewhere forwards it to the instances watching it.
// State changes need no relay: every instance's presence client sees every
// birth and last will.
//
// It must not import api or ingest: cmd wires ingest's hook to it, and api
// serves it through the small interface declared there. It uses tsdb for
// the rows' type only.
package live
