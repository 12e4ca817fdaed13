// Package mqtttest runs a private Mosquitto for one test: the project's
// settings (.ci/mosquitto-setup, with its dynamic-security plugin and
// service login) on a free port and a temporary data directory, so that
// fault tests can stop and restart it without touching the shared broker
// other tests use; and it gives tests broker logins (login.go).
package mqtttest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"devicehub/bench/testkit"
	"devicehub/ingest/dynsec"
)

// Broker is a mosquitto process of one test.
type Broker struct {
	t      testing.TB
	bin    string
	dir    string
	port   int
	tls    int // TLS listener's port; 0: none
	cmd    *exec.Cmd
	exited chan struct{}
}

// StartBroker starts a private broker, killed when the test ends; the test
// is skipped where mosquitto is not installed. Extra lines are appended to
// the configuration (e.g. "log_type all" to read the packets in Log).
func StartBroker(t testing.TB, extra ...string) *Broker {
	t.Helper()
	return startBroker(t, false, extra)
}

// StartBrokerTLS is StartBroker with a TLS listener too (TLSURL, CAFile),
// its certificate self-signed as `make run` makes it.
func StartBrokerTLS(t testing.TB) *Broker {
	t.Helper()
	return startBroker(t, true, nil)
}

func startBroker(t testing.TB, withTLS bool, extra []string) *Broker {
	t.Helper()
	bin := mosquittoBin(t)
	// A free port may be taken by another test's broker between
	// FreePort and this one's bind: then it starts again on other ports.
	for attempt := 1; ; attempt++ {
		b := prepareBroker(t, bin, withTLS, extra)
		err := b.start()
		if err == nil {
			return b
		}
		if attempt == 3 || !strings.Contains(err.Error(), "Address already in use") {
			t.Fatal(err)
		}
	}
}

// mosquittoBin is the broker's program; the test fails without one.
func mosquittoBin(t testing.TB) string {
	t.Helper()
	bin, err := exec.LookPath("mosquitto")
	if err != nil {
		for _, p := range []string{"/usr/sbin/mosquitto", "/usr/bin/mosquitto"} {
			if _, err := os.Stat(p); err == nil {
				bin = p
			}
		}
	}
	if bin == "" {
		t.Fatal("mosquitto is not installed: .ci/services installs it (make test runs it)")
	}
	return bin
}

