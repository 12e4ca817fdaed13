package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"devicehub/bench/sim"
	"devicehub/bench/testkit"
	"devicehub/schema"
)

// TestConsoleManageInBrowser manages a product and a device through the
// console (api/console) in headless chromium, against the real binary:
// it creates a product with a thing model from the form (the model's JSON
// shown beside it), edits it, deploys it; creates a device (its key shown
// once), sees the value a simulated device reports, reads a property from
// the device (endpoint 10) and invokes its function (endpoint 12), charts
// a custom time range, rotates the key (the new one works, the old one no
// longer). The platform's zone (Asia/Kolkata) is not the browser's
// (America/New_York): the device page's "Updated" time and the chart's
// bucket read on the platform's clock, labelled. The device list is in
// the server's order. At 420 px nothing overflows horizontally. A viewer
// sees none of the buttons.
//
// Serial: t.Setenv (the browser's TZ) is the whole process's.
func TestConsoleManageInBrowser(t *testing.T) {
	chromium := findChromium(t)
	own := startOwn(t, "consolemanage", "DEVICEHUB_INGEST_FLUSH_INTERVAL=100ms", "DEVICEHUB_TIMEZONE=Asia/Kolkata")
	srv, broker, suffix, token := own.server, own.broker, own.suffix, own.token
	kolkata, err := time.LoadLocation("Asia/Kolkata")
	if err != nil {
		t.Fatal(err)
	}
	// The browser's zone differs from the platform's (chromium reads TZ).
	t.Setenv("TZ", "America/New_York")
	start := time.Now()

	product := "mp" + suffix
	devID := "dev-" + suffix
	b := newBrowser(t, chromium)
	b.run("open the console", chromedp.Navigate(srv.base+"/"), chromedp.WaitVisible(chromedp.ID("login-form")))
	b.run("sign in",
		chromedp.SendKeys(chromedp.ID("login-user"), "admin"),
		chromedp.SendKeys(chromedp.ID("login-password"), "admin123"),
		chromedp.Click(chromedp.ID("login-submit")),
		chromedp.WaitVisible(chromedp.CSS(`#volume-chart svg`)))
	b.poll("the zone label", `document.querySelector('#zone').textContent.includes('Asia/Kolkata (IST)')`)

	// A product from the form: the default row (temperature, float, scale
	// 1), humidity (int, percent), controllers on.
	b.run("open the product list", chromedp.Click(chromedp.CSS(`a[data-nav=products]`)), chromedp.WaitVisible(chromedp.ID("product-new")))
	b.run("open the new product form", chromedp.Click(chromedp.ID("product-new")), chromedp.WaitVisible(chromedp.ID("product-form")))
	b.run("fill the product",
		chromedp.SendKeys(chromedp.ID("product-id"), product),
		chromedp.SendKeys(chromedp.ID("product-name"), "Heater "+suffix),
		chromedp.Click(chromedp.ID("product-regulator")),
		chromedp.Click(chromedp.ID("model-add")),
		fill(`#model-rows tr:nth-child(2) .prop-id`, "humidity"),
		fill(`#model-rows tr:nth-child(2) .prop-name`, "Humidity"),
		fill(`#model-rows tr:nth-child(2) .prop-unit`, "percent"))
	b.poll("the model's JSON beside the form", `(() => {
		const m = JSON.parse(document.querySelector('#model-json').textContent);
		const p = m.properties;
		return p.length === 2 && p[0].id === 'temperature' && p[0].valueType.type === 'float' && p[0].valueType.scale === 1 &&
			p[1].id === 'humidity' && p[1].valueType.type === 'int' && p[1].valueType.unit === 'percent' &&
			JSON.stringify(p[1].expands.type) === '["read","report"]';
	})()`)
	b.shot("product-new")
	b.run("create the product", chromedp.Click(chromedp.ID("product-save")), chromedp.WaitVisible(chromedp.ID("product-deploy")))
	b.poll("the product's page", fmt.Sprintf(`location.hash === '#/product/%s' && document.querySelectorAll('#model-rows tr').length === 2`, product))

	// A model the server refuses: its message, naming the field, on the page.
	b.run("an enum without values",
		fill(`#model-rows tr:nth-child(2) .prop-type`, "enum"),
		chromedp.Click(chromedp.ID("product-save")))
	b.poll("the refusal", `(() => { const n = document.querySelector('#product-note'); return n.className === 'error' && n.textContent.includes('elements') && n.textContent.includes('illegal_argument'); })()`)
	b.run("back to int", fill(`#model-rows tr:nth-child(2) .prop-type`, "int"))

	// Edit: a string property with a maximum length, saved (PATCH).
	b.run("add a string property",
		chromedp.Click(chromedp.ID("model-add")),
		fill(`#model-rows tr:nth-child(3) .prop-id`, "label"),
		fill(`#model-rows tr:nth-child(3) .prop-name`, "Label"),
		fill(`#model-rows tr:nth-child(3) .prop-type`, "string"),
		fill(`#model-rows tr:nth-child(3) .prop-maxlength`, "32"),
		chromedp.Click(chromedp.ID("product-save")))
	b.poll("the save", `document.querySelector('#product-note').textContent === 'Saved.'`)
	b.run("deploy the product", chromedp.Click(chromedp.ID("product-deploy")), chromedp.WaitVisible(chromedp.ID("product-undeploy")))
	b.shot("product")
	var p struct {
		State     int    `json:"state"`
		Regulator bool   `json:"regulator"`
		Metadata  string `json:"metadata"`
	}
	srv.do(t, token, "GET", "/api/device-product/"+product, nil, &p)
	model, err := schema.ParseThingModelString(p.Metadata)
	if err != nil {
		t.Fatalf("the stored thing model: %v", err)
	}
	if p.State != 1 || !p.Regulator || len(model.Properties) != 3 || model.Properties[1].ValueType.Unit != "percent" ||
		model.Properties[2].ValueType.Type != "string" || model.Properties[2].ValueType.Expands.MaxLength != 32 {
		t.Fatalf("the stored product: state %d, regulator %v, model %s", p.State, p.Regulator, p.Metadata)
	}

	// Devices whose ids text puts out of natural order: the list keeps the
	// server's order (and says so), page after page.
	for _, n := range []string{"n1", "n2", "n10"} {
		srv.call(t, token, "POST", "/api/device/instance", map[string]any{"id": n + "-" + suffix, "name": "Spare " + n, "productId": product})
	}

	// A device from the form, deployed, its key shown once.
	b.run("open the devices of the product", goTo("#/devices?product="+product), chromedp.WaitVisible(chromedp.ID("new-device-open")))
	b.run("open the new device form", chromedp.Click(chromedp.ID("new-device-open")), chromedp.WaitVisible(chromedp.ID("new-device")))
	b.poll("the products to choose from", fmt.Sprintf(`!!document.querySelector('#new-device-product option[value=%q]')`, product))
	b.run("create a device",
		setSelect("#new-device-product", product),
		chromedp.SendKeys(chromedp.ID("new-device-id"), devID),
		chromedp.SendKeys(chromedp.ID("new-device-name"), "Hall heater"),
		chromedp.Click(chromedp.ID("new-device-submit")),
		chromedp.WaitVisible(chromedp.ID("secret-key")))
	if msg := b.text("#new-device-result p"); !strings.Contains(msg, "created, deployed") {
		t.Fatalf("after creating the device: %q", msg)
	}
	secureID, key := b.text("#secret-id"), b.text("#secret-key")
	b.shot("device-new")
	var page struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	srv.do(t, token, "POST", "/api/device-instance/_query", map[string]any{"pageSize": 20, "sorts": []map[string]string{{"name": "id", "order": "asc"}},
		"terms": []map[string]any{{"column": "productId", "value": product}}}, &page)
	var serverOrder []string
	for _, d := range page.Data {
		serverOrder = append(serverOrder, d.ID)
	}
	want, _ := json.Marshal(serverOrder)
	if len(serverOrder) != 4 || serverOrder[2] != "n2-"+suffix || serverOrder[3] != "n10-"+suffix {
		t.Fatalf("the server's order of ids: %s (the test expects natural order, n2 before n10)", want)
	}
	b.poll("the list in the server's order", fmt.Sprintf(`JSON.stringify([...document.querySelectorAll('a.device-link')].map((a) => a.dataset.id)) === %q`, want))

	// Its page; a simulated device connects and reports.
	var temperature atomic.Uint64
	temperature.Store(math.Float64bits(21.5))
	b.run("open the device", chromedp.Click(chromedp.CSS(fmt.Sprintf(`a.device-link[data-id=%q]`, devID))), chromedp.WaitVisible(chromedp.ID("device-name")))
	b.poll("live updates to connect", `document.querySelector('#live-status').classList.contains('on') && document.querySelector('#device-properties').dataset.latest === 'loaded'`)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	fleet, err := sim.Start(ctx, sim.Options{BrokerURL: broker.URL(), ProductID: product, DeviceIDs: []string{devID}, Model: model,
		Login: sim.OwnLogins(map[string]sim.Credential{devID: {SecureID: secureID, SecureKey: key}}),
		ValueFunc: func(_, property string, _ *schema.ValueType) (any, bool) {
			switch property {
			case "temperature":
				return math.Float64frombits(temperature.Load()), true
			case "humidity":
				return 40, true
			}
			return nil, false
		}})
	if err != nil {
		t.Fatalf("the simulated device, with the key the console showed: %v", err)
	}
	t.Cleanup(fleet.Close)
	b.poll("the state to turn online", `document.querySelector('#device-state [data-state]').dataset.state === 'online'`)
	if err := fleet.Device(devID).Report(ctx); err != nil {
		t.Fatal(err)
	}
	b.poll("the reported values", `(() => {
		const v = (p) => document.querySelector('td.value[data-property="' + p + '"]').textContent;
		return v('temperature') === '21.5' && v('humidity') === '40%';
	})()`)

	// One clock: "Updated" is the platform's time, and the hourly chart's
	// bucket holding that value starts in the same hour of the same day.
	updated := evalJS[string](b, `document.querySelector('td.value[data-property="temperature"]').nextElementSibling.textContent`)
	at, err := time.ParseInLocation("2006-01-02 15:04:05", updated, kolkata)
	if err != nil || time.Until(at).Abs() > 2*time.Minute {
		t.Fatalf("Updated %q is not now in Asia/Kolkata (%s): %v", updated, time.Now().In(kolkata).Format(time.DateTime), err)
	}
	testkit.Eventually(t, 10*time.Second, "the value in the hourly rollup", func() bool {
		var items []struct {
			Data struct {
				Value uint64 `json:"value"`
			} `json:"data"`
		}
		srv.do(t, token, "POST", "/api/dashboard/_multi", []map[string]any{{"dashboard": "device", "object": product,
			"measurement": "properties", "dimension": "agg", "params": map[string]any{"deviceId": devID, "properties": []string{"temperature"},
				"agg": "count", "time": "1h", "limit": 2, "from": "now-1h/h", "to": "now"}}}, &items)
		return len(items) > 0 && items[0].Data.Value+items[len(items)-1].Data.Value >= 1
	})
	b.run("choose hourly averages", setSelect("#chart-mode", "1h"))
	b.poll("24 hourly bars", `document.querySelectorAll('#property-chart rect.bar').length === 24 && !!document.querySelector('#property-chart rect.bar:not(.empty)')`)
	bucket := evalJS[string](b, `document.querySelector('#property-chart rect.bar:not(.empty) title').textContent`)
	if len(bucket) < 13 || bucket[:13] != updated[:13] {
		t.Fatalf("the chart's bucket %q and the Updated time %q are on different clocks", bucket, updated)
	}
	if c := b.text("#property-chart-caption"); !strings.Contains(c, "Asia/Kolkata (IST)") {
		t.Fatalf("the chart does not name its zone: %q", c)
	}
	b.shot("device-same-clock")

	// A custom range: the last 24 hours by the hour, then a range that ends
	// before it starts.
	b.run("choose a custom range", setSelect("#chart-mode", "custom"), setSelect("#chart-bucket", "1h"))
	b.poll("the custom range's bars", `(() => {
		const n = document.querySelectorAll('#property-chart rect.bar').length;
		const v = [...document.querySelectorAll('#property-chart rect.bar:not(.empty)')].map((r) => Number(r.dataset.value));
		return (n === 24 || n === 25) && v.length === 1 && v[0] === 21.5 && document.querySelector('#property-chart-caption').textContent.includes('every 1h');
	})()`)
	b.run("end the range before its start", chromedp.Evaluate[chromedp.Void](
		`(() => { const f = document.querySelector('#chart-from'); f.value = '2099-01-01T00:00'; f.dispatchEvent(new Event('change')); })()`))
	b.poll("the range refused", `!!document.querySelector('#range-error')`)

	// Read a property from the device now (endpoint 10): its answer, not
	// the stored value.
	temperature.Store(math.Float64bits(30.5))
	b.run("read the temperature", setSelect("#read-property", "temperature"), chromedp.Click(chromedp.ID("read-submit")))
	b.poll("the device's answer", `(document.querySelector('#read-value') || {}).textContent === '30.5'`)
	if fleet.Reads.Load() < 1 {
		t.Fatal("the simulated device got no read")
	}
	// Invoke DeviceCtrl (endpoint 12): the product is a controller.
	b.run("invoke DeviceCtrl",
		chromedp.SendKeys(chromedp.ID("invoke-Location"), "hall"),
		setSelect("#invoke-OperCode-Switch", "1"),
		chromedp.SendKeys(chromedp.ID("invoke-OperCode-Temperature"), "21"),
		chromedp.Click(chromedp.ID("invoke-submit")))
	b.poll("the invoke sent", `!!document.querySelector('#invoke-ok')`)
	b.shot("device-commands")

	// The gap rules of the line chart: a silence longer than opts.gap
	// breaks it, and so does a time the device went offline.
	if n := evalJS[[]int](b, `(() => {
		const pts = [0, 1, 2, 3, 60, 61, 62].map((s) => ({ t: s * 1000, v: s }));
		const moves = (o) => (Chart.line(pts, o).querySelector('path.line').getAttribute('d').match(/M/g) || []).length;
		return [moves({}), moves({ gap: 3000 }), moves({ breaks: [1500] }), moves({ gap: 3000, breaks: [1500, 60500] })];
	})()`); fmt.Sprint(n) != "[1 2 2 4]" {
		t.Fatalf("line segments without a gap, with a silence, with an offline time, with both: %v, want [1 2 2 4]", n)
	}

	// Rotate the key: shown once; the new one logs in, the old one not.
	b.run("rotate the key",
		chromedp.Evaluate[chromedp.Void](`window.confirm = () => true`),
		chromedp.Click(chromedp.ID("device-rotate")),
		chromedp.WaitVisible(chromedp.ID("secret-key")))
	newKey := b.text("#secret-key")
	if newKey == key || newKey == "" {
		t.Fatalf("the rotated key %q", newKey)
	}
	fleet.Close()
	if c, err := dial(broker.URL(), devID, secureID, key, nil); err == nil {
		c.Disconnect(0)
		t.Fatal("the old key still logs in")
	}
	c, err := dial(broker.URL(), devID, secureID, newKey, nil)
	if err != nil {
		t.Fatalf("the new key: %v", err)
	}
	c.Disconnect(0)

	// Another device's lifecycle from its page: deploy, undeploy, delete.
	spare := "n2-" + suffix
	b.run("open a device not deployed", goTo("#/device/"+spare), chromedp.WaitVisible(chromedp.ID("device-deploy")))
	b.run("deploy it", chromedp.Click(chromedp.ID("device-deploy")), chromedp.WaitVisible(chromedp.ID("device-undeploy")))
	if s := b.text("#device-state"); s != "Offline" {
		t.Fatalf("a deployed device that never connected: %q", s)
	}
	b.run("undeploy it", chromedp.Click(chromedp.ID("device-undeploy")), chromedp.WaitVisible(chromedp.ID("device-deploy")))
	b.run("delete it", chromedp.Click(chromedp.ID("device-delete")), chromedp.WaitVisible(chromedp.CSS(`a.device-link`)))
	b.poll("the list without it", fmt.Sprintf(`location.hash === '#/devices?product=%s' && !document.querySelector('a.device-link[data-id=%q]')`, product, spare))
	if res, err := srv.api(token).Request("GET", "/api/device/instance/"+spare+"/detail", nil); err != nil || res.HTTPStatus != 404 {
		t.Fatalf("the deleted device answers %d (%v)", res.HTTPStatus, err)
	}

	// 420 px wide: no page is wider than the window.
	b.run("a narrow window", chromedp.EmulateViewport(420, 860))
	for _, pg := range []struct{ name, hash, ready string }{
		{"overview", "#/", `#volume-chart svg`},
		{"products", "#/products", `a.product-edit`},
		{"product", "#/product/" + product, `#model-rows tr`},
		{"devices", "#/devices?product=" + product, `a.device-link`},
		{"device", "#/device/" + devID, `#device-properties[data-latest=loaded]`},
	} {
		b.run("open "+pg.name+" at 420 px", goTo(pg.hash), chromedp.WaitVisible(chromedp.CSS(pg.ready)))
		b.narrowShot("narrow-" + pg.name)
		if w := evalJS[[]int](b, `[document.scrollingElement.scrollWidth, innerWidth, document.querySelector('#top').scrollWidth, document.querySelector('#top').clientWidth]`); w[0] > w[1] || w[2] > w[3] {
			t.Fatalf("%s at 420 px: page %d px wide in a %d px window, header %d in %d", pg.name, w[0], w[1], w[2], w[3])
		}
	}
	b.run("a wide window", chromedp.EmulateViewport(1366, 860))

	// A viewer: the same pages, none of the buttons.
	srv.call(t, token, "POST", "/api/user", map[string]any{"username": "watcher" + suffix, "password": "watcher-pass", "roles": []string{"viewer"}})
	b.run("sign out", chromedp.Click(chromedp.ID("logout")), chromedp.WaitVisible(chromedp.ID("login-form")))
	b.run("sign in as a viewer",
		chromedp.Evaluate[chromedp.Void](`document.getElementById('login-user').value = ''; document.getElementById('login-password').value = ''`),
		chromedp.SendKeys(chromedp.ID("login-user"), "watcher"+suffix),
		chromedp.SendKeys(chromedp.ID("login-password"), "watcher-pass"),
		chromedp.Click(chromedp.ID("login-submit")))
	b.poll("the viewer signed in", `document.querySelector('#whoami').textContent === 'watcher`+suffix+`'`)
	b.run("the products", goTo("#/products"), chromedp.WaitVisible(chromedp.CSS(`a.product-edit`)))
	if n := evalJS[int](b, `document.querySelectorAll('#product-new').length`); n != 0 {
		t.Fatal("a viewer is offered New product")
	}
	b.run("the product", chromedp.Click(chromedp.CSS(fmt.Sprintf(`a.product-edit[data-product=%q]`, product))), chromedp.WaitVisible(chromedp.CSS(`#model-rows tr`)))
	if n := evalJS[int](b, `document.querySelectorAll('#product-save, #product-deploy, #product-undeploy, #model-add').length + document.querySelectorAll('#product-form input:not(:disabled)').length`); n != 0 {
		t.Fatalf("a viewer has %d product controls", n)
	}
	b.run("the devices", goTo("#/devices?product="+product), chromedp.WaitVisible(chromedp.CSS(`a.device-link`)))
	if n := evalJS[int](b, `document.querySelectorAll('#new-device-open, #import-open').length`); n != 0 {
		t.Fatal("a viewer is offered to create devices")
	}
	b.run("the device", goTo("#/device/"+devID), chromedp.WaitVisible(chromedp.ID("device-name")))
	b.poll("its properties", `document.querySelectorAll('td.value[data-property]').length === 3`)
	if n := evalJS[int](b, `document.querySelectorAll('#device-actions, #read-card, #invoke-card').length`); n != 0 {
		t.Fatalf("a viewer has %d device controls", n)
	}
	b.checkExceptions()
	t.Logf("from the server's start to the end: %s", time.Since(start).Round(time.Millisecond))
}

// goTo opens a page of the console by its hash, as a link does.
func goTo(hash string) chromedp.Action[chromedp.Void] {
	return chromedp.Evaluate[chromedp.Void](fmt.Sprintf(`location.hash = %q`, hash))
}

// fill sets an input's or a select's value as typing or choosing does:
// input and change events follow.
func fill(sel, value string) chromedp.Action[chromedp.Void] {
	return chromedp.Evaluate[chromedp.Void](fmt.Sprintf(`(() => {
		const e = document.querySelector(%q);
		e.value = %q;
		e.dispatchEvent(new Event('input', { bubbles: true }));
		e.dispatchEvent(new Event('change', { bubbles: true }));
	})()`, sel, value))
}

// narrowShot saves the window as it is (not the full page, which would
// resize it) in $DEVICEHUB_CONSOLE_SCREENSHOTS.
func (b *browser) narrowShot(name string) {
	dir := os.Getenv("DEVICEHUB_CONSOLE_SCREENSHOTS")
	if dir == "" {
		return
	}
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644)
	}
	if err != nil {
		b.t.Logf("screenshot %s: %v", name, err)
	}
}
