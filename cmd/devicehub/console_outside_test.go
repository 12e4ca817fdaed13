package main

import (
	"fmt"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"devicehub/bench/testkit"
	"devicehub/ingest/mqttconn"
)

// TestConsoleOutsideModelInBrowser: a device reports a value of a
// property its thing model does not declare and an enum value the enum
// does not list. Its page shows the undeclared property in a row of its
// own and marks it (a badge whose tooltip gives the reason); the API
// marks values outside the model (outsideModel), so the enum value is
// marked not_in_enum and the declared, fitting value is not; the product
// page shows the product's outsideModelPolicy and changes it.
func TestConsoleOutsideModelInBrowser(t *testing.T) {
	t.Parallel()
	chromium := findChromium(t)
	own := startOwn(t, "consoleoutside", "DEVICEHUB_INGEST_FLUSH_INTERVAL=100ms")
	srv, suffix, token := own.server, own.suffix, own.token
	product, dev := "om"+suffix, "meter-"+suffix
	own.productWithDevice(t, product, "Meters "+suffix, `{"properties":[`+
		`{"id":"temp","name":"Temperature","valueType":{"type":"float"}},`+
		`{"id":"mode","name":"Mode","valueType":{"type":"enum","elements":[{"value":"eco","text":"Eco"},{"value":"boost","text":"Boost"}]}}]}`,
		dev, "Meter", true)

	pub := gateway(t, own.broker.URL(), "gw-"+suffix)
	if err := mqttconn.WaitToken(pub.Publish("/"+product+"/"+dev+"/properties/report", 1, false,
		`{"messageId":"m1","properties":{"temp":21.5,"mode":"turbo","switch":true}}`), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	var latest []struct {
		Data struct {
			Value map[string]any `json:"value"`
		} `json:"data"`
	}
	if !testkit.Within(20*time.Second, func() bool {
		srv.do(t, token, "POST", "/api/dashboard/_multi", []map[string]any{{"dashboard": "device", "object": product, "measurement": "properties",
			"dimension": "history", "group": "latest", "params": map[string]any{"deviceId": dev, "history": 1}}}, &latest)
		return len(latest) == 3
	}) {
		t.Fatalf("the three values not stored in 20 s: %+v\n%s", latest, srv.logTail())
	}
	marked := false // the API marks values outside the model
	for _, v := range latest {
		if _, ok := v.Data.Value["outsideModel"]; ok {
			marked = true
		}
	}

	b := newBrowser(t, chromium)
	signIn(b, srv.base, "admin", "admin123", chromedp.WaitVisible(chromedp.ID("whoami")))
	b.run("the device", goTo("#/device/"+dev), chromedp.WaitVisible(chromedp.CSS(`#device-properties[data-latest=loaded]`)))
	b.poll("the undeclared property in a row of its own, marked", `(() => {
		const td = document.querySelector('td.value[data-property=switch]');
		const badge = td && td.querySelector('.badge.outside');
		return !!badge && badge.dataset.outside === 'undeclared' && badge.title.startsWith('undeclared: ') && td.textContent.startsWith('true');
	})()`)
	if n := evalJS[int](b, `document.querySelectorAll('td.value[data-property=temp] .badge.outside').length`); n != 0 {
		t.Fatal("a value that fits the thing model is marked")
	}
	b.shot("outside-device")
	narrowFits(b, "device with an undeclared value", "#/device/"+dev, `td.value[data-property=switch] .badge.outside`)
	b.checkExceptions()

	var p map[string]any
	srv.do(t, token, "GET", "/api/device-product/"+product, nil, &p)
	if _, ok := p["outsideModelPolicy"]; !ok || !marked {
		t.Fatalf("the API lacks the outsideModel marker or the product's outsideModelPolicy: product has outsideModelPolicy %v, values marked %v", ok, marked)
	}
	b.run("the device again", goTo("#/"), goTo("#/device/"+dev), chromedp.WaitVisible(chromedp.CSS(`#device-properties[data-latest=loaded]`)))
	b.poll("the enum value marked not_in_enum", `(() => {
		const badge = document.querySelector('td.value[data-property=mode] .badge.outside');
		return !!badge && badge.dataset.outside === 'not_in_enum' && badge.title.startsWith('not_in_enum: ');
	})()`)
	if n := evalJS[int](b, `document.querySelectorAll('td.value[data-property=temp] .badge.outside').length`); n != 0 {
		t.Fatal("a value that fits the thing model is marked")
	}
	b.run("the product", goTo("#/product/"+product), chromedp.WaitVisible(chromedp.ID("product-outside-label")))
	if v := evalJS[string](b, `document.getElementById('product-outside-policy').value`); v != "keep" || fmt.Sprint(p["outsideModelPolicy"]) != "map[text:Keep and flag value:keep]" {
		t.Fatalf("the product page shows policy %q, the API %v", v, p["outsideModelPolicy"])
	}
	b.run("drop values outside the model", fill("#product-outside-policy", "drop"), chromedp.Click(chromedp.ID("product-save")))
	b.poll("saved", `document.getElementById('product-note').textContent === 'Saved.'`)
	srv.do(t, token, "GET", "/api/device-product/"+product, nil, &p)
	if policy, _ := p["outsideModelPolicy"].(map[string]any); policy["value"] != "drop" {
		t.Fatalf("policy after the console's save: %v", p["outsideModelPolicy"])
	}
	b.checkExceptions()
}
