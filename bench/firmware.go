package bench

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"devicehub/bench/fwdevice"
)

// FirmwareParams configure RunFirmware. Zero fields take the defaults
// noted.
type FirmwareParams struct {
	// Devices downloading at once; default 10,000.
	Devices int `json:"devices"`
	// Size of the package in bytes; default 1 MiB.
	Size int `json:"size"`
	// Rate is the rollout's devices started per minute; default 100,000
	// (the API's most): every device at once.
	Rate int `json:"ratePerMinute"`
	// Gateways are the MQTT connections playing the devices; default 4.
	Gateways int `json:"gateways"`
	// Timeout bounds each phase; default 10 minutes.
	Timeout time.Duration `json:"timeout"`
	ChildParams
}

// FirmwarePhase is one server handing the package to every device.
type FirmwarePhase struct {
	Server  string `json:"server"`
	Devices int    `json:"devices"`
	// Updated: devices that reported UPDATED for the target (device side).
	Updated int `json:"updated"`
	// Failed: FAILED reports (a retried device may still end UPDATED).
	Failed  int            `json:"failed"`
	Reasons map[string]int `json:"reasons,omitempty"`
	Resumes int64          `json:"resumes"`
	// ServerErrors are 5xx answers to downloads (each asked again).
	ServerErrors int64 `json:"serverErrors"`
	Bytes        int64 `json:"bytes"` // received over HTTP by the devices
	// DownloadMs is from the first device's DOWNLOADING to the last one's
	// DOWNLOADED; MBps is Bytes over it (MB = 10^6 bytes).
	DownloadMs float64 `json:"downloadMs"`
	MBps       float64 `json:"mbPerSecond"`
	// DevicesUpdatedMs is from the start (upgrades published, or the
	// rollout created) until the last device reported UPDATED;
	// ServerUpdatedMs (devicehub) until the rollout counted every device
	// UPDATED (its own rule: the device reported the target version).
	DevicesUpdatedMs float64 `json:"devicesUpdatedMs"`
	ServerUpdatedMs  float64 `json:"serverUpdatedMs,omitempty"`
	// The serving process's RSS before the phase and its peak during it
	// (sampled from /proc every 250 ms), and its CPU in the phase.
	RSSBeforeMB float64 `json:"rssBeforeMB"`
	PeakRSSMB   float64 `json:"peakRssMB"`
	CPUSeconds  float64 `json:"cpuSeconds"`
}

// FirmwareResult is what RunFirmware measured: the same devices fetching
// the same file from Go's http.FileServer (a child process of the bench,
// upgrades published by the bench) and through a devicehub rollout.
type FirmwareResult struct {
	Params     FirmwareParams `json:"params"`
	FileServer FirmwarePhase  `json:"fileServer"`
	Devicehub  FirmwarePhase  `json:"devicehub"`
	RolloutID  string         `json:"rolloutId"`
	// ReportsBacklogSeconds is how long devicehub still stored the
	// file-server phase's reports after its devices were all UPDATED (the
	// devicehub phase begins after).
	ReportsBacklogSeconds float64 `json:"reportsBacklogSeconds"`
}

func (r FirmwareResult) String() string {
	d, f := r.Devicehub, r.FileServer
	return fmt.Sprintf("firmware: %d devices, a %d-byte package at once; devicehub %.0f MB/s (http.FileServer %.0f MB/s), "+
		"peak RSS %.0f MB from %.0f MB (http.FileServer %.0f MB), all UPDATED in %.1f s by the rollout's counts, %.1f s by the devices' reports "+
		"(http.FileServer with upgrades published at once: %.1f s); devicehub CPU %.1f s (http.FileServer %.1f s); FAILED reports %d (%d), resumes %d (%d), 5xx answers %d (%d)",
		r.Params.Devices, r.Params.Size, d.MBps, f.MBps, d.PeakRSSMB, d.RSSBeforeMB, f.PeakRSSMB, d.ServerUpdatedMs/1000, d.DevicesUpdatedMs/1000,
		f.DevicesUpdatedMs/1000, d.CPUSeconds, f.CPUSeconds, d.Failed, f.Failed, d.Resumes, f.Resumes, d.ServerErrors, f.ServerErrors) +
		fmt.Sprintf("; the http.FileServer phase's reports stored %.1f s after it", r.ReportsBacklogSeconds) + reasonsText(d.Reasons) + reasonsText(f.Reasons)
}

