package api_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"mime/multipart"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	"devicehub/ingest/firmware"
	"devicehub/meta"
)

// files lists the package directory.
func (e *firmwareEnv) files() []string {
	e.t.Helper()
	ents, err := os.ReadDir(e.dir)
	if err != nil {
		e.t.Fatal(err)
	}
	var names []string
	for _, d := range ents {
		names = append(names, d.Name())
	}
	return names
}

// send posts body to the upload route: the raw file with q, or (ct set)
// a multipart form. A body that is an io.Reader but not a *bytes.Reader
// goes chunked (no Content-Length).
func (e *firmwareEnv) send(q url.Values, ct string, body io.Reader) response {
	e.t.Helper()
	req, _ := http.NewRequest("POST", e.base+"/api/firmware/package?"+q.Encode(), body)
	req.Header.Set("X-Access-Token", e.token)
	if ct == "" {
		ct = "application/octet-stream"
	}
	req.Header.Set("Content-Type", ct)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	return e.envelope("POST", "/api/firmware/package", res)
}

// form is a multipart upload of data as part file, with fields.
func form(fields map[string]string, data []byte) (string, *bytes.Reader) {
	var mb bytes.Buffer
	mw := multipart.NewWriter(&mb)
	for k, v := range fields {
		_ = mw.WriteField(k, v)
	}
	fw, _ := mw.CreateFormFile("file", "fw.bin")
	_, _ = fw.Write(data)
	_ = mw.Close()
	return mw.FormDataContentType(), bytes.NewReader(mb.Bytes())
}

// checkPackage checks that r is a package of data whose file, alone
// under its name, holds data.
func (e *firmwareEnv) checkPackage(what string, r response, data []byte) firmware.Package {
	e.t.Helper()
	if r.HTTPStatus != 200 {
		e.t.Fatalf("%s: %d %s", what, r.HTTPStatus, r.raw)
	}
	var p firmware.Package
	_ = json.Unmarshal(r.Result, &p)
	sum := sha256.Sum256(data)
	if p.Size != int64(len(data)) || p.SHA256 != hex.EncodeToString(sum[:]) {
		e.t.Fatalf("%s: package %+v, want %d bytes of %x", what, p, len(data), sum)
	}
	got, err := os.ReadFile(filepath.Join(e.dir, p.ID+".bin"))
	if err != nil || !bytes.Equal(got, data) {
		e.t.Fatalf("%s: file of %s: %d bytes, %v", what, p.ID, len(got), err)
	}
	return p
}

