package mqtttest

import (
	"net"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// TestRunSeesATakenPort: a broker whose port another process holds is
// not taken for running because the port answers (as another test's
// broker would answer): run reports the failed bind, on which
// startBroker tries other ports.
func TestRunSeesATakenPort(t *testing.T) {
	b := prepareBroker(t, mosquittoBin(t), false, nil)
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(b.port))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	err = b.run()
	if err == nil {
		b.Stop(syscall.SIGKILL)
		t.Fatal("run found the broker running on a port another process holds")
	}
	if !strings.Contains(err.Error(), "Address already in use") {
		t.Fatalf("run: %v, want the failed bind", err)
	}
}
