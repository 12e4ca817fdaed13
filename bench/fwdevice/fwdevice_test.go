package fwdevice_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"devicehub/bench/fwdevice"
	"devicehub/bench/mqttc"
	"devicehub/bench/testkit"
	"devicehub/ingest/mqtttest"
)

// download is one image the test server hands out under a token, to one
// device, until an expiry (FIRMWARE.md "Download").
type download struct {
	secureID string
	data     []byte
	expires  time.Time
	// hang: the answer sends half the image and then waits.
	hang bool
	// errors: the first answers are 503, this many.
	errors int
}

// request is one download request as the server saw it.
type request struct {
	token, rangeHdr string
	status          int
}

// fileServer implements FIRMWARE.md's download contract: Basic auth with
// the device's secureId/secureKey (401), the token bound to one device and
// an expiry (403 access_denied), 404 for an unknown token, 200 or 206 for a
// range (416 unsatisfiable) with Content-Length, Accept-Ranges, ETag.
type fileServer struct {
	mu    sync.Mutex
	keys  map[string]string // secureId -> secureKey
	files map[string]*download
	reqs  []request
}

func (s *fileServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	token := strings.TrimPrefix(r.URL.Path, "/firmware/download/")
	rec := &statusWriter{ResponseWriter: w, status: 200}
	defer func() {
		s.mu.Lock()
		s.reqs = append(s.reqs, request{token, r.Header.Get("Range"), rec.status})
		s.mu.Unlock()
	}()
	s.mu.Lock()
	f := s.files[token]
	user, pass, ok := r.BasicAuth()
	authed := ok && s.keys[user] == pass && pass != ""
	s.mu.Unlock()
	switch {
	case !authed:
		rec.Header().Set("WWW-Authenticate", `Basic realm="devicehub"`)
		http.Error(rec, `{"code":"unauthorized"}`, http.StatusUnauthorized)
		return
	case f == nil:
		http.Error(rec, `{"code":"not_found"}`, http.StatusNotFound)
		return
	case f.secureID != user || time.Now().After(f.expires):
		http.Error(rec, `{"code":"access_denied"}`, http.StatusForbidden)
		return
	}
	s.mu.Lock()
	busy := f.errors > 0
	f.errors--
	s.mu.Unlock()
	if busy {
		http.Error(rec, `{"code":"service_unavailable"}`, http.StatusServiceUnavailable)
		return
	}
	sum := sha256.Sum256(f.data)
	rec.Header().Set("ETag", `"`+hex.EncodeToString(sum[:])+`"`)
	rec.Header().Set("Content-Type", "application/octet-stream")
	if f.hang {
		rec.Header().Set("Content-Length", fmt.Sprint(len(f.data)))
		_, _ = rec.Write(f.data[:len(f.data)/2])
		rec.Flush()
		<-r.Context().Done()
		return
	}
	http.ServeContent(rec, r, "", time.Time{}, bytes.NewReader(f.data))
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(s int) { w.status = s; w.ResponseWriter.WriteHeader(s) }
func (w *statusWriter) Flush()            { w.ResponseWriter.(http.Flusher).Flush() }

func (s *fileServer) requests(token string) []request {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []request
	for _, r := range s.reqs {
		if r.token == token {
			out = append(out, r)
		}
	}
	return out
}

// rig is one test's product on the shared broker: a gateway login for the
// devices and for the test's side (upgrades down, reports up), the test's
// subscription to every uplink of the product, and the download server.
type rig struct {
	t       *testing.T
	broker  string
	user    string
	pass    string
	product string
	side    mqtt.Client
	srv     *httptest.Server
	files   *fileServer

	mu   sync.Mutex
	msgs map[string][]msg // by device
}

// msg is an uplink: the level below the device and its payload.
type msg struct {
	level   string
	payload []byte
}

func newRig(t *testing.T) *rig {
	t.Helper()
	broker := mqtttest.SharedURL()
	u, _ := url.Parse(broker)
	c, err := net.DialTimeout("tcp", u.Host, time.Second)
	if err != nil {
		t.Fatalf("no broker at %s (.ci/services starts it; make test runs it): %v", u.Host, err)
	}
	c.Close()
	o := mqtt.NewClientOptions()
	mqtttest.Gateway(t, broker)(o)
	r := &rig{t: t, broker: broker, user: o.Username, pass: o.Password, product: testkit.RandID("fwp"),
		files: &fileServer{keys: map[string]string{}, files: map[string]*download{}}, msgs: map[string][]msg{}}
	r.srv = httptest.NewServer(r.files)
	t.Cleanup(r.srv.Close)
	r.side, err = mqtttest.Dial(broker, testkit.RandID("fwside-"), r.user, r.pass, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.side.Disconnect(100) })
	tok := r.side.Subscribe("/"+r.product+"/+/#", 1, func(_ mqtt.Client, m mqtt.Message) {
		parts := strings.SplitN(m.Topic(), "/", 4) // "", p, d, level
		r.mu.Lock()
		r.msgs[parts[2]] = append(r.msgs[parts[2]], msg{parts[3], m.Payload()})
		r.mu.Unlock()
	})
	if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	return r
}

