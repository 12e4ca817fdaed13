package main

import (
	"flag"
	"io"
	"log/slog"
	"strings"
	"testing"

	"devicehub/bench/fwdevice"
	"devicehub/bench/sim"
)

// TestFirmwareFlags: the -fw-* flags become the updater's faults, on the
// -fw-faulty share of the devices only; a bad flag is refused by name.
func TestFirmwareFlags(t *testing.T) {
	parse := func(args ...string) (*fwFlags, error) {
		var f fwFlags
		fs := flag.NewFlagSet("devicesim", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		f.register(fs)
		return &f, fs.Parse(args)
	}
	for _, c := range []struct {
		args []string
		want fwdevice.Faults
		err  string
	}{
		{args: nil},
		{args: []string{"-fw-fail", "verified:flash worn", "-fw-fault-times", "1"}, want: fwdevice.Faults{FailAt: fwdevice.Verified, FailReason: "flash worn", Times: 1}},
		{args: []string{"-fw-stall", "DOWNLOADING", "-fw-cut", "0.5", "-fw-reboot-old", "-fw-wrong-hash"},
			want: fwdevice.Faults{StallAt: fwdevice.Downloading, CutAt: 0.5, RebootOld: true, WrongHash: true}},
		{args: []string{"-fw-fail", "QUEUED"}, err: "-fw-fail"},
		{args: []string{"-fw-stall", "x"}, err: "-fw-stall"},
		{args: []string{"-fw-cut", "1"}, err: "-fw-cut"},
		{args: []string{"-fw-faulty", "1.5"}, err: "-fw-faulty"},
		{args: []string{"-fw-fault-times", "-1"}, err: "-fw-fault-times"},
	} {
		f, err := parse(c.args...)
		if err != nil {
			t.Fatal(err)
		}
		got, err := f.faults()
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%q: error %v, want one naming %s", c.args, err, c.err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%q: %+v, %v; want %+v", c.args, got, err, c.want)
		}
	}
	f, _ := parse("-firmware", "-fw-version", "2.1.0", "-fw-wrong-hash", "-fw-faulty", "0.2")
	faults, err := f.faults()
	if err != nil {
		t.Fatal(err)
	}
	ids := []string{"d1", "d2", "d3", "d4", "d5", "d6", "d7", "d8", "d9", "d10"}
	creds := map[string]sim.Credential{"d1": {SecureID: "s1", SecureKey: "k1"}}
	opts := f.options(ids, creds, faults, slog.New(slog.NewTextHandler(io.Discard, nil)))
	var wrong []string
	for _, id := range ids {
		if opts(id).Faults.WrongHash {
			wrong = append(wrong, id)
		}
	}
	if o := opts("d1"); o.Version != "2.1.0" || o.SecureID != "s1" || o.SecureKey != "k1" || strings.Join(wrong, ",") != "d1,d2" {
		t.Errorf("d1: %+v; faulty %q, want d1,d2", o, wrong)
	}
	f, _ = parse()
	if f.options(ids, creds, faults, nil) != nil {
		t.Error("an updater without -firmware")
	}
}