// TestFirmwareUploadStreamed: an upload is streamed to a temporary file
// and renamed into place with its row; a refusal (too large, a duplicate
// version) leaves no file; uploads at once both land.
func TestFirmwareUploadStreamed(t *testing.T) {
	t.Parallel()
	e := newFirmwareEnv(t, 100_000)
	data := bytes.Repeat([]byte("0123456789"), 10_000) // 100,000 bytes: the largest
	onlyPackages := func(what string, want int) {
		t.Helper()
		names := e.files()
		n := 0
		for _, name := range names {
			if strings.HasPrefix(name, ".") {
				t.Fatalf("%s: a temporary file is left: %v", what, names)
			}
			n++
		}
		if n != want {
			t.Fatalf("%s: %d files %v, want %d", what, n, names, want)
		}
	}

	// Works as before, with a length or chunked, raw or multipart.
	e.checkPackage("raw", e.send(url.Values{"productId": {"fwp"}, "version": {"s1"}}, "", bytes.NewReader(data)), data)
	e.checkPackage("raw chunked", e.send(url.Values{"productId": {"fwp"}, "version": {"s2"}}, "", io.MultiReader(bytes.NewReader(data))), data)
	ct, body := form(map[string]string{"productId": "fwp", "version": "s3", "releaseNotes": "notes"}, data)
	p := e.checkPackage("multipart", e.send(nil, ct, body), data)
	if p.ReleaseNotes != "notes" || p.Version != "s3" {
		t.Fatalf("multipart fields: %+v", p)
	}
	ct, body = form(map[string]string{"productId": "fwp", "version": "s4"}, data)
	e.checkPackage("multipart chunked", e.send(nil, ct, io.MultiReader(body)), data)
	onlyPackages("after four uploads", 4)

	// Refused: 400, nothing stored, no file left. (A body declaring more
	// than the limit is refused from its header: TestFirmwarePackages.)
	big := append(slices.Clone(data), 'x')
	for _, c := range []struct {
		name string
		ct   string
		body io.Reader
		code string
		want string
	}{
		{"raw one byte too large", "", bytes.NewReader(big), "illegal_argument", "file"},
		{"raw chunked too large", "", io.MultiReader(bytes.NewReader(big)), "illegal_argument", "file"},
		{"multipart too large", "multipart", nil, "illegal_argument", "file"},
		{"duplicate version", "", bytes.NewReader(data), "duplicate_key", "s1"},
		{"multipart duplicate version", "multipart-dup", nil, "duplicate_key", "s3"},
	} {
		q := url.Values{"productId": {"fwp"}, "version": {"s1"}}
		if strings.HasPrefix(c.name, "raw") {
			q.Set("version", "big")
		}
		ct, body := c.ct, c.body
		switch c.ct {
		case "multipart":
			ct, body = form(map[string]string{"productId": "fwp", "version": "big"}, big)
		case "multipart-dup":
			ct, body = form(map[string]string{"productId": "fwp", "version": "s3"}, data)
		}
		r := e.send(q, ct, body)
		if r.HTTPStatus != 400 || r.Code != c.code || !strings.Contains(r.Message, c.want) {
			t.Errorf("%s: %d %s, want 400 %s naming %q", c.name, r.HTTPStatus, r.raw, c.code, c.want)
		}
		onlyPackages(c.name, 4)
	}

	// A caller refused before the handler runs (403) leaves the body
	// unread: the connection is closed, never read on from inside it.
	_, viewer := e.addUser("fwviewer", meta.RoleViewer)
	req, _ := http.NewRequest("POST", e.base+"/api/firmware/package?productId=fwp&version=v", bytes.NewReader(data))
	req.Header.Set("X-Access-Token", viewer)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if r := e.envelope("POST", "/api/firmware/package", res); r.HTTPStatus != 403 || !res.Close {
		t.Errorf("a viewer's upload: %d (connection closed: %v) %s, want 403 and closed", r.HTTPStatus, res.Close, r.raw)
	}
	onlyPackages("a viewer's upload", 4)

	// Two at once: both bodies in flight together (each sends half, waits
	// for the other's half, then the rest).
	var half sync.WaitGroup
	half.Add(2)
	var wg sync.WaitGroup
	out := make([]response, 2)
	bodies := [][]byte{bytes.Repeat([]byte("a"), 90_000), bytes.Repeat([]byte("b"), 80_000)}
	for i := range 2 {
		pr, pw := io.Pipe()
		wg.Add(1)
		go func() {
			defer wg.Done()
			b := bodies[i]
			_, _ = pw.Write(b[:len(b)/2])
			half.Done()
			half.Wait()
			_, _ = pw.Write(b[len(b)/2:])
			pw.Close()
		}()
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest("POST", e.base+"/api/firmware/package?productId=fwp&version=c"+string(rune('0'+i)), pr)
			req.Header.Set("X-Access-Token", e.token)
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			defer res.Body.Close()
			raw, _ := io.ReadAll(res.Body)
			out[i] = response{HTTPStatus: res.StatusCode, raw: raw}
			_ = json.Unmarshal(raw, &out[i])
		}()
	}
	wg.Wait()
	for i := range 2 {
		e.checkPackage("upload at once", out[i], bodies[i])
	}
	onlyPackages("after two at once", 6)
}

