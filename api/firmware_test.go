package api_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"mime/multipart"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"devicehub/api"
	"devicehub/ingest/firmware"
	"devicehub/meta"
)

// firmwareEnv is the API with firmware updates (no broker: nothing is
// sent), a product with two deployed devices, and a package of it.
type firmwareEnv struct {
	*env
	svc *firmware.Service
	ms  *meta.Store
	dir string // the package directory
}

func newFirmwareEnv(t *testing.T, maxSize int64) *firmwareEnv {
	t.Helper()
	return newFirmwareEnvWith(t, maxSize, firmware.Options{PublicURL: "http://dh.test"})
}

func newFirmwareEnvWith(t *testing.T, maxSize int64, opt firmware.Options) *firmwareEnv {
	t.Helper()
	var svc *firmware.Service
	var ms *meta.Store
	dir := t.TempDir()
	e := newEnvWith(t, func(store *meta.Store, deps *api.Deps) {
		files, err := firmware.NewFiles(dir, maxSize)
		if err != nil {
			t.Fatal(err)
		}
		ms = store
		svc, err = firmware.New(context.Background(), firmware.NewStore(store, 0), files, store, nil, opt)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(svc.Close)
		deps.Firmware, deps.FirmwareMaxSize = svc, int(maxSize)
	})
	e.createProduct("fwp", "Firmware product", nil)
	e.ok("POST", "/api/device-product/fwp/deploy", nil, nil)
	for _, d := range []string{"fwd-a", "fwd-b"} {
		e.ok("POST", "/api/device/instance", map[string]any{"id": d, "name": d, "productId": "fwp",
			"configuration": map[string]any{"secureKey": "secret-key-of-" + d}}, nil)
	}
	return &firmwareEnv{env: e, svc: svc, ms: ms, dir: dir}
}

// upload sends a raw-body upload with query q.
func (e *firmwareEnv) upload(q url.Values, body []byte) response {
	e.t.Helper()
	req, _ := http.NewRequest("POST", e.base+"/api/firmware/package?"+q.Encode(), bytes.NewReader(body))
	req.Header.Set("X-Access-Token", e.token)
	req.Header.Set("Content-Type", "application/octet-stream")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	return e.envelope("POST", "/api/firmware/package", res)
}

