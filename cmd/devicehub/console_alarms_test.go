package main

import (
	"fmt"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"devicehub/bench/testkit"
	"devicehub/ingest/mqttconn"
)

// TestConsoleAlarmsInBrowser: a device's report crosses a rule's
// threshold; the console's Alarms page lists the alarm, its device page
// shows it, and the page acknowledges and clears it with comments.
func TestConsoleAlarmsInBrowser(t *testing.T) {
	t.Parallel()
	chromium := findChromium(t)
	own := startOwn(t, "consolealarms")
	srv, suffix, token := own.server, own.suffix, own.token
	product, dev := "ca"+suffix, "boiler-"+suffix
	own.productWithDevice(t, product, "Boiler", alarmTestModel, dev, "Basement boiler", true)
	own.hotRule(t, "hot-"+suffix, "Boiler too hot", product)
	pub := gateway(t, own.broker.URL(), "gw-"+suffix)
	n := 0
	testkit.Eventually(t, 30*time.Second, "the alarm", func() bool {
		n++
		_ = mqttconn.WaitToken(pub.Publish("/"+product+"/"+dev+"/properties/report", 1, false, fmt.Sprintf(`{"messageId":"m%d","properties":{"temp":95}}`, n)), 5*time.Second)
		recs, _ := srv.alarmRecords(t, token)
		return len(recs) == 1
	})

	b := newBrowser(t, chromium)
	signIn(b, srv.base, "admin", "admin123", chromedp.WaitVisible(chromedp.ID("nav-alarms")))
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