// image is a random firmware image of n bytes and its SHA-256.
func image(n int) ([]byte, string) {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	s := sha256.Sum256(b)
	return b, hex.EncodeToString(s[:])
}

// device is a simulated device: a login for downloads and an updater on a
// connection of the chosen client.
type device struct {
	id, secureID, secureKey string
	u                       *fwdevice.Updater
}

// startDevice connects device id (paho or mqttc) with an updater on
// version; its Reboot reconnects, publishes the birth and calls Connected.
func (r *rig) startDevice(id, client, version string, configure func(*fwdevice.Options)) *device {
	t := r.t
	t.Helper()
	d := &device{id: id, secureID: "sid-" + id, secureKey: testkit.RandID("key-")}
	r.files.mu.Lock()
	r.files.keys[d.secureID] = d.secureKey
	r.files.mu.Unlock()
	var connect func() error
	var closeConn func()
	birth := func(publish func(topic string, payload []byte) error) error {
		return publish("/"+r.product+"/"+id+"/online", []byte(`{"timestamp":1}`))
	}
	switch client {
	case "paho":
		var cur mqtt.Client
		connect = func() error {
			c, err := mqtttest.Dial(r.broker, testkit.RandID("fwdev-"), r.user, r.pass, nil)
			if err != nil {
				return err
			}
			cur = c
			conn := fwdevice.Paho(c)
			if err := birth(conn.Publish); err != nil {
				return err
			}
			return d.u.Connected(conn)
		}
		closeConn = func() { cur.Disconnect(0) }
	case "mqttc":
		var cur *mqttc.Client
		ad := &mqttc.TopicConn{}
		addr := strings.TrimPrefix(r.broker, "tcp://")
		connect = func() error {
			c, err := mqttc.Dial(context.Background(), mqttc.Options{Addr: addr, OnMessage: ad.Handle,
				Connect: mqttc.Connect{ClientID: testkit.RandID("fwdev-"), Username: r.user, Password: r.pass, KeepAlive: 30, CleanSession: true}})
			if err != nil {
				return err
			}
			cur = c
			ad.SetClient(c)
			if err := birth(ad.Publish); err != nil {
				return err
			}
			return d.u.Connected(ad)
		}
		closeConn = func() { _ = cur.Disconnect() }
	default:
		t.Fatalf("client %q", client)
	}
	opts := fwdevice.Options{ProductID: r.product, DeviceID: id, Version: version, SecureID: d.secureID, SecureKey: d.secureKey,
		KeepImage: true, Reboot: func(context.Context) error { closeConn(); return connect() }}
	if configure != nil {
		configure(&opts)
	}
	u, err := fwdevice.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	d.u = u
	if err := connect(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { u.Close(); closeConn() })
	return d
}

// offer makes data downloadable by d under a new token and returns its URL.
func (r *rig) offer(d *device, data []byte, expires time.Time, hang bool) (token, u string) {
	token = testkit.RandID("tok")
	r.files.mu.Lock()
	r.files.files[token] = &download{secureID: d.secureID, data: data, expires: expires, hang: hang}
	r.files.mu.Unlock()
	return token, r.srv.URL + "/firmware/download/" + token
}

// upgrade sends d an upgrade.
func (r *rig) upgrade(d *device, up fwdevice.Upgrade) {
	r.t.Helper()
	up.MessageID = testkit.RandID("m")
	up.Timestamp = time.Now().UnixMilli()
	if up.RolloutID == "" {
		up.RolloutID = "r1"
	}
	b, _ := json.Marshal(up)
	tok := r.side.Publish("/"+r.product+"/"+d.id+"/firmware/upgrade", 1, false, b)
	if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		r.t.Fatalf("upgrade: %v", tok.Error())
	}
}