func TestFirmwarePackages(t *testing.T) {
	t.Parallel()
	e := newFirmwareEnv(t, 100_000)
	data := bytes.Repeat([]byte("firmware!"), 7000) // 63,000 bytes
	sum := sha256.Sum256(data)
	r := e.upload(url.Values{"productId": {"fwp"}, "version": {"1.2.0"}, "releaseNotes": {"fixes"}}, data)
	if r.HTTPStatus != 200 {
		t.Fatalf("upload: %d %s", r.HTTPStatus, r.raw)
	}
	var p firmware.Package
	_ = json.Unmarshal(r.Result, &p)
	if p.Size != int64(len(data)) || p.SHA256 != hex.EncodeToString(sum[:]) || p.Version != "1.2.0" || p.ID == "" {
		t.Fatalf("package %+v", p)
	}

	// Multipart, another version.
	var mb bytes.Buffer
	mw := multipart.NewWriter(&mb)
	_ = mw.WriteField("productId", "fwp")
	_ = mw.WriteField("version", "1.3.0")
	fw, _ := mw.CreateFormFile("file", "fw.bin")
	_, _ = fw.Write(data[:1000])
	_ = mw.Close()
	req, _ := http.NewRequest("POST", e.base+"/api/firmware/package", &mb)
	req.Header.Set("X-Access-Token", e.token)
	req.Header.Set("Content-Type", mw.FormDataContentType())
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if r := e.envelope("POST", "/api/firmware/package", res); r.HTTPStatus != 200 || !strings.Contains(string(r.Result), `"size":1000`) {
		t.Fatalf("multipart upload: %d %s", r.HTTPStatus, r.raw)
	}

	// Bad input: 400 naming the field, nothing stored.
	for _, c := range []struct {
		q     url.Values
		body  []byte
		field string
		code  string
	}{
		{url.Values{"version": {"1"}}, data, "productId", "illegal_argument"},
		{url.Values{"productId": {"fwp"}}, data, "version", "illegal_argument"},
		{url.Values{"productId": {"fwp"}, "version": {"has space"}}, data, "version", "illegal_argument"},
		{url.Values{"productId": {"fwp"}, "version": {"9"}}, nil, "file", "illegal_argument"},
		{url.Values{"productId": {"fwp"}, "version": {"1.2.0"}}, data, "", "duplicate_key"},
	} {
		r := e.upload(c.q, c.body)
		if r.HTTPStatus != 400 || r.Code != c.code || !strings.Contains(r.Message, c.field) {
			t.Errorf("upload %v: %d %s, want 400 %s naming %q", c.q, r.HTTPStatus, r.raw, c.code, c.field)
		}
	}
	if r := e.upload(url.Values{"productId": {"nope"}, "version": {"1"}}, data); r.HTTPStatus != 404 {
		t.Errorf("upload to an unknown product: %d %s", r.HTTPStatus, r.raw)
	}
	// Past the largest size: refused from its length, before it is read.
	if r := e.doOversized("POST", "/api/firmware/package?productId=fwp&version=big", 200_000); r.HTTPStatus != 400 {
		t.Errorf("oversize upload: %d %s", r.HTTPStatus, r.raw)
	}
	var page struct {
		Total int                `json:"total"`
		Data  []firmware.Package `json:"data"`
	}
	e.ok("GET", "/api/firmware/package?productId=fwp", nil, &page)
	if page.Total != 2 {
		t.Fatalf("packages: %+v", page)
	}

	// Rollouts: bad input names the field.
	for _, c := range []struct {
		body  map[string]any
		field string
	}{
		{map[string]any{"ratePerMinute": 10, "timeoutSeconds": 60}, "packageId"},
		{map[string]any{"packageId": p.ID, "ratePerMinute": 0, "timeoutSeconds": 60}, "ratePerMinute"},
		{map[string]any{"packageId": p.ID, "ratePerMinute": 10, "timeoutSeconds": 0}, "timeoutSeconds"},
		{map[string]any{"packageId": p.ID, "ratePerMinute": 10, "timeoutSeconds": 60, "retries": -1}, "retries"},
		{map[string]any{"packageId": p.ID, "ratePerMinute": 10, "timeoutSeconds": 60, "abort": map[string]any{"percent": 100, "minStarted": 5}}, "abort.percent"},
		{map[string]any{"packageId": p.ID, "ratePerMinute": 10, "timeoutSeconds": 60, "abort": map[string]any{"percent": 10}}, "abort.minStarted"},
		{map[string]any{"packageId": p.ID, "ratePerMinute": 10, "timeoutSeconds": 60, "rampUp": map[string]any{"initialRate": 20, "minutes": 5}}, "rampUp.initialRate"},
		{map[string]any{"packageId": p.ID, "ratePerMinute": 10, "timeoutSeconds": 60, "target": map[string]any{"deviceIds": []string{"fwd-a", "ghost"}}}, "target.deviceIds"},
		{map[string]any{"packageId": p.ID, "ratePerMinute": 10, "timeoutSeconds": 60, "target": map[string]any{"deviceIds": []string{}}}, "target.deviceIds"},
		{map[string]any{"packageId": p.ID, "ratePerMinute": 10, "timeoutSeconds": 60, "target": map[string]any{"query": map[string]any{"terms": []any{map[string]any{"column": "nope", "value": 1}}}}}, "target.query"},
		{map[string]any{"packageId": "nope", "ratePerMinute": 10, "timeoutSeconds": 60}, "packageId"},
	} {
		r := e.call("POST", "/api/firmware/rollout", c.body)
		if r.HTTPStatus != 400 || r.Code != "illegal_argument" || !strings.Contains(r.Message, c.field) {
			t.Errorf("rollout %v: %d %s, want 400 naming %q", c.body, r.HTTPStatus, r.raw, c.field)
		}
	}
	var ro firmware.Rollout
	e.ok("POST", "/api/firmware/rollout", map[string]any{"packageId": p.ID, "ratePerMinute": 10, "timeoutSeconds": 60,
		"target": map[string]any{"query": map[string]any{"terms": []any{map[string]any{"column": "id", "value": "fwd-b"}}}}}, &ro)
	if ro.Devices != 1 || ro.State != "running" || ro.Counts["QUEUED"] != 1 {
		t.Fatalf("rollout by query: %+v", ro)
	}
	// One running rollout a product.
	e.fails("POST", "/api/firmware/rollout", map[string]any{"packageId": p.ID, "ratePerMinute": 10, "timeoutSeconds": 60}, 409, "conflict")
	// A package in use is not deleted.
	if r := e.call("DELETE", "/api/firmware/package/"+p.ID, nil); r.HTTPStatus != 400 || !strings.Contains(r.Message, "rollout") {
		t.Fatalf("delete in use: %d %s", r.HTTPStatus, r.raw)
	}
	e.ok("POST", "/api/firmware/rollout/"+ro.ID+"/_pause", nil, &ro)
	e.fails("POST", "/api/firmware/rollout/"+ro.ID+"/_pause", nil, 409, "conflict")
	e.ok("POST", "/api/firmware/rollout/"+ro.ID+"/_resume", nil, &ro)
	e.ok("POST", "/api/firmware/rollout/"+ro.ID+"/_cancel", nil, &ro)
	if ro.State != "canceled" || ro.Counts["CANCELED"] != 1 {
		t.Fatalf("canceled: %+v", ro)
	}
	e.fails("GET", "/api/firmware/rollout/"+ro.ID+"/devices?state=NOPE", nil, 400, "illegal_argument")
	var jobs struct {
		Total int            `json:"total"`
		Data  []firmware.Job `json:"data"`
	}
	e.ok("GET", "/api/firmware/rollout/"+ro.ID+"/devices?state=CANCELED", nil, &jobs)
	if jobs.Total != 1 || jobs.Data[0].DeviceID != "fwd-b" || jobs.Data[0].Reason == "" {
		t.Fatalf("jobs: %+v", jobs)
	}
	// Still referred to by the ended rollout: kept.
	if r := e.call("DELETE", "/api/firmware/package/"+p.ID, nil); r.HTTPStatus != 400 {
		t.Fatalf("delete in use by an ended rollout: %d %s", r.HTTPStatus, r.raw)
	}
	var other firmware.Package
	_ = json.Unmarshal(e.upload(url.Values{"productId": {"fwp"}, "version": {"2"}}, data[:10]).Result, &other)
	e.ok("DELETE", "/api/firmware/package/"+other.ID, nil, nil)
	e.fails("GET", "/api/firmware/package/"+other.ID, nil, 404, "not_found")
}

