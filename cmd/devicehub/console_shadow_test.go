package main

import (
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	mqtt "github.com/eclipse/paho.mqtt.golang"

	"devicehub/bench/testkit"
	"devicehub/ingest/mqtttest"
)

// TestConsoleShadow drives the device page's desired state in chromium
// against the real binary: a desired value set there reaches the device
// as a delta and shows as still to apply, against the reported value;
// once the device reports it, the page shows it applied; "Write now"
// writes the property and shows the device took it.
func TestConsoleShadow(t *testing.T) {
	t.Parallel()
	chromium := findChromium(t)
	own := startOwn(t, "consoleshadow", "DEVICEHUB_INGEST_FLUSH_INTERVAL=100ms")
	srv, broker, suffix, token := own.server, own.broker, own.suffix, own.token
	product, device := "csp"+suffix, "csd"+suffix
	srv.deployDevice(t, token, product, device)
	var p map[string]any
	srv.do(t, token, "GET", "/api/device-product/"+product, nil, &p)
	p["metadata"] = `{"properties":[{"id":"target","name":"Target","valueType":{"type":"float"},"expands":{"type":["read","write","report"]}}]}`
	srv.call(t, token, "PATCH", "/api/device-product", p)

	topic := func(level string) string { return "/" + product + "/" + device + "/" + level }
	var mu sync.Mutex
	var deltas, writes []map[string]any
	o := mqtt.NewClientOptions().AddBroker(broker.URL()).SetClientID(testkit.RandID("csdev-")).SetCleanSession(true)
	mqtttest.Gateway(t, broker.URL())(o)
	dev := mqtt.NewClient(o)
	if tok := dev.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatal(tok.Error())
	}
	defer dev.Disconnect(0)
	tok := dev.SubscribeMultiple(map[string]byte{topic("shadow/delta"): 1, topic("properties/write"): 1}, func(c mqtt.Client, m mqtt.Message) {
		var msg map[string]any
		if json.Unmarshal(m.Payload(), &msg) != nil {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if strings.HasSuffix(m.Topic(), "/properties/write") {
			writes = append(writes, msg)
			body, _ := json.Marshal(map[string]any{"messageId": msg["messageId"], "success": true, "properties": msg["properties"]})
			c.Publish(topic("properties/write/reply"), 1, false, body)
			return
		}
		deltas = append(deltas, msg)
	})
	if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatal(tok.Error())
	}
	publish := func(level, payload string) {
		if tok := dev.Publish(topic(level), 1, false, payload); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
			t.Fatal(tok.Error())
		}
	}
	publish("online", `{}`)
	publish("properties/report", `{"properties":{"target":19}}`)

	b := newBrowser(t, chromium)
	b.run("sign in", chromedp.Navigate(srv.base+"/"), chromedp.WaitVisible(chromedp.ID("login-form")),
		chromedp.SendKeys(chromedp.ID("login-user"), "admin"),
		chromedp.SendKeys(chromedp.ID("login-password"), "admin123"),
		chromedp.Click(chromedp.ID("login-submit")),
		chromedp.WaitVisible(chromedp.ID("top")))
	b.run("open the device", chromedp.Navigate(srv.base+"/#/device/"+device), chromedp.WaitVisible(chromedp.ID("device-shadow")))
	b.poll("the desired state loaded", `document.querySelector('#shadow-table').dataset.version === '0'`)

	b.run("set a desired value",
		chromedp.SendKeys(chromedp.ID("shadow-value"), "21.5"),
		chromedp.Click(chromedp.ID("shadow-set")))
	b.poll("the desired value, still to apply", `(() => { const r = document.querySelector('#shadow-table tr[data-property=target]');
		return r && r.classList.contains('delta') && r.querySelector('td.desired').textContent === '21.5' &&
			r.querySelector('td.reported').textContent === '19' && document.querySelector('#shadow-table').dataset.version === '1'; })()`)
	b.shot("shadow-delta")
	testkit.Eventually(t, 10*time.Second, "the device's delta", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(deltas) > 0 && deltas[len(deltas)-1]["version"] == 1.0
	})

	publish("properties/report", `{"properties":{"target":21.5}}`)
	testkit.Eventually(t, 10*time.Second, "the report stored", func() bool {
		var sh struct{ Delta map[string]any }
		srv.do(t, token, "GET", "/api/device/instance/"+device+"/shadow", nil, &sh)
		return len(sh.Delta) == 0
	})
	b.run("reload the device page", chromedp.Reload(), chromedp.WaitVisible(chromedp.ID("device-shadow")))
	b.poll("the desired value applied", `(() => { const r = document.querySelector('#shadow-table tr[data-property=target]');
		return r && !r.classList.contains('delta') && r.querySelector('td.reported').textContent === '21.5'; })()`)

	b.run("write the property now",
		chromedp.Evaluate[chromedp.Void](`document.getElementById('shadow-value').value = ''`),
		chromedp.SendKeys(chromedp.ID("shadow-value"), "23"),
		chromedp.Click(chromedp.ID("shadow-write")))
	b.poll("the write answered", `document.querySelector('#shadow-message').textContent.includes('The device took target')`)
	mu.Lock()
	n := len(writes)
	mu.Unlock()
	if n != 1 {
		t.Fatalf("the device got %d writes", n)
	}
	b.checkExceptions()
}
