package main

import (
	"bufio"
	"context"
	"debug/elf"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// No container engine runs here: these tests keep cmd/devicehub/Dockerfile
// and cmd/devicehub/compose/ honest against the code instead.

// dockerInstruction is one Dockerfile instruction, continuation lines joined.
type dockerInstruction struct {
	cmd, args string
}

// dockerStage is one FROM stage.
type dockerStage struct {
	from   string
	name   string
	instrs []dockerInstruction
}

func readDockerfile(t *testing.T, path string) []dockerStage {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var stages []dockerStage
	var cur strings.Builder
	flush := func() {
		line := strings.TrimSpace(cur.String())
		cur.Reset()
		if line == "" {
			return
		}
		cmd, args, _ := strings.Cut(line, " ")
		in := dockerInstruction{strings.ToUpper(cmd), strings.TrimSpace(args)}
		if in.cmd == "FROM" {
			f := strings.Fields(in.args)
			s := dockerStage{from: f[0]}
			if len(f) == 3 && strings.EqualFold(f[1], "AS") {
				s.name = f[2]
			}
			stages = append(stages, s)
			return
		}
		if len(stages) == 0 {
			if in.cmd != "ARG" {
				t.Fatalf("%s: %s before FROM", path, in.cmd)
			}
			return
		}
		stages[len(stages)-1].instrs = append(stages[len(stages)-1].instrs, in)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue
		}
		if s, ok := strings.CutSuffix(line, "\\"); ok {
			cur.WriteString(s + " ")
			continue
		}
		cur.WriteString(line)
		flush()
	}
	flush()
	return stages
}

// TestDockerfile: the build stage's go build builds ./cmd/devicehub
// statically (CGO_ENABLED=0); run here as written, with the revision
// argument, it gives a static binary whose -version shows that revision.
// The final stage copies that binary, runs it as a non-root user, and sets
// only variables devicehub has.
func TestDockerfile(t *testing.T) {
	t.Parallel()
	stages := readDockerfile(t, "Dockerfile")
	if len(stages) < 2 {
		t.Fatalf("want a multi-stage build, got %d stages", len(stages))
	}
	build, final := stages[0], stages[len(stages)-1]
	args := map[string]string{}
	var goBuild string
	for _, in := range build.instrs {
		switch in.cmd {
		case "ARG":
			k, v, _ := strings.Cut(in.args, "=")
			args[k] = v
		case "RUN":
			if strings.Contains(in.args, "go build") {
				goBuild = in.args
			}
		}
	}
	if goBuild == "" {
		t.Fatal("the build stage runs no go build")
	}
	for _, want := range []string{"CGO_ENABLED=0 ", "./cmd/devicehub", "-o /out/devicehub"} {
		if !strings.Contains(goBuild, want) {
			t.Errorf("go build %q: no %q", goBuild, want)
		}
	}
	if _, ok := args["REVISION"]; !ok {
		t.Errorf("the build stage has no ARG REVISION")
	}

	// The same command here, from the repository's top level (the build
	// context), into a temporary directory.
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("go is not in PATH")
	}
	out := t.TempDir()
	cmdline := strings.ReplaceAll(goBuild, "${REVISION}", "test-rev-1")
	cmdline = strings.ReplaceAll(cmdline, "/out/", out+"/")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "sh", "-c", cmdline)
	cmd.Dir = "../.."
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", cmdline, err, b)
	}
	bin := filepath.Join(out, "devicehub")
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("the binary is dynamically linked (program header %v)", p.Type)
		}
	}
	v, err := exec.Command(bin, "-version").Output()
	if err != nil || !strings.Contains(string(v), " revision=test-rev-1 ") {
		t.Errorf("-version of the image's build: %q %v, want revision=test-rev-1", v, err)
	}

	// The final stage.
	var user, entrypoint string
	copied := map[string]bool{}
	for _, in := range final.instrs {
		switch in.cmd {
		case "USER":
			user = in.args
		case "ENTRYPOINT", "CMD":
			entrypoint = in.args
		case "COPY":
			f := strings.Fields(in.args)
			if len(f) == 3 && f[0] == "--from="+build.name && f[1] == "/out/devicehub" {
				copied[f[2]] = true
			}
		case "ENV":
			k, _, _ := strings.Cut(in.args, "=")
			if strings.HasPrefix(k, "DEVICEHUB_") && !knownVariable(k) {
				t.Errorf("ENV %s: devicehub has no such setting", k)
			}
		}
	}
	uid, _, _ := strings.Cut(user, ":")
	if uid == "" || uid == "root" || uid == "0" {
		t.Errorf("the final stage runs as %q, want a non-root USER", user)
	}
	if len(copied) != 1 {
		t.Fatalf("the final stage copies the binary to %v, want one place", copied)
	}
	for dest := range copied {
		if !strings.Contains(entrypoint, `"`+dest+`"`) {
			t.Errorf("the final stage runs %s, not the binary at %s", entrypoint, dest)
		}
	}
}

