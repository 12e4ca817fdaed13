package main

import (
	"flag"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"devicehub/bench/fwdevice"
	"devicehub/bench/sim"
)

// fwFlags are the firmware updater's flags (README "Try it with simulated
// devices").
type fwFlags struct {
	enabled          bool
	version          string
	fail, stall      string
	cut, faulty      float64
	rebootOld, wrong bool
	times            int
	timeout          time.Duration
}

func (f *fwFlags) register(fs *flag.FlagSet) {
	fs.BoolVar(&f.enabled, "firmware", false, "each device runs a firmware updater (firmware/upgrade, HTTP download, progress, version reports)")
	fs.StringVar(&f.version, "fw-version", "1.0.0", "firmware version the devices run at start")
	fs.StringVar(&f.fail, "fw-fail", "", "STATE[:reason]: report FAILED with reason where STATE (DOWNLOADING, DOWNLOADED, VERIFIED, UPDATING, UPDATED) would be reported")
	fs.StringVar(&f.stall, "fw-stall", "", "STATE: report STATE, then nothing more for the job (until an upgrade restarts it)")
	fs.Float64Var(&f.cut, "fw-cut", 0, "cut each device's first download at this fraction (0-1), once; it resumes with a range request")
	fs.BoolVar(&f.rebootOld, "fw-reboot-old", false, "once per device: report UPDATING, reboot into the old version and claim UPDATED anyway")
	fs.BoolVar(&f.wrong, "fw-wrong-hash", false, "compute a wrong SHA-256 of the download: FAILED sha256 mismatch")
	fs.IntVar(&f.times, "fw-fault-times", 0, "-fw-fail, -fw-stall and -fw-wrong-hash hit each device's first N jobs only, so a retry succeeds (0: every job)")
	fs.Float64Var(&f.faulty, "fw-faulty", 1, "share of the devices (the first ones) that have the -fw-* faults")
	fs.DurationVar(&f.timeout, "fw-timeout", 2*time.Minute, "bound of one job's download, resumes included")
}

func parseState(flagName, s string) (fwdevice.State, error) {
	st := fwdevice.State(strings.ToUpper(s))
	switch st {
	case fwdevice.Downloading, fwdevice.Downloaded, fwdevice.Verified, fwdevice.Updating, fwdevice.Updated:
		return st, nil
	}
	return "", fmt.Errorf("-%s %q: want DOWNLOADING, DOWNLOADED, VERIFIED, UPDATING or UPDATED", flagName, s)
}

// faults are the faults the flags ask for, or the first bad flag.
func (f *fwFlags) faults() (fwdevice.Faults, error) {
	var faults fwdevice.Faults
	if f.fail != "" {
		state, reason, _ := strings.Cut(f.fail, ":")
		st, err := parseState("fw-fail", state)
		if err != nil {
			return faults, err
		}
		faults.FailAt, faults.FailReason = st, reason
	}
	if f.stall != "" {
		st, err := parseState("fw-stall", f.stall)
		if err != nil {
			return faults, err
		}
		faults.StallAt = st
	}
	if f.cut < 0 || f.cut >= 1 {
		return faults, fmt.Errorf("-fw-cut %v: want a fraction in [0,1)", f.cut)
	}
	if f.faulty < 0 || f.faulty > 1 {
		return faults, fmt.Errorf("-fw-faulty %v: want a share in [0,1]", f.faulty)
	}
	if f.times < 0 {
		return faults, fmt.Errorf("-fw-fault-times %d: want 0 or more", f.times)
	}
	faults.CutAt, faults.RebootOld, faults.WrongHash, faults.Times = f.cut, f.rebootOld, f.wrong, f.times
	return faults, nil
}

// options returns sim's Firmware function for the devices ids with their
// logins (faults on the -fw-faulty share of them), nil when the updater is
// off.
func (f *fwFlags) options(ids []string, creds map[string]sim.Credential, faults fwdevice.Faults, log *slog.Logger) func(string) *fwdevice.Options {
	if !f.enabled {
		return nil
	}
	faulty := make(map[string]bool, len(ids))
	for i := range int(f.faulty*float64(len(ids)) + 0.5) {
		faulty[ids[i]] = true
	}
	return func(id string) *fwdevice.Options {
		o := &fwdevice.Options{Version: f.version, SecureID: creds[id].SecureID, SecureKey: creds[id].SecureKey, Timeout: f.timeout,
			OnReport: func(p fwdevice.Progress) {
				switch p.State {
				case "":
					log.Info("firmware version", "device", id, "version", p.Version)
				case fwdevice.Downloading:
				default:
					log.Info("firmware progress", "device", id, "rollout", p.RolloutID, "version", p.Version, "state", p.State, "reason", p.Reason)
				}
			}}
		if faulty[id] {
			o.Faults = faults
		}
		return o
	}
}
