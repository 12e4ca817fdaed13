package api

import (
	"bytes"
	"io"
	"net/http/httptest"
	"regexp"
	"testing"
	"time"

	"github.com/gofiber/fiber/v2"

	"devicehub/meta"
)

// TestOKPage checks that okPage answers the bytes and headers ok answers
// for the same page (but for the timestamp).
func TestOKPage(t *testing.T) {
	devices := meta.Page[meta.Device]{PageIndex: 2, PageSize: 3, Total: 1001, Data: []meta.Device{
		{ID: "d<1>", Name: "Kitchen \u2028 \"meter\"", State: "offline", CreateTime: meta.Millis(time.UnixMilli(1700000000123)),
			Features: []meta.DeviceFeature{}, DeviceMetadata: `{"properties":[]}`},
		{ID: "d2", Features: []meta.DeviceFeature{{ID: "f", Name: "F"}}},
	}}
	products := meta.Page[meta.Product]{TotalExact: true, Data: []meta.Product{{ID: "p&1", Name: "Meter", DeviceNum: 7,
		Configuration: meta.Configuration{SecureID: "s", SecureKey: "******"}}}}
	empty := meta.Page[meta.Device]{TotalExact: true, Data: []meta.Device{}}
	app := fiber.New()
	app.Get("/ok/devices", func(c *fiber.Ctx) error { return ok(c, mapPage(&devices, deviceOf)) })
	app.Get("/page/devices", func(c *fiber.Ctx) error { return okPage(c, &devices, appendDevice) })
	app.Get("/ok/products", func(c *fiber.Ctx) error { return ok(c, mapPage(&products, productOf)) })
	app.Get("/page/products", func(c *fiber.Ctx) error { return okPage(c, &products, appendProduct) })
	app.Get("/ok/empty", func(c *fiber.Ctx) error { return ok(c, mapPage(&empty, deviceOf)) })
	app.Get("/page/empty", func(c *fiber.Ctx) error { return okPage(c, &empty, appendDevice) })
	get := func(path string) (string, []byte) { t.Helper(); return getStamped(t, app, path) }
	for _, kind := range []string{"devices", "products", "empty"} {
		wantType, want := get("/ok/" + kind)
		gotType, got := get("/page/" + kind)
		if gotType != wantType || !bytes.Equal(got, want) {
			t.Errorf("%s:\n got %s %s\nwant %s %s", kind, gotType, got, wantType, want)
		}
	}
}

// stampPattern matches an envelope's timestamp, which getStamped zeroes.
var stampPattern = regexp.MustCompile(`"timestamp":\d+`)

// getStamped GETs path from app, requires 200, and returns the
// Content-Type and the body with its timestamp zeroed (so two answers
// compare byte by byte).
func getStamped(t *testing.T, app *fiber.App, path string) (string, []byte) {
	t.Helper()
	res, err := app.Test(httptest.NewRequest("GET", path, nil))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	if res.StatusCode != 200 {
		t.Fatalf("%s: %d %s", path, res.StatusCode, body)
	}
	return res.Header.Get("Content-Type"), stampPattern.ReplaceAll(body, []byte(`"timestamp":0`))
}
