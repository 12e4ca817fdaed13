package main

import (
	"context"
	"log/slog"
	"net"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"devicehub/api/live"
	"devicehub/ingest/firmware"
	"devicehub/meta"
)

// newFirmware builds firmware updates (ingest/firmware): packages in
// cfg.FirmwareDir, the engine (Run), and ingest's hook for devices'
// reports. It sends upgrades on send, the command path built after
// ingest (lateCommands).
func newFirmware(ctx context.Context, store *meta.Store, cfg config, log *slog.Logger, reg prometheus.Registerer,
	send *lateCommands, changed func(firmware.Change)) (*firmware.Service, error) {
	files, err := firmware.NewFiles(cfg.FirmwareDir, cfg.FirmwareMaxSize)
	if err != nil {
		return nil, err
	}
	opt := firmware.DefaultOptions()
	opt.PublicURL, opt.URLLifetime = publicURL(cfg), cfg.FirmwareURLLifetime
	opt.Logger, opt.Registerer, opt.Changed = log, reg, changed
	return firmware.New(ctx, firmware.NewStore(store, cfg.QueryTimeout), files, store, send, opt)
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
