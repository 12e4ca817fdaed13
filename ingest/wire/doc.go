// Package wire is the device wire format of DESIGN.md in one place: the
// MQTT topics devices and devicehub use (ParseTopic, DeviceTopic,
// UplinkFilters, ParsePresenceTopic), the decoding of uplink payloads into
// tsdb rows (Decode and its kinds, over a JSON scanner of its own), the
// firmware downlink's body (FirmwareUpgrade), and message ids
// (NewMessageID, MessageTime). Its functions are pure: bytes in, values
// out, no I/O; they are fuzzed here.
//
// It imports tsdb for the row types only, and nothing else of devicehub.
package wire
