package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"devicehub/bench/testkit"
	"devicehub/ingest/mqtttest"
	"devicehub/tsdb/tsdbtest"
)

// quickStartStep is what one command of README's quick start must do;
// quickStartSteps has one per command, in the README's order.
type quickStartStep struct {
	match string         // a substring of the command
	out   *regexp.Regexp // its output (stdout and stderr) must match; nil: no output
	check string         // optional bash run right after it, must print "ok"
	retry time.Duration  // a read-only command that may be repeated until its output matches, up to this long
	again *regexp.Regexp // its output when the block runs a second time on the same database, where it differs
}

var quickStartSteps = []quickStartStep{
	{match: "API=http"},
	{match: "MQTT_PORT="},
	{match: "/api/authorize/login", check: `[[ $TOKEN =~ ^[0-9a-f]{32,}$ ]] && echo ok`},
	{match: `[ -n "$TOKEN" ] ||`},
	{match: "/api/device/product", out: regexp.MustCompile(`^\{"message":"success",.*"id":"meter".*\\"id\\":\\"humidity\\".*"status":200`),
		again: regexp.MustCompile(`^\{"message":".*meter.*already exists","status":400,"code":"duplicate_key"`)},
	{match: "/api/device-product/meter/deploy", out: regexp.MustCompile(`^\{"message":"success",.*"status":200`)},
	{match: "KEY=$(curl"},
	{match: "/api/device/instance/meter-1/secret", check: `[[ $KEY =~ ^[0-9a-f]{32}$ ]] && echo ok`},
	{match: `[ -n "$KEY" ] || echo`},
	{match: "/api/device/instance/meter-1/deploy", out: regexp.MustCompile(`^\{"message":"success",.*"status":200`)},
	{match: "mosquitto_pub"},
	{match: "sleep "},
	{match: "/api/dashboard/_multi", retry: 10 * time.Second, out: regexp.MustCompile(
		`^\{"message":"success","result":\[` +
			`\{"group":"latest",.*"property":"humidity","propertyName":"Humidity",.*"formatValue":"40%".*\},` +
			`\{"group":"latest",.*"property":"temperature","propertyName":"Temperature",.*"formatValue":"21.5".*\},` +
			`\{"group":"today","data":\{"value":1,"timeString":"[0-9-]{10}","timestamp":0,"time":[0-9]{13},"timeZone":"[^"]+"\}\}\]`),
		again: regexp.MustCompile(`^\{"message":"success","result":\[` +
			`\{"group":"latest",.*"property":"humidity",.*"formatValue":"40%".*\},` +
			`\{"group":"latest",.*"property":"temperature",.*"formatValue":"21.5".*\},` +
			`\{"group":"today","data":\{"value":[1-9][0-9]*,`)}, // run 1's messages too (the simulator's among them), unless the day turned
	{match: "devicesim"},
	{match: "/api/device/standard/sim-1/property/temperature", out: regexp.MustCompile(
		`^\{"message":"success","result":\{"temperature":-?[0-9.]+\},"status":200,`)},
	{match: "kill "},
}

// TestQuickStart runs the shell block of README's "Quick start" with bash,
// command by command, against the real binary on a port, broker and
// databases of its own, and checks each command's output: the quick start
// is what a new user types, so it must work as written. The block's first
// two commands set API and MQTT_PORT to make run's addresses; the test sets
// them to its own, and no other command may name those addresses.
func TestQuickStart(t *testing.T) {
	t.Parallel()
	for _, tool := range []string{"bash", "curl", "sed", "mosquitto_pub"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is not installed: .ci/services installs it (make test runs it)", tool)
		}
	}
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	cmds, err := quickStartCommands(string(readme))
	if err != nil {
		t.Fatal(err)
	}
	if len(cmds) != len(quickStartSteps) {
		t.Fatalf("the quick start has %d commands, quickStartSteps %d: change both together", len(cmds), len(quickStartSteps))
	}
	for i, c := range cmds {
		if !strings.Contains(c, quickStartSteps[i].match) {
			t.Fatalf("command %d is not the one quickStartSteps expects there (%q; change both together): %s", i+1, quickStartSteps[i].match, c)
		}
	}

	broker := mqtttest.StartBroker(t)
	bin := testkit.Devicehub(t)
	env, chDB, _ := firstStartEnv(t, broker.URL(), "quickstart") // a new user's first start
	srv := startServer(t, bin, env, "quickstart")
	tsdbtest.OpenDB(t, chDB, nil) // dropped at the end, after the server stops
	t.Cleanup(func() {
		srv.signal(syscall.SIGTERM)
		srv.wait(15 * time.Second)
	})
	brokerURL, err := url.Parse(broker.URL())
	if err != nil {
		t.Fatal(err)
	}

	// The quick start runs ./bin/devicesim, which make run builds.
	work := t.TempDir()
	build := exec.Command("go", "build", "-o", filepath.Join(work, "bin", "devicesim"), "devicehub/cmd/devicesim")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build devicesim: %v\n%s", err, out)
	}

	t.Cleanup(func() {
		if t.Failed() {
			sim, _ := os.ReadFile(filepath.Join(work, "sim.log"))
			t.Logf("sim.log:\n%s\nserver log:\n%s", sim, srv.logTail())
		}
	})
	// Twice on the same database, each time in a new shell, as a user
	// who runs it again another day would.
	for pass := 1; pass <= 2; pass++ {
		runQuickStart(t, startShell(t, work), cmds, pass, srv.base, brokerURL.Port())
	}
}

