package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"devicehub/bench/testkit"
	"devicehub/ingest"
	"devicehub/meta"
)

func TestLoadConfig(t *testing.T) {
	f := func(env map[string]string, args []string, check func(c config) bool, wantErr string) {
		t.Helper()
		c, err := loadConfig(args, func(k string) string { return env[k] })
		if wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), wantErr) {
				t.Errorf("env %v args %v: err %v, want %q", env, args, err, wantErr)
			}
			return
		}
		if err != nil {
			t.Errorf("env %v args %v: %v", env, args, err)
			return
		}
		if !check(c) {
			t.Errorf("env %v args %v: config %+v", env, args, c)
		}
	}
	f(nil, nil, func(c config) bool {
		return c.HTTPAddr == "127.0.0.1:8848" && c.BatchRows == 300000 && c.BatchBytes == 32<<20 && c.FlushInterval == time.Second && c.IngestWriters == 0 &&
			c.RetentionMonths == 0 && c.PprofAddr == "" && c.MemoryLimit == 160<<20 && c.Roles["api"] && c.Roles["ingest"]
	}, "")
	// The defaults of the settings before the table.
	f(nil, nil, func(c config) bool {
		return c.PostgresDSN == meta.DefaultOptions().DSN && c.QueryTimeout == 5*time.Second && c.PageCacheTTL == 10*time.Second && c.AdminPassword == "admin123" &&
			c.TokenLifetime == 30*time.Minute && c.ShutdownTimeout == 15*time.Second && c.LoginMaxFailures == 5 && c.LoginLockout == 10*time.Minute &&
			c.CommandTimeout == 10*time.Second && c.LogLevel == "info" && c.ClickHouseAddr == "127.0.0.1:9000" && c.TimeZone == "Local" &&
			c.MQTTURL == ingest.DefaultOptions().BrokerURL && c.MQTTLogin == ingest.DefaultOptions().Login && c.DeviceAuth == "plugin" &&
			c.MQTTClientID == "" && c.MQTTShareGroup == ingest.NoShareGroup && c.IngestConnections == 0 && c.RolesText == "api,ingest"
	}, "")
	f(map[string]string{"DEVICEHUB_INGEST_BATCH_ROWS": "50000", "DEVICEHUB_INGEST_FLUSH_INTERVAL": "1s", "DEVICEHUB_RETENTION_MONTHS": "12"}, nil,
		func(c config) bool {
			return c.BatchRows == 50000 && c.FlushInterval == time.Second && c.RetentionMonths == 12
		}, "")
	// Flags override the environment.
	f(map[string]string{"DEVICEHUB_INGEST_BATCH_ROWS": "50000", "DEVICEHUB_INGEST_CONNECTIONS": "3"}, []string{"-ingest-batch-rows=7", "-roles=ingest"},
		func(c config) bool {
			return c.BatchRows == 7 && c.IngestConnections == 3 && !c.Roles["api"] && c.Roles["ingest"]
		}, "")
	f(map[string]string{"DEVICEHUB_PAGE_CACHE_TTL": "0"}, nil, func(c config) bool { return c.PageCacheTTL == 0 }, "")
	f(nil, []string{"-page-cache-ttl=soon"}, nil, `-page-cache-ttl="soon": want a duration`)
	f(nil, []string{"-ingest-batch-rows=-1"}, nil, `-ingest-batch-rows="-1": want an integer from 1 to 1000000`)
	f(nil, []string{"-ingest-flush-interval=0s"}, nil, `-ingest-flush-interval="0s": want a positive duration`)
	f(nil, []string{"-ingest-batch-rows=1000001"}, nil, "from 1 to 1000000")
	f(map[string]string{"DEVICEHUB_INGEST_BATCH_ROWS": "1000001"}, nil, nil, `DEVICEHUB_INGEST_BATCH_ROWS="1000001": want an integer from 1 to 1000000`)
	f(map[string]string{"DEVICEHUB_INGEST_BATCH_BYTES": "128MiB"}, nil, func(c config) bool { return c.BatchBytes == 128<<20 }, "")
	f(nil, []string{"-ingest-batch-bytes=0"}, nil, "want a size from 1 byte to 1GiB")
	f(nil, []string{"-ingest-batch-bytes=2GiB"}, nil, "want a size from 1 byte to 1GiB")
	f(nil, []string{"-ingest-batch-bytes=big"}, nil, `-ingest-batch-bytes="big": want a size`)
	f(map[string]string{"DEVICEHUB_INGEST_WRITERS": "3"}, nil, func(c config) bool { return c.IngestWriters == 3 }, "")
	f(nil, []string{"-ingest-writers=-1"}, nil, `-ingest-writers="-1": want an integer, 0 (the default) or more`)
	f(nil, []string{"-retention-months=-2"}, nil, "retention-months")
	f(map[string]string{"DEVICEHUB_MEMORY_LIMIT": "1GiB"}, nil, func(c config) bool { return c.MemoryLimit == 1<<30 }, "")
	f(nil, []string{"-memory-limit=0"}, func(c config) bool { return c.MemoryLimit == 0 }, "")
	f(nil, []string{"-memory-limit=5000"}, func(c config) bool { return c.MemoryLimit == 5000 }, "")
	f(nil, []string{"-memory-limit=lots"}, nil, `-memory-limit="lots": want a size like 160MiB`)
	f(nil, []string{"-memory-limit=-1MiB"}, nil, "want a size like")
	f(nil, []string{"-memory-limit=99999999999GiB"}, nil, "want a size like")
	f(nil, []string{"-roles=web"}, nil, `-roles="web": want api, ingest or both`)
	f(nil, []string{"-roles=,"}, nil, `-roles=",": want api, ingest or both`)
	f(nil, []string{"-roles= ingest , api"}, func(c config) bool { return c.Roles["api"] && c.Roles["ingest"] && len(c.Roles) == 2 }, "")
	f(nil, []string{"-device-auth=ldap"}, nil, `-device-auth="ldap": want plugin or none`)
	f(nil, []string{"-log-level=WARN"}, func(c config) bool { return c.LogLevel == "WARN" }, "")
	f(nil, nil, func(c config) bool { return c.LogFormat == "text" && !c.AccessLog && c.CORSOrigins == nil }, "")
	f(map[string]string{"DEVICEHUB_LOG_FORMAT": "json", "DEVICEHUB_ACCESS_LOG": "true"}, nil,
		func(c config) bool { return c.LogFormat == "json" && c.AccessLog }, "")
	// A bool setting may be given as a flag alone, and turned off by one.
	f(nil, []string{"-access-log"}, func(c config) bool { return c.AccessLog }, "")
	f(map[string]string{"DEVICEHUB_ACCESS_LOG": "1"}, []string{"-access-log=false"}, func(c config) bool { return !c.AccessLog }, "")
	f(map[string]string{"DEVICEHUB_LOG_FORMAT": "xml"}, nil, nil, `DEVICEHUB_LOG_FORMAT="xml": want text or json`)
	f(map[string]string{"DEVICEHUB_ACCESS_LOG": "yes"}, nil, nil, `DEVICEHUB_ACCESS_LOG="yes": want true or false`)
	// CORS origins are checked and normalised with the other settings.
	f(map[string]string{"DEVICEHUB_CORS_ORIGINS": " https://Console.example.com/ ,http://localhost:3000"}, nil, func(c config) bool {
		return len(c.CORSOrigins) == 2 && c.CORSOrigins[0] == "https://console.example.com" && c.CORSOrigins[1] == "http://localhost:3000"
	}, "")
	f(map[string]string{"DEVICEHUB_CORS_ORIGINS": "console.example.com"}, nil, nil, `DEVICEHUB_CORS_ORIGINS="console.example.com": want comma-separated origins`)
	f(nil, []string{"-cors-origins=*,https://a.example"}, nil, `-cors-origins="*,https://a.example": want comma-separated origins`)

	// Malformed variables stop the start instead of falling back to defaults.
	f(map[string]string{"DEVICEHUB_QUERY_TIMEOUT": "7"}, nil, nil, `DEVICEHUB_QUERY_TIMEOUT="7": want a duration like 5s or 1m`)
	f(map[string]string{"DEVICEHUB_INGEST_CONNECTIONS": "four"}, nil, nil, `DEVICEHUB_INGEST_CONNECTIONS="four": want an integer`)
	f(map[string]string{"DEVICEHUB_INGEST_CONNECTIONS": "-1"}, nil, nil, `DEVICEHUB_INGEST_CONNECTIONS="-1": want an integer, 0 (the default) or more`)
	f(map[string]string{"DEVICEHUB_DEVICE_AUTH": "ldap"}, nil, nil, `DEVICEHUB_DEVICE_AUTH="ldap": want plugin or none`)
	f(map[string]string{"DEVICEHUB_ROLES": "web"}, nil, nil, `DEVICEHUB_ROLES="web": want api, ingest or both`)
	f(map[string]string{"DEVICEHUB_LOG_LEVEL": "loud"}, nil, nil, `DEVICEHUB_LOG_LEVEL="loud": want debug, info, warn or error`)
	// A malformed variable is an error even when its flag is given.
	f(map[string]string{"DEVICEHUB_QUERY_TIMEOUT": "7"}, []string{"-query-timeout=7s"}, nil, `DEVICEHUB_QUERY_TIMEOUT="7"`)
	f(nil, []string{"-query-timeout=7"}, nil, `-query-timeout="7": want a duration like 5s or 1m`)
	f(nil, []string{"-no-such-flag"}, nil, "flag provided but not defined: -no-such-flag")
	f(nil, []string{"stray"}, nil, `unexpected argument "stray"`)

	// -postgres-max-conns has a variable too, and the ClickHouse login.
	f(nil, nil, func(c config) bool {
		return c.PostgresMaxConns == 32 && c.ClickHouseUser == "default" && c.ClickHousePassword == "" && c.ClickHouseDB == "devicehub"
	}, "")
	f(map[string]string{"DEVICEHUB_POSTGRES_MAX_CONNS": "8", "DEVICEHUB_CLICKHOUSE_USER": "ingest", "DEVICEHUB_CLICKHOUSE_PASSWORD": "s3cret"}, nil,
		func(c config) bool {
			return c.PostgresMaxConns == 8 && c.ClickHouseUser == "ingest" && c.ClickHousePassword == "s3cret"
		}, "")
	f(map[string]string{"DEVICEHUB_POSTGRES_MAX_CONNS": "8"}, []string{"-postgres-max-conns=4"}, func(c config) bool { return c.PostgresMaxConns == 4 }, "")
}