// Figures are the result's report lines.
func (r FirmwareResult) Figures() []Figure {
	d, f := r.Devicehub, r.FileServer
	n := fmt.Sprintf(" (%d devices, %d-byte package, at once)", r.Params.Devices, r.Params.Size)
	fs := "Go http.FileServer, same file and devices, same run"
	all := float64(r.Params.Devices) * float64(r.Params.Size) / 1e6
	return []Figure{
		{Name: "download rate, devicehub" + n, Value: d.MBps, Unit: "MB/s", Against: fs, Baseline: f.MBps, Ratio: Ratio(d.MBps, f.MBps)},
		{Name: "peak RSS of the server while serving" + n, Value: d.PeakRSSMB, Unit: "MB", Against: fs + " (its child process)", Baseline: f.PeakRSSMB, Ratio: Ratio(d.PeakRSSMB, f.PeakRSSMB)},
		{Name: "devicehub RSS growth while serving" + n, Value: d.PeakRSSMB - d.RSSBeforeMB, Unit: "MB",
			Target: fmt.Sprintf("bounded: far below package x downloads (%.0f MB)", all)},
		{Name: "time until every device UPDATED, by the rollout's counts" + n, Value: d.ServerUpdatedMs / 1000, Unit: "s",
			Against: "upgrades published at once by the bench, file from " + fs, Baseline: f.DevicesUpdatedMs / 1000, Ratio: Ratio(d.ServerUpdatedMs, f.DevicesUpdatedMs)},
		{Name: "time until every device reported UPDATED, devicehub rollout" + n, Value: d.DevicesUpdatedMs / 1000, Unit: "s"},
		{Name: "server CPU for the phase, devicehub" + n, Value: d.CPUSeconds, Unit: "CPU s", Against: fs, Baseline: f.CPUSeconds, Ratio: Ratio(d.CPUSeconds, f.CPUSeconds)},
		{Name: "devices UPDATED, devicehub" + n, Value: float64(d.Updated), Unit: "devices", Target: "all " + strconv.Itoa(r.Params.Devices)},
		{Name: "FAILED reports, devicehub" + n, Value: float64(d.Failed), Unit: "reports", Target: "0"},
		{Name: "downloads resumed or asked again, devicehub" + n, Value: float64(d.Resumes), Unit: "resumes"},
		{Name: "5xx answers to downloads (asked again after a pause), devicehub" + n, Value: float64(d.ServerErrors), Unit: "answers", Target: "0"},
	}
}

