package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"devicehub/bench/testkit"
)

// TestConsoleInBrowser drives the built-in console (api/console) in
// Debian's chromium, headless, against the real binary, PostgreSQL,
// ClickHouse and a private Mosquitto: a wrong password shows the API's
// message, the right one signs in; the product search finds its product,
// the device search one device of three; the device's page shows its
// thing model's properties, and values and state changes the device
// publishes over MQTT appear on it live (SSE, /api/live); the history
// chart draws the values, the hourly aggregate chart has its 24 bars with
// this hour's average; the overview's message-volume chart has one bar
// per day (30) and per month (12), each as high as endpoint 14 says.
// Names are in natural, case-insensitive order wherever the console lists
// them ("Meter 1, meter 2, Meter 10": the product list and both product
// choosers). A page exception fails the test.
//
// chromium missing is a failure, not a skip: `bash .ci/services` (make
// test) installs it. DEVICEHUB_CONSOLE_SCREENSHOTS=<dir> saves a
// screenshot of each page there.
func TestConsoleInBrowser(t *testing.T) {
	t.Parallel()
	chromium := findChromium(t)
	own := startOwn(t, "console", "DEVICEHUB_INGEST_FLUSH_INTERVAL=100ms")
	srv, broker, suffix, token := own.server, own.broker, own.suffix, own.token
	start := time.Now()

	// The console's routes beside the API's: / is the page, an /api miss
	// is still the API's 404 envelope.
	checkConsoleRoutes(t, srv.base, token)

	product := "cp" + suffix
	srv.call(t, token, "POST", "/api/device/product", map[string]any{
		"id": product, "name": "Boiler " + suffix, "classifiedId": "test", "modelFrom": "custom", "accessId": "mqtt", "deviceType": "device"})
	var p map[string]any // its thing model: as the spec says, the whole product back with metadata
	srv.do(t, token, "GET", "/api/device-product/"+product, nil, &p)
	p["metadata"] = `{"properties":[` +
		`{"id":"temperature","name":"Temperature","valueType":{"type":"float","scale":1}},` +
		`{"id":"humidity","name":"Humidity","valueType":{"type":"int","unit":"percent"}},` +
		`{"id":"mode","name":"Mode","valueType":{"type":"enum","elements":[{"value":"eco","text":"Economy"},{"value":"boost","text":"Boost"}]}}]}`
	srv.call(t, token, "PATCH", "/api/device-product", p)
	srv.call(t, token, "POST", "/api/device-product/"+product+"/deploy", nil)
	var created struct {
		Configuration struct {
			SecureID  string `json:"secureId"`
			SecureKey string `json:"secureKey"`
		} `json:"configuration"`
	}
	devID := "boiler-" + suffix
	srv.do(t, token, "POST", "/api/device/instance", map[string]any{"id": devID, "name": "Basement boiler", "productId": product}, &created)
	srv.call(t, token, "POST", "/api/device/instance/"+devID+"/deploy", nil)
	for _, name := range []string{"Attic fan", "Garage door"} {
		id := strings.ToLower(strings.Fields(name)[0]) + "-" + suffix
		srv.call(t, token, "POST", "/api/device/instance", map[string]any{"id": id, "name": name, "productId": product})
	}
	// Products whose names byte order puts wrongly ("Meter 1, Meter 10,
	// meter 2"), and a collation too; the console shows them naturally.
	for i, name := range []string{"Meter 10", "meter 2", "Meter 1"} {
		srv.call(t, token, "POST", "/api/device/product", map[string]any{
			"id": fmt.Sprintf("cm%d%s", i, suffix), "name": name, "classifiedId": "test", "modelFrom": "custom", "accessId": "mqtt", "deviceType": "device"})
	}
	natural := `["Boiler ` + suffix + `","Meter 1","meter 2","Meter 10"]`
	// optionNames is the product names a chooser offers, in its order.
	optionNames := func(sel string) string {
		return `JSON.stringify([...document.querySelectorAll('` + sel + ` option')].filter((o) => o.value).map((o) => o.textContent.replace(/ \(.*$/, ''))) === '` + natural + `'`
	}

	b := newBrowser(t, chromium)
	b.run("open the console", chromedp.Navigate(srv.base+"/"), chromedp.WaitVisible(chromedp.ID("login-form")))
	b.shot("login")

	// A wrong password: the envelope's message, on the form.
	b.run("sign in with a wrong password",
		chromedp.SendKeys(chromedp.ID("login-user"), "admin"),
		chromedp.SendKeys(chromedp.ID("login-password"), "wrong"),
		chromedp.Click(chromedp.ID("login-submit")),
		chromedp.WaitVisible(chromedp.ID("login-error")))
	if msg := b.text("#login-error"); !strings.Contains(msg, "wrong username or password") {
		t.Fatalf("login error shown: %q", msg)
	}
	b.run("sign in",
		chromedp.Evaluate[chromedp.Void](`document.getElementById('login-password').value = ''`),
		chromedp.SendKeys(chromedp.ID("login-password"), "admin123"),
		chromedp.Click(chromedp.ID("login-submit")),
		chromedp.WaitVisible(chromedp.CSS(`#volume-chart svg`)))
	b.shot("overview")
	b.poll("the overview's products in natural order", optionNames("#volume-product"))

	// The product list, searched by name.
	b.run("open the product list", chromedp.Click(chromedp.CSS(`a[data-nav=products]`)), chromedp.WaitVisible(chromedp.ID("product-search")))
	b.poll("the product list in natural order", `JSON.stringify([...document.querySelectorAll('#view table.list tbody a.strong')].map((a) => a.textContent)) === '`+natural+`'`)
	b.run("search products", chromedp.SendKeys(chromedp.ID("product-search"), "boiler "+suffix))
	b.poll("the search to find the product", fmt.Sprintf(
		`document.querySelectorAll('#view table.list tbody tr').length === 1 && document.querySelector('#view table.list tbody').textContent.includes(%q)`, product))
	b.shot("products")
	b.run("search products for nothing", chromedp.SendKeys(chromedp.ID("product-search"), "-nothing"))
	b.poll("the empty list", `(document.querySelector('#view .empty') || {textContent: ''}).textContent.includes('No product name contains')`)
	b.shot("products-empty")

	// Find the device: three in the list, one after the search.
	b.run("open the device list", chromedp.Click(chromedp.CSS(`a[data-nav=devices]`)), chromedp.WaitVisible(chromedp.ID("device-search")))
	b.poll("the list of three devices", `document.querySelectorAll('#view table.list tbody tr').length === 3`)
	importDevices(t, b, srv, token, product, suffix, optionNames("#import-product"))
	b.run("search", chromedp.SendKeys(chromedp.ID("device-search"), "basement"))
	b.poll("the search to leave one device", fmt.Sprintf(
		`document.querySelectorAll('#view table.list tbody tr').length === 1 && document.querySelector('a.device-link').dataset.id === %q`, devID))
	b.shot("devices")

	// Its page: the thing model's properties, no value yet, live updates on.
	b.run("open the device", chromedp.Click(chromedp.CSS(`a.device-link`)), chromedp.WaitVisible(chromedp.ID("device-name")))
	if name := b.text("#device-name"); name != "Basement boiler" {
		t.Fatalf("device page title %q", name)
	}
	b.poll("the properties, their latest values loaded", `document.querySelectorAll('td.value[data-property]').length === 3 && document.querySelector('#device-properties').dataset.latest === 'loaded'`)
	b.poll("live updates to connect", `document.querySelector('#live-status').classList.contains('on')`)
	if s := b.text(`#device-state`); s != "Offline" {
		t.Fatalf("device state before it connects: %q", s)
	}

	// The device connects and reports: the page shows both live.
	dev, err := dial(broker.URL(), devID, created.Configuration.SecureID, created.Configuration.SecureKey, nil)
	if err != nil {
		t.Fatalf("device connect: %v", err)
	}
	t.Cleanup(func() { dev.Disconnect(0) })
	publish(t, dev, "/"+product+"/"+devID+"/online", `{}`)
	b.poll("the state to turn online", `document.querySelector('#device-state [data-state]').dataset.state === 'online'`)
	publish(t, dev, "/"+product+"/"+devID+"/properties/report", `{"properties":{"temperature":21.46,"humidity":40,"mode":"eco"}}`)
	b.poll("the reported values", `(() => {
		const v = (p) => document.querySelector('td.value[data-property="' + p + '"]').textContent;
		return v('temperature') === '21.5' && v('humidity') === '40%' && v('mode') === 'Economy';
	})()`)
	publish(t, dev, "/"+product+"/"+devID+"/properties/report", `{"properties":{"temperature":23}}`)
	b.poll("the next value", `document.querySelector('td.value[data-property="temperature"]').textContent === '23.0'`)
	b.poll("the history line to have both values", `document.querySelectorAll('#property-chart circle.dot').length === 2`)
	b.shot("device")

	// The hourly average: 24 bars, this hour's the mean of both values.
	// Live events may come before their values are stored, and history
	// (device_property) may show them before their insert has ended, the
	// hourly rollup being written by a view inside that insert: the
	// chart's query waits until the rollup counts both.
	testkit.Eventually(t, 10*time.Second, "both temperatures in the hourly rollup", func() bool {
		var items []struct {
			Data struct {
				Value uint64 `json:"value"`
			} `json:"data"`
		}
		srv.do(t, token, "POST", "/api/dashboard/_multi", []map[string]any{{"dashboard": "device", "object": product,
			"measurement": "properties", "dimension": "agg", "params": map[string]any{"deviceId": devID, "properties": []string{"temperature"},
				"agg": "count", "time": "1h", "limit": 24, "from": "now-23h/h", "to": "now"}}}, &items)
		var n uint64
		for _, it := range items {
			n += it.Data.Value
		}
		return n == 2
	})

	b.run("choose hourly averages", setSelect("#chart-mode", "1h"))
	b.poll("24 hourly bars", `document.querySelectorAll('#property-chart rect.bar').length === 24`)
	// Both values fell in this hour (avg 22.23), or, across an hour's
	// edge, one in each of the last two.
	withData := evalJS[[]float64](b, `[...document.querySelectorAll('#property-chart rect.bar:not(.empty)')].map((r) => Number(r.dataset.value))`)
	near := func(a, b float64) bool { return a-b < 1e-9 && b-a < 1e-9 }
	if !(len(withData) == 1 && near(withData[0], 22.23)) && !(len(withData) == 2 && near(withData[0], 21.46) && near(withData[1], 23)) {
		t.Fatalf("hourly average temperature bars with data: %v, want [22.23]", withData)
	}
	b.shot("device-hourly")

	// The device leaves: the state turns offline.
	publish(t, dev, "/"+product+"/"+devID+"/offline", `{}`)
	b.poll("the state to turn offline", `document.querySelector('#device-state [data-state]').dataset.state === 'offline'`)

	// Message volume: one bar per day, then per month, as endpoint 14 counts.
	b.run("open the overview", chromedp.Click(chromedp.CSS(`a[data-nav=overview]`)), chromedp.WaitVisible(chromedp.CSS(`#volume-chart svg`)))
	checkVolume(t, b, srv, token, "day", 30)
	b.shot("overview-day")
	checkVolume(t, b, srv, token, "month", 12)

	b.run("sign out", chromedp.Click(chromedp.ID("logout")), chromedp.WaitVisible(chromedp.ID("login-form")))
	if tok := evalJS[string](b, `sessionStorage.getItem('devicehub.token') || ''`); tok != "" {
		t.Fatal("the token is still in sessionStorage after signing out")
	}
	b.checkExceptions()
	t.Logf("from the server's start to signing out: %s", time.Since(start).Round(time.Millisecond))
}

