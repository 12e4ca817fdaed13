package main

import (
	"context"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"devicehub/api/live"
)

// startLive starts the live-update hub (REFERENCE.md "Live updates"), joined
// to the other instances of the deployment through the PostgreSQL
// database they share. stop closes it and its bus.
func startLive(ctx context.Context, dsn string, log *slog.Logger, reg prometheus.Registerer) (hub *live.Hub, stop func(), err error) {
	bus, err := live.NewPGBus(dsn)
	if err != nil {
		return nil, nil, err
	}
	opt := live.DefaultOptions()
	opt.Bus, opt.Registerer, opt.Logger = bus, reg, log
	if hub, err = live.New(ctx, opt); err != nil {
		bus.Close()
		return nil, nil, err
	}
	return hub, func() { hub.Close(); bus.Close() }, nil
}
