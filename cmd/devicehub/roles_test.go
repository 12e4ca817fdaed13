package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"devicehub/bench/sim"
	"devicehub/bench/testkit"
	"devicehub/ingest/mqtttest"
	"devicehub/schema"
)

// TestAPIOnlyInstance runs the binary with -roles api on its own
// Mosquitto: the device link works (the presence view sees a device come
// online, a property read through endpoint 10 is answered by it and
// counted), while the ingest pipeline is not built: no devicehub_ingest_*
// metric is registered and /readyz checks no ingest connection.
func TestAPIOnlyInstance(t *testing.T) {
	t.Parallel()
	own := startOwn(t, "apionly", "DEVICEHUB_ROLES=api")
	srv, broker, suffix, token := own.server, own.broker, own.suffix, own.token
	product, device := "ap"+suffix, "ad"+suffix
	srv.deployDevice(t, token, product, device)

	model, err := schema.ParseThingModelString(`{"properties":[{"id":"temp","name":"T","valueType":{"type":"float"}}]}`)
	if err != nil {
		t.Fatal(err)
	}
	gw := mqtttest.Gateway(t, broker.URL())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	fleet, err := sim.Start(ctx, sim.Options{BrokerURL: broker.URL(), ProductID: product, DeviceIDs: []string{device}, Model: model,
		Login:     func(_ string, o *mqtt.ClientOptions) { gw(o) },
		ValueFunc: func(string, string, *schema.ValueType) (any, bool) { return 21.5, true }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fleet.Close)
	testkit.Eventually(t, 10*time.Second, "devicehub_devices_online 1", func() bool {
		return strings.Contains(metricsText(t, srv.base), "\ndevicehub_devices_online 1\n")
	})

	var values map[string]any
	srv.do(t, token, "GET", "/api/device/standard/"+device+"/property/temp", nil, &values)
	if values["temp"] != 21.5 {
		t.Fatalf("endpoint 10 on an API-only instance: %v", values)
	}

	text := metricsText(t, srv.base)
	if !strings.Contains(text, `devicehub_commands_total{kind="read",outcome="answered"} 1`+"\n") {
		t.Errorf("the answered read is not counted in /metrics")
	}
	if i := strings.Index(text, "devicehub_ingest_"); i >= 0 {
		t.Errorf("an API-only instance registered ingest metrics: %.80s", text[i:])
	}
	resp, err := http.Get(srv.base + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var ready struct {
		Result map[string]string `json:"result"`
	}
	if err := json.Unmarshal(raw, &ready); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("/readyz: %d %s", resp.StatusCode, raw)
	}
	if ready.Result["mqtt"] != "up" || ready.Result["mqtt_ingest"] != "" {
		t.Fatalf("/readyz of an API-only instance: %s", raw)
	}
}