// sample is two valid values of a setting, a differing from its default,
// and how get shows each.
type sample struct{ a, getA, b, getB string }

// kindSamples are, per kind of setting, samples valid for every setting of
// that kind; settingSamples replace them for one setting.
var kindSamples = map[string]sample{
	"string":   {"x-test", "x-test", "y-test", "y-test"},
	"duration": {"7m", "7m0s", "9s", "9s"},
	"int":      {"3", "3", "4", "4"},
	"size":     {"3MiB", "3145728", "4KiB", "4096"},
	"enum":     {"none", "none", "plugin", "plugin"},
	"level":    {"debug", "debug", "error", "error"},
	"roles":    {"ingest", "ingest", "api", "api"},
	"bool":     {"true", "true", "0", "false"},
	"origins":  {"https://A.example/", "https://a.example", "http://localhost:3000,https://b.example", "http://localhost:3000,https://b.example"},
	"brokers":  {"tcp://b1:1883", "tcp://b1:1883", "tcp://b1:1883,tcp://b2:1883", "tcp://b1:1883,tcp://b2:1883"},
	"addrs":    {"10.1.2.3/8", "10.0.0.0/8", "192.168.1.7, fd00::/8", "192.168.1.7/32,fd00::/8"},
}

// settingSamples are the samples of the settings whose kind's do not fit.
var settingSamples = map[string]sample{
	"log-format": {"json", "json", "text", "text"},
	// A forwarding spool is at least 1 MiB.
	"forward-spool-bytes": {"3MiB", "3145728", "2MiB", "2097152"},
}