// knownVariable reports whether name is a setting's variable.
func knownVariable(name string) bool {
	for _, s := range settings(new(config)) {
		if s.env == name {
			return true
		}
	}
	return false
}

// yamlNode is a value of the block-style YAML subset the compose file is
// written in: maps of "key: value" or "key:" and a nested block, lists of
// "- scalar"; flow values ([...]) are kept as text.
type yamlNode struct {
	scalar string
	m      map[string]*yamlNode
	list   []string
}

type yamlLine struct {
	indent int
	text   string
	no     int
}

func readYAML(t *testing.T, path string) *yamlNode {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines []yamlLine
	sc := bufio.NewScanner(f)
	for no := 1; sc.Scan(); no++ {
		raw := sc.Text()
		if strings.Contains(raw, "\t") {
			t.Fatalf("%s:%d: a tab", path, no)
		}
		text := strings.TrimSpace(raw)
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		lines = append(lines, yamlLine{len(raw) - len(strings.TrimLeft(raw, " ")), text, no})
	}
	n, rest := parseYAMLBlock(t, path, lines, 0)
	if len(rest) > 0 {
		t.Fatalf("%s:%d: unexpected indentation", path, rest[0].no)
	}
	return n
}

// parseYAMLBlock reads the lines indented exactly indent as one map or
// list, and returns the lines after it.
func parseYAMLBlock(t *testing.T, path string, lines []yamlLine, indent int) (*yamlNode, []yamlLine) {
	n := &yamlNode{}
	for len(lines) > 0 && lines[0].indent == indent {
		l := lines[0]
		lines = lines[1:]
		if item, ok := strings.CutPrefix(l.text, "- "); ok {
			n.list = append(n.list, unquote(item))
			continue
		}
		key, value, ok := strings.Cut(l.text, ":")
		if !ok || strings.ContainsAny(key, "&*!|>") {
			t.Fatalf("%s:%d: %q is outside the YAML subset this test reads", path, l.no, l.text)
		}
		if n.m == nil {
			n.m = map[string]*yamlNode{}
		}
		if value = strings.TrimSpace(value); value != "" {
			n.m[key] = &yamlNode{scalar: unquote(value)}
			continue
		}
		child := &yamlNode{}
		if len(lines) > 0 && lines[0].indent > indent {
			child, lines = parseYAMLBlock(t, path, lines, lines[0].indent)
		}
		n.m[key] = child
	}
	return n, lines
}

func unquote(s string) string {
	if u, err := strconv.Unquote(s); err == nil && strings.HasPrefix(s, `"`) {
		return u
	}
	return s
}

// get walks n by keys; nil if a key is missing.
func (n *yamlNode) get(keys ...string) *yamlNode {
	for _, k := range keys {
		if n == nil || n.m == nil {
			return nil
		}
		n = n.m[k]
	}
	return n
}

// composeDefault resolves compose interpolation to its defaults:
// ${VAR:-default} and ${VAR-default} become default.
var composeVar = regexp.MustCompile(`\$\{[A-Za-z_][A-Za-z0-9_]*(?::?-([^}]*))?\}`)

func composeDefault(s string) string {
	return composeVar.ReplaceAllString(s, "$1")
}

