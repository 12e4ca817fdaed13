// Package ingest takes device traffic from the MQTT broker into storage:
// every uplink message and property value into the time-series store
// (tsdb) in batches, and device connection state (birth and last-will
// messages) into the metadata store (meta).
//
// The wire format is decoded by pure functions (package ingest/wire:
// ParseTopic and the Decode* functions) that turn a topic and payload into
// tsdb rows, so the hot path is fuzzed and benchmarked without a network. Ingester owns
// the shared, persistent QoS 1 subscriptions with manual acknowledgements:
// a message is acknowledged only once the batch holding it is stored.
// Births and wills travel in a session of their own at each broker, and
// have workers and a ClickHouse writer of their own, so that a device's
// state waits neither behind the reports published ahead of it nor for
// room in the reports' writer, which a storm's backlog fills
// (sessions.go); the one start that moves them there from a session of
// an earlier run neither loses nor doubles one (handoff.go).
//
// The device link (commands to devices, the in-memory presence view and
// the MQTT helpers both sides use: devicehub's login, the buffered
// connection) is package ingest/link, which an instance without the ingest
// role runs alone; Ingester records the link's downlinks
// (link.DownlinkRecorder).
//
// Reported property values are checked against the device's thing model
// and its product's outsideModelPolicy (keep or drop) applied before they
// are stored, from models kept in memory (models.go); births and wills
// are written to PostgreSQL by several batchers, each for its share of
// the devices, a device's change still waiting folded into the one behind
// it (state.go).
//
// Births and devices' requests for their shadow are also handed to
// Options.Shadow (ingest/shadow, through ShadowHook), and acknowledged
// only once it has answered them (shadowhook.go); devices' firmware
// progress and version reports go to Options.Firmware (ingest/firmware,
// through FirmwareHook), acknowledged once it stored them (firmwarehook.go).
//
// Several brokers (Options.BrokerURL with a comma-separated list, a
// broker pool each holding a share of the devices) feed one pipeline:
// each broker has its own subscriber connections, and a will counts only
// from the broker the device's last birth came from (brokers.go).
//
// It must not import api; it consumes meta and tsdb through the small
// interfaces declared here.
package ingest
