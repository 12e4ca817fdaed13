package main

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"devicehub/bench/testkit"
)

// TestConsoleFirmwareInBrowser drives the Firmware pages in headless
// chromium against the real binary: a package uploaded through the page
// is listed with the SHA-256 of its bytes; the same version again is
// refused beside its field; a rollout to one device is started from the
// package, paused and resumed from its page; the device, once online,
// is started and reports FAILED with a reason: the page counts it and
// lists it among the failed devices with that reason; the package in
// use is refused deletion (the server's message shown). At 420 px both
// pages fit.
func TestConsoleFirmwareInBrowser(t *testing.T) {
	t.Parallel()
	chromium := findChromium(t)
	own := startOwn(t, "consolefirmware", "DEVICEHUB_FIRMWARE_DIR="+t.TempDir())
	srv, broker, suffix, token := own.server, own.broker, own.suffix, own.token
	product, dev := "fw"+suffix, "gauge-"+suffix
	srv.call(t, token, "POST", "/api/device/product", map[string]any{"id": product, "name": "Gauges " + suffix, "classifiedId": "test",
		"modelFrom": "custom", "accessId": "mqtt", "deviceType": "device", "metadata": alarmTestModel})
	srv.call(t, token, "POST", "/api/device-product/"+product+"/deploy", nil)
	var created struct {
		Configuration struct {
			SecureID  string `json:"secureId"`
			SecureKey string `json:"secureKey"`
		} `json:"configuration"`
	}
	srv.do(t, token, "POST", "/api/device/instance", map[string]any{"id": dev, "name": "Gauge", "productId": product}, &created)
	srv.call(t, token, "POST", "/api/device/instance/"+dev+"/deploy", nil)

	image := []byte("devicehub firmware image " + suffix + "\n")
	for len(image) < 64<<10 {
		image = append(image, image...)
	}
	sum := sha256.Sum256(image)
	file := filepath.Join(t.TempDir(), "gauge-2.0.0.bin")
	if err := os.WriteFile(file, image, 0o644); err != nil {
		t.Fatal(err)
	}

	b := newBrowser(t, chromium)
	signIn(b, srv.base, "admin", "admin123", chromedp.WaitVisible(chromedp.ID("nav-firmware")))
	b.run("open the firmware", chromedp.Click(chromedp.ID("nav-firmware")), chromedp.WaitVisible(chromedp.ID("fw-product")))
	b.poll("the product offered", fmt.Sprintf(`!!document.querySelector('#fw-product option[value=%q]')`, product))
	b.run("choose the product", fill("#fw-product", product), chromedp.WaitVisible(chromedp.ID("fw-version")))
	upload := func(what string) {
		b.t.Helper()
		b.run(what, fill("#fw-version", "2.0.0"), fill("#fw-name", "Spring release"), fill("#fw-notes", "Faster sampling."),
			chromedp.SetUploadFiles("#fw-file", []string{file}), chromedp.Click(chromedp.ID("fw-upload-submit")))
	}
	upload("upload a package")
	b.poll("the package with the bytes' SHA-256", fmt.Sprintf(`(document.querySelector('#fw-packages .fw-sha') || {}).textContent === %q`, hex.EncodeToString(sum[:])))
	upload("the same version again")
	b.poll("the refusal beside the version", `(() => {
		const e = document.getElementById('fw-version').nextElementSibling;
		return !!e && e.classList.contains('field-error') && e.dataset.for === 'version';
	})()`)
	if n := evalJS[int](b, `document.querySelectorAll('#fw-packages tr[data-package]').length`); n != 1 {
		t.Fatalf("%d packages listed after the refused upload, want 1", n)
	}

	// A rollout to the device, from the package.
	b.run("roll it out", chromedp.Click(chromedp.CSS(`button[data-action=rollout]`)), chromedp.WaitVisible(chromedp.ID("fw-target")))
	b.run("to the device, no retry", fill("#fw-target", "list"), fill("#fw-devices", dev), fill("#fw-retries", "0"), fill("#fw-timeout", "300"),
		chromedp.Click(chromedp.ID("fw-rollout-start")))
	b.poll("the rollout's page", `location.hash.startsWith('#/firmware/rollout/') && !!document.querySelector('#rollout-head .rollout-state[data-state=running]')`)
	rollout := evalJS[string](b, `decodeURIComponent(location.hash.slice('#/firmware/rollout/'.length))`)
	if got := b.text("#rollout-head .rollout-progress"); got != "0 of 1 updated" {
		t.Fatalf("progress %q", got)
	}
	b.run("pause", chromedp.Click(chromedp.ID("rollout-pause")), chromedp.WaitVisible(chromedp.ID("rollout-resume")))
	var r struct {
		State  string         `json:"state"`
		Counts map[string]int `json:"counts"`
	}
	srv.do(t, token, "GET", "/api/firmware/rollout/"+rollout, nil, &r)
	if r.State != "paused" {
		t.Fatalf("after Pause: %s", r.State)
	}
	b.run("resume", chromedp.Click(chromedp.ID("rollout-resume")), chromedp.WaitVisible(chromedp.ID("rollout-pause")))
	srv.do(t, token, "GET", "/api/firmware/rollout/"+rollout, nil, &r)
	if r.State != "running" {
		t.Fatalf("after Resume: %s", r.State)
	}
	narrowFits(b, "rollout", "#/firmware/rollout/"+rollout, `#rollout-head .rollout-state`)

	// The device comes online, is started, and fails.
	d, err := dial(broker.URL(), dev, created.Configuration.SecureID, created.Configuration.SecureKey, nil)
	if err != nil {
		t.Fatalf("device connect: %v", err)
	}
	t.Cleanup(func() { d.Disconnect(0) })
	publish(t, d, "/"+product+"/"+dev+"/online", `{}`)
	testkit.Eventually(t, 30*time.Second, "the device started", func() bool {
		srv.do(t, token, "GET", "/api/firmware/rollout/"+rollout, nil, &r)
		return r.Counts["INITIATED"] == 1
	})
	publish(t, d, "/"+product+"/"+dev+"/firmware/progress",
		fmt.Sprintf(`{"messageId":"p1","rolloutId":%q,"version":"2.0.0","state":"FAILED","reason":"flash write error at 0x4000"}`, rollout))
	b.poll("the failed device with its reason", fmt.Sprintf(`(() => {
		const tr = document.querySelector('#rollout-failed tr[data-device=%q]');
		return !!tr && tr.querySelector('.failed-reason').textContent === 'flash write error at 0x4000' &&
			document.querySelector('#rollout-counts tr[data-state=FAILED] .rollout-count').textContent === '1' &&
			document.querySelector('#rollout-head .rollout-progress').dataset.failed === '1';
	})()`, dev))
	b.shot("firmware-rollout")

	// The package in use is kept.
	b.run("the product's firmware", goTo("#/firmware?product="+product), chromedp.WaitVisible(chromedp.CSS(`button[data-action=delete][data-package]`)))
	b.poll("the rollout listed", `document.querySelectorAll('#fw-rollouts tr[data-rollout]').length === 1`)
	narrowFits(b, "firmware", "#/firmware?product="+product, `#fw-rollouts tr[data-rollout]`)
	b.run("delete the package", chromedp.Evaluate[chromedp.Void](`window.confirm = () => true`), chromedp.Click(chromedp.CSS(`button[data-action=delete][data-package]`)))
	b.poll("refused: in use", `document.getElementById('firmware-note').className === 'error' && document.getElementById('firmware-note').textContent.includes('a rollout uses package')`)
	b.checkExceptions()
}
