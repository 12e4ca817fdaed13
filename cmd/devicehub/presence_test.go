package main

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"devicehub/bench/testkit"
	"devicehub/ingest/mqtttest"
)

// TestPresenceThroughHTTP runs the real binary and a device with a last
// will on its own Mosquitto: the device's birth message makes endpoint 8
// answer online with an onlineTime, and cutting its connection without a
// DISCONNECT (the broker publishes the will) makes it answer offline with
// an offlineTime, the onlineTime kept. /metrics follows the presence view
// (devicehub_devices_online) and shows the command metrics.
func TestPresenceThroughHTTP(t *testing.T) {
	t.Parallel()
	own := startOwn(t, "presence")
	srv, broker, suffix, token := own.server, own.broker, own.suffix, own.token
	product, device := "pp"+suffix, "pd"+suffix
	srv.deployDevice(t, token, product, device)

	type view struct {
		State                   string
		OnlineTime, OfflineTime int64
	}
	detail := func() view {
		var d struct {
			State struct {
				Value string `json:"value"`
			} `json:"state"`
			OnlineTime  int64 `json:"onlineTime"`
			OfflineTime int64 `json:"offlineTime"`
		}
		srv.do(t, token, "GET", "/api/device/instance/"+device+"/detail", nil, &d)
		return view{d.State.Value, d.OnlineTime, d.OfflineTime}
	}
	if v := detail(); v != (view{State: "offline"}) {
		t.Fatalf("deployed device before any message: %+v", v)
	}

	gw := mqtttest.Gateway(t, broker.URL())
	dev := mqtttest.ConnectDevice(t, broker.URL(), device, func(o *mqtt.ClientOptions) {
		gw(o)
		o.SetWill("/"+product+"/"+device+"/offline", `{"reason":"connection lost"}`, 1, false)
	})
	before := time.Now().UnixMilli()
	dev.MustPublish(t, "/"+product+"/"+device+"/online", 1, "")
	var online view
	testkit.Eventually(t, 15*time.Second, "endpoint 8 to answer online", func() bool {
		online = detail()
		return online.State == "online"
	})

	if online.OnlineTime < before || online.OnlineTime > time.Now().UnixMilli() || online.OfflineTime != 0 {
		t.Fatalf("online: %+v, birth published at %d", online, before)
	}
	testkit.Eventually(t, 5*time.Second, "devicehub_devices_online 1", func() bool {
		return strings.Contains(metricsText(t, srv.base), "\ndevicehub_devices_online 1\n")
	})

	for _, series := range []string{`devicehub_commands_total{kind="read",outcome="answered"} 0`,
		`devicehub_commands_total{kind="invoke",outcome="sent"} 0`, `devicehub_commands_pending 0`} {
		if !strings.Contains(metricsText(t, srv.base), series+"\n") {
			t.Errorf("no %s in /metrics", series)
		}
	}

	cut := time.Now().UnixMilli()
	dev.Cut() // no DISCONNECT: the broker publishes the will
	var offline view
	testkit.Eventually(t, 15*time.Second, "endpoint 8 to answer offline after the last will", func() bool {
		offline = detail()
		return offline.State == "offline"
	})

	if offline.OnlineTime != online.OnlineTime || offline.OfflineTime < cut || offline.OfflineTime > time.Now().UnixMilli() {
		t.Fatalf("offline: %+v, online was %+v, connection cut at %d", offline, online, cut)
	}
	testkit.Eventually(t, 5*time.Second, "devicehub_devices_online 0 after the will", func() bool {
		return strings.Contains(metricsText(t, srv.base), "\ndevicehub_devices_online 0\n")
	})

}

// metricsText is the server's /metrics page.
func metricsText(t *testing.T, base string) string {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %d %v", resp.StatusCode, err)
	}
	return string(b)
}