// trace is d's uplinks so far in a readable form: "online",
// "version 1.0.0", "DOWNLOADING 10", "FAILED <reason>", ...
func (r *rig) trace(d *device) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, m := range r.msgs[d.id] {
		switch m.level {
		case "firmware/version":
			var v struct{ Version string }
			_ = json.Unmarshal(m.payload, &v)
			out = append(out, "version "+v.Version)
		case "firmware/progress":
			var p fwdevice.Progress
			_ = json.Unmarshal(m.payload, &p)
			s := string(p.State)
			if p.Percent != nil {
				s += fmt.Sprintf(" %d", *p.Percent)
			}
			if p.Reason != "" {
				s += " " + p.Reason
			}
			out = append(out, s)
		case "firmware/upgrade": // the test's own downlink
		default:
			out = append(out, m.level)
		}
	}
	return out
}

// waitFor waits until d's trace holds an entry with prefix after the
// first skip such entries, and returns the trace.
func (r *rig) waitFor(d *device, prefix string, skip int) []string {
	r.t.Helper()
	var tr []string
	testkit.Eventually(r.t, 20*time.Second, d.id+" reporting "+prefix, func() bool {
		tr = r.trace(d)
		n := 0
		for _, e := range tr {
			if strings.HasPrefix(e, prefix) {
				n++
			}
		}
		return n > skip
	})
	return tr
}

var healthy = []string{"online", "version 1.0.0",
	"DOWNLOADING 0", "DOWNLOADING 10", "DOWNLOADING 20", "DOWNLOADING 30", "DOWNLOADING 40", "DOWNLOADING 50",
	"DOWNLOADING 60", "DOWNLOADING 70", "DOWNLOADING 80", "DOWNLOADING 90",
	"DOWNLOADED", "VERIFIED", "UPDATING", "online", "version 1.1.0", "UPDATED"}

// TestUpdate: a healthy device on each client downloads the image in one
// request, reports every 10% and each state, reboots (a new connection
// with its birth) and reports the new version before UPDATED.
func TestUpdate(t *testing.T) {
	r := newRig(t)
	data, sum := image(1 << 20)
	for _, client := range []string{"paho", "mqttc"} {
		t.Run(client, func(t *testing.T) {
			d := r.startDevice("dev-"+client, client, "1.0.0", nil)
			token, u := r.offer(d, data, time.Now().Add(time.Minute), false)
			r.upgrade(d, fwdevice.Upgrade{Version: "1.1.0", Size: int64(len(data)), SHA256: sum, URL: u})
			tr := r.waitFor(d, "UPDATED", 0)
			if !slices.Equal(tr, healthy) {
				t.Errorf("reports:\n%q\nwant\n%q", tr, healthy)
			}
			if got := r.files.requests(token); len(got) != 1 || got[0].rangeHdr != "" || got[0].status != 200 {
				t.Errorf("requests %+v, want one whole download", got)
			}
			if d.u.Version() != "1.1.0" || !bytes.Equal(d.u.Image(), data) {
				t.Errorf("runs %s, image of %d bytes equal %v", d.u.Version(), len(d.u.Image()), bytes.Equal(d.u.Image(), data))
			}
		})
	}
}

// TestCutResumes: a download cut at half resumes from its offset with a
// range request answered 206, and the image verifies.
func TestCutResumes(t *testing.T) {
	r := newRig(t)
	data, sum := image(1 << 20)
	d := r.startDevice("dev-cut", "paho", "1.0.0", func(o *fwdevice.Options) { o.Faults.CutAt = 0.5 })
	token, u := r.offer(d, data, time.Now().Add(time.Minute), false)
	r.upgrade(d, fwdevice.Upgrade{Version: "1.1.0", Size: int64(len(data)), SHA256: sum, URL: u})
	tr := r.waitFor(d, "UPDATED", 0)
	want := []request{{token, "", 200}, {token, fmt.Sprintf("bytes=%d-", len(data)/2), 206}}
	if got := r.files.requests(token); !slices.Equal(got, want) {
		t.Errorf("requests %+v, want %+v", got, want)
	}
	if !slices.Equal(tr, healthy) {
		t.Errorf("reports:\n%q\nwant\n%q", tr, healthy)
	}
	if !bytes.Equal(d.u.Image(), data) || d.u.Resumes.Load() != 1 {
		t.Errorf("image equal %v, resumes %d", bytes.Equal(d.u.Image(), data), d.u.Resumes.Load())
	}
}