// importDevices imports devices from a CSV file with the Devices page's
// form: a file with a row twice shows that row in the error table and
// stores nothing; a good one, deployed, is stored, offers the logins for
// download and shows in the list, the progress bar at its end. It leaves
// the list as it found it. inOrder is true (JavaScript) when the form's
// products are in the console's order.
func importDevices(t *testing.T, b *browser, srv *server, token, product, suffix, inOrder string) {
	t.Helper()
	dir := t.TempDir()
	bad, good := filepath.Join(dir, "bad.csv"), filepath.Join(dir, "good.csv")
	ids := []string{"imp1-" + suffix, "imp2-" + suffix}
	_ = os.WriteFile(bad, []byte("id,name\n"+ids[0]+",Imported 1\n"+ids[0]+",Imported again\n"), 0o644)
	_ = os.WriteFile(good, []byte("id,name,description\n"+ids[0]+",Imported 1,\n"+ids[1]+",Imported 2,from the console\n"), 0o644)
	b.run("open the import form", chromedp.Click(chromedp.ID("import-open")), chromedp.WaitVisible(chromedp.ID("import-form")))
	b.poll("the products to choose from", fmt.Sprintf(`!!document.querySelector('#import-product option[value=%q]')`, product))
	b.poll("the products to choose from in natural order", inOrder)
	b.run("import a file with a row twice", setSelect("#import-product", product),
		chromedp.SetUploadFiles(`#import-file`, []string{bad}), chromedp.Click(chromedp.ID("import-submit")))
	b.poll("the refused row", `document.querySelectorAll('#import-errors tbody tr').length === 1 && document.querySelector('#import-errors tbody tr').dataset.row === '2'`)
	if p := evalJS[string](b, `document.querySelector('#import-progress').dataset.phase + ' ' + document.querySelector('#import-progress').value`); p != "done 100" {
		t.Fatalf("progress bar after the answer: %s", p)
	}
	b.shot("devices-import-refused")
	b.run("import a good file, deployed", chromedp.SetUploadFiles(`#import-file`, []string{good}),
		chromedp.Click(chromedp.ID("import-deploy")), chromedp.Click(chromedp.ID("import-submit")))
	b.poll("the import to succeed", `document.querySelector('#import-status').textContent.includes('Imported 2 devices, deployed') && !!document.querySelector('#import-keys')`)
	b.poll("the imported devices in the list", `document.querySelectorAll('#view table.list tbody tr').length === 5`)
	b.shot("devices-imported")
	for _, id := range ids {
		var d struct {
			State struct{ Value string } `json:"state"`
		}
		srv.do(t, token, "GET", "/api/device/instance/"+id, nil, &d)
		if d.State.Value != "offline" {
			t.Fatalf("imported device %s: state %q, want offline (deployed)", id, d.State.Value)
		}
	}
	srv.call(t, token, "POST", "/api/device/instance/batch/_undeploy", ids)
	srv.call(t, token, "POST", "/api/device/instance/batch/_delete", ids)
	b.run("close the import form", chromedp.Click(chromedp.ID("import-open")))
	b.run("reload the list", chromedp.Reload())
	b.poll("the list of three devices again", `document.querySelectorAll('#view table.list tbody tr').length === 3`)
}

