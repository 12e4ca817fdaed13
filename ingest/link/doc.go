// Package link is how a command reaches a device and its answer comes
// back: every instance's own MQTT client, its view of which devices are
// online, and the request/reply table of property reads, property writes
// and function invokes; it also carries the shadow's messages to devices
// (SendShadow: deltas and answers, sent without a reply to wait for).
//
// Presence (presence.go) is the instance's plain (not shared) client: it
// keeps the in-memory online view from birth and last-will messages,
// seeded from the stored state at start and after every reconnect, and
// carries the commands' publishes and reply subscriptions. Commands
// (commands.go) publishes a downlink with a fresh messageId and waits for
// the reply with that id, the request's deadline, the device going offline
// or the connection's loss, whichever comes first; its errors (ErrOffline,
// ErrTimeout, ErrTooBusy, DeviceError) are mapped to the spec's codes by
// api. With a broker pool (Brokers: a comma-separated broker setting)
// Presence holds a client per broker and one view that notes, per online
// device, the broker of its last birth: a will from another broker is
// stale (the device moved) and ignored, and a command goes to that broker
// only. Its clients are set up and dialled by ingest/mqttconn, as every
// devicehub client is.
//
// It must not import api or ingest (the uplink pipeline, which imports
// it): an instance with only the API role builds the link and not the
// pipeline. What it needs from storage comes through the small interfaces
// declared here: OnlineLister (the stored online devices, *meta.Store) and
// the optional DownlinkRecorder (*ingest.Ingester, with tsdb's Message).
package link