// TestFailed: every way a job fails ends FAILED with its reason, before
// UPDATING, on the old version.
func TestFailed(t *testing.T) {
	r := newRig(t)
	data, sum := image(256 << 10)
	other, _ := image(256 << 10)
	otherDev := r.startDevice("dev-other", "paho", "1.0.0", nil)
	for _, c := range []struct {
		name   string
		faults fwdevice.Faults
		// up adjusts the upgrade; offer decides what is served.
		up      func(d *device, up *fwdevice.Upgrade)
		timeout time.Duration
		reason  string
		last    string // the last report before FAILED
	}{
		{name: "wrong hash", faults: fwdevice.Faults{WrongHash: true}, reason: "sha256 mismatch", last: "DOWNLOADED"},
		{name: "hash mismatch", up: func(_ *device, up *fwdevice.Upgrade) {
			h := sha256.Sum256(other)
			up.SHA256 = hex.EncodeToString(h[:])
		}, reason: "sha256 mismatch", last: "DOWNLOADED"},
		{name: "size mismatch", up: func(_ *device, up *fwdevice.Upgrade) { up.Size-- }, reason: "size mismatch", last: "DOWNLOADING 0"},
		{name: "bad credentials", up: func(d *device, _ *fwdevice.Upgrade) {
			r.files.mu.Lock()
			r.files.keys[d.secureID] = "changed"
			r.files.mu.Unlock()
		}, reason: "http 401", last: "DOWNLOADING 0"},
		{name: "another device's url", up: func(_ *device, up *fwdevice.Upgrade) {
			_, up.URL = r.offer(otherDev, data, time.Now().Add(time.Minute), false)
		}, reason: "http 403", last: "DOWNLOADING 0"},
		{name: "expired url", up: func(d *device, up *fwdevice.Upgrade) {
			_, up.URL = r.offer(d, data, time.Now().Add(-time.Second), false)
		}, reason: "http 403", last: "DOWNLOADING 0"},
		{name: "unknown token", up: func(_ *device, up *fwdevice.Upgrade) { up.URL += "x" }, reason: "http 404", last: "DOWNLOADING 0"},
		{name: "timeout", timeout: 500 * time.Millisecond, up: func(d *device, up *fwdevice.Upgrade) {
			_, up.URL = r.offer(d, data, time.Now().Add(time.Minute), true)
		}, reason: "timeout after", last: "DOWNLOADING 50"},
		{name: "server errors", faults: fwdevice.Faults{}, up: func(d *device, up *fwdevice.Upgrade) {
			var token string
			token, up.URL = r.offer(d, data, time.Now().Add(time.Minute), false)
			r.files.mu.Lock()
			r.files.files[token].errors = 100
			r.files.mu.Unlock()
		}, reason: "download: http 503", last: "DOWNLOADING 0"},
		{name: "fail at VERIFIED", faults: fwdevice.Faults{FailAt: fwdevice.Verified, FailReason: "flash worn"}, reason: "flash worn", last: "DOWNLOADED"},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := r.startDevice("dev-"+strings.ReplaceAll(c.name, " ", "-"), "paho", "1.0.0", func(o *fwdevice.Options) {
				o.Faults = c.faults
				if c.timeout > 0 {
					o.Timeout = c.timeout
				}
				o.MaxResumes, o.RetryWait = 2, 10*time.Millisecond
			})
			_, u := r.offer(d, data, time.Now().Add(time.Minute), false)
			up := fwdevice.Upgrade{Version: "1.1.0", Size: int64(len(data)), SHA256: sum, URL: u}
			if c.up != nil {
				c.up(d, &up)
			}
			r.upgrade(d, up)
			tr := r.waitFor(d, "FAILED", 0)
			last := tr[len(tr)-1]
			if !strings.HasPrefix(last, "FAILED "+c.reason) || tr[len(tr)-2] != c.last {
				t.Errorf("reports %q, want %q then FAILED %s...", tr, c.last, c.reason)
			}
			if slices.Contains(tr, "UPDATING") || d.u.Version() != "1.0.0" || d.u.Failures.Load() != 1 {
				t.Errorf("reports %q, runs %s, failures %d", tr, d.u.Version(), d.u.Failures.Load())
			}
		})
	}
}

