package main

import (
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
)

// buildRevision is the VCS revision of a build that has no VCS stamp of
// its own, set with -ldflags "-X main.buildRevision=<rev>": the container
// build (Dockerfile) builds with -buildvcs=false, without .git.
var buildRevision string

// build is what the binary knows of its own build (debug.ReadBuildInfo).
type build struct {
	version   string // module version, "(devel)" for a build from a work tree
	goVersion string // the toolchain's, e.g. go1.26.8
	revision  string // VCS revision, with "-modified" for a dirty tree; else buildRevision; else "unknown"
	time      string // VCS commit time; empty when not recorded
}

// readBuild reads the build information the Go linker embedded.
func readBuild() build {
	b := build{version: "(devel)", goVersion: "unknown", revision: "unknown"}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return b
	}
	if bi.Main.Version != "" {
		b.version = bi.Main.Version
	}
	b.goVersion = bi.GoVersion
	modified := false
	for _, kv := range bi.Settings {
		switch kv.Key {
		case "vcs.revision":
			b.revision = kv.Value
		case "vcs.time":
			b.time = kv.Value
		case "vcs.modified":
			modified = kv.Value == "true"
		}
	}
	if modified && b.revision != "unknown" {
		b.revision += "-modified"
	}
	if b.revision == "unknown" && buildRevision != "" {
		b.revision = buildRevision
	}
	return b
}

// versionText is the -version line: module version, VCS revision and
// commit time when the build recorded them, Go version.
func versionText() string {
	b := readBuild()
	v := "devicehub " + b.version + " revision=" + b.revision
	if b.time != "" {
		v += " time=" + b.time
	}
	return v + " " + b.goVersion
}

// buildInfo is the devicehub_build_info gauge: always 1, its labels say
// which build runs (the Prometheus convention, joined to other series
// with `* on(instance) group_left(version)`).
func buildInfo() prometheus.Collector {
	b := readBuild()
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "devicehub_build_info",
		Help:        "1, labelled with the devicehub build: module version, Go version and VCS revision.",
		ConstLabels: prometheus.Labels{"version": b.version, "goversion": b.goVersion, "revision": b.revision},
	})
	g.Set(1)
	return g
}
