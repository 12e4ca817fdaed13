// Package openapi serves devicehub's API description: the OpenAPI 3
// document (openapi.json, written by hand beside this file and embedded)
// at /openapi.json, and a page that renders it at /docs, its script and
// style at /docs/{file}, embedded too: nothing is loaded from elsewhere.
// None of them needs a token. It must not import api (api imports it);
// its tests check the document against the routes api registers and
// against real responses.
package openapi

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io/fs"
	"path"

	"github.com/gofiber/fiber/v2"
)

//go:embed openapi.json
var document []byte

//go:embed docs
var docs embed.FS

// StaticPrefixes are the path prefixes of static files that the document
// does not list: the console's assets and images and the docs page's own files. Every
// other route is documented.
var StaticPrefixes = []string{"/assets/", "/docs/", "/images/"}

// Document returns the OpenAPI document, JSON. The caller must not modify it.
func Document() []byte { return document }

// The docs page runs only its own script and style, and fetches only its
// own origin (the document).
const contentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; " +
	"img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// file is one embedded file, ready to serve.
type file struct {
	body        []byte
	contentType string
	etag        string // quoted, strong
}

func newFile(name string, body []byte) *file {
	sum := sha256.Sum256(body)
	ct := map[string]string{
		".json": fiber.MIMEApplicationJSONCharsetUTF8,
		".html": fiber.MIMETextHTMLCharsetUTF8,
		".js":   "text/javascript; charset=utf-8",
		".css":  "text/css; charset=utf-8",
	}[path.Ext(name)]
	if ct == "" {
		ct = fiber.MIMEOctetStream
	}
	return &file{body: body, contentType: ct, etag: `"` + hex.EncodeToString(sum[:8]) + `"`}
}

// Register serves the document and the docs page on r. Register it before
// the app's catch-all, which then answers the misses under /docs/.
func Register(r fiber.Router) {
	doc := newFile("openapi.json", document)
	page, assets := loadDocs()
	r.Get("/openapi.json", func(c *fiber.Ctx) error { return serve(c, doc) })
	r.Get("/docs", func(c *fiber.Ctx) error {
		c.Set(fiber.HeaderContentSecurityPolicy, contentSecurityPolicy)
		c.Set(fiber.HeaderXFrameOptions, "DENY")
		c.Set(fiber.HeaderReferrerPolicy, "no-referrer")
		return serve(c, page)
	})
	r.Get("/docs/:file", func(c *fiber.Ctx) error {
		f, ok := assets[c.Params("file")]
		if !ok {
			return c.Next()
		}
		return serve(c, f)
	})
}

// serve answers with f, revalidated on each use (no-cache with an ETag):
// the files change with the binary.
func serve(c *fiber.Ctx, f *file) error {
	c.Set(fiber.HeaderCacheControl, "no-cache")
	c.Set(fiber.HeaderETag, f.etag)
	c.Set(fiber.HeaderXContentTypeOptions, "nosniff")
	if c.Get(fiber.HeaderIfNoneMatch) == f.etag {
		return c.SendStatus(fiber.StatusNotModified)
	}
	c.Set(fiber.HeaderContentType, f.contentType)
	return c.Send(f.body)
}

// loadDocs reads the page (docs/index.html) and its other files by name.
func loadDocs() (*file, map[string]*file) {
	entries, err := fs.ReadDir(docs, "docs")
	if err != nil {
		panic("openapi: " + err.Error()) // embedded at build time: cannot fail
	}
	var page *file
	assets := make(map[string]*file, len(entries))
	for _, e := range entries {
		body, err := docs.ReadFile("docs/" + e.Name())
		if err != nil {
			panic("openapi: " + err.Error())
		}
		if e.Name() == "index.html" {
			page = newFile(e.Name(), body)
			continue
		}
		assets[e.Name()] = newFile(e.Name(), body)
	}
	if page == nil {
		panic("openapi: docs/index.html is not embedded")
	}
	return page, assets
}