// checkConsoleRoutes checks what the console adds to the server's routes.
func checkConsoleRoutes(t *testing.T, base, token string) {
	t.Helper()
	get := func(path string) (*http.Response, map[string]any) {
		req, _ := http.NewRequest("GET", base+path, nil)
		req.Header.Set("X-Access-Token", token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var env map[string]any
		if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
			_ = json.NewDecoder(resp.Body).Decode(&env)
		}
		return resp, env
	}
	if resp, _ := get("/"); resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/html; charset=utf-8" {
		t.Fatalf("GET /: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	if resp, _ := get("/assets/app.js"); resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/javascript; charset=utf-8" {
		t.Fatalf("GET /assets/app.js: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	for _, path := range []string{"/api/no-such-thing", "/api/", "/assets/nope.js", "/nope"} {
		resp, env := get(path)
		if resp.StatusCode != 404 || env["code"] != "not_found" {
			t.Fatalf("GET %s: %d %v, want the API's 404 envelope", path, resp.StatusCode, env)
		}
	}
}

// checkVolume shows the message-volume chart of a period and compares its
// bars with what endpoint 14 answers for the same query. Ingest may still
// be storing, so both are read again until they agree.
func checkVolume(t *testing.T, b *browser, srv *server, token, period string, bars int) {
	t.Helper()
	params := map[string]any{"time": "1d", "format": "yyyy-MM-dd", "limit": 30, "from": "now-29d/d", "to": "now"}
	if period == "month" {
		params = map[string]any{"time": "1M", "format": "yyyy-MM", "limit": 12, "from": "now-11M/M", "to": "now"}
	}
	var got, want []string
	deadline := time.Now().Add(10 * time.Second)
	for {
		b.run("show the "+period+" chart", chromedp.Click(chromedp.CSS(`button[data-period=`+period+`]`)))
		b.poll(fmt.Sprintf("%d bars per %s", bars, period), fmt.Sprintf(
			`document.querySelector('button[data-period=%s]').getAttribute('aria-pressed') === 'true' && !document.querySelector('#volume-chart').classList.contains('loading') && document.querySelectorAll('#volume-chart rect.bar').length === %d`, period, bars))
		got = evalJS[[]string](b, `[...document.querySelectorAll('#volume-chart rect.bar')].map((r) => r.dataset.label + '=' + r.dataset.value)`)
		var items []struct {
			Data struct {
				Value      uint64 `json:"value"`
				TimeString string `json:"timeString"`
			} `json:"data"`
		}
		srv.do(t, token, "POST", "/api/dashboard/_multi", []map[string]any{{"dashboard": "device", "object": "message",
			"measurement": "quantity", "dimension": "agg", "group": "volume", "params": params}}, &items)
		want = want[:0]
		var today uint64
		for i := len(items) - 1; i >= 0; i-- { // oldest first, as drawn
			label := items[i].Data.TimeString
			if period == "day" {
				label = label[5:]
			}
			want = append(want, fmt.Sprintf("%s=%d", label, items[i].Data.Value))
		}
		if len(items) > 0 {
			today = items[0].Data.Value
		}
		if strings.Join(got, " ") == strings.Join(want, " ") && today > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("per %s: the chart's bars\n%v\ndiffer from endpoint 14's counts (the newest must be > 0)\n%v", period, got, want)
		}
		time.Sleep(200 * time.Millisecond) // polling: the chart is compared again after a new click
	}
}

// setSelect chooses a value of a <select> as a user does: the change event
// follows.
func setSelect(sel, value string) chromedp.Action[chromedp.Void] {
	return chromedp.Evaluate[chromedp.Void](fmt.Sprintf(
		`(() => { const s = document.querySelector(%q); s.value = %q; s.dispatchEvent(new Event('change')); })()`, sel, value))
}

// findChromium is Debian's chromium. Missing is a failure: CI installs it
// with the other services, and a skip would hide a broken install step.
func findChromium(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("chromium"); err == nil {
		return p
	}
	if _, err := os.Stat("/usr/bin/chromium"); err == nil {
		return "/usr/bin/chromium"
	}
	t.Fatal("chromium is not installed: run `bash .ci/services` (make test does), which installs Debian's chromium")
	return ""
}

// browser is one headless chromium with one tab, for one test.
type browser struct {
	t     *testing.T
	ctx   context.Context // the tab, bounded by the test's deadline
	mu    sync.Mutex
	fails []string // uncaught page exceptions
}

func newBrowser(t *testing.T, path string) *browser {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1366, 860),
	)
	// The whole browser lives at most this long: a hung step fails, it
	// does not hang the test binary.
	life, stopLife := context.WithTimeout(context.Background(), 90*time.Second)
	actx, stopAlloc := chromedp.NewExecAllocator(life, opts...)
	ctx, stopTab := chromedp.NewContext(actx)
	t.Cleanup(func() { stopTab(); stopAlloc(); stopLife() })
	if err := chromedp.Do(ctx); err != nil { // starts the browser
		t.Fatalf("start %s: %v", path, err)
	}
	b := &browser{t: t, ctx: ctx}
	messages := chromedp.Console(ctx)
	go func() {
		for m, err := range messages {
			if err != nil {
				return
			}
			if m.IsException() {
				b.mu.Lock()
				b.fails = append(b.fails, m.String())
				b.mu.Unlock()
			} else if m.Type == chromedp.ConsoleError || m.Type == chromedp.ConsoleWarning {
				t.Logf("browser console: %s", m)
			}
		}
	}()
	return b
}

