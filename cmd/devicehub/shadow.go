package main

import (
	"context"

	"devicehub/ingest/link"
	"devicehub/ingest/shadow"
	"devicehub/meta"
	"devicehub/tsdb"
)

// newShadows builds the devices' shadows (ingest/shadow). Ingest hands it
// births from its start on, and the command path it sends on is built
// after ingest (which records the command path's downlinks): its sender
// waits for that (lateSender.set).
// changed is told each committed change (the live relay).
func newShadows(store *meta.Store, ts *tsdb.DB, cfg config, changed func(string, shadow.View)) (*shadow.Service, *lateSender) {
	send := &lateSender{ready: make(chan struct{})}
	opt := shadow.DefaultOptions()
	opt.Changed = changed
	svc := shadow.New(shadow.NewStore(store, cfg.QueryTimeout), ts, send, opt)
	return svc, send
}

// lateSender is a shadow.Sender whose link.Commands comes later.
type lateSender struct {
	ready chan struct{}
	cmds  *link.Commands
}

func (l *lateSender) set(c *link.Commands) {
	l.cmds = c
	close(l.ready)
}

func (l *lateSender) SendShadow(ctx context.Context, t link.Target, m link.ShadowMessage) (string, error) {
	select {
	case <-l.ready:
	case <-ctx.Done():
		return "", ctx.Err()
	}
	return l.cmds.SendShadow(ctx, t, m)
}
