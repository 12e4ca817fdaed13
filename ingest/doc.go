// Package ingest takes device traffic from the MQTT broker into storage:
// every uplink message and property value into the time-series store
// (tsdb) in batches, and device connection state (birth and last-will
// messages) into the metadata store (meta).
//
// The wire format is decoded by pure functions (decode.go: ParseTopic and
// the Decode* functions) that turn a topic and payload into tsdb rows, so
// the hot path is fuzzed and benchmarked without a network. Ingester owns
// the shared, persistent QoS 1 subscription with manual acknowledgements:
// a message is acknowledged only once the batch holding it is stored.
// Presence keeps every instance's in-memory view of which devices are
// online, on a plain subscription of its own client.
//
// It must not import api; it consumes meta and tsdb through the small
// interfaces declared here.
package ingest
