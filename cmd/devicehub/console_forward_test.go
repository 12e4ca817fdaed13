package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"devicehub/bench/testkit"
	"devicehub/ingest/mqttconn"
)

// TestConsoleForwardInBrowser drives the Notifications pages' forwarding
// rules in headless chromium against the real binary and a real webhook:
// a rule is refused for its URL (the message beside the URL), then made
// from the form for one property of one device; the device's reports
// reach the webhook, and the rule's status on the page counts them sent;
// disable, enable, edit and delete work from the list; at 420 px the page
// fits.
func TestConsoleForwardInBrowser(t *testing.T) {
	t.Parallel()
	chromium := findChromium(t)
	var mu sync.Mutex
	var lines []map[string]any
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		sc := bufio.NewScanner(bytes.NewReader(b))
		mu.Lock()
		for sc.Scan() {
			var m map[string]any
			if json.Unmarshal(sc.Bytes(), &m) == nil {
				lines = append(lines, m)
			}
		}
		mu.Unlock()
	}))
	defer rcv.Close()
	received := func() int { mu.Lock(); defer mu.Unlock(); return len(lines) }

	own := startOwn(t, "consoleforward", "DEVICEHUB_FORWARD_DIR="+t.TempDir())
	srv, suffix, token := own.server, own.suffix, own.token
	product, dev := "cf"+suffix, "valve-"+suffix
	own.productWithDevice(t, product, "Valves "+suffix, alarmTestModel, dev, "Valve", true)

	b := newBrowser(t, chromium)
	signIn(b, srv.base, "admin", "admin123", chromedp.WaitVisible(chromedp.ID("nav-notify")))
	b.run("open the forwarding rules", chromedp.Click(chromedp.ID("nav-notify")), chromedp.WaitVisible(chromedp.CSS(`nav.tabs a[data-tab=forward]`)),
		chromedp.Click(chromedp.CSS(`nav.tabs a[data-tab=forward]`)), chromedp.WaitVisible(chromedp.ID("forward-new")))
	b.poll("no rule yet", `document.getElementById('forward-list').textContent.includes('No forwarding rule yet.')`)
	b.run("new rule", chromedp.Click(chromedp.ID("forward-new")), chromedp.WaitVisible(chromedp.ID("forward-url")))
	b.poll("the product offered", fmt.Sprintf(`!!document.querySelector('#forward-product option[value=%q]')`, product))
	b.run("a URL that is none", fill("#forward-id", "out"), fill("#forward-name", "To the lake"), fill("#forward-product", product),
		fill("#forward-devices", dev), fill("#forward-properties", "temp"), fill("#forward-batch-ms", "50"),
		chromedp.Click(chromedp.CSS(`#forward-types input[value=property]`)),
		fill("#forward-url", "ftp://nowhere"), chromedp.Click(chromedp.ID("forward-save")))
	b.poll("the refusal beside the URL", `(() => {
		const e = document.getElementById('forward-url').nextElementSibling;
		return !!e && e.classList.contains('field-error') && e.dataset.for === 'webhook.url';
	})()`)
	b.run("a real URL", fill("#forward-url", rcv.URL), chromedp.Click(chromedp.ID("forward-save")))
	b.poll("the rule listed", `!!document.querySelector('tr[data-forward=out]') && !document.getElementById('forward-form')`)
	var rule struct {
		ProductID  string   `json:"productId"`
		DeviceIDs  []string `json:"deviceIds"`
		Types      []string `json:"types"`
		Properties []string `json:"properties"`
		Enabled    bool     `json:"enabled"`
		Webhook    struct {
			URL     string `json:"url"`
			BatchMs int64  `json:"batchMs"`
		} `json:"webhook"`
	}
	srv.do(t, token, "GET", "/api/notify/forward/out", nil, &rule)
	if fmt.Sprint(rule.ProductID, rule.DeviceIDs, rule.Types, rule.Properties, rule.Enabled, rule.Webhook.URL, rule.Webhook.BatchMs) !=
		fmt.Sprint(product, []string{dev}, []string{"property"}, []string{"temp"}, true, rcv.URL, 50) {
		t.Fatalf("the rule from the form: %+v", rule)
	}

	// The device reports: the webhook receives, the page counts them sent.
	pub := gateway(t, own.broker.URL(), "gw-"+suffix)
	n := 0
	testkit.Eventually(t, 30*time.Second, "reports forwarded", func() bool {
		n++
		_ = mqttconn.WaitToken(pub.Publish("/"+product+"/"+dev+"/properties/report", 1, false, fmt.Sprintf(`{"messageId":"m%d","properties":{"temp":%d}}`, n, n)), 5*time.Second)
		return received() >= 3
	})
	b.poll("the status counts them", `(() => {
		const s = document.querySelector('tr[data-forward=out] .forward-status');
		return !!s && Number(s.dataset.sent) >= 3;
	})()`)
	b.shot("forward")

	btn := func(action string) string { return fmt.Sprintf(`button[data-action=%s][data-forward=out]`, action) }
	// The list re-renders every 3 s (the status moves): each click and
	// wait is one evaluation in the page (browser.click, poll).
	shown := func(sel string) string { return fmt.Sprintf(`!!document.querySelector(%q)`, sel) }
	b.click("disable", btn("disable"))
	b.poll("Enable shown", shown(btn("enable")))
	srv.do(t, token, "GET", "/api/notify/forward/out", nil, &rule)
	if rule.Enabled {
		t.Fatal("enabled after Disable")
	}
	b.click("enable", btn("enable"))
	b.poll("Disable shown", shown(btn("disable")))
	srv.do(t, token, "GET", "/api/notify/forward/out", nil, &rule)
	if !rule.Enabled {
		t.Fatal("disabled after Enable")
	}
	narrowFits(b, "forwarding rules", "#/notify/forward", btn("edit"))
	b.click("edit", btn("edit"))
	b.run("edit", chromedp.WaitVisible(chromedp.ID("forward-name")))
	b.run("every property", fill("#forward-properties", ""), chromedp.Click(chromedp.ID("forward-save")))
	b.poll("saved", `document.getElementById('forward-note').textContent === 'Saved To the lake.'`)
	srv.do(t, token, "GET", "/api/notify/forward/out", nil, &rule)
	if len(rule.Properties) != 0 || rule.Webhook.URL != rcv.URL {
		t.Fatalf("the rule after the edit: %+v", rule)
	}
	b.run("confirm", chromedp.Evaluate[chromedp.Void](`window.confirm = () => true`))
	b.click("delete", btn("delete"))
	b.poll("deleted", `document.getElementById('forward-list').textContent.includes('No forwarding rule yet.')`)
	if res, err := srv.api(token).Request("GET", "/api/notify/forward/out", nil); err != nil || res.HTTPStatus != 404 {
		t.Fatalf("the deleted rule answers %d (%v)", res.HTTPStatus, err)
	}
	b.checkExceptions()
}
