package bench

import (
	"context"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha512"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"time"

	"devicehub/ingest/dynsec"
	"devicehub/ingest/wire"
)

// The dynamic-security side of the comparison: device logins as that
// plugin holds them when it is the only one, as devicehub wrote them
// before its own plugin (a client per device, bound to its client id,
// with a role of its own holding its topic rights).

// dynsecDeviceRole is the role of a device's rights.
func dynsecDeviceRole(id string) string { return "bench-device:" + id }

// dynsecDeviceACLs are a device's rights: publish its own uplinks,
// subscribe below its own prefix (DESIGN.md "Device state and messages").
func dynsecDeviceACLs(product, id string) []dynsec.ACL {
	var acls []dynsec.ACL
	for _, level := range []string{wire.LevelReport, wire.LevelEvent + "#", wire.LevelOnline, wire.LevelOffline, wire.LevelReadReply, wire.LevelInvokeReply} {
		acls = append(acls, dynsec.ACL{Type: "publishClientSend", Topic: wire.DeviceTopic(product, id, level), Allow: true})
	}
	return append(acls, dynsec.ACL{Type: "subscribePattern", Topic: wire.DeviceTopic(product, id, "#"), Allow: true})
}

// dynsecDeviceCommands create a device's role and client, in that order.
func dynsecDeviceCommands(product string, l fleetLogin) []dynsec.Command {
	return []dynsec.Command{
		{"command": "createRole", "rolename": dynsecDeviceRole(l.ID), "acls": dynsecDeviceACLs(product, l.ID)},
		{"command": "createClient", "username": l.SecureID, "password": l.Key, "clientid": l.ID,
			"roles": []map[string]any{{"rolename": dynsecDeviceRole(l.ID), "priority": 0}}},
	}
}

// createDynsecDevices creates the devices' logins through the plugin's
// control topic, perMessage devices per control message; the plugin
// rewrites its file after each command.
func createDynsecDevices(ctx context.Context, brokerURL, product string, logins []fleetLogin, perMessage int) error {
	admin, err := dialAdmin(ctx, brokerURL)
	if err != nil {
		return err
	}
	defer admin.Close()
	for i := 0; i < len(logins); i += perMessage {
		var cmds []dynsec.Command
		for _, l := range logins[i:min(i+perMessage, len(logins))] {
			cmds = append(cmds, dynsecDeviceCommands(product, l)...)
		}
		cctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		rs, err := admin.Do(cctx, cmds...)
		cancel()
		if err != nil {
			return fmt.Errorf("bench: dynamic-security devices: %w", err)
		}
		for _, r := range rs {
			if err := r.Err(); err != nil {
				return fmt.Errorf("bench: dynamic-security devices: %w", err)
			}
		}
	}
	return nil
}

// seedDynsecFile adds the devices, with their roles, to the plugin's file
// in dir before the broker starts, as the plugin itself writes them
// (PBKDF2-SHA512, 101 iterations, 12-byte salt): a file of n devices in
// seconds instead of the 2n rewrites of a growing file that creating
// them through the control topic costs.
func seedDynsecFile(dir, product string, logins []fleetLogin) error {
	path := filepath.Join(dir, "dynsec.json")
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		return fmt.Errorf("bench: %s: %w", path, err)
	}
	clients := make([]any, len(logins))
	roles := make([]any, len(logins))
	var wg sync.WaitGroup
	workers := max(runtime.GOMAXPROCS(0), 1)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < len(logins); i += workers {
				l := logins[i]
				var salt [12]byte
				_, _ = rand.Read(salt[:])
				hash, err := pbkdf2.Key(sha512.New, l.Key, salt[:], 101, 64)
				if err != nil {
					panic(err) // only for invalid parameters, which these are not
				}
				clients[i] = map[string]any{"username": l.SecureID, "clientid": l.ID,
					"roles":    []map[string]any{{"rolename": dynsecDeviceRole(l.ID), "priority": 0}},
					"password": base64.StdEncoding.EncodeToString(hash), "salt": base64.StdEncoding.EncodeToString(salt[:]),
					"iterations": 101}
				roles[i] = map[string]any{"rolename": dynsecDeviceRole(l.ID), "acls": dynsecDeviceACLs(product, l.ID)}
			}
		}()
	}
	wg.Wait()
	add := func(key string, items []any) {
		have, _ := doc[key].([]any)
		doc[key] = append(have, items...)
	}
	add("clients", clients)
	add("roles", roles)
	out, err := json.Marshal(doc)
	if err != nil {
		return err
	}
	return os.WriteFile(path, out, 0o600)
}

