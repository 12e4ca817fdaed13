package main

import (
	"context"

	"devicehub/ingest/link"
	"devicehub/ingest/wire"
)

// lateCommands is the command path (link.Commands) of the services built
// before it: devices' shadows and firmware updates are built before
// ingest (which hands them reports from its start on), the command path
// after ingest (which records its downlinks). A send waits until set.
type lateCommands struct {
	ready chan struct{}
	cmds  *link.Commands
}

func newLateCommands() *lateCommands { return &lateCommands{ready: make(chan struct{})} }

// set makes c the command path; once only.
func (l *lateCommands) set(c *link.Commands) {
	l.cmds = c
	close(l.ready)
}

// wait returns the command path once set, or ctx's error before.
func (l *lateCommands) wait(ctx context.Context) (*link.Commands, error) {
	select {
	case <-l.ready:
		return l.cmds, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// SendShadow is the shadows' sender (shadow.Sender).
func (l *lateCommands) SendShadow(ctx context.Context, t link.Target, m link.ShadowMessage) (string, error) {
	c, err := l.wait(ctx)
	if err != nil {
		return "", err
	}
	return c.SendShadow(ctx, t, m)
}

// SendFirmware is firmware updates' sender (firmware.Sender).
func (l *lateCommands) SendFirmware(ctx context.Context, t link.Target, m wire.FirmwareUpgrade) error {
	c, err := l.wait(ctx)
	if err != nil {
		return err
	}
	return c.SendFirmware(ctx, t, m)
}
