package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"devicehub/ingest/dynsec"
)

// fleetBroker is a private Mosquitto of the fleet scenario: the project's
// settings (.ci/mosquitto-setup) on a port and data directory of its own,
// so that the shared broker on :1884 is never filled with a million
// logins. stop ends it and removes its directory (its logins with it).
type fleetBroker struct {
	kind   string // brokerPlugin, brokerDynsec or brokerBare
	dir    string
	port   int
	cmd    *exec.Cmd
	exited chan struct{}
	// running is the broker's pid while it runs, 0 otherwise: the
	// samplers read it while a restart replaces cmd and exited.
	running atomic.Int64
	// Loaded is how long the broker took from exec to accepting
	// connections (it reads its dynamic-security file meanwhile).
	Loaded time.Duration
}

const (
	// brokerPlugin is the project's configuration as .ci/mosquitto-setup
	// writes it: devicehub's device-login plugin ahead of the
	// dynamic-security plugin.
	brokerPlugin = "devicehub plugin"
	// brokerDynsec is the same configuration without devicehub's plugin:
	// every login, devices' included, is a dynamic-security client.
	brokerDynsec = "dynamic security only"
	// brokerBare is the same configuration with no plugin at all and
	// anonymous clients allowed: what the machine gives a connect storm
	// with no login checked (fleet-connect's ceiling without the plugin).
	brokerBare = "no plugin"
)

// errFleetUnavailable marks what the fleet scenario needs and this tree
// or machine does not have (mosquitto, devicehub's plugin, the bulk API).
var errFleetUnavailable = errors.New("bench fleet: not available here")

