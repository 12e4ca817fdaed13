//go:build !linux

package mqttc

import "syscall"

// deferPort is Linux's (dial_linux.go); elsewhere the port is chosen at
// bind.
func deferPort(_, _ string, _ syscall.RawConn) error { return nil }
