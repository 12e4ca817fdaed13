package console

import (
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"path"
	"regexp"
	"strings"
	"testing"

	"github.com/gofiber/fiber/v2"
)

// app is the console registered before a catch-all, as api/routes.go
// does it; the catch-all answers 404 "api".
func app() *fiber.App {
	a := fiber.New(fiber.Config{DisableStartupMessage: true})
	Register(a)
	a.Use(func(c *fiber.Ctx) error { return c.Status(404).SendString("api") })
	return a
}

func get(t *testing.T, a *fiber.App, path string, header ...string) (*http.Response, string) {
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, path, nil)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := a.Test(req, -1)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b)
}

func TestIndexLinksVersionedAssets(t *testing.T) {
	a := app()
	resp, body := get(t, a, "/")
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/html; charset=utf-8" {
		t.Fatalf("GET /: %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	if cc := resp.Header.Get("Cache-Control"); cc != "no-cache" {
		t.Errorf("GET / Cache-Control %q, want no-cache", cc)
	}
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") {
		t.Errorf("GET / Content-Security-Policy %q", csp)
	}
	links := regexp.MustCompile(`"/assets/([a-z0-9-]+\.[a-z]+)\?v=([0-9a-f]{16})"`).FindAllStringSubmatch(body, -1)
	// Every script and style sheet of static/ is linked, each with its
	// version: a file left out would never load, one unversioned never cache.
	entries, err := fs.ReadDir(static, "static")
	if err != nil {
		t.Fatal(err)
	}
	types := map[string]string{}
	for _, e := range entries {
		switch path.Ext(e.Name()) {
		case ".js":
			types[e.Name()] = "text/javascript; charset=utf-8"
		case ".css":
			types[e.Name()] = "text/css; charset=utf-8"
		}
	}
	linked := map[string]bool{}
	for _, l := range links {
		linked[l[1]] = true
	}
	if len(links) != len(types) || len(linked) != len(types) || len(types) < 3 {
		t.Fatalf("index.html links %d versioned assets, want each of the %d scripts and style sheets once: %v", len(links), len(types), links)
	}
	for _, l := range links {
		name, v := l[1], l[2]
		resp, body := get(t, a, "/assets/"+name+"?v="+v)
		if resp.StatusCode != 200 || body == "" {
			t.Fatalf("GET %s: %d, %d bytes", name, resp.StatusCode, len(body))
		}
		if ct := resp.Header.Get("Content-Type"); ct != types[name] {
			t.Errorf("%s Content-Type %q, want %q", name, ct, types[name])
		}
		if cc := resp.Header.Get("Cache-Control"); cc != "public, max-age=31536000, immutable" {
			t.Errorf("%s?v=<its version> Cache-Control %q, want immutable", name, cc)
		}
		if resp.Header.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("%s: no nosniff", name)
		}
		// Another version, or none: revalidated each time.
		resp, _ = get(t, a, "/assets/"+name+"?v=0000")
		if cc := resp.Header.Get("Cache-Control"); cc != "no-cache" {
			t.Errorf("%s with another version: Cache-Control %q, want no-cache", name, cc)
		}
		etag := resp.Header.Get("ETag")
		resp, body = get(t, a, "/assets/"+name, "If-None-Match", etag)
		if resp.StatusCode != 304 || body != "" {
			t.Errorf("%s If-None-Match %s: %d, %d bytes; want 304, none", name, etag, resp.StatusCode, len(body))
		}
	}
	index := resp.Header.Get("ETag")
	resp, _ = get(t, a, "/", "If-None-Match", `"x", W/`+index)
	if resp.StatusCode != 304 {
		t.Errorf("GET / If-None-Match its own ETag in a list: %d, want 304", resp.StatusCode)
	}
	resp, _ = get(t, a, "/", "If-None-Match", `"x"`)
	if resp.StatusCode != 200 {
		t.Errorf("GET / If-None-Match another ETag: %d, want 200", resp.StatusCode)
	}
}

func TestOtherPathsFallThrough(t *testing.T) {
	a := app()
	for _, path := range []string{"/api/nope", "/api/", "/assets/missing.js", "/assets/index.html", "/index.html", "/assets/", "/images/app.js", "/images/nope.png"} {
		resp, body := get(t, a, path)
		if resp.StatusCode != 404 || body != "api" {
			t.Errorf("GET %s: %d %q, want the catch-all's 404", path, resp.StatusCode, body)
		}
	}
}

// TestDefaultProductImage: the photoUrl every product gets by default is
// served (a PNG), and only the images are served there.
func TestDefaultProductImage(t *testing.T) {
	resp, body := get(t, app(), "/images/device-product.png")
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "image/png" || !strings.HasPrefix(body, "\x89PNG\r\n") {
		t.Fatalf("GET /images/device-product.png: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
}
