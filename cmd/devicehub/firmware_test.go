package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"devicehub/bench/fwdevice"
	"devicehub/bench/testkit"
	"devicehub/ingest/mqtttest"
)

// fwFleet simulates devices that follow the firmware protocol
// (README "Firmware updates") over one gateway connection: each upgrade
// is downloaded over HTTP with the device's own credentials, checked
// against its SHA-256, and reported on firmware/progress, then the new
// version on firmware/version. A device's behaviour may be one of the
// faults below.
type fwFleet struct {
	t       *testing.T
	product string
	old     string // the version devices run before the update
	c       mqtt.Client

	mu       sync.Mutex
	behave   map[string]string // device: "fail", "cut", "reboot-old", "corrupt", "no-version"
	online   map[string]bool
	upgrades map[string][]fwUpgrade // received, in order
	starts   []time.Time            // arrival of each first upgrade of a device
	cuts     map[string]fwCut
	sem      chan struct{}
}

type fwUpgrade struct {
	MessageID string `json:"messageId"`
	RolloutID string `json:"rolloutId"`
	Version   string `json:"version"`
	Size      int64  `json:"size"`
	SHA256    string `json:"sha256"`
	URL       string `json:"url"`
	Expires   int64  `json:"expires"`
}

// fwCut is what a cut download asked for and got when it resumed.
type fwCut struct {
	Offset       int
	Range        string
	Status       int
	ContentRange string
}

func fwKey(device string) string { return "secret-key-of-" + device }

func newFwFleet(t *testing.T, brokerURL, product string) *fwFleet {
	t.Helper()
	f := &fwFleet{t: t, product: product, old: "1.0.0", behave: map[string]string{}, online: map[string]bool{},
		upgrades: map[string][]fwUpgrade{}, cuts: map[string]fwCut{}, sem: make(chan struct{}, 64)}
	o := mqtt.NewClientOptions().AddBroker(brokerURL).SetClientID(testkit.RandID("fwgw-")).SetCleanSession(true)
	mqtttest.Gateway(t, brokerURL)(o)
	f.c = mqtt.NewClient(o)
	if tok := f.c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatal(tok.Error())
	}
	t.Cleanup(func() { f.c.Disconnect(100) })
	tok := f.c.Subscribe("/"+product+"/+/firmware/upgrade", 1, func(_ mqtt.Client, m mqtt.Message) {
		parts := strings.Split(m.Topic(), "/")
		dev := parts[2]
		var up fwUpgrade
		if json.Unmarshal(m.Payload(), &up) != nil {
			return
		}
		f.mu.Lock()
		if !f.online[dev] { // a device offline does not get it
			f.mu.Unlock()
			return
		}
		if len(f.upgrades[dev]) == 0 {
			f.starts = append(f.starts, time.Now())
		}
		f.upgrades[dev] = append(f.upgrades[dev], up)
		n := len(f.upgrades[dev])
		f.mu.Unlock()
		go f.update(dev, up, n)
	})
	if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatal(tok.Error())
	}
	return f
}

func (f *fwFleet) publish(dev, level string, body any) {
	b, _ := json.Marshal(body)
	tok := f.c.Publish("/"+f.product+"/"+dev+"/"+level, 1, false, b)
	if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		f.t.Errorf("publish %s of %s: %v", level, dev, tok.Error())
	}
}

// connect brings devices online: their birth, then their version.
func (f *fwFleet) connect(devs ...string) {
	for _, d := range devs {
		f.mu.Lock()
		f.online[d] = true
		f.mu.Unlock()
		f.publish(d, "online", map[string]any{})
		f.publish(d, "firmware/version", map[string]any{"version": f.old})
	}
}

func (f *fwFleet) progress(dev string, up fwUpgrade, state string, extra map[string]any) {
	body := map[string]any{"rolloutId": up.RolloutID, "version": up.Version, "state": state}
	for k, v := range extra {
		body[k] = v
	}
	f.publish(dev, "firmware/progress", body)
}