// samplesOf returns s's samples.
func samplesOf(s setting) sample {
	if k, ok := settingSamples[s.name]; ok {
		return k
	}
	return kindSamples[s.kind]
}

// kindMalformed are, per kind, values that are not of the kind's form.
var kindMalformed = map[string][]string{
	"duration": {"7", "5 s", "soon", "1h1"},
	"int":      {"four", "1.5", "0x10", "3 ", "99999999999999999999"},
	"size":     {"big", "-1MiB", "1.5GiB", "10MB", "99999999999GiB"},
	"enum":     {"ldap", "DYNSEC"},
	"level":    {"loud", "info-"},
	"roles":    {"web", ",", "api;ingest"},
	"bool":     {"yes", "on", "2", "truth"},
	"brokers":  {"broker:1883", "tcp://b1:1883,", "tcp://b1:1883,,tcp://b2:1883", "tcp://b1:1883,tcp://b1:1883"},
	"origins":  {"console.example.com", "ftp://a.example", "https://a.example/app", "https://a.example?x=1", "https://user@a.example", "*,https://a.example"},
	"addrs":    {"localhost", "10.0.0.0/33", "10.0.0.300", "none,10.0.0.1", ",", "fe80::1%eth0"},
}

// settingOf returns c's setting of flag name.
func settingOf(t *testing.T, c *config, name string) setting {
	t.Helper()
	for _, s := range settings(c) {
		if s.name == name {
			return s
		}
	}
	t.Fatalf("no setting -%s", name)
	return setting{}
}

