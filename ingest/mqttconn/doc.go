// Package mqttconn is how devicehub reaches its brokers: every client it
// opens, for every role (the ingest pipeline's subscribers and the removal
// of their retired sessions, the link's presence and command client, the
// dynamic-security and device-login control clients, the alarm runner's
// subscriber, a notification channel's one-off publisher), is set up by a
// Config and dialled by Dial or New and Connect, so a choice made for all
// (messages in order on one goroutine, a buffered connection without
// Nagle's delay, the reconnect interval, no retry of a first connect) is
// made here once, and a role's own choices (a persistent session, manual
// acknowledgement, resuming, keep-alive, handlers) are named fields.
//
// It also owns the broker setting (Brokers: one URL or a comma-separated
// pool, BrokerName for logs), the service Login and WaitToken, and the
// Subscriber: a role's persistent, manually acknowledged sessions, one
// per broker of a pool, subscribed to filters that may change while they
// run and again after each reconnect, handing the messages on in order
// through a bounded channel (the alarm runner's and the forwarder's
// intake).
//
// It imports paho only, nothing of the project: every ingest package and
// the link may use it. It neither stores nor acts on what it receives:
// what a client's session keeps across restarts (a Persistent session
// and its queued QoS 1 messages, redelivered when not acknowledged with
// ManualAck) is the broker's, and each role's doc says why that is
// neither lost nor doubled; this package's tests check against the real
// Mosquitto that the fields and the Subscriber do what those arguments
// rely on (TestPersistentManualAck, TestSubscriberRedelivers,
// TestSubscriberResubscribes).
package mqttconn