// DynsecStep is the dynamic-security plugin holding Logins device
// logins: what one more device costs it, and what a connected device
// sees meanwhile.
type DynsecStep struct {
	Logins int `json:"logins"` // device logins in the file before the changes
	// LoadSeconds: from the broker's exec to its first accepted
	// connection (it reads the file meanwhile).
	LoadSeconds float64 `json:"loadSeconds"`
	FileBytes   int64   `json:"fileBytes"` // after the changes
	// Added devices, one after another: Commands sent (createRole and
	// createClient of each), one per control message; Command is each
	// one's round trip, publish to response (the plugin answers after
	// rewriting its file), Device the two of one device.
	Added    int            `json:"added"`
	Commands int            `json:"commands"`
	Command  LatencySummary `json:"command"`
	Device   LatencySummary `json:"device"`
	// Quiet and During: a connected device's QoS 1 reports every probe
	// interval, before and during the changes.
	Quiet    PubackProbe `json:"quiet"`
	During   PubackProbe `json:"during"`
	RSSBytes int64       `json:"brokerRssBytes"` // after the changes
	// TimedOut: the step's time bound ended the changes early.
	TimedOut bool       `json:"timedOut,omitempty"`
	Phase    FleetPhase `json:"phase"`
}

func (s DynsecStep) String() string {
	to := ""
	if s.TimedOut {
		to = " (time bound reached)"
	}
	return fmt.Sprintf("dynamic security at %d logins: loaded in %.1fs; %d devices added%s, one command at a time: one %s; one device (role+client) p50 %.1fms; then file %.1f MB, broker RSS %d MiB\n    PUBACK quiet  %s\n    PUBACK during %s\n    %s",
		s.Logins, s.LoadSeconds, s.Added, to, s.Command, s.Device.P50Ms, float64(s.FileBytes)/1e6, s.RSSBytes>>20, s.Quiet, s.During, s.Phase)
}

// runDynsecStep starts a dynamic-security-only broker whose file holds n
// device logins, connects one of them as a probe, and adds devices one
// command per message (p.DynsecChanges and p.DynsecQuiet at least,
// p.DynsecTime at most).
func runDynsecStep(ctx context.Context, p FleetParams, n int) (DynsecStep, error) {
	st := DynsecStep{Logins: n}
	product, seed := "fleetds"+randHex(3), randHex(8)
	logins := fleetLogins(product, "s", n, seed)
	b, err := startFleetBroker(ctx, brokerDynsec, func(dir string) error {
		return seedDynsecFile(dir, product, logins)
	})
	if err != nil {
		return st, err
	}
	defer b.stop()
	st.LoadSeconds = b.Loaded.Seconds()
	meter := startPhase(fmt.Sprintf("dynamic security at %d logins", n), []namedProc{
		{Name: "bench (admin client, probe device)", PID: 0}, {Name: "mosquitto (dynamic security only)", PID: b.pid()}})
	// The probe is the first device of the file (n >= 1).
	probe, err := startPubackProber(b.url(), logins[0], wire.DeviceTopic(product, logins[0].ID, wire.LevelReport), p.ProbeInterval)
	if err != nil {
		return st, fmt.Errorf("%w\n%s", err, b.logTail())
	}
	defer probe.close()
	admin, err := dialAdmin(ctx, b.url())
	if err != nil {
		return st, err
	}
	defer admin.Close()
	quiet := probe.window()
	if err := sleepCtx(ctx, p.DynsecQuiet); err != nil {
		return st, err
	}
	st.Quiet = quiet()
	during := probe.window()
	var cmd, dev Histogram
	// New devices one after another, as a provisioning through this
	// plugin would go: at least p.DynsecChanges of them, and more for as
	// long as the quiet window lasted (so that both windows hold about as
	// many probes) while they add at most a tenth to the file; within
	// p.DynsecTime.
	start := time.Now()
	more := func(j int) bool {
		return j < p.DynsecChanges || time.Since(start) < p.DynsecQuiet && j < n/10
	}
	for j := 0; more(j); j++ {
		if time.Since(start) > p.DynsecTime {
			st.TimedOut = true
			break
		}
		id := fleetID(product, "s", n+j)
		l := fleetLogin{ID: id, SecureID: id, Key: fleetKey(seed, id)}
		var took time.Duration
		for _, c := range dynsecDeviceCommands(product, l) {
			cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
			t0 := time.Now()
			rs, err := admin.Do(cctx, c)
			cancel()
			if err != nil {
				return st, fmt.Errorf("bench: dynamic security at %d logins: %w", n, err)
			}
			if err := rs[0].Err(); err != nil {
				return st, err
			}
			d := time.Since(t0)
			cmd.Record(d)
			took += d
			st.Commands++
		}
		dev.Record(took)
		st.Added++
	}
	st.During = during()
	st.Command, st.Device = cmd.Summary(), dev.Summary()
	st.FileBytes = b.dynsecFileSize()
	st.RSSBytes = pidRSS(b.pid())
	st.Phase = meter.end(int64(st.Commands), "change")
	return st, nil
}

// sleepCtx sleeps d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