// update is a device's side of one upgrade (the n-th it got).
func (f *fwFleet) update(dev string, up fwUpgrade, n int) {
	f.sem <- struct{}{}
	defer func() { <-f.sem }()
	f.mu.Lock()
	mode := f.behave[dev]
	f.mu.Unlock()
	f.progress(dev, up, "DOWNLOADING", map[string]any{"progress": 0})
	if mode == "fail" {
		f.progress(dev, up, "FAILED", map[string]any{"reason": "flash write error"})
		return
	}
	data, err := f.download(dev, up, mode == "cut" && n == 1)
	if err != nil {
		f.progress(dev, up, "FAILED", map[string]any{"reason": "download: " + err.Error()})
		return
	}
	f.progress(dev, up, "DOWNLOADED", nil)
	if mode == "corrupt" {
		data[0] ^= 0xff
	}
	if sum := sha256.Sum256(data); hex.EncodeToString(sum[:]) != up.SHA256 {
		f.progress(dev, up, "FAILED", map[string]any{"reason": "sha256 mismatch"})
		return
	}
	f.progress(dev, up, "VERIFIED", nil)
	f.progress(dev, up, "UPDATING", nil)
	f.progress(dev, up, "UPDATED", nil)
	switch {
	case mode == "no-version":
		return // says UPDATED, never reports the version
	case mode == "reboot-old" && n == 1:
		f.publish(dev, "online", map[string]any{})
		f.publish(dev, "firmware/version", map[string]any{"version": f.old}) // booted the old image
	default:
		f.publish(dev, "online", map[string]any{})
		f.publish(dev, "firmware/version", map[string]any{"version": up.Version})
	}
}

// download fetches the package with the device's credentials; cut reads
// half of it, drops the connection, and resumes with a Range request.
func (f *fwFleet) download(dev string, up fwUpgrade, cut bool) ([]byte, error) {
	get := func(rng string) (*http.Response, error) {
		req, err := http.NewRequest("GET", up.URL, nil)
		if err != nil {
			return nil, err
		}
		req.SetBasicAuth(dev, fwKey(dev))
		if rng != "" {
			req.Header.Set("Range", rng)
		}
		return http.DefaultClient.Do(req)
	}
	res, err := get("")
	if err != nil {
		return nil, err
	}
	if res.StatusCode != 200 {
		res.Body.Close()
		return nil, fmt.Errorf("status %d", res.StatusCode)
	}
	if !cut {
		defer res.Body.Close()
		return io.ReadAll(res.Body)
	}
	half := make([]byte, up.Size/2)
	_, err = io.ReadFull(res.Body, half)
	res.Body.Close() // cut
	if err != nil {
		return nil, err
	}
	rng := "bytes=" + strconv.Itoa(len(half)) + "-"
	res, err = get(rng)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	rest, err := io.ReadAll(res.Body)
	f.mu.Lock()
	f.cuts[dev] = fwCut{Offset: len(half), Range: rng, Status: res.StatusCode, ContentRange: res.Header.Get("Content-Range")}
	f.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return append(half, rest...), nil
}

func (f *fwFleet) upgradesOf(dev string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.upgrades[dev])
}

// fwDevices creates and deploys n devices of product named prefix-000..,
// each with its own secureKey.
func fwDevices(t *testing.T, srv *ownServer, product, prefix string, n int) []string {
	t.Helper()
	var ids []string
	var body []map[string]any
	for i := range n {
		id := fmt.Sprintf("%s-%03d", prefix, i)
		ids = append(ids, id)
		body = append(body, map[string]any{"id": id, "name": id, "productId": product,
			"configuration": map[string]any{"secureKey": fwKey(id)}})
	}
	srv.call(t, srv.token, "POST", "/api/device/instance/batch/_create?deploy=true", body)
	return ids
}

// fwProduct creates and deploys a product.
func fwProduct(t *testing.T, srv *ownServer, product string) {
	t.Helper()
	srv.call(t, srv.token, "POST", "/api/device/product", map[string]any{
		"id": product, "name": "Product " + product, "classifiedId": "test", "modelFrom": "custom",
		"accessId": "mqtt", "deviceType": "device"})
	srv.call(t, srv.token, "POST", "/api/device-product/"+product+"/deploy", nil)
}