// RunFirmware runs the devicehub binary (api and ingest) on a private
// broker, provisions Devices devices with their logins and plays them with
// bench/fwdevice updaters over a few gateway connections. It then hands a
// Size-byte package to every device at once twice: first from Go's
// http.FileServer in a child process of this binary (the bench publishing
// the upgrades itself), then through devicehub: the package uploaded, one
// rollout over the product at Rate, each device downloading from
// devicehub's download route with its own login, until the rollout counts
// every device UPDATED. Each phase reports the download rate, the serving
// process's peak RSS and CPU, and the time until all were updated.
func RunFirmware(ctx context.Context, p FirmwareParams) (res FirmwareResult, err error) {
	if p.Devices <= 0 {
		p.Devices = 10_000
	}
	if p.Size <= 0 {
		p.Size = 1 << 20
	}
	if p.Rate <= 0 {
		p.Rate = 100_000
	}
	if p.Gateways <= 0 {
		p.Gateways = 4
	}
	if p.Timeout <= 0 {
		p.Timeout = 10 * time.Minute
	}
	p.childDefaults()
	res.Params = p
	tmp, bin, db, cleanup, err := p.prepare(ctx, "firmware")
	if err != nil {
		return res, err
	}
	defer cleanup()
	image := make([]byte, p.Size)
	_, _ = rand.Read(image)
	sum := sha256.Sum256(image)
	files := filepath.Join(tmp, "files")
	if err := os.MkdirAll(files, 0o755); err != nil {
		return res, err
	}
	if err := os.WriteFile(filepath.Join(files, "fw.bin"), image, 0o644); err != nil {
		return res, err
	}
	broker, err := startFleetBroker(ctx, brokerPlugin, nil)
	if err != nil {
		return res, err
	}
	defer broker.stop()
	p.Logf("firmware: starting devicehub (api, ingest) on a private broker")
	addr, err := freeAddr()
	if err != nil {
		return res, err
	}
	srv, err := startChildAPI(ctx, childAPIConfig{Binary: bin, LogDir: tmp, DB: db, ClickHouseAddr: p.ClickHouseAddr,
		BrokerURL: broker.url(), Roles: "api,ingest", Args: p.ServerArgs, Conns: 8,
		Env: map[string]string{"HTTP_ADDR": addr, "FIRMWARE_DIR": filepath.Join(tmp, "firmware"), "FIRMWARE_PUBLIC_URL": "http://" + addr}})
	if err != nil {
		return res, err
	}
	defer srv.stop()

	product := "benchfw" + randHex(4)
	if err := srv.deployProduct(ctx, product, "Bench firmware", ""); err != nil {
		return res, err
	}
	p.Logf("firmware: provisioning %d devices", p.Devices)
	logins := make([]fwLogin, 0, p.Devices)
	for lo := 0; lo < p.Devices; lo += 10_000 {
		batch := make([]map[string]any, 0, 10_000)
		for i := lo; i < min(lo+10_000, p.Devices); i++ {
			id := product + "-" + strconv.Itoa(i)
			batch = append(batch, map[string]any{"id": id, "name": id, "productId": product})
		}
		var created struct {
			Devices []struct {
				ID        string `json:"id"`
				SecureID  string `json:"secureId"`
				SecureKey string `json:"secureKey"`
			} `json:"devices"`
		}
		if err := srv.call(ctx, "POST", "/api/device/instance/batch/_create?deploy=true", batch, &created); err != nil {
			return res, err
		}
		for _, d := range created.Devices {
			logins = append(logins, fwLogin{d.ID, d.SecureID, d.SecureKey})
		}
	}
	if len(logins) != p.Devices {
		return res, fmt.Errorf("bench: %d logins for %d devices created", len(logins), p.Devices)
	}
	p.Logf("firmware: %d devices up on %d gateway connections", p.Devices, p.Gateways)
	fleet, err := startFWFleet(ctx, broker.url(), product, logins, "1.0.0", p.Gateways)
	if err != nil {
		return res, err
	}
	defer fleet.close()

	// The ceiling: Go's http.FileServer, the bench publishing the upgrades.
	fsrv, err := startFileServer(ctx, files)
	if err != nil {
		return res, err
	}
	p.Logf("firmware: every device fetching the package from http.FileServer (%s)", fsrv.url)
	res.FileServer, err = runFWPhase(ctx, fleet, "Go http.FileServer (child process)", fsrv.pid(), "1.1.0", p.Timeout, func() error {
		return fleet.upgradeAll(ctx, fwdevice.Upgrade{RolloutID: "bench-ceiling", Version: "1.1.0", Size: int64(p.Size),
			SHA256: hex.EncodeToString(sum[:]), URL: fsrv.url + "/fw.bin", Expires: time.Now().Add(time.Hour).UnixMilli()})
	}, nil)
	fsrv.stop()
	if err != nil {
		return res, err
	}
	// The devicehub phase begins once devicehub stored every report the
	// devices sent so far (the file-server phase's, about 13 a device):
	// else it would store them during the next phase, which they slow.
	if res.ReportsBacklogSeconds, err = waitReportsStored(ctx, srv, fleet, p.Timeout, p.Logf); err != nil {
		return res, err
	}

	// devicehub: the package uploaded, one rollout over the product.
	var pkg struct {
		ID     string `json:"id"`
		SHA256 string `json:"sha256"`
		Size   int64  `json:"size"`
	}
	q := url.Values{"productId": {product}, "version": {"1.2.0"}, "name": {"bench"}}
	raw, err := srv.apiClient.rawPost(ctx, "/api/firmware/package?"+q.Encode(), "application/octet-stream", image)
	if err != nil {
		return res, err
	}
	if err := decodeResult(raw, &pkg); err != nil {
		return res, err
	}
	if pkg.SHA256 != hex.EncodeToString(sum[:]) || pkg.Size != int64(p.Size) {
		return res, fmt.Errorf("bench: package stored as %d bytes, sha256 %s", pkg.Size, pkg.SHA256)
	}
	p.Logf("firmware: every device updated by a devicehub rollout (%d a minute)", p.Rate)
	res.Devicehub, err = runFWPhase(ctx, fleet, "devicehub", srv.pid(), "1.2.0", p.Timeout, func() error {
		var r struct {
			ID string `json:"id"`
		}
		err := srv.call(ctx, "POST", "/api/firmware/rollout", map[string]any{"packageId": pkg.ID, "ratePerMinute": p.Rate,
			"timeoutSeconds": int(p.Timeout.Seconds()), "retries": 2}, &r)
		res.RolloutID = r.ID
		return err
	}, func() (bool, error) {
		var r struct {
			State  string         `json:"state"`
			Reason string         `json:"reason"`
			Counts map[string]int `json:"counts"`
		}
		if err := srv.call(ctx, "GET", "/api/firmware/rollout/"+res.RolloutID, nil, &r); err != nil {
			return false, err
		}
		if r.Counts["UPDATED"] >= p.Devices {
			return true, nil
		}
		switch strings.ToUpper(r.State) {
		case "ABORTED", "CANCELED", "FAILED", "COMPLETED", "DONE", "FINISHED":
			return false, fmt.Errorf("bench: rollout %s ended %s (%s) with counts %v", res.RolloutID, r.State, r.Reason, r.Counts)
		}
		return false, nil
	})
	if err == nil && res.Devicehub.Updated < p.Devices {
		err = fmt.Errorf("bench: %d of %d devices reported UPDATED", res.Devicehub.Updated, p.Devices)
	}
	if err != nil {
		var r json.RawMessage
		_ = srv.call(ctx, "GET", "/api/firmware/rollout/"+res.RolloutID, nil, &r)
		err = fmt.Errorf("%w\nrollout: %.1000s\ndevicehub's log:\n%s", err, r, srv.proc.logTail())
	}
	return res, err
}

