// Package console is devicehub's built-in web console: hand-written HTML,
// CSS and JavaScript (static/), embedded in the binary and served at "/".
// The pages call only the public REST API, the same as any other client;
// nothing here reads a store. It must not import api (api imports it).
package console

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io/fs"
	"path"
	"strings"

	"github.com/gofiber/fiber/v2"
)

//go:embed static
var static embed.FS

// file is one embedded file, ready to serve.
type file struct {
	body        []byte
	contentType string
	etag        string // quoted, strong
	version     string // of the content, the ?v= that index.html links with
}

// contentTypes are the types of the files the console ships; any other
// extension is served as bytes.
var contentTypes = map[string]string{
	".html": "text/html; charset=utf-8",
	".js":   "text/javascript; charset=utf-8",
	".css":  "text/css; charset=utf-8",
	".svg":  "image/svg+xml",
	".png":  "image/png",
	".ico":  "image/x-icon",
}

// The page loads only its own files and talks only to its own origin.
const contentSecurityPolicy = "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; " +
	"connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"

// Register serves the console on r: index.html at "/", the other files of
// static/ at /assets/<name>, and its images also at /images/<name>: a
// product's default photoUrl is /images/device-product.png. Register it before the app's catch-all, which
// then still answers everything else (every /api miss included).
func Register(r fiber.Router) {
	index, assets := load()
	r.Get("/", func(c *fiber.Ctx) error {
		c.Set(fiber.HeaderContentSecurityPolicy, contentSecurityPolicy)
		c.Set(fiber.HeaderXFrameOptions, "DENY")
		c.Set(fiber.HeaderReferrerPolicy, "no-referrer")
		return serve(c, index, "no-cache")
	})
	r.Get("/assets/:name", func(c *fiber.Ctx) error {
		f, ok := assets[c.Params("name")]
		if !ok {
			return c.Next()
		}
		// index.html links each file with ?v=<its version>: that URL's
		// content never changes, so the browser keeps it. Any other URL
		// is checked again on each use.
		cache := "no-cache"
		if c.Query("v") == f.version {
			cache = "public, max-age=31536000, immutable"
		}
		return serve(c, f, cache)
	})
	r.Get("/images/:name", func(c *fiber.Ctx) error {
		f, ok := assets[c.Params("name")]
		if !ok || !productImages[c.Params("name")] {
			return c.Next()
		}
		return serve(c, f, "public, max-age=86400")
	})
}

// productImages are the images served at /images/<name>: the default
// photoUrl of products and devices points there.
var productImages = map[string]bool{"device-product.png": true}

// serve answers with f, or 304 when the client holds the same version.
func serve(c *fiber.Ctx, f *file, cacheControl string) error {
	c.Set(fiber.HeaderCacheControl, cacheControl)
	c.Set(fiber.HeaderETag, f.etag)
	c.Set(fiber.HeaderXContentTypeOptions, "nosniff")
	if match := c.Get(fiber.HeaderIfNoneMatch); match != "" && etagMatches(match, f.etag) {
		return c.SendStatus(fiber.StatusNotModified)
	}
	c.Set(fiber.HeaderContentType, f.contentType)
	return c.Send(f.body)
}

// etagMatches reports whether an If-None-Match list names etag (weak
// comparison, as RFC 9110 asks for If-None-Match).
func etagMatches(list, etag string) bool {
	for _, t := range strings.Split(list, ",") {
		t = strings.TrimPrefix(strings.TrimSpace(t), "W/")
		if t == "*" || t == etag {
			return true
		}
	}
	return false
}

// load reads the embedded files: index.html with each asset link given
// its version, and the assets by name.
func load() (*file, map[string]*file) {
	entries, err := fs.ReadDir(static, "static")
	if err != nil {
		panic("console: " + err.Error()) // embedded at build time: cannot fail
	}
	assets := make(map[string]*file, len(entries))
	var indexHTML []byte
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		body, err := static.ReadFile("static/" + e.Name())
		if err != nil {
			panic("console: " + err.Error())
		}
		if e.Name() == "index.html" {
			indexHTML = body
			continue
		}
		assets[e.Name()] = newFile(e.Name(), body)
	}
	for name, f := range assets {
		indexHTML = bytes.ReplaceAll(indexHTML, []byte(`"/assets/`+name+`"`), []byte(`"/assets/`+name+`?v=`+f.version+`"`))
	}
	return newFile("index.html", indexHTML), assets
}

func newFile(name string, body []byte) *file {
	sum := sha256.Sum256(body)
	version := hex.EncodeToString(sum[:8])
	ct, ok := contentTypes[path.Ext(name)]
	if !ok {
		ct = "application/octet-stream"
	}
	return &file{body: body, contentType: ct, etag: `"` + version + `"`, version: version}
}