// fwUpload uploads a package of size bytes and returns its id.
func fwUpload(t *testing.T, srv *ownServer, product, version string, size int) string {
	t.Helper()
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(i*31 + 7)
	}
	q := url.Values{"productId": {product}, "version": {version}}
	req, _ := http.NewRequest("POST", srv.base+"/api/firmware/package?"+q.Encode(), bytes.NewReader(data))
	req.Header.Set("X-Access-Token", srv.token)
	req.Header.Set("Content-Type", "application/octet-stream")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var env struct {
		Result struct {
			ID string `json:"id"`
		} `json:"result"`
	}
	raw, _ := io.ReadAll(res.Body)
	if res.StatusCode != 200 || json.Unmarshal(raw, &env) != nil || env.Result.ID == "" {
		t.Fatalf("upload: %d %s", res.StatusCode, raw)
	}
	return env.Result.ID
}

type fwRollout struct {
	ID     string         `json:"id"`
	State  string         `json:"state"`
	Reason string         `json:"reason"`
	Counts map[string]int `json:"counts"`
}

type fwJob struct {
	DeviceID string `json:"deviceId"`
	State    string `json:"state"`
	Reported string `json:"reported"`
	Reason   string `json:"reason"`
	Attempts int    `json:"attempts"`
	Version  string `json:"version"`
}

func fwJobs(t *testing.T, srv *ownServer, rollout, states string) map[string]fwJob {
	t.Helper()
	out := map[string]fwJob{}
	for page := 0; ; page++ {
		var p struct {
			Total int     `json:"total"`
			Data  []fwJob `json:"data"`
		}
		srv.do(t, srv.token, "GET", fmt.Sprintf("/api/firmware/rollout/%s/devices?pageSize=1000&pageIndex=%d&state=%s", rollout, page, states), nil, &p)
		for _, j := range p.Data {
			out[j.DeviceID] = j
		}
		if len(p.Data) < 1000 {
			return out
		}
	}
}

// fwWait polls the rollout until cond holds or d passes.
func fwWait(t *testing.T, srv *ownServer, rollout string, d time.Duration, what string, cond func(fwRollout) bool) fwRollout {
	t.Helper()
	var r fwRollout
	if !testkit.Within(d, func() bool {
		srv.do(t, srv.token, "GET", "/api/firmware/rollout/"+rollout, nil, &r)
		return cond(r)
	}) {
		t.Fatalf("%s: not within %s: %+v\n%s", what, d, r, srv.logTail())
	}
	return r
}

// TestFirmwareRollout1000: a rollout over 1,000 devices at 2,000 a
// minute ends with all UPDATED, started at its pace. The engine paces in
// windows of 6 s (firmware.pace: 200 first starts each at this rate), so
// the starts span about 24 s; no 12 s holds more than the rate's share
// of it (400) and a window's slack (200). Without the pacing all 1,000
// start within a second. It runs beside the other tests.
func TestFirmwareRollout1000(t *testing.T) {
	t.Parallel()
	const (
		devices = 1000
		rate    = 2000 // a minute
		window  = 12 * time.Second
		most    = rate*int(window/time.Second)/60 + rate/10 // the rate's share of a window, and a pacing window's
		minSpan = 20 * time.Second                          // 5 pacing windows: about 24 s
	)
	srv := startOwn(t, "fw1000", "DEVICEHUB_FIRMWARE_DIR="+t.TempDir())
	product := "fwk" + srv.suffix
	fwProduct(t, srv, product)
	devs := fwDevices(t, srv, product, "k"+srv.suffix, devices)
	fleet := newFwFleet(t, srv.broker.URL(), product)
	fleet.connect(devs...)
	pkg := fwUpload(t, srv, product, "2.0.0", 64<<10)
	var r fwRollout
	res := srv.api(srv.token).Send(t, "POST", "/api/firmware/rollout", map[string]any{"packageId": pkg, "ratePerMinute": rate,
		"timeoutSeconds": 120, "retries": 2, "abort": map[string]any{"percent": 5, "minStarted": 50}})
	if res.HTTPStatus != 200 || json.Unmarshal(res.Result, &r) != nil {
		t.Fatalf("create the rollout: %d %s\n%s", res.HTTPStatus, res.Raw, srv.logTail())
	}
	start := time.Now()
	r = fwWait(t, srv, r.ID, 5*time.Minute, "all UPDATED", func(r fwRollout) bool { return r.State != "running" })
	if r.State != "completed" || r.Counts["UPDATED"] != devices {
		t.Fatalf("rollout ended %s (%s) with %v", r.State, r.Reason, r.Counts)
	}
	took := time.Since(start)
	fleet.mu.Lock()
	starts := append([]time.Time(nil), fleet.starts...)
	fleet.mu.Unlock()
	sort.Slice(starts, func(i, j int) bool { return starts[i].Before(starts[j]) })
	if len(starts) != devices {
		t.Fatalf("%d devices got an upgrade, want %d", len(starts), devices)
	}
	span := starts[len(starts)-1].Sub(starts[0])
	for i, j := 0, 0; i < len(starts); i++ {
		for starts[i].Sub(starts[j]) >= window {
			j++
		}
		if n := i - j + 1; n > most {
			t.Fatalf("%d devices started within %s (from %s), want at most %d", n, window, starts[j].Sub(starts[0]), most)
		}
	}
	if span < minSpan {
		t.Fatalf("%d devices started in %s at %d a minute, want about 24 s", devices, span, rate)
	}
	for _, j := range fwJobs(t, srv, r.ID, "UPDATED") {
		if j.Version != "2.0.0" {
			t.Fatalf("job %+v: its reported version is not the target", j)
		}
	}
	t.Logf("%d devices UPDATED in %s, first to last start %s", devices, took.Round(time.Second), span.Round(time.Second))
}