// TestRebootOld: a device whose new image does not boot reports UPDATING,
// comes back (a new birth) on its old version and claims UPDATED anyway;
// the retry that follows updates it.
func TestRebootOld(t *testing.T) {
	r := newRig(t)
	data, sum := image(64 << 10)
	d := r.startDevice("dev-old", "mqttc", "1.0.0", func(o *fwdevice.Options) { o.Faults.RebootOld = true })
	_, u := r.offer(d, data, time.Now().Add(time.Minute), false)
	up := fwdevice.Upgrade{Version: "1.1.0", Size: int64(len(data)), SHA256: sum, URL: u}
	r.upgrade(d, up)
	tr := r.waitFor(d, "UPDATED", 0)
	want := []string{"UPDATING", "online", "version 1.0.0", "UPDATED"}
	if !slices.Equal(tr[len(tr)-4:], want) || d.u.Version() != "1.0.0" {
		t.Fatalf("reports %q, runs %s; want it to end %q on 1.0.0", tr, d.u.Version(), want)
	}
	_, up.URL = r.offer(d, data, time.Now().Add(time.Minute), false)
	r.upgrade(d, up)
	tr = r.waitFor(d, "UPDATED", 1)
	if !slices.Equal(tr[len(tr)-4:], []string{"UPDATING", "online", "version 1.1.0", "UPDATED"}) || d.u.Version() != "1.1.0" {
		t.Fatalf("after the retry: reports %q, runs %s", tr, d.u.Version())
	}
}

// TestRestart: an upgrade for the version a stalled job installs restarts
// it (with the new URL), and the device is updated once.
func TestRestart(t *testing.T) {
	r := newRig(t)
	data, sum := image(64 << 10)
	d := r.startDevice("dev-stall", "paho", "1.0.0", func(o *fwdevice.Options) {
		o.Faults = fwdevice.Faults{StallAt: fwdevice.Verified, Times: 1}
	})
	tok1, u := r.offer(d, data, time.Now().Add(time.Minute), false)
	up := fwdevice.Upgrade{Version: "1.1.0", Size: int64(len(data)), SHA256: sum, URL: u}
	r.upgrade(d, up)
	r.waitFor(d, "VERIFIED", 0)
	tok2, u2 := r.offer(d, data, time.Now().Add(time.Minute), false)
	up.URL = u2
	r.upgrade(d, up)
	tr := r.waitFor(d, "UPDATED", 0)
	if d.u.Version() != "1.1.0" || d.u.Started.Load() != 2 || d.u.Updates.Load() != 1 {
		t.Errorf("reports %q, runs %s, jobs %d, updates %d", tr, d.u.Version(), d.u.Started.Load(), d.u.Updates.Load())
	}
	// The stalled job had the whole image: the restart verifies it again
	// without downloading it.
	if n1, n2 := len(r.files.requests(tok1)), len(r.files.requests(tok2)); n1 != 1 || n2 != 0 {
		t.Errorf("requests: first url %d, second %d; want 1, 0", n1, n2)
	}
	// A repeated upgrade for the version it runs: version and UPDATED again.
	r.upgrade(d, up)
	tr = r.waitFor(d, "UPDATED", 1)
	if !slices.Equal(tr[len(tr)-2:], []string{"version 1.1.0", "UPDATED"}) || d.u.Started.Load() != 2 {
		t.Errorf("reports %q, jobs %d", tr, d.u.Started.Load())
	}
}

// TestServerErrorRetried: a 503 is asked again after a pause, and the
// device ends UPDATED.
func TestServerErrorRetried(t *testing.T) {
	r := newRig(t)
	data, sum := image(64 << 10)
	d := r.startDevice("dev-503", "paho", "1.0.0", func(o *fwdevice.Options) { o.RetryWait = 20 * time.Millisecond })
	token, u := r.offer(d, data, time.Now().Add(time.Minute), false)
	r.files.mu.Lock()
	r.files.files[token].errors = 2
	r.files.mu.Unlock()
	r.upgrade(d, fwdevice.Upgrade{Version: "1.1.0", Size: int64(len(data)), SHA256: sum, URL: u})
	r.waitFor(d, "UPDATED", 0)
	want := []request{{token, "", 503}, {token, "", 503}, {token, "", 200}}
	if got := r.files.requests(token); !slices.Equal(got, want) || d.u.ServerErrors.Load() != 2 {
		t.Errorf("requests %+v, server errors %d; want %+v", got, d.u.ServerErrors.Load(), want)
	}
}