// TestFirmwareDownload: a link works for its device only (another
// device's credentials 403, none or wrong 401), not after its expiry
// (403), and answers ranges with 206 from the offset asked, 416 past the
// end.
func TestFirmwareDownload(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	e := newFirmwareEnvWith(t, 1<<20, firmware.Options{PublicURL: "http://dh.test", Registerer: reg})
	data := make([]byte, 64<<10)
	for i := range data {
		data[i] = byte(i * 7)
	}
	var p firmware.Package
	_ = json.Unmarshal(e.upload(url.Values{"productId": {"fwp"}, "version": {"3.0"}}, data).Result, &p)
	link := e.svc.DownloadURL("fwd-a", "fwd-a", "secret-key-of-fwd-a", p.ID, time.Now().Add(time.Minute))
	path := strings.TrimPrefix(link, "http://dh.test")
	get := func(path, user, pass, rng string) (*http.Response, []byte) {
		t.Helper()
		req, _ := http.NewRequest("GET", e.base+path, nil)
		if user != "" {
			req.SetBasicAuth(user, pass)
		}
		if rng != "" {
			req.Header.Set("Range", rng)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res, b
	}
	res, body := get(path, "fwd-a", "secret-key-of-fwd-a", "")
	if res.StatusCode != 200 || !bytes.Equal(body, data) || res.Header.Get("ETag") != `"`+p.SHA256+`"` || res.Header.Get("Accept-Ranges") != "bytes" {
		t.Fatalf("whole: %d %d bytes %v", res.StatusCode, len(body), res.Header)
	}
	res, body = get(path, "fwd-a", "secret-key-of-fwd-a", "bytes=40000-")
	if res.StatusCode != 206 || !bytes.Equal(body, data[40000:]) || res.Header.Get("Content-Range") != fmt.Sprintf("bytes 40000-%d/%d", len(data)-1, len(data)) {
		t.Fatalf("range: %d %d bytes %q", res.StatusCode, len(body), res.Header.Get("Content-Range"))
	}
	res, body = get(path, "fwd-a", "secret-key-of-fwd-a", "bytes=10-19")
	if res.StatusCode != 206 || !bytes.Equal(body, data[10:20]) {
		t.Fatalf("range 10-19: %d %d bytes", res.StatusCode, len(body))
	}
	if res, _ = get(path, "fwd-a", "secret-key-of-fwd-a", "bytes=70000-"); res.StatusCode != 416 {
		t.Fatalf("range past the end: %d", res.StatusCode)
	}
	for _, c := range []struct {
		name, path, user, pass string
		status                 int
	}{
		{"another device's credentials", path, "fwd-b", "secret-key-of-fwd-b", 403},
		{"no credentials", path, "", "", 401},
		{"a wrong key", path, "fwd-a", "secret-key-of-fwd-b", 401},
		{"an unknown token", "/firmware/download/x.y", "fwd-a", "secret-key-of-fwd-a", 404},
		{"a forged token", path[:len(path)-2] + "AA", "fwd-a", "secret-key-of-fwd-a", 404},
		{"expired", strings.TrimPrefix(e.svc.DownloadURL("fwd-a", "fwd-a", "secret-key-of-fwd-a", p.ID, time.Now().Add(-time.Second)), "http://dh.test"), "fwd-a", "secret-key-of-fwd-a", 403},
	} {
		if res, body := get(c.path, c.user, c.pass, ""); res.StatusCode != c.status || bytes.Contains(body, data[:64]) {
			t.Errorf("%s: %d, want %d: %.200s", c.name, res.StatusCode, c.status, body)
		}
	}
	// Each download is counted under the status it was answered with.
	want := map[string]float64{"200": 1, "206": 2, "416": 1, "401": 2, "403": 2, "404": 2, "500": 0, "503": 0}
	if got := downloadCounts(t, reg); !maps.Equal(got, want) {
		t.Errorf("devicehub_firmware_downloads_total: %v, want %v", got, want)
	}
}

// downloadCounts is devicehub_firmware_downloads_total by code.
func downloadCounts(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() == "devicehub_firmware_downloads_total" {
			for _, m := range mf.GetMetric() {
				counts[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
			}
		}
	}
	return counts
}

// TestFirmwareDownloadBusy: a device's own download reads no device
// from the database (it goes through while the devices table is locked);
// the rare download that must look credentials up (here another
// device's) is bounded: while the lookups allowed at once are all
// waiting on the database (one, held by the lock), another is answered
// 503 with Retry-After at once rather than queued for a connection until
// it fails with a 500; once the database answers, both are answered.
func TestFirmwareDownloadBusy(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	e := newFirmwareEnvWith(t, 1<<20, firmware.Options{PublicURL: "http://dh.test", Lookups: 1, LookupWait: 200 * time.Millisecond, Registerer: reg})
	data := bytes.Repeat([]byte("fw"), 1000)
	var p firmware.Package
	_ = json.Unmarshal(e.upload(url.Values{"productId": {"fwp"}, "version": {"3.1"}}, data).Result, &p)
	client := &http.Client{Timeout: 5 * time.Second}
	link := e.svc.DownloadURL("fwd-a", "fwd-a", "secret-key-of-fwd-a", p.ID, time.Now().Add(time.Minute))
	get := func(dev string) (*http.Response, error) {
		req, _ := http.NewRequest("GET", e.base+strings.TrimPrefix(link, "http://dh.test"), nil)
		req.SetBasicAuth(dev, "secret-key-of-"+dev)
		res, err := client.Do(req)
		if err == nil {
			_, _ = io.ReadAll(res.Body)
			res.Body.Close()
		}
		return res, err
	}
	ctx := context.Background()
	tx, err := e.ms.DB().BeginTxx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback() //nolint:errcheck // released below
	if _, err := tx.ExecContext(ctx, `LOCK TABLE devices IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	if res, err := get("fwd-a"); err != nil || res.StatusCode != 200 {
		t.Fatalf("the device's own download, devices locked: %v %v (want 200: no lookup)", res, err)
	}
	first := make(chan int, 1)
	go func() {
		res, err := get("fwd-b")
		if err != nil {
			first <- 0
			return
		}
		first <- res.StatusCode
	}()
	// The first lookup waits on the lock, holding the one slot.
	for deadline := time.Now().Add(5 * time.Second); ; {
		var waiting int
		_ = e.ms.DB().GetContext(ctx, &waiting, `SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = 'devices'::regclass`)
		if waiting > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the first lookup never waited on the lock")
		}
		time.Sleep(20 * time.Millisecond)
	}
	res, err := get("fwd-b")
	if err != nil {
		t.Fatalf("the second lookup, lookups all taken: %v (want 503 at once)", err)
	}
	if res.StatusCode != 503 || res.Header.Get("Retry-After") != "1" {
		t.Fatalf("the second lookup, lookups all taken: %d Retry-After %q, want 503 and 1", res.StatusCode, res.Header.Get("Retry-After"))
	}
	if n := downloadCounts(t, reg)["503"]; n != 1 {
		t.Errorf("downloads counted 503: %v, want 1", n)
	}
	if res, err := get("fwd-a"); err != nil || res.StatusCode != 200 {
		t.Fatalf("the device's own download, lookups all taken: %v %v (want 200)", res, err)
	}
	_ = tx.Rollback()
	if code := <-first; code != 403 {
		t.Fatalf("the first lookup: %d, want 403", code)
	}
	if res, err := get("fwd-b"); err != nil || res.StatusCode != 403 {
		t.Fatalf("the second lookup asked again: %v %v, want 403", res, err)
	}
}

// TestFirmwareDownloadCredentials: a link carries a digest of its
// device's credentials as signed. Whoever holds the link with other
// credentials is refused (another device's 403, wrong ones 401); a key
// rotated after the link was signed works, through a lookup, and the old
// key still works until the link expires (REFERENCE.md); a link signed
// for the new key refuses the old one; a link of the earlier format (no
// digest) works for its device only; a token whose digest was replaced
// is unknown (404).
func TestFirmwareDownloadCredentials(t *testing.T) {
	t.Parallel()
	e := newFirmwareEnv(t, 1<<20)
	data := bytes.Repeat([]byte("cred"), 500)
	var p firmware.Package
	_ = json.Unmarshal(e.upload(url.Values{"productId": {"fwp"}, "version": {"3.2"}}, data).Result, &p)
	ctx := context.Background()
	var key []byte
	if err := e.ms.DB().GetContext(ctx, &key, `SELECT token_key FROM firmware_owner WHERE id = 1`); err != nil {
		t.Fatal(err)
	}
	exp := time.Now().Add(time.Minute)
	path := func(link string) string { return strings.TrimPrefix(link, "http://dh.test") }
	// The earlier format: base64url("device\npackage\nexpiry-ms") "." base64url(HMAC).
	oldToken := func(dev string) string {
		enc := base64.RawURLEncoding.EncodeToString([]byte(dev + "\n" + p.ID + "\n" + strconv.FormatInt(exp.UnixMilli(), 10)))
		m := hmac.New(sha256.New, key)
		m.Write([]byte(enc))
		return "/firmware/download/" + enc + "." + base64.RawURLEncoding.EncodeToString(m.Sum(nil))
	}
	// A link whose digest is the attacker's (fwd-b's) credentials, its
	// MAC left as signed for fwd-a.
	signed := path(e.svc.DownloadURL("fwd-a", "fwd-a", "secret-key-of-fwd-a", p.ID, exp))
	enc, mac, _ := strings.Cut(strings.TrimPrefix(signed, "/firmware/download/"), ".")
	body, _ := base64.RawURLEncoding.DecodeString(enc)
	parts := strings.Split(string(body), "\n")
	parts[4] = base64.RawURLEncoding.EncodeToString(firmware.NewSigner(key).CredDigest("fwd-b", "secret-key-of-fwd-b"))
	swapped := "/firmware/download/" + base64.RawURLEncoding.EncodeToString([]byte(strings.Join(parts, "\n"))) + "." + mac

	beforeRotation := path(e.svc.DownloadURL("fwd-a", "fwd-a", "secret-key-of-fwd-a", p.ID, exp))
	if _, err := e.ms.DB().ExecContext(ctx, `UPDATE devices SET secure_key = 'rotated-key-of-fwd-a' WHERE id = 'fwd-a'`); err != nil {
		t.Fatal(err)
	}
	afterRotation := path(e.svc.DownloadURL("fwd-a", "fwd-a", "rotated-key-of-fwd-a", p.ID, exp))
	for _, c := range []struct {
		name, path, user, pass string
		status                 int
	}{
		{"signed before rotation, the new key", beforeRotation, "fwd-a", "rotated-key-of-fwd-a", 200},
		{"signed before rotation, the old key (until it expires)", beforeRotation, "fwd-a", "secret-key-of-fwd-a", 200},
		{"signed before rotation, another device's credentials", beforeRotation, "fwd-b", "secret-key-of-fwd-b", 403},
		{"signed after rotation, the new key", afterRotation, "fwd-a", "rotated-key-of-fwd-a", 200},
		{"signed after rotation, the old key", afterRotation, "fwd-a", "secret-key-of-fwd-a", 401},
		{"signed after rotation, another device's credentials", afterRotation, "fwd-b", "secret-key-of-fwd-b", 403},
		{"the earlier format, its device", oldToken("fwd-a"), "fwd-a", "rotated-key-of-fwd-a", 200},
		{"the earlier format, another device's credentials", oldToken("fwd-a"), "fwd-b", "secret-key-of-fwd-b", 403},
		{"the earlier format, a wrong key", oldToken("fwd-a"), "fwd-a", "secret-key-of-fwd-a", 401},
		{"a digest replaced by the attacker's", swapped, "fwd-b", "secret-key-of-fwd-b", 404},
	} {
		req, _ := http.NewRequest("GET", e.base+c.path, nil)
		req.SetBasicAuth(c.user, c.pass)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != c.status || (c.status != 200) == bytes.Equal(got, data) {
			t.Errorf("%s: %d, want %d: %.200s", c.name, res.StatusCode, c.status, got)
		}
	}
	// A package deleted after its link was signed (and its file read
	// into the cache by a download): 404.
	var gone firmware.Package
	_ = json.Unmarshal(e.upload(url.Values{"productId": {"fwp"}, "version": {"3.3"}}, data).Result, &gone)
	goneLink := path(e.svc.DownloadURL("fwd-b", "fwd-b", "secret-key-of-fwd-b", gone.ID, exp))
	for i, want := range []int{200, 404} {
		if i == 1 {
			e.ok("DELETE", "/api/firmware/package/"+gone.ID, nil, nil)
		}
		req, _ := http.NewRequest("GET", e.base+goneLink, nil)
		req.SetBasicAuth("fwd-b", "secret-key-of-fwd-b")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != want {
			t.Errorf("a package's link, deleted %v: %d, want %d", i == 1, res.StatusCode, want)
		}
	}
}

// TestFirmwareUploadRefusedBodyRead: an upload refused before its body is
// read (a bad version) is answered once its body is read to its end: the
// client, still sending, gets its 400 rather than a reset, and the
// connection serves the next request.
func TestFirmwareUploadRefusedBodyRead(t *testing.T) {
	t.Parallel()
	e := newFirmwareEnv(t, 16<<20)
	conn, err := net.Dial("tcp", strings.TrimPrefix(e.base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(60 * time.Second))
	br := bufio.NewReader(conn)
	body := bytes.Repeat([]byte("x"), 4<<20)
	head := "POST /api/firmware/package?productId=fwp&version=has+space HTTP/1.1\r\nHost: dh\r\nX-Access-Token: " + e.token +
		"\r\nContent-Type: application/octet-stream\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n"
	go func() { _, _ = conn.Write(append([]byte(head), body...)) }()
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 400 || !strings.Contains(string(b), "illegal_argument") || res.Close {
		t.Fatalf("bad version: %d close=%v %s", res.StatusCode, res.Close, b)
	}
	if _, err := conn.Write([]byte("GET /api/firmware/package/nope HTTP/1.1\r\nHost: dh\r\nX-Access-Token: " + e.token + "\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	res, err = http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("the next request on the connection: %v", err)
	}
	res.Body.Close()
	if res.StatusCode != 404 {
		t.Fatalf("the next request on the connection: %d", res.StatusCode)
	}
}
