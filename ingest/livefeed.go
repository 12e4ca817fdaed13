package ingest

import (
	"devicehub/tsdb"
)

// LiveFeed is told of property values as soon as they are decoded, for
// live updates (Options.Live; api/live's Hub is one).
//
// Values go to it before they are stored, not after the batch holding
// them is inserted: a subscriber sees a value within milliseconds of its
// message instead of up to a flush interval (1 s) later. Storage is
// unchanged: the message is acknowledged only once its batch is stored
// (at-least-once), so a value whose insert fails is stored later from the
// broker's redelivery, and its event may then come twice. A message that
// fails to decode, or is dropped (unknown device, wrong product, not
// active, retained, oversize), is never handed over.
type LiveFeed interface {
	// Watching reports whether values of the device are wanted. It runs
	// for every message with property values, on the workers' hot path:
	// it must be cheap and must not block.
	Watching(deviceID string) bool
	// Decoded receives a watched device's values of one message once it
	// is decoded and checked, before storage, on the worker's goroutine:
	// it must not block, and must keep nothing of values once it returns
	// (their strings are views of the message's payload, ingest/wire).
	Decoded(values []tsdb.PropertyValue)
}

// liveDecoded hands the values of a device's message to the live feed
// when a subscriber watches the device.
func (in *Ingester) liveDecoded(deviceID string, props []tsdb.PropertyValue) {
	if in.opt.Live != nil && len(props) > 0 && in.opt.Live.Watching(deviceID) {
		in.opt.Live.Decoded(props)
	}
}
