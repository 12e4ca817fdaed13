//go:build linux

package mqttc

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// deferPort sets IP_BIND_ADDRESS_NO_PORT on a socket about to be bound to
// a source address (Options.LocalIP): the kernel then picks its port at
// connect, unique for the four-tuple, instead of at bind, where it must
// find a port that no socket of the address holds towards any
// destination. A fleet generator's addresses hold up to 20,000
// connections each, and that search was 70% of a generator's CPU
// (inet_bind2_bucket_match_addr_any, inet_bhash2_conflict: perf, Linux
// 6.18, 2-core AMD EPYC), its time 94% in the kernel. fleet-connect's
// connect storm without plugin on that machine: 99% connected in 108.3 s
// with the generators at 194.5 CPU-s, and 27.2 s at 43.4 CPU-s with it.
func deferPort(_, _ string, c syscall.RawConn) error {
	var serr error
	if err := c.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_BIND_ADDRESS_NO_PORT, 1)
	}); err != nil {
		return err
	}
	return serr
}
