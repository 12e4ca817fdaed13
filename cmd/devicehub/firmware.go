package main

import (
	"context"
	"log/slog"
	"net"
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
	opt.PublicURL, opt.URLLifetime = publicURL(cfg), cfg.FirmwareURLLifetime
	opt.Logger, opt.Registerer, opt.Changed = log, reg, changed
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

// publicURL is -firmware-public-url, or else http:// and -http-addr, with
// 127.0.0.1 for an address of every interface.
func publicURL(cfg config) string {
	if cfg.FirmwarePublicURL != "" {
		return cfg.FirmwarePublicURL
	}
	host, port, err := net.SplitHostPort(cfg.HTTPAddr)
	if err != nil {
		return "http://" + cfg.HTTPAddr
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port)
}
