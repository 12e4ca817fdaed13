package main

import (
	"bytes"
	"encoding/json"
	"runtime"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestNewLogger(t *testing.T) {
	f := func(format, level string, wantLines []string) {
		t.Helper()
		var buf bytes.Buffer
		log := newLogger(&buf, format, level)
		log.Debug("d", "k", 1)
		log.Info("i", "k", 2)
		log.Warn("w", "k", 3)
		log.Error("e", "k", 4)
		lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
		if buf.Len() == 0 {
			lines = nil
		}
		if len(lines) != len(wantLines) {
			t.Fatalf("%s %s: %d lines, want %d:\n%s", format, level, len(lines), len(wantLines), buf.String())
		}
		for i, line := range lines {
			if format == "json" {
				var rec map[string]any
				if err := json.Unmarshal([]byte(line), &rec); err != nil {
					t.Fatalf("%s %s: line %q is not JSON: %v", format, level, line, err)
				}
				if rec["msg"] != wantLines[i] || rec["time"] == nil || rec["level"] == nil || rec["k"] == nil {
					t.Errorf("%s %s: line %q, want msg %q with time, level and k", format, level, line, wantLines[i])
				}
				continue
			}
			if !strings.HasPrefix(line, "time=") || !strings.Contains(line, " msg="+wantLines[i]+" k=") {
				t.Errorf("%s %s: line %q, want key=value text with msg=%s", format, level, line, wantLines[i])
			}
		}
	}
	f("text", "info", []string{"i", "w", "e"})
	f("json", "info", []string{"i", "w", "e"})
	f("json", "debug", []string{"d", "i", "w", "e"})
	f("text", "DEBUG", []string{"d", "i", "w", "e"})
	f("json", "warn", []string{"w", "e"})
	f("text", "error", []string{"e"})
	f("json", "error+4", nil)
}

func TestRedactURL(t *testing.T) {
	f := func(raw, want string) {
		t.Helper()
		if got := redactURL(raw); got != want {
			t.Errorf("redactURL(%q) = %q, want %q", raw, got, want)
		}
	}
	f("tcp://127.0.0.1:1884", "tcp://127.0.0.1:1884")
	f("tcp://devicehub:s3cret@broker:1883", "tcp://devicehub:xxxxx@broker:1883")
	f("ssl://user@broker:8883", "ssl://user@broker:8883")
	f("postgres://postgres:pw@db:5432/devicehub?sslmode=disable", "postgres://postgres:xxxxx@db:5432/devicehub?sslmode=disable")
	f("127.0.0.1:9000", "127.0.0.1:9000")
}

func TestBuildInfo(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(buildInfo())
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(mfs) != 1 || mfs[0].GetName() != "devicehub_build_info" || len(mfs[0].GetMetric()) != 1 {
		t.Fatalf("gathered %v, want one devicehub_build_info series", mfs)
	}
	m := mfs[0].GetMetric()[0]
	if v := m.GetGauge().GetValue(); v != 1 {
		t.Errorf("value %v, want 1", v)
	}
	labels := map[string]string{}
	for _, l := range m.GetLabel() {
		labels[l.GetName()] = l.GetValue()
	}
	if len(labels) != 3 || labels["version"] == "" || labels["revision"] == "" || labels["goversion"] != runtime.Version() {
		t.Errorf("labels %v, want version, revision and goversion %s", labels, runtime.Version())
	}
	if v := versionText(); !strings.HasPrefix(v, "devicehub "+labels["version"]+" revision="+labels["revision"]) || !strings.HasSuffix(v, runtime.Version()) {
		t.Errorf("-version %q disagrees with the build info labels %v", v, labels)
	}
}