func TestSettingsTable(t *testing.T) {
	seen := map[string]bool{}
	for _, s := range settings(new(config)) {
		if want := "DEVICEHUB_" + strings.ToUpper(strings.ReplaceAll(s.name, "-", "_")); s.env != want {
			t.Errorf("-%s: variable %s, want %s", s.name, s.env, want)
		}
		if seen[s.name] {
			t.Errorf("-%s twice", s.name)
		}
		seen[s.name] = true
		if _, ok := kindSamples[s.kind]; !ok && settingSamples[s.name] == (sample{}) {
			t.Errorf("-%s: kind %q has no test samples", s.name, s.kind)
		}
		if _, ok := kindMalformed[s.kind]; !ok && s.kind != "string" {
			t.Errorf("-%s: kind %q has no malformed test values", s.name, s.kind)
		}
		if s.help == "" || s.want == "" {
			t.Errorf("-%s: no help or expected form", s.name)
		}
	}
}

func TestSettingsVariablesRead(t *testing.T) {
	for _, s := range settings(new(config)) {
		k := samplesOf(s)
		c, err := loadConfig(nil, func(v string) string {
			if v == s.env {
				return k.a
			}
			return ""
		})
		if err != nil {
			t.Errorf("%s=%s: %v", s.env, k.a, err)
			continue
		}
		if got := settingOf(t, &c, s.name).get(); got != k.getA {
			t.Errorf("%s=%s: -%s is %q, want %q", s.env, k.a, s.name, got, k.getA)
		}
	}
}

func TestSettingsFlagsOverrideVariables(t *testing.T) {
	for _, s := range settings(new(config)) {
		k := samplesOf(s)
		env := map[string]string{s.env: k.a}
		c, err := loadConfig([]string{"-" + s.name + "=" + k.b}, func(v string) string { return env[v] })
		if err != nil {
			t.Errorf("%s=%s -%s=%s: %v", s.env, k.a, s.name, k.b, err)
			continue
		}
		if got := settingOf(t, &c, s.name).get(); got != k.getB {
			t.Errorf("%s=%s -%s=%s: %q, want %q", s.env, k.a, s.name, k.b, got, k.getB)
		}
	}
}

func TestSettingsMalformed(t *testing.T) {
	n := 0
	for _, s := range settings(new(config)) {
		bad := kindMalformed[s.kind]
		if strings.HasPrefix(s.want, "a positive") {
			bad = append(bad, "0s", "-1s")
		}
		for _, v := range bad {
			n++
			_, err := loadConfig(nil, func(k string) string {
				if k == s.env {
					return v
				}
				return ""
			})
			if want := s.env + "=" + fmt.Sprintf("%q", v) + ": want " + s.want; err == nil || err.Error() != want {
				t.Errorf("%s=%q: err %v, want %q", s.env, v, err, want)
			}
			_, err = loadConfig([]string{"-" + s.name + "=" + v}, func(string) string { return "" })
			if want := "-" + s.name + "=" + fmt.Sprintf("%q", v) + ": want " + s.want; err == nil || err.Error() != want {
				t.Errorf("-%s=%q: err %v, want %q", s.name, v, err, want)
			}
		}
	}
	if n < 40 {
		t.Errorf("only %d malformed values tried", n)
	}
}

