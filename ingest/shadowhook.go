package ingest

import (
	"strings"

	"devicehub/ingest/wire"
)

// ShadowHook is told of what devices' shadows (ingest/shadow's Service)
// answer: births, after which a device is sent its pending delta, and a
// device's request for its whole shadow (.../shadow/get). Ingest takes
// both on its persistent QoS 1 session and acknowledges each only once
// the hook calls done, so that one stopped before answering is delivered
// again to the next session (the shadow package's doc says why this
// loses no delta). Each call may wait while the hook is busy
// (backpressure) but must not wait for storage.
type ShadowHook interface {
	Born(productID, deviceID string, done func())
	Requested(productID, deviceID, messageID string, done func())
}

// toShadow hands a birth or a shadow request, decoded into rows, to the
// hook; done is the message's share of its acknowledgement.
func (in *Ingester) toShadow(t wire.Topic, rows *wire.Rows, done func()) {
	if t.Kind == wire.KindOnline {
		in.opt.Shadow.Born(t.ProductID, t.DeviceID, done)
		return
	}
	id := ""
	if n := len(rows.Msgs); n > 0 {
		id = rows.Msgs[n-1].MessageID
	}
	in.opt.Shadow.Requested(t.ProductID, t.DeviceID, strings.Clone(id), done) // the id is a view of the payload
}
