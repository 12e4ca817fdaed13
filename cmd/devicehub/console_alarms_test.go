package main

import (
	"fmt"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	mqtt "github.com/eclipse/paho.mqtt.golang"

	"devicehub/bench/testkit"
	"devicehub/ingest/mqttconn"
	"devicehub/ingest/mqtttest"
)

// TestConsoleAlarmsInBrowser: a device's report crosses a rule's
// threshold; the console's Alarms page lists the alarm, its device page
// shows it, and the page acknowledges and clears it with comments.
func TestConsoleAlarmsInBrowser(t *testing.T) {
	chromium := findChromium(t)
	own := startOwn(t, "consolealarms")
	srv, suffix, token := own.server, own.suffix, own.token
	product, dev := "ca"+suffix, "boiler-"+suffix
	srv.call(t, token, "POST", "/api/device/product", map[string]any{"id": product, "name": "Boiler", "classifiedId": "test",
		"modelFrom": "custom", "accessId": "mqtt", "deviceType": "device", "metadata": alarmTestModel})
	srv.call(t, token, "POST", "/api/device/instance", map[string]any{"id": dev, "name": "Basement boiler", "productId": product})
	srv.call(t, token, "POST", "/api/alarm/config", map[string]any{"id": "hot-" + suffix, "name": "Boiler too hot", "productId": product,
		"severity": "major", "enabled": true, "clear": map[string]any{"type": "manual"},
		"trigger": map[string]any{"type": "property", "all": []any{map[string]any{"property": "temp", "op": "gt", "value": 80}}}})
	gw := mqtttest.Gateway(t, own.broker.URL())
	o := mqtt.NewClientOptions().AddBroker(own.broker.URL()).SetClientID("gw-" + suffix).SetCleanSession(true)
	gw(o)
	pub := mqtt.NewClient(o)
	if err := mqttconn.WaitToken(pub.Connect(), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	defer pub.Disconnect(0)
	n := 0
	testkit.Eventually(t, 30*time.Second, "the alarm", func() bool {
		n++
		_ = mqttconn.WaitToken(pub.Publish("/"+product+"/"+dev+"/properties/report", 1, false, fmt.Sprintf(`{"messageId":"m%d","properties":{"temp":95}}`, n)), 5*time.Second)
		recs, _ := srv.alarmRecords(t, token)
		return len(recs) == 1
	})

	b := newBrowser(t, chromium)
	b.run("sign in",
		chromedp.Navigate(srv.base+"/"),
		chromedp.WaitVisible(chromedp.ID("login-form")),
		chromedp.SendKeys(chromedp.ID("login-user"), "admin"),
		chromedp.SendKeys(chromedp.ID("login-password"), "admin123"),
		chromedp.Click(chromedp.ID("login-submit")),
		chromedp.WaitVisible(chromedp.ID("nav-alarms")))
	b.run("open the alarms", chromedp.Click(chromedp.ID("nav-alarms")), chromedp.WaitVisible(chromedp.ID("alarm-search")))
	b.poll("the alarm listed", fmt.Sprintf(`(document.querySelector('.alarm-device') || {}).textContent === %q &&
		document.querySelector('[data-severity]').dataset.severity === 'major'`, dev))
	b.run("its device page", chromedp.Click(chromedp.CSS(`.alarm-device`)), chromedp.WaitVisible(chromedp.ID("device-alarms")))
	b.poll("the device's active alarm", `document.querySelectorAll('#device-alarms li').length === 1 &&
		document.querySelector('#device-alarms li').textContent.includes('Boiler too hot')`)
	b.run("back to the alarms", chromedp.Click(chromedp.ID("nav-alarms")), chromedp.WaitVisible(chromedp.CSS(`.alarm-ack`)))
	b.run("acknowledge", chromedp.Evaluate[chromedp.Void](`window.prompt = () => 'on it'`), chromedp.Click(chromedp.CSS(`.alarm-ack`)))
	b.poll("acknowledged", `document.querySelector('.alarm-state').textContent === 'active, acknowledged' &&
		document.getElementById('view').textContent.includes('admin: on it') && !document.querySelector('.alarm-ack')`)
	b.run("clear", chromedp.Evaluate[chromedp.Void](`window.prompt = () => 'fan replaced'`), chromedp.Click(chromedp.CSS(`.alarm-clear`)))
	b.poll("no active alarm left", `document.getElementById('view').textContent.includes('No active alarm.')`)
	b.shot("alarms")
	var recs []struct {
		State      string `json:"state"`
		ClearedBy  string `json:"clearedBy"`
		ClearValue string `json:"clearValue"`
		AckComment string `json:"ackComment"`
	}
	var page struct {
		Data *[]struct {
			State      string `json:"state"`
			ClearedBy  string `json:"clearedBy"`
			ClearValue string `json:"clearValue"`
			AckComment string `json:"ackComment"`
		} `json:"data"`
	}
	page.Data = &recs
	srv.do(t, token, "POST", "/api/alarm/record/_query", map[string]any{}, &page)
	if len(recs) != 1 || recs[0].State != "cleared" || recs[0].ClearedBy != "admin" || recs[0].ClearValue != "fan replaced" || recs[0].AckComment != "on it" {
		t.Errorf("the record after the console's ack and clear: %+v", recs)
	}
	b.checkExceptions()
}