// TestComposeFile: every DEVICEHUB_* variable the compose file sets is a
// setting, and with their defaults devicehub's settings load; the
// addresses name the compose's services, whose logins are the ones
// devicehub is given; the files it builds and mounts exist.
func TestComposeFile(t *testing.T) {
	const dir = "compose"
	doc := readYAML(t, filepath.Join(dir, "docker-compose.yml"))
	services := doc.get("services")
	if services == nil || services.m["devicehub"] == nil {
		t.Fatal("no services.devicehub")
	}
	for _, name := range []string{"postgres", "clickhouse", "mosquitto"} {
		if services.m[name] == nil {
			t.Errorf("no service %s", name)
		}
	}
	dh := services.m["devicehub"]
	env := dh.get("environment")
	if env == nil || len(env.m) < 8 {
		t.Fatalf("services.devicehub.environment: %v", env)
	}
	values := map[string]string{}
	for k, v := range env.m {
		if !knownVariable(k) {
			t.Errorf("services.devicehub.environment.%s: devicehub has no such setting", k)
		}
		values[k] = composeDefault(v.scalar)
	}
	// Any DEVICEHUB_ key anywhere else (another service, a list form) too.
	raw, err := os.ReadFile(filepath.Join(dir, "docker-compose.yml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`(?m)^\s*-?\s*(DEVICEHUB_[A-Z0-9_]+)\s*[:=]`).FindAllStringSubmatch(string(raw), -1) {
		if !knownVariable(m[1]) {
			t.Errorf("%s: devicehub has no such setting", m[1])
		}
	}
	c, err := loadConfig(nil, func(k string) string { return values[k] })
	if err != nil {
		t.Fatalf("the compose file's settings do not load: %v", err)
	}
	if c.HTTPAddr != "0.0.0.0:8848" || c.LogFormat != "json" {
		t.Errorf("http %s, log format %s", c.HTTPAddr, c.LogFormat)
	}
	if c.MQTTClientID == "" {
		t.Errorf("DEVICEHUB_MQTT_CLIENT_ID is not set: the default names the container's host, new on each re-creation")
	}

	// The addresses are the services'; the logins are theirs.
	pg, err := url.Parse(values["DEVICEHUB_POSTGRES_DSN"])
	if err != nil {
		t.Fatal(err)
	}
	pgEnv := services.get("postgres", "environment")
	pgPass, _ := pg.User.Password()
	if pg.Hostname() != "postgres" || pg.User.Username() != pgEnv.get("POSTGRES_USER").scalar ||
		pgPass != composeDefault(pgEnv.get("POSTGRES_PASSWORD").scalar) || pg.Path != "/"+pgEnv.get("POSTGRES_DB").scalar {
		t.Errorf("DEVICEHUB_POSTGRES_DSN %s does not match the postgres service", pg.Redacted())
	}
	chEnv := services.get("clickhouse", "environment")
	if host, _, _ := strings.Cut(c.ClickHouseAddr, ":"); host != "clickhouse" || c.ClickHouseUser != chEnv.get("CLICKHOUSE_USER").scalar ||
		c.ClickHousePassword != composeDefault(chEnv.get("CLICKHOUSE_PASSWORD").scalar) {
		t.Errorf("ClickHouse %s as %s does not match the clickhouse service", c.ClickHouseAddr, c.ClickHouseUser)
	}
	mq, err := url.Parse(c.MQTTURL)
	if err != nil || mq.Hostname() != "mosquitto" {
		t.Errorf("DEVICEHUB_MQTT_URL %s: want the mosquitto service", c.MQTTURL)
	}
	mqEnv := services.get("mosquitto", "environment")
	if env.get("DEVICEHUB_MQTT_USERNAME").scalar != mqEnv.get("MQTT_USERNAME").scalar ||
		env.get("DEVICEHUB_MQTT_PASSWORD").scalar != mqEnv.get("MQTT_PASSWORD").scalar {
		t.Errorf("devicehub's broker login is not the one the mosquitto service makes")
	}
	for _, dep := range []string{"postgres", "clickhouse", "mosquitto"} {
		if dh.get("depends_on", dep) == nil {
			t.Errorf("services.devicehub does not depend on %s", dep)
		}
	}

	// What it builds and mounts exists.
	bctx, df := dh.get("build", "context"), dh.get("build", "dockerfile")
	if bctx == nil || df == nil {
		t.Fatal("services.devicehub.build: no context or dockerfile")
	}
	if p := filepath.Join(dir, bctx.scalar, df.scalar); !sameFile(t, p, "Dockerfile") {
		t.Errorf("build %s is not cmd/devicehub/Dockerfile", p)
	}
	if !sameFile(t, filepath.Join(dir, bctx.scalar, "go.mod"), "../../go.mod") {
		t.Errorf("build context %s is not the repository's top level", bctx.scalar)
	}
	for _, v := range services.get("mosquitto", "volumes").list {
		if src, _, _ := strings.Cut(v, ":"); strings.HasPrefix(src, "./") {
			if _, err := os.Stat(filepath.Join(dir, src)); err != nil {
				t.Errorf("mosquitto mounts %s: %v", src, err)
			}
		}
	}
}

func sameFile(t *testing.T, a, b string) bool {
	t.Helper()
	fa, errA := os.Stat(a)
	fb, errB := os.Stat(b)
	return errA == nil && errB == nil && os.SameFile(fa, fb)
}

// mosquittoConf reads a Mosquitto config: directive to its values, in order.
func mosquittoConf(t *testing.T, path string) map[string][]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, _ := strings.Cut(line, " ")
		out[k] = append(out[k], strings.TrimSpace(v))
	}
	return out
}