// run runs steps, failing the test after 20 s or on an error.
func (b *browser) run(what string, steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 20*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		b.fail(what, err)
	}
}

// click clicks the element sel in one evaluation in the page. A page that
// re-renders on a timer (the forwarding rules' status every 3 s) can
// replace the node between chromedp's query and its click ("Could not
// find node with given id").
func (b *browser) click(what, sel string) {
	b.t.Helper()
	if !evalJS[bool](b, fmt.Sprintf(`(() => { const e = document.querySelector(%q); if (!e) return false; e.click(); return true })()`, sel)) {
		b.fail(what, fmt.Errorf("no element %s", sel))
	}
}

// poll waits (10 s at most) until the JavaScript expression is true.
func (b *browser) poll(what, expr string) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 12*time.Second)
	defer cancel()
	if _, err := chromedp.Run(ctx, chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingTimeout(10*time.Second))); err != nil {
		b.fail("wait for "+what, err)
	}
}

func (b *browser) text(sel string) string {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
	if err != nil {
		b.fail("read "+sel, err)
	}
	return strings.TrimSpace(s)
}

func evalJS[T any](b *browser, expr string) T {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		b.fail("evaluate "+expr, err)
	}
	return v
}

// fail ends the test with the step, the error, the page's exceptions and
// what the page shows.
func (b *browser) fail(what string, err error) {
	b.t.Helper()
	b.shot("failed")
	ctx, cancel := context.WithTimeout(b.ctx, 5*time.Second)
	defer cancel()
	page, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`location.href + '\n' + document.body.innerText`))
	b.mu.Lock()
	defer b.mu.Unlock()
	b.t.Fatalf("%s: %v\npage exceptions: %v\npage:\n%s", what, err, b.fails, page)
}

func (b *browser) checkExceptions() {
	b.t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.fails) > 0 {
		b.t.Fatalf("the page threw: %s", strings.Join(b.fails, "\n"))
	}
}

// shot saves a screenshot of the page in $DEVICEHUB_CONSOLE_SCREENSHOTS.
func (b *browser) shot(name string) {
	dir := os.Getenv("DEVICEHUB_CONSOLE_SCREENSHOTS")
	if dir == "" {
		return
	}
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644)
	}
	if err != nil {
		b.t.Logf("screenshot %s: %v", name, err)
	}
}
