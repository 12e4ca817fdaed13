package main

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"devicehub/api/live"
	"devicehub/ingest/firmware"
	"devicehub/ingest/link"
	"devicehub/meta"
)

// newFirmware builds firmware updates (ingest/firmware): packages in
// cfg.FirmwareDir, the engine (Run), and ingest's hook for devices'
// reports. Its sender waits for the command path (lateFirmware.set).
func newFirmware(ctx context.Context, store *meta.Store, cfg config, log *slog.Logger, reg prometheus.Registerer,
	changed func(firmware.Change)) (*firmware.Service, *lateFirmware, error) {
	files, err := firmware.NewFiles(cfg.FirmwareDir, cfg.FirmwareMaxSize)
	if err != nil {
		return nil, nil, err
	}
	send := &lateFirmware{ready: make(chan struct{})}
	opt := firmware.DefaultOptions()
	opt.PublicURL, opt.URLLifetime, opt.Logger, opt.Registerer, opt.Changed = cfg.FirmwarePublicURL, cfg.FirmwareURLLifetime, log, reg, changed
	svc, err := firmware.New(ctx, firmware.NewStore(store, cfg.QueryTimeout), files, store, send, opt)
	if err != nil {
		return nil, nil, err
	}
	return svc, send, nil
}

// lateFirmware is a firmware.Sender whose link.Commands comes later.
type lateFirmware struct {
	ready chan struct{}
	cmds  *link.Commands
}

func (l *lateFirmware) set(c *link.Commands) {
	l.cmds = c
	close(l.ready)
}

func (l *lateFirmware) SendFirmware(ctx context.Context, t link.Target, m link.FirmwareUpgrade) error {
	select {
	case <-l.ready:
	case <-ctx.Done():
		return ctx.Err()
	}
	return l.cmds.SendFirmware(ctx, t, m)
}

// firmwareChanged announces a committed change of a device's firmware
// job (the firmware service's Changed) to every instance's live hub.
func (r *eventRelay) firmwareChanged(c firmware.Change) {
	r.announce(firmwareChannel, live.FirmwareEvent{DeviceID: c.DeviceID, ProductID: c.ProductID, RolloutID: c.RolloutID,
		State: c.State, Progress: c.Progress, Reason: c.Reason, Version: c.Version, Timestamp: time.Now().UnixMilli()})
}