// runQuickStart runs the quick start's commands in sh, checking each
// command's output against its step (its again on the second pass).
func runQuickStart(t *testing.T, sh *shell, cmds []string, pass int, base, mqttPort string) {
	t.Helper()
	started := time.Now()
	for i, cmd := range cmds {
		switch {
		case strings.HasPrefix(cmd, "API="):
			if !strings.HasPrefix(cmd, "API=http://127.0.0.1:8848 ") && cmd != "API=http://127.0.0.1:8848" {
				t.Fatalf("the quick start's first command should set API to make run's address: %q", cmd)
			}
			cmd = "API=" + base
		case strings.HasPrefix(cmd, "MQTT_PORT="):
			if !strings.HasPrefix(cmd, "MQTT_PORT=1884 ") && cmd != "MQTT_PORT=1884" {
				t.Fatalf("the quick start should set MQTT_PORT to make run's broker port: %q", cmd)
			}
			cmd = "MQTT_PORT=" + mqttPort
		case strings.Contains(cmd, "8848") || strings.Contains(cmd, "1884") || strings.Contains(cmd, "localhost"):
			t.Fatalf("command %d names an address instead of $API or $MQTT_PORT: %s", i+1, cmd)
		}
		step := quickStartSteps[i]
		if pass == 2 && step.again != nil {
			step.out = step.again
		}
		deadline := time.Now().Add(step.retry)
		for {
			out, code := sh.run(t, cmd)
			ok := code == 0
			if step.out == nil {
				ok = ok && out == ""
			} else {
				ok = ok && step.out.MatchString(out)
			}
			if ok {
				t.Logf("run %d, command %d ok: %.300s", pass, i+1, out)
				break
			}
			if time.Now().Before(deadline) {
				time.Sleep(500 * time.Millisecond) // polling: the command is retried until its deadline
				continue
			}
			want := "no output"
			if step.out != nil {
				want = step.out.String()
			}
			t.Fatalf("run %d, command %d:\n%s\nexit %d, output:\n%s\nwant exit 0 and %s", pass, i+1, cmd, code, out, want)
		}
		if step.check != "" {
			if out, _ := sh.run(t, step.check); out != "ok" {
				t.Fatalf("run %d, after command %d (%s): %s did not hold", pass, i+1, cmd, step.check)
			}
		}
	}
	t.Logf("quick start, run %d: %d commands in %s", pass, len(cmds), time.Since(started).Round(time.Millisecond))
}

// quickStartCommands returns the commands of the quick start's shell
// block (the one starting with API=): comment and blank lines left out,
// lines ending in a backslash joined. Each must be complete on its own
// (bash -n), so that a command never runs into the next.
func quickStartCommands(readme string) ([]string, error) {
	_, section, ok := strings.Cut(readme, "\n## Quick start\n")
	if !ok {
		return nil, fmt.Errorf("README.md has no \"## Quick start\" section")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	var block string
	for rest := section; ; {
		_, after, ok := strings.Cut(rest, "\n```sh\n")
		if !ok {
			return nil, fmt.Errorf("the quick start has no ```sh block starting with API=")
		}
		body, tail, ok := strings.Cut(after, "\n```\n")
		if !ok {
			return nil, fmt.Errorf("an unterminated ```sh block in the quick start")
		}
		if strings.HasPrefix(body, "API=") {
			block = body
			break
		}
		rest = "\n" + tail
	}
	var cmds []string
	var cur strings.Builder
	for _, line := range strings.Split(block, "\n") {
		trimmed := strings.TrimSpace(line)
		if cur.Len() == 0 && (trimmed == "" || strings.HasPrefix(trimmed, "#")) {
			continue
		}
		if strings.HasSuffix(line, "\\") {
			cur.WriteString(strings.TrimSuffix(line, "\\"))
			continue
		}
		cur.WriteString(line)
		cmds = append(cmds, cur.String())
		cur.Reset()
	}
	if cur.Len() > 0 {
		return nil, fmt.Errorf("the quick start's last command ends in a backslash")
	}
	for i, c := range cmds {
		if out, err := exec.Command("bash", "-n", "-c", c).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("quick start command %d is not complete on its own (%v: %s): %s", i+1, err, out, c)
		}
	}
	return cmds, nil
}

// shell is one bash process that runs commands as a user types them, in
// one environment, and tells each command's output and exit status apart
// by a marker line.
type shell struct {
	stdin io.WriteCloser
	lines chan string
}

const shellMarker = "@@quickstart-done@@"

func startShell(t *testing.T, dir string) *shell {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, "bash", "--noprofile", "--norc", "-s")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	s := &shell{stdin: stdin, lines: make(chan string, 256)}
	go func() {
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			s.lines <- sc.Text()
		}
		close(s.lines)
	}()
	t.Cleanup(func() {
		stdin.Close()
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
		}
		cancel() // the process group: a background job left running too
		<-done
	})
	return s
}

// run runs one command and returns its output, trimmed, and exit status.
func (s *shell) run(t *testing.T, cmd string) (string, int) {
	t.Helper()
	if _, err := fmt.Fprintf(s.stdin, "%s\nprintf '\\n%s %%d\\n' $?\n", cmd, shellMarker); err != nil {
		t.Fatalf("bash: %v", err)
	}
	var out []string
	timeout := time.After(60 * time.Second)
	for {
		select {
		case line, ok := <-s.lines:
			if !ok {
				t.Fatalf("bash exited during: %s\noutput: %s", cmd, strings.Join(out, "\n"))
			}
			if code, found := strings.CutPrefix(line, shellMarker+" "); found {
				n, _ := strconv.Atoi(code)
				return strings.TrimSpace(strings.Join(out, "\n")), n
			}
			out = append(out, line)
		case <-timeout:
			t.Fatalf("no end within 60s of: %s\noutput so far: %s", cmd, strings.Join(out, "\n"))
		}
	}
}