// TestFirmwareRules runs the protocol's rules on one server, each on
// devices of its own: a cut download resumes from its offset; a device
// that reboots into its old version is started again; one offline during
// the rollout is started when it connects; a wrong SHA-256 ends FAILED;
// a progress UPDATED without the version is not UPDATED; a link is
// refused to another device; and 20% failing devices abort a rollout at
// its threshold, before the rest are started.
func TestFirmwareRules(t *testing.T) {
	t.Parallel()
	srv := startOwn(t, "fwrules", "DEVICEHUB_FIRMWARE_DIR="+t.TempDir())
	product := "fwr" + srv.suffix
	fwProduct(t, srv, product)
	devs := fwDevices(t, srv, product, "r"+srv.suffix, 6)
	ok, cut, reboot, offline, corrupt, noVersion := devs[0], devs[1], devs[2], devs[3], devs[4], devs[5]
	fleet := newFwFleet(t, srv.broker.URL(), product)
	fleet.behave[cut], fleet.behave[reboot], fleet.behave[corrupt], fleet.behave[noVersion] = "cut", "reboot-old", "corrupt", "no-version"
	fleet.connect(ok, cut, reboot, corrupt, noVersion) // offline stays away
	size := 64 << 10
	pkg := fwUpload(t, srv, product, "2.0.0", size)
	var r fwRollout
	srv.do(t, srv.token, "POST", "/api/firmware/rollout", map[string]any{"packageId": pkg, "ratePerMinute": 600,
		"timeoutSeconds": 60, "retries": 2}, &r)
	fwWait(t, srv, r.ID, time.Minute, "the online devices done", func(r fwRollout) bool {
		return r.Counts["UPDATED"] == 3 && r.Counts["FAILED"] == 1 && r.Counts["UPDATING"] == 1
	})
	jobs := fwJobs(t, srv, r.ID, "")
	t.Run("a cut download resumes from its offset", func(t *testing.T) {
		c := fleet.cuts[cut]
		want := fmt.Sprintf("bytes %d-%d/%d", size/2, size-1, size)
		if c.Range != fmt.Sprintf("bytes=%d-", size/2) || c.Status != 206 || c.ContentRange != want || jobs[cut].State != "UPDATED" {
			t.Fatalf("resumed with %+v (want 206 %s), job %+v", c, want, jobs[cut])
		}
	})
	t.Run("a device back on its old version is started again", func(t *testing.T) {
		if n := fleet.upgradesOf(reboot); n != 2 || jobs[reboot].State != "UPDATED" || jobs[reboot].Attempts != 2 {
			t.Fatalf("%d upgrades, job %+v: want 2 and UPDATED", n, jobs[reboot])
		}
		if n := fleet.upgradesOf(ok); n != 1 || jobs[ok].State != "UPDATED" || jobs[ok].Version != "2.0.0" {
			t.Fatalf("a plain device: %d upgrades, job %+v", n, jobs[ok])
		}
	})
	t.Run("a wrong SHA-256 ends FAILED", func(t *testing.T) {
		if j := jobs[corrupt]; j.State != "FAILED" || !strings.Contains(j.Reason, "sha256") {
			t.Fatalf("job %+v", j)
		}
		var failed struct {
			Data []fwJob `json:"data"`
		}
		srv.do(t, srv.token, "GET", "/api/firmware/rollout/"+r.ID+"/failed", nil, &failed)
		if len(failed.Data) != 1 || failed.Data[0].DeviceID != corrupt {
			t.Fatalf("failed devices: %+v", failed.Data)
		}
	})
	t.Run("UPDATED without the version is not UPDATED", func(t *testing.T) {
		if j := jobs[noVersion]; j.State != "UPDATING" || j.Reported != "UPDATED" {
			t.Fatalf("job %+v", j)
		}
	})
	t.Run("a device offline is started when it connects", func(t *testing.T) {
		if j := jobs[offline]; j.State != "QUEUED" || fleet.upgradesOf(offline) != 0 {
			t.Fatalf("while offline: job %+v, %d upgrades", j, fleet.upgradesOf(offline))
		}
		fleet.connect(offline)
		fwWait(t, srv, r.ID, time.Minute, "the late device UPDATED", func(r fwRollout) bool { return r.Counts["UPDATED"] == 4 })
	})
	t.Run("a link is refused to another device", func(t *testing.T) {
		fleet.mu.Lock()
		link := fleet.upgrades[ok][0].URL
		fleet.mu.Unlock()
		for _, c := range []struct {
			user, pass string
			status     int
		}{{corrupt, fwKey(corrupt), 403}, {ok, fwKey(corrupt), 401}, {ok, fwKey(ok), 200}} {
			req, _ := http.NewRequest("GET", link, nil)
			req.SetBasicAuth(c.user, c.pass)
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
			if res.StatusCode != c.status {
				t.Errorf("%s with %s's link: %d, want %d", c.user, ok, res.StatusCode, c.status)
			}
		}
	})
	srv.call(t, srv.token, "POST", "/api/firmware/rollout/"+r.ID+"/_cancel", nil)

	t.Run("20% failing devices abort at the threshold", func(t *testing.T) {
		product := "fwa" + srv.suffix
		fwProduct(t, srv, product)
		devs := fwDevices(t, srv, product, "a"+srv.suffix, 50)
		fleet := newFwFleet(t, srv.broker.URL(), product)
		for _, d := range devs[:10] { // the first started
			fleet.behave[d] = "fail"
		}
		fleet.connect(devs...)
		pkg := fwUpload(t, srv, product, "2.0.0", 4096)
		var r fwRollout
		srv.do(t, srv.token, "POST", "/api/firmware/rollout", map[string]any{"packageId": pkg, "ratePerMinute": 60,
			"timeoutSeconds": 60, "abort": map[string]any{"percent": 10, "minStarted": 10}}, &r)
		r = fwWait(t, srv, r.ID, 2*time.Minute, "aborted", func(r fwRollout) bool { return r.State != "running" })
		started := 0
		for _, d := range devs {
			if fleet.upgradesOf(d) > 0 {
				started++
			}
		}
		// Aborted once at least 10 had started and more than 10% of those
		// had failed: which devices the engine started first (and so how
		// many of the failing ten) depends on the machine's pace.
		begun := 0
		for state, n := range r.Counts {
			if state != "QUEUED" && state != "CANCELED" {
				begun += n
			}
		}
		if r.State != "aborted" || begun < 10 || r.Counts["FAILED"]*100 <= 10*begun || r.Counts["CANCELED"] == 0 || started >= 30 {
			t.Fatalf("rollout %s (%s), %v, %d devices started", r.State, r.Reason, r.Counts, started)
		}
		t.Logf("aborted: %s; %d of 50 started", r.Reason, started)
	})
}