// TestComposeMosquittoMatchesCI: the compose's broker config has the
// directives of .ci/mosquitto.conf (as .ci/mosquitto-setup fills it in)
// with the same values, its data directory for @DATA@ and the image's
// plugin for @DYNSEC_PLUGIN@; only the listener and the log destination
// differ. Its start script makes the plugin's file that config names with
// the same mosquitto_ctrl command as .ci/mosquitto-setup, with devicehub's
// service login.
func TestComposeMosquittoMatchesCI(t *testing.T) {
	ci := mosquittoConf(t, "../../.ci/mosquitto.conf")
	compose := mosquittoConf(t, "compose/mosquitto.conf")
	data := strings.TrimSuffix(compose["persistence_location"][0], "/")
	hostOnly := map[string]bool{"listener": true, "log_dest": true, "pid_file": true}
	for k, vs := range ci {
		if hostOnly[k] {
			continue
		}
		want := make([]string, len(vs))
		for i, v := range vs {
			want[i] = strings.ReplaceAll(v, "@DATA@", data)
		}
		got := compose[k]
		if k == "plugin" {
			// devicehub's plugin first (it answers for devices), then
			// the dynamic-security plugin.
			if len(got) != 2 || filepath.Base(got[0]) != "devicehub_auth.so" || filepath.Base(got[1]) != "mosquitto_dynamic_security.so" {
				t.Errorf("plugin %v, want devicehub's plugin, then the dynamic-security plugin", got)
			}
			continue
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s %v, want %v as in .ci/mosquitto.conf", k, got, want)
		}
	}
	for k := range compose {
		if ci[k] == nil && !hostOnly[k] {
			t.Errorf("%s is not in .ci/mosquitto.conf", k)
		}
	}
	if len(compose["listener"]) != 1 || compose["listener"][0] != "1883" {
		t.Errorf("listener %v, want 1883 on every interface of the container (the compose file publishes it on the host's loopback)", compose["listener"])
	}

	setup, err := os.ReadFile("../../.ci/mosquitto-setup")
	if err != nil {
		t.Fatal(err)
	}
	start, err := os.ReadFile("compose/mosquitto-start.sh")
	if err != nil {
		t.Fatal(err)
	}
	initRE := regexp.MustCompile(`mosquitto_ctrl dynsec init "([^"]+)" "\$([a-z_A-Z]+)" "\$([a-z_A-Z]+)"`)
	ciInit := initRE.FindStringSubmatch(string(setup))
	composeInit := initRE.FindStringSubmatch(string(start))
	if ciInit == nil || composeInit == nil {
		t.Fatalf("no mosquitto_ctrl dynsec init in .ci/mosquitto-setup (%v) or compose/mosquitto-start.sh (%v)", ciInit, composeInit)
	}
	if want := strings.ReplaceAll(ci["plugin_opt_config_file"][0], "@DATA@", "$data"); ciInit[1] != want {
		t.Fatalf(".ci/mosquitto-setup inits %s, its config reads %s: this test is out of date", ciInit[1], want)
	}
	if composeInit[1] != "$dynsec" || !strings.Contains(string(start), "dynsec="+compose["plugin_opt_config_file"][0]+"\n") {
		t.Errorf("compose/mosquitto-start.sh inits %s, not the plugin's file %s", composeInit[1], compose["plugin_opt_config_file"][0])
	}
	if composeInit[2] != "MQTT_USERNAME" || composeInit[3] != "MQTT_PASSWORD" {
		t.Errorf("compose/mosquitto-start.sh gives the admin login $%s/$%s, want $MQTT_USERNAME/$MQTT_PASSWORD (the compose's)", composeInit[2], composeInit[3])
	}
	if !strings.Contains(string(start), "/mosquitto/config/mosquitto.conf >/mosquitto/data/mosquitto.conf") ||
		!strings.Contains(string(start), "exec mosquitto -c /mosquitto/data/mosquitto.conf") {
		t.Errorf("compose/mosquitto-start.sh does not run the broker with its config")
	}
	// The plugin the compose's image builds is the project's, from its sources.
	dockerfile, err := os.ReadFile("compose/mosquitto.Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"COPY ingest/devauth/mosquitto /src", "make -C /src OUT=/out", compose["plugin"][0]} {
		if !strings.Contains(string(dockerfile), want) {
			t.Errorf("compose/mosquitto.Dockerfile lacks %q", want)
		}
	}
}
