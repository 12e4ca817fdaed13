// Package forward owns forwarding telemetry to other systems: forwarding
// rules (store.go) and the forwarder that sends matching messages to a
// webhook or another MQTT broker through a spool on disk.
package forward