// TestFirmwareDevices runs bench/fwdevice's updater on devices with their
// own broker logins (the plugin's rights: they may publish firmware
// progress and version and receive the upgrade): a healthy device, one
// whose download is cut halfway, one that boots its old image and then
// claims UPDATED, one that stalls once (timed out, retried), one whose
// hash is wrong, and one offline until the others are done.
func TestFirmwareDevices(t *testing.T) {
	t.Parallel()
	srv := startOwn(t, "fwdev", "DEVICEHUB_FIRMWARE_DIR="+t.TempDir())
	product := "fwd" + srv.suffix
	fwProduct(t, srv, product)
	ids := fwDevices(t, srv, product, "d"+srv.suffix, 6)
	faults := []fwdevice.Faults{{}, {CutAt: 0.5}, {RebootOld: true}, {StallAt: fwdevice.Downloading, Times: 1}, {WrongHash: true}, {}}
	offline := ids[5]
	pkg := fwUpload(t, srv, product, "2.0.0", 200<<10)
	type dev struct {
		u       *fwdevice.Updater
		connect func() error
		mu      sync.Mutex
		reports []fwdevice.Progress
	}
	devs := map[string]*dev{}
	for i, id := range ids {
		d := &dev{}
		var cur mqtt.Client
		d.connect = func() error {
			c, err := mqtttest.Dial(srv.broker.URL(), id, id, fwKey(id), nil) // the client id is the device id
			if err != nil {
				return err
			}
			cur = c
			conn := fwdevice.Paho(c)
			if err := d.u.Connected(conn); err != nil { // subscribed before the birth
				return err
			}
			return conn.Publish("/"+product+"/"+id+"/online", []byte(`{}`))
		}
		u, err := fwdevice.New(fwdevice.Options{ProductID: product, DeviceID: id, Version: "1.0.0", SecureID: id, SecureKey: fwKey(id),
			Faults: faults[i], Reboot: func(context.Context) error { cur.Disconnect(0); return d.connect() },
			OnReport: func(p fwdevice.Progress) { d.mu.Lock(); d.reports = append(d.reports, p); d.mu.Unlock() }})
		if err != nil {
			t.Fatal(err)
		}
		d.u = u
		t.Cleanup(func() {
			u.Close()
			if cur != nil {
				cur.Disconnect(0)
			}
		})
		devs[id] = d
		if id != offline {
			if err := d.connect(); err != nil {
				t.Fatal(err)
			}
		}
	}
	var r fwRollout
	srv.do(t, srv.token, "POST", "/api/firmware/rollout", map[string]any{"packageId": pkg, "ratePerMinute": 600,
		"timeoutSeconds": 8, "retries": 2}, &r)
	fwWait(t, srv, r.ID, 90*time.Second, "the online devices done", func(r fwRollout) bool {
		return r.Counts["UPDATED"] == 4 && r.Counts["FAILED"] == 1
	})
	jobs := fwJobs(t, srv, r.ID, "")
	if j := jobs[offline]; j.State != "QUEUED" || j.Attempts != 0 {
		t.Fatalf("the offline device: %+v", j)
	}
	if err := devs[offline].connect(); err != nil {
		t.Fatal(err)
	}
	fwWait(t, srv, r.ID, time.Minute, "all ended", func(r fwRollout) bool { return r.State == "completed" })
	jobs = fwJobs(t, srv, r.ID, "")
	for i, id := range ids {
		j := jobs[id]
		want, attempts := "UPDATED", 1
		switch {
		case faults[i].WrongHash:
			want = "FAILED"
		case faults[i].RebootOld, faults[i].StallAt != "":
			attempts = 2
		}
		if j.State != want || j.Attempts != attempts || (want == "UPDATED") != (devs[id].u.Version() == "2.0.0") {
			t.Errorf("device %d (%+v): job %+v, runs %s; want %s after %d attempts", i, faults[i], j, devs[id].u.Version(), want, attempts)
		}
		if want == "FAILED" && !strings.Contains(j.Reason, "sha256") {
			t.Errorf("device %d: reason %q", i, j.Reason)
		}
	}
}