// TestFirmwareStreamOtherRoutes: with request bodies streamed, other
// routes still get their body whole and within their limit, chunked or
// not, and the connection stays usable after one.
func TestFirmwareStreamOtherRoutes(t *testing.T) {
	t.Parallel()
	e := newFirmwareEnv(t, 100_000)
	send := func(body io.Reader) response {
		req, _ := http.NewRequest("POST", e.base+"/api/device/instance", body)
		req.Header.Set("X-Access-Token", e.token)
		req.Header.Set("Content-Type", "application/json")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return e.envelope("POST", "/api/device/instance", res)
	}
	dev := func(id, pad string) string {
		return `{"id":"` + id + `","name":"` + id + `","productId":"fwp"` + pad + `}`
	}
	pad := strings.Repeat(" ", 100_000) // past fasthttp's first 8 KiB
	if r := send(strings.NewReader(dev("os1", pad))); r.HTTPStatus != 200 {
		t.Fatalf("create with a length: %d %.300s", r.HTTPStatus, r.raw)
	}
	if r := send(io.MultiReader(strings.NewReader(dev("os2", pad)))); r.HTTPStatus != 200 {
		t.Fatalf("create chunked: %d %.300s", r.HTTPStatus, r.raw)
	}
	// A body past its limit is not read: the server answers 400 and
	// closes the connection, so a client still sending may see its write
	// cut (a reset, a broken pipe) before it reads the answer; either way
	// nothing is stored (checked below).
	huge := dev("os3", strings.Repeat(" ", 2<<20))
	for name, body := range map[string]io.Reader{"with a length": strings.NewReader(huge), "chunked": io.MultiReader(strings.NewReader(huge))} {
		req, _ := http.NewRequest("POST", e.base+"/api/device/instance", body)
		req.Header.Set("X-Access-Token", e.token)
		req.Header.Set("Content-Type", "application/json")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			if !strings.Contains(err.Error(), "connection reset") && !strings.Contains(err.Error(), "broken pipe") {
				t.Errorf("2 MiB %s: %v, want 400 too large or the write cut", name, err)
			}
			continue
		}
		if r := e.envelope("POST", "/api/device/instance", res); r.HTTPStatus != 400 || r.Code != "illegal_argument" || !strings.Contains(r.Message, "too large") {
			t.Errorf("2 MiB %s: %d %.300s, want 400 too large", name, r.HTTPStatus, r.raw)
		}
	}
	if r := e.do("GET", "/api/device/instance/os2", nil, e.token); r.HTTPStatus != 200 {
		t.Fatalf("read: %d %.300s", r.HTTPStatus, r.raw)
	}
	if r := e.do("GET", "/api/device/instance/os3", nil, e.token); r.HTTPStatus != 404 {
		t.Fatalf("refused device: %d %.300s", r.HTTPStatus, r.raw)
	}
}

// TestFirmwareUploadMemory reports the heap allocated by one 32 MiB
// upload (raw and multipart), server and client in this process.
//
// Serial: runtime.MemStats counts the allocations of every running test.
func TestFirmwareUploadMemory(t *testing.T) {
	e := newFirmwareEnv(t, 64<<20)
	data := bytes.Repeat([]byte("firmware"), 4<<20) // 32 MiB
	ct, mp := form(map[string]string{"productId": "fwp", "version": "mem2"}, data)
	measure := func(name string, send func() response) {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		r := send()
		runtime.ReadMemStats(&after)
		if r.HTTPStatus != 200 {
			t.Fatalf("%s: %d %s", name, r.HTTPStatus, r.raw)
		}
		alloc := after.TotalAlloc - before.TotalAlloc
		t.Logf("%s of 32 MiB: %.1f MiB allocated, heap in use %+.1f MiB", name, float64(alloc)/(1<<20), (float64(after.HeapInuse)-float64(before.HeapInuse))/(1<<20))
		if alloc > 8<<20 {
			t.Errorf("%s of 32 MiB allocated %d bytes, want a stream (under 8 MiB)", name, alloc)
		}
	}
	measure("raw upload", func() response { return e.upload(url.Values{"productId": {"fwp"}, "version": {"mem1"}}, data) })
	measure("multipart upload", func() response { return e.send(nil, ct, mp) })
}