func TestHelpListsEverySetting(t *testing.T) {
	for _, arg := range []string{"-h", "-help", "--help"} {
		var out, errOut bytes.Buffer
		_, code := parseCommandLine([]string{arg}, func(string) string { return "" }, &out, &errOut)
		if code != 0 || errOut.Len() != 0 {
			t.Errorf("%s: exit %d, stderr %q", arg, code, errOut.String())
		}
		help := out.String()
		for _, s := range settings(new(config)) {
			def := s.def
			if def == "" {
				def = "empty"
			}
			if !strings.Contains(help, "  -"+s.name+" "+s.kind+"\n        "+s.env+" (default "+def+")\n") {
				t.Errorf("%s: no -%s, %s and its default %s in\n%s", arg, s.name, s.env, def, help)
			}
		}
		if !strings.Contains(help, "-version") {
			t.Errorf("%s: no -version in\n%s", arg, help)
		}
	}
	// Help shows the defaults, whatever the variables hold.
	var out bytes.Buffer
	if _, code := parseCommandLine([]string{"-h"}, func(string) string { return "secret" }, &out, &out); code != 0 || strings.Contains(out.String(), "secret") {
		t.Errorf("-h with every variable set: exit %d\n%s", code, out.String())
	}
}

func TestVersionAndExitCodes(t *testing.T) {
	none := func(string) string { return "" }
	var out, errOut bytes.Buffer
	if _, code := parseCommandLine([]string{"-version"}, none, &out, &errOut); code != 0 || !strings.HasPrefix(out.String(), "devicehub ") {
		t.Errorf("-version: exit %d, stdout %q, stderr %q", code, out.String(), errOut.String())
	}
	out.Reset()
	if _, code := parseCommandLine(nil, func(k string) string {
		if k == "DEVICEHUB_QUERY_TIMEOUT" {
			return "7"
		}
		return ""
	}, &out, &errOut); code != 2 || !strings.Contains(errOut.String(), `DEVICEHUB_QUERY_TIMEOUT="7": want a duration like 5s or 1m`) {
		t.Errorf("malformed variable: exit %d, stderr %q", code, errOut.String())
	}
	if c, code := parseCommandLine(nil, none, &out, &errOut); code != -1 || !c.Roles["api"] {
		t.Errorf("no arguments: exit %d", code)
	}
	if _, err := loadConfig([]string{"-h"}, none); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: %v", err)
	}
}

// TestHelpVersionBinary runs the built command: -h and -version exit 0,
// a malformed variable, of any kind, exits 2 naming it.
func TestHelpVersionBinary(t *testing.T) {
	bin := testkit.Devicehub(t)
	run := func(env []string, args ...string) (string, string, int) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Env = append([]string{}, env...) // only env, not the test's own DEVICEHUB_* variables
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		err := cmd.Run()
		var exit *exec.ExitError
		if err != nil && !errors.As(err, &exit) {
			t.Fatalf("%v: %v", args, err)
		}
		return out.String(), errOut.String(), cmd.ProcessState.ExitCode()
	}
	for _, arg := range []string{"-h", "-help"} {
		out, errOut, code := run(nil, arg)
		if code != 0 || !strings.Contains(out, "DEVICEHUB_CLICKHOUSE_PASSWORD") || !strings.Contains(out, "DEVICEHUB_POSTGRES_MAX_CONNS") {
			t.Errorf("%s: exit %d\nstdout %s\nstderr %s", arg, code, out, errOut)
		}
	}
	out, errOut, code := run(nil, "-version")
	if code != 0 || !strings.HasPrefix(out, "devicehub ") {
		t.Errorf("-version: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	t.Logf("-version: %s", out)
	for _, c := range []struct{ env, want string }{
		{"DEVICEHUB_INGEST_CONNECTIONS=four", `DEVICEHUB_INGEST_CONNECTIONS="four": want an integer`},
		{"DEVICEHUB_CORS_ORIGINS=console.example.com", `DEVICEHUB_CORS_ORIGINS="console.example.com": want comma-separated origins`},
		{"DEVICEHUB_LOG_FORMAT=xml", `DEVICEHUB_LOG_FORMAT="xml": want text or json`},
		{"DEVICEHUB_LOG_LEVEL=loud", `DEVICEHUB_LOG_LEVEL="loud": want debug, info, warn or error`},
		{"DEVICEHUB_ACCESS_LOG=yes", `DEVICEHUB_ACCESS_LOG="yes": want true or false`},
	} {
		_, errOut, code = run([]string{c.env})
		if code != 2 || !strings.Contains(errOut, c.want) {
			t.Errorf("%s: exit %d, stderr %q, want exit 2 and %q", c.env, code, errOut, c.want)
		}
	}
}
