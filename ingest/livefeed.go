package ingest

import (
	"strings"

	"devicehub/tsdb"
)

// LiveFeed is told of property values once they are stored, for live
// updates (Options.Live; api/live's Hub is one).
type LiveFeed interface {
	// Watching reports whether values of the device are wanted. It runs
	// for every message with property values, on the workers' hot path:
	// it must be cheap and must not block.
	Watching(deviceID string) bool
	// Stored receives a watched device's values of one message once the
	// batch holding them is committed, on the writer's goroutine: it must
	// not block. values are the feed's to keep.
	Stored(values []tsdb.PropertyValue)
}

// liveDone is done preceded by handing copies of props to the live feed,
// for a message of a watched device. The copies own their strings: the
// decoded ones are views of the payload (jsonscan.go), which the QoS 0
// path lets go once the writer has copied the rows.
func (in *Ingester) liveDone(props []tsdb.PropertyValue, done func()) func() {
	values := make([]tsdb.PropertyValue, len(props))
	for i, p := range props {
		p.Property, p.Str = strings.Clone(p.Property), strings.Clone(p.Str)
		values[i] = p
	}
	return func() {
		in.opt.Live.Stored(values)
		done()
	}
}
