package link

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"devicehub/ingest/wire"
	"devicehub/tsdb"
)

// SendFirmware publishes an upgrade to the device t at QoS 1, recorded
// as a downlink (messageType FIRMWARE_UPGRADE). As a shadow message, it is
// sent whether or not the device is online as this instance sees it, to
// every broker of a pool. The publish waits at most the default timeout.
func (c *Commands) SendFirmware(ctx context.Context, t Target, m wire.FirmwareUpgrade) error {
	if m.Timestamp == 0 {
		m.Timestamp = time.Now().UnixMilli()
	}
	body, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("link: encode upgrade: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, c.opt.Timeout)
	defer cancel()
	topic := wire.DeviceTopic(t.ProductID, t.DeviceID, wire.LevelFirmwareUpgrade)
	send := c.client.Publish
	if e, ok := c.client.(everywhere); ok {
		send = e.PublishEverywhere
	}
	if err := send(ctx, topic, 1, body); err != nil {
		if ctx.Err() != nil {
			return ErrTimeout
		}
		return err
	}
	c.m.sent(kindFirmware)
	if c.rec != nil {
		_ = c.rec.RecordDownlink(ctx, tsdb.Message{
			Time: time.Now(), ProductID: t.ProductID, DeviceID: t.DeviceID, Direction: "down",
			MessageType: "FIRMWARE_UPGRADE", MessageID: m.MessageID, Topic: topic, Payload: body,
		})
	}
	return nil
}