// fwReportsMetric counts the firmware reports devicehub stored, by topic.
const fwReportsMetric = "devicehub_firmware_reports_total"

// waitReportsStored waits until devicehub's count of stored firmware
// reports reaches the count of those the broker acknowledged to the
// fleet (a report delivered twice counts twice: at least), polling
// /metrics every 250 ms, for at most timeout.
// It returns how long it waited.
func waitReportsStored(ctx context.Context, srv *childAPI, f *fwFleet, timeout time.Duration, logf func(string, ...any)) (float64, error) {
	want := float64(f.reports.Load())
	start := time.Now()
	for {
		m, err := srv.proc.scrapeMetrics(ctx)
		if err != nil {
			return 0, err
		}
		got := m.sum(fwReportsMetric)
		waited := time.Since(start).Seconds()
		if got >= want {
			logf("firmware: devicehub stored the %.0f reports sent so far, %.1f s after the phase", want, waited)
			return waited, nil
		}
		if time.Since(start) > timeout {
			return waited, fmt.Errorf("bench: devicehub stored %.0f of the %.0f firmware reports sent within %s", got, want, timeout)
		}
		select {
		case <-ctx.Done():
			return waited, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// runFWPhase measures one phase: start sets the devices going; the phase
// ends when every device reported UPDATED for target and, if serverDone
// is set, it says so too (polled every 250 ms), or at timeout (an error).
// pid is the serving process.
func runFWPhase(ctx context.Context, f *fwFleet, server string, pid int, target string, timeout time.Duration,
	start func() error, serverDone func() (bool, error)) (FirmwarePhase, error) {
	ph := FirmwarePhase{Server: server, Devices: len(f.devs)}
	bytes0, resumes0, errors0 := f.bytes()
	ph.RSSBeforeMB = float64(pidRSS(pid)) / 1e6
	cpu0, _ := procCPUTime(pid)
	peak := pidRSSSampler(pid)
	t := newFWTrack(target, len(f.devs))
	f.track.Store(t)
	defer f.track.Store(nil)
	err := start()
	var serverAt time.Time
	deadline := t.start.Add(timeout)
	for err == nil {
		updated, _ := t.counts()
		if serverDone != nil && serverAt.IsZero() {
			var ok bool
			if ok, err = serverDone(); ok {
				serverAt = time.Now()
			}
		}
		if updated >= ph.Devices && (serverDone == nil || !serverAt.IsZero()) {
			break
		}
		if time.Now().After(deadline) {
			err = fmt.Errorf("bench: %s: %d of %d devices UPDATED within %s", server, updated, ph.Devices, timeout)
		} else if ctx.Err() != nil {
			err = ctx.Err()
		}
		time.Sleep(250 * time.Millisecond)
	}
	ph.PeakRSSMB = float64(peak()) / 1e6
	cpu1, _ := procCPUTime(pid)
	ph.CPUSeconds = (cpu1 - cpu0).Seconds()
	bytes1, resumes1, errors1 := f.bytes()
	ph.Bytes, ph.Resumes, ph.ServerErrors = bytes1-bytes0, resumes1-resumes0, errors1-errors0
	t.mu.Lock()
	ph.Updated, ph.Failed = len(t.updated), t.failed
	if len(t.reasons) > 0 {
		ph.Reasons = t.reasons
	}
	if !t.firstDownload.IsZero() && t.lastDownloaded.After(t.firstDownload) {
		ph.DownloadMs = float64(t.lastDownloaded.Sub(t.firstDownload).Microseconds()) / 1000
		ph.MBps = float64(ph.Bytes) / 1e6 / (ph.DownloadMs / 1000)
	}
	if !t.lastUpdated.IsZero() {
		ph.DevicesUpdatedMs = float64(t.lastUpdated.Sub(t.start).Milliseconds())
	}
	t.mu.Unlock()
	if !serverAt.IsZero() {
		ph.ServerUpdatedMs = float64(serverAt.Sub(t.start).Milliseconds())
	}
	return ph, err
}

// reasonsText lists a phase's failure reasons, most frequent first.
func reasonsText(m map[string]int) string {
	type kv struct {
		k string
		v int
	}
	var l []kv
	for k, v := range m {
		l = append(l, kv{k, v})
	}
	sort.Slice(l, func(i, j int) bool { return l[i].v > l[j].v })
	var b strings.Builder
	for _, e := range l {
		fmt.Fprintf(&b, "; %dx FAILED %s", e.v, e.k)
	}
	return b.String()
}

// rawPost posts body as contentType and returns a 200 answer's body.
func (s *apiClient) rawPost(ctx context.Context, path, contentType string, body []byte) ([]byte, error) {
	headers := []string{"Content-Type", contentType}
	if s.token != "" {
		headers = append(headers, "X-Access-Token", s.token)
	}
	status, raw, err := s.http.do(ctx, "POST", s.base+path, headers, body)
	if err != nil {
		return nil, err
	}
	if status != 200 {
		return raw, fmt.Errorf("bench: POST %s: HTTP %d: %.200s", path, status, raw)
	}
	return raw, nil
}

// decodeResult decodes an API envelope's result.
func decodeResult(raw []byte, out any) error {
	var env struct {
		Result json.RawMessage `json:"result"`
	}
	if err := json.Unmarshal(raw, &env); err != nil {
		return fmt.Errorf("bench: %w: %.200s", err, raw)
	}
	return json.Unmarshal(env.Result, out)
}
