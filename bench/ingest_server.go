package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// BuildServer builds cmd/devicehub into dir and returns the binary's path.
// It runs `go build`, the go command found in PATH, in the current
// directory, which must be inside the devicehub module (the repository or
// any folder of it).
func BuildServer(ctx context.Context, dir string) (string, error) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		return "", fmt.Errorf("bench: building the server needs the go command in PATH: %w", err)
	}
	bin := filepath.Join(dir, "devicehub")
	out, err := exec.CommandContext(ctx, goBin, "build", "-o", bin, "devicehub/cmd/devicehub").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("bench: go build devicehub/cmd/devicehub (run inside the repository): %w\n%s", err, out)
	}
	return bin, nil
}

// serverProc is one devicehub child process.
type serverProc struct {
	cmd     *exec.Cmd
	base    string // http://127.0.0.1:port
	logPath string
	exited  chan struct{}
	waitErr error // of cmd.Wait, once exited is closed
}

// serverConfig is the child's configuration, as DEVICEHUB_* variables
// (without the prefix) and extra flags.
type serverConfig struct {
	Env  map[string]string
	Args []string
}

// freeAddr returns 127.0.0.1:<a port free right now>.
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr, nil
}

// startServer starts bin with this process's environment minus every
// DEVICEHUB_* variable, plus cfg, logging to logDir/devicehub.log (after
// what an earlier child there logged), and
// waits until /healthz answers 200 (or the child exits, or 60 s pass).
// Its HTTP address is a free port's unless cfg.Env sets HTTP_ADDR.
func startServer(ctx context.Context, bin, logDir string, cfg serverConfig) (*serverProc, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	if a, ok := cfg.Env["HTTP_ADDR"]; ok { // chosen by the caller, who names it elsewhere too
		addr = a
	}
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DEVICEHUB_") {
			env = append(env, kv)
		}
	}
	env = append(env, "DEVICEHUB_HTTP_ADDR="+addr)
	for k, v := range cfg.Env {
		env = append(env, "DEVICEHUB_"+k+"="+v)
	}
	logPath := filepath.Join(logDir, "devicehub.log")
	// Appended to: a restarted child's log follows its predecessor's.
	lf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer lf.Close() // the child holds its own descriptor
	cmd := exec.Command(bin, cfg.Args...)
	cmd.Env, cmd.Stdout, cmd.Stderr = env, lf, lf
	// The child dies with the bench if the bench is killed outright.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("bench: start %s: %w", bin, err)
	}
	s := &serverProc{cmd: cmd, base: "http://" + addr, logPath: logPath, exited: make(chan struct{})}
	go func() { s.waitErr = cmd.Wait(); close(s.exited) }()

	client := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case <-s.exited:
			return nil, fmt.Errorf("bench: devicehub exited at start: %v\n%s", s.waitErr, s.logTail())
		default:
		}
		if resp, err := client.Get(s.base + "/healthz"); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return s, nil
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			s.stop(5 * time.Second)
			return nil, fmt.Errorf("bench: devicehub not healthy on %s within 60s (%v)\n%s", s.base, ctx.Err(), s.logTail())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (s *serverProc) pid() int { return s.cmd.Process.Pid }

// stop sends SIGTERM (the server drains and flushes) and waits up to
// grace, then kills. It returns an error if the child did not exit 0.
func (s *serverProc) stop(grace time.Duration) error {
	select {
	case <-s.exited:
		return s.exitErr()
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
		return s.exitErr()
	case <-time.After(grace):
		_ = s.cmd.Process.Kill()
		<-s.exited
		return fmt.Errorf("bench: devicehub did not stop within %s after SIGTERM; killed", grace)
	}
}

func (s *serverProc) exitErr() error {
	if s.waitErr != nil {
		return fmt.Errorf("bench: devicehub exited: %w\n%s", s.waitErr, s.logTail())
	}
	return nil
}

func (s *serverProc) logTail() string {
	b, _ := os.ReadFile(s.logPath)
	if len(b) > 3000 {
		b = b[len(b)-3000:]
	}
	return string(b)
}

// scrapeMetrics fetches the child's /metrics.
func (s *serverProc) scrapeMetrics(ctx context.Context) (promSamples, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.base+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		return nil, fmt.Errorf("bench: scrape /metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("bench: scrape /metrics: HTTP %d", resp.StatusCode)
	}
	return parsePromText(resp.Body)
}

// promSamples are the samples of a Prometheus text exposition, keyed by
// the series as written: `name` or `name{label="v",...}`.
type promSamples map[string]float64

// parsePromText reads the Prometheus text format (0.0.4): comments are
// skipped, each other line is a series, a value and an optional timestamp.
// Label values holding spaces are handled; that is all devicehub exposes.
func parsePromText(r io.Reader) (promSamples, error) {
	out := promSamples{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if l == "" || l[0] == '#' {
			continue
		}
		series, rest := l, ""
		if i := strings.LastIndexByte(l, '}'); i >= 0 {
			series, rest = l[:i+1], l[i+1:]
		} else if i := strings.IndexAny(l, " \t"); i >= 0 {
			series, rest = l[:i], l[i:]
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			return nil, fmt.Errorf("bench: metrics line without value: %q", l)
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return nil, fmt.Errorf("bench: metrics line %q: %w", l, err)
		}
		out[series] = v
	}
	return out, sc.Err()
}

// sum adds the samples of metric name over every label set.
func (m promSamples) sum(name string) float64 {
	var t float64
	for k, v := range m {
		if k == name || strings.HasPrefix(k, name+"{") {
			t += v
		}
	}
	return t
}

// byLabel returns name's samples keyed by the value of label, leaving out
// zeros.
func (m promSamples) byLabel(name, label string) map[string]uint64 {
	out := map[string]uint64{}
	for k, v := range m {
		rest, ok := strings.CutPrefix(k, name+"{")
		if !ok || v == 0 {
			continue
		}
		_, val, ok := strings.Cut(rest, label+`="`)
		if !ok {
			continue
		}
		val, _, _ = strings.Cut(val, `"`)
		out[val] += uint64(v)
	}
	return out
}