// prepareBroker writes a private broker's configuration on free ports.
func prepareBroker(t testing.TB, bin string, withTLS bool, extra []string) *Broker {
	t.Helper()
	dir := t.TempDir()
	port := FreePort(t)
	args := []string{filepath.Join(testkit.RepoRoot(t), ".ci", "mosquitto-setup"), dir, strconv.Itoa(port)}
	tlsPort := 0
	if withTLS {
		tlsPort = FreePort(t)
		args = append(args, strconv.Itoa(tlsPort))
	}
	setup := exec.Command("bash", args...)
	if out, err := setup.CombinedOutput(); err != nil {
		t.Fatalf("mosquitto-setup: %v\n%s", err, out)
	}
	src, err := os.ReadFile(filepath.Join(dir, "mosquitto.conf"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := string(src)
	if os.Geteuid() == 0 {
		// As root mosquitto drops to user mosquitto, which cannot enter
		// the test's temporary directory: stay root.
		cfg += "\nuser root\n"
	}
	cfg += "\n" + strings.Join(extra, "\n") + "\n"
	if err := os.WriteFile(filepath.Join(dir, "mosquitto.conf"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	return &Broker{t: t, bin: bin, dir: dir, port: port, tls: tlsPort}
}

// start starts the broker and, once it runs, gives the service login its
// rights and arranges its end with the test.
func (b *Broker) start() error {
	t := b.t
	t.Helper()
	if err := b.run(); err != nil {
		return err
	}
	dir := b.dir
	t.Cleanup(func() {
		b.Stop(syscall.SIGKILL)
		if t.Failed() {
			log, _ := os.ReadFile(filepath.Join(dir, "mosquitto.log"))
			t.Logf("mosquitto.log:\n%s", log)
		}
	})
	// The service login's rights, before anything connects with it.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	admin := dialAdmin(ctx, t, b.URL())
	defer admin.Close()
	svc, _ := Service()
	if err := dynsec.EnsureService(ctx, admin, svc); err != nil {
		t.Fatalf("service login rights: %v", err)
	}
	return nil
}

// Log returns the broker's log so far.
func (b *Broker) Log() string {
	log, err := os.ReadFile(filepath.Join(b.dir, "mosquitto.log"))
	if err != nil {
		b.t.Fatal(err)
	}
	return string(log)
}

// URL is the broker's address for paho.
func (b *Broker) URL() string { return "tcp://127.0.0.1:" + strconv.Itoa(b.port) }

// TLSURL is the TLS listener's address (StartBrokerTLS), by the name its
// certificate holds.
func (b *Broker) TLSURL() string { return "ssl://localhost:" + strconv.Itoa(b.tls) }

// CAFile is the certificate that signed the TLS listener's.
func (b *Broker) CAFile() string { return filepath.Join(b.dir, "tls", "ca.crt") }

// Start (re)starts the broker on its port and waits until it runs.
func (b *Broker) Start() {
	b.t.Helper()
	if err := b.run(); err != nil {
		b.t.Fatal(err)
	}
}

// running is what Mosquitto logs once every listener of its
// configuration is open.
const running = " running\n"

// run starts the broker process and waits until it logs that it runs:
// the port answering is not enough, another test's broker may hold it.
func (b *Broker) run() error {
	logPath := filepath.Join(b.dir, "mosquitto.log")
	before, _ := os.ReadFile(logPath) // a restart appends to the log
	runs := strings.Count(string(before), running)
	cmd := exec.Command(b.bin, "-c", filepath.Join(b.dir, "mosquitto.conf"))
	cmd.Dir = b.dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	b.cmd, b.exited = cmd, make(chan struct{})
	exited := b.exited
	go func() { _ = cmd.Wait(); close(exited) }()
	deadline := time.Now().Add(15 * time.Second)
	for {
		log, _ := os.ReadFile(logPath)
		if strings.Count(string(log), running) > runs {
			return nil
		}
		select {
		case <-exited:
			b.cmd = nil
			log, _ := os.ReadFile(logPath)
			return fmt.Errorf("private mosquitto exited at start: %s", log[len(before):])
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("private mosquitto not running on port %d within 15 s", b.port)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop signals the broker (only the process this test started) and waits
// for it to exit; SIGTERM lets it save its persistence file.
func (b *Broker) Stop(sig syscall.Signal) {
	if b.cmd == nil {
		return
	}
	_ = syscall.Kill(-b.cmd.Process.Pid, sig)
	select {
	case <-b.exited:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-b.cmd.Process.Pid, syscall.SIGKILL)
		<-b.exited
	}
	b.cmd = nil
}

// FreePort returns a loopback TCP port nobody listens on.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// IDRanges summarizes message ids "m<n>" as ranges of n ("3 5-9 ..."),
// for fault tests that report which messages were lost or duplicated.
func IDRanges(ids []string) string {
	var ns []int
	for _, id := range ids {
		if n, err := strconv.Atoi(strings.TrimPrefix(id, "m")); err == nil {
			ns = append(ns, n)
		}
	}
	sort.Ints(ns)
	var b strings.Builder
	for i := 0; i < len(ns); {
		j := i
		for j+1 < len(ns) && ns[j+1] == ns[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteString(" ")
		}
		if b.Len() > 300 {
			b.WriteString("...")
			break
		}
		if i == j {
			fmt.Fprintf(&b, "%d", ns[i])
		} else {
			fmt.Fprintf(&b, "%d-%d", ns[i], ns[j])
		}
		i = j + 1
	}
	return b.String()
}