// mosquittoBinary finds mosquitto in PATH or where Debian puts it.
func mosquittoBinary() (string, error) {
	if bin, err := exec.LookPath("mosquitto"); err == nil {
		return bin, nil
	}
	for _, p := range []string{"/usr/sbin/mosquitto", "/usr/bin/mosquitto"} {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("%w: mosquitto is not installed", errFleetUnavailable)
}

// isDynsecPlugin tells the dynamic-security plugin's library from others.
func isDynsecPlugin(path string) bool {
	return strings.Contains(filepath.Base(path), "mosquitto_dynamic_security")
}

// withoutOtherPlugins removes from a Mosquitto configuration every plugin
// but the dynamic-security one, with its plugin_opt_ lines. It also
// reports whether there was such a plugin.
func withoutOtherPlugins(conf string) (out string, removed bool) {
	return dropPlugins(conf, func(path string) bool { return !isDynsecPlugin(path) }, nil)
}

// withoutPlugins removes every plugin (with its plugin_opt_ lines) from a
// Mosquitto configuration and allows anonymous clients.
func withoutPlugins(conf string) string {
	out, _ := dropPlugins(conf, func(string) bool { return true },
		func(f []string) bool { return len(f) >= 1 && f[0] == "allow_anonymous" })
	return out + "allow_anonymous true\n"
}

// dropPlugins removes from a Mosquitto configuration the plugins drop
// picks (by the library's path), with the plugin_opt_ lines that belong
// to each (Mosquitto gives each plugin_opt_ line to the plugin line above
// it), and the lines also (if not nil) picks by their fields. removed
// reports whether a plugin was dropped.
func dropPlugins(conf string, drop func(path string) bool, also func(fields []string) bool) (out string, removed bool) {
	var b strings.Builder
	skipping := false
	sc := bufio.NewScanner(strings.NewReader(conf))
	for sc.Scan() {
		line := sc.Text()
		f := strings.Fields(line)
		if len(f) >= 2 && (f[0] == "plugin" || f[0] == "auth_plugin") {
			skipping = drop(f[1])
			removed = removed || skipping
		} else if skipping && (len(f) == 0 || !strings.HasPrefix(f[0], "plugin_opt_") && !strings.HasPrefix(f[0], "auth_opt_")) {
			skipping = false
		}
		if skipping || also != nil && also(f) {
			continue
		}
		b.WriteString(line)
		b.WriteByte('\n')
	}
	return b.String(), removed
}

// hasOtherPlugin reports whether conf loads a plugin besides the
// dynamic-security one: devicehub's device-login plugin.
func hasOtherPlugin(conf string) bool {
	_, removed := withoutOtherPlugins(conf)
	return removed
}

// startFleetBroker prepares a data directory with .ci/mosquitto-setup on a
// free port, keeps (brokerPlugin) or drops (brokerDynsec) devicehub's
// plugin, lets seed change the directory (the dynamic-security file)
// before the start, starts mosquitto and gives the service login its
// rights. A brokerPlugin broker whose configuration has no plugin of
// devicehub's is errFleetUnavailable.
func startFleetBroker(ctx context.Context, kind string, seed func(dir string) error) (_ *fleetBroker, err error) {
	bin, err := mosquittoBinary()
	if err != nil {
		return nil, err
	}
	root, err := repoRoot()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "devicehub-bench-fleet-broker-")
	if err != nil {
		return nil, err
	}
	b := &fleetBroker{kind: kind, dir: dir}
	defer func() {
		if err != nil {
			b.stop()
		}
	}()
	if b.port, err = freePort(); err != nil {
		return nil, err
	}
	setup := exec.CommandContext(ctx, "bash", filepath.Join(root, ".ci", "mosquitto-setup"), dir, strconv.Itoa(b.port))
	setup.Env = os.Environ()
	if out, err := setup.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("bench: .ci/mosquitto-setup: %w\n%s", err, out)
	}
	confPath := filepath.Join(dir, "mosquitto.conf")
	src, err := os.ReadFile(confPath)
	if err != nil {
		return nil, err
	}
	conf := string(src)
	switch kind {
	case brokerPlugin:
		if !hasOtherPlugin(conf) {
			return nil, fmt.Errorf("%w: .ci/mosquitto-setup loads no device-login plugin of devicehub's (ingest/devauth/mosquitto)", errFleetUnavailable)
		}
	case brokerDynsec:
		conf, _ = withoutOtherPlugins(conf)
	case brokerBare:
		conf = withoutPlugins(conf)
	default:
		return nil, fmt.Errorf("bench: unknown broker kind %q", kind)
	}
	if os.Geteuid() == 0 {
		// As root mosquitto drops to user mosquitto, which cannot enter a
		// private temporary directory: stay root.
		conf += "\nuser root\n"
	}
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		return nil, err
	}
	if seed != nil {
		if err := seed(dir); err != nil {
			return nil, err
		}
	}
	start := time.Now()
	b.cmd = exec.Command(bin, "-c", confPath)
	b.cmd.Dir = dir
	// Its own process group (stop signals only it); killed with this
	// process if this one dies first.
	b.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := b.cmd.Start(); err != nil {
		b.cmd = nil
		return nil, fmt.Errorf("bench: start mosquitto: %w", err)
	}
	b.exited = make(chan struct{})
	b.watch(b.cmd, b.exited)
	deadline := time.Now().Add(5 * time.Minute) // a large dynamic-security file takes a while to load
	for {
		c, err := net.DialTimeout("tcp", b.addr(), time.Second)
		if err == nil {
			c.Close()
			break
		}
		select {
		case <-b.exited:
			return nil, fmt.Errorf("bench: private mosquitto exited at start:\n%s", b.logTail())
		default:
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil, fmt.Errorf("bench: private mosquitto not up on port %d: %v", b.port, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	b.Loaded = time.Since(start)
	if kind == brokerBare {
		return b, nil // no logins, no rights to give
	}
	// The service login's rights (downlinks, backlog markers), as a
	// devicehub leader gives them, before anything else connects with it.
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	admin, err := dialAdmin(actx, b.url())
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	if err := dynsec.EnsureService(actx, admin, serviceLogin().Username); err != nil {
		return nil, fmt.Errorf("bench: private broker: service login rights: %w", err)
	}
	return b, nil
}

func (b *fleetBroker) addr() string { return "127.0.0.1:" + strconv.Itoa(b.port) }

// url is the broker's address for paho and devicehub.
func (b *fleetBroker) url() string { return "tcp://" + b.addr() }

// pid is the broker process, 0 once stopped.
func (b *fleetBroker) pid() int {
	if b == nil {
		return 0
	}
	return int(b.running.Load())
}

// watch publishes cmd's pid in running until it exits, then closes exited.
func (b *fleetBroker) watch(cmd *exec.Cmd, exited chan struct{}) {
	pid := int64(cmd.Process.Pid)
	b.running.Store(pid)
	go func() {
		_ = cmd.Wait()
		b.running.CompareAndSwap(pid, 0)
		close(exited)
	}()
}

// dynsecFileSize is the size of the dynamic-security plugin's file now.
func (b *fleetBroker) dynsecFileSize() int64 {
	fi, err := os.Stat(filepath.Join(b.dir, "dynsec.json"))
	if err != nil {
		return 0
	}
	return fi.Size()
}

func (b *fleetBroker) logTail() string {
	log, _ := os.ReadFile(filepath.Join(b.dir, "mosquitto.log"))
	if len(log) > 3000 {
		log = log[len(log)-3000:]
	}
	return string(log)
}

// stop ends the broker (SIGTERM, then SIGKILL after 10 s) and removes its
// directory. It may be called more than once.
func (b *fleetBroker) stop() {
	if b == nil {
		return
	}
	if b.cmd != nil {
		stopGroup(b.cmd, b.exited, 10*time.Second)
		b.cmd = nil
	}
	if b.dir != "" {
		os.RemoveAll(b.dir)
		b.dir = ""
	}
}

// freePort is a loopback TCP port nobody listens on right now.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// stopGroup ends cmd's process group: SIGTERM, then SIGKILL if it has
// not exited (exited closed) within grace; it returns once it has.
func stopGroup(cmd *exec.Cmd, exited <-chan struct{}, grace time.Duration) {
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(grace):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-exited
	}
}
