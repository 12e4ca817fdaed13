package ingest

import (
	"time"

	"devicehub/ingest/wire"
)

// FirmwareHook is told of devices' firmware reports (ingest/firmware's
// Service): progress on .../firmware/progress and the version on
// .../firmware/version. Ingest takes both on its persistent QoS 1
// session and acknowledges each only once the hook calls done (the
// report is stored), so that one not stored is delivered again to the
// next session. A device's reports reach the hook in their order; each
// call may wait while the hook is busy (backpressure) but must not wait
// for storage.
type FirmwareHook interface {
	Progress(productID, deviceID string, p wire.FirmwareProgress, at time.Time, done func())
	Version(productID, deviceID, version string, at time.Time, done func())
}

// toFirmware hands a decoded firmware report to the hook; done is the
// message's share of its acknowledgement.
func (in *Ingester) toFirmware(t wire.Topic, p wire.FirmwareProgress, version string, at time.Time, done func()) {
	if t.Kind == wire.KindFirmwareProgress {
		in.opt.Firmware.Progress(t.ProductID, t.DeviceID, p, at, done)
		return
	}
	in.opt.Firmware.Version(t.ProductID, t.DeviceID, version, at, done)
}
