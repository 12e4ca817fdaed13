package main

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"devicehub/bench/testkit"
	"devicehub/ingest/mqtttest"
	"devicehub/tsdb/tsdbtest"
)

// TestShadowAcrossRestart runs the real binary on its own broker: a
// property write is answered by the device; a device offline while its
// desired state changes three times, and that connects while devicehub
// is stopped, gets one delta with the last values and version once
// devicehub is back (its birth waited in ingest's broker session).
func TestShadowAcrossRestart(t *testing.T) {
	t.Parallel()
	broker := mqtttest.StartBroker(t)
	env, chDB, suffix := testEnv(t, broker.URL(), "shadow")
	bin := testkit.Devicehub(t)
	srv := startServer(t, bin, env, "shadow")
	tsdbtest.OpenDB(t, chDB, nil)
	t.Cleanup(func() { // whichever run is current stops before the drop
		srv.signal(syscall.SIGTERM)
		srv.wait(15 * time.Second)
	})
	token := login(t, srv.base)
	product, device := "sp"+suffix, "sd"+suffix
	srv.deployDevice(t, token, product, device)
	var p map[string]any
	srv.do(t, token, "GET", "/api/device-product/"+product, nil, &p)
	p["metadata"] = `{"properties":[{"id":"target","name":"Target","valueType":{"type":"float"},"expands":{"type":["read","write"]}},` +
		`{"id":"temp","name":"Temperature","valueType":{"type":"float"},"expands":{"type":["report"]}}]}`
	srv.call(t, token, "PATCH", "/api/device-product", p)

	gw := mqtttest.Gateway(t, broker.URL())
	topic := func(level string) string { return "/" + product + "/" + device + "/" + level }
	var mu sync.Mutex
	var got []map[string]any // shadow messages, in arrival order
	connect := func() mqtt.Client {
		o := mqtt.NewClientOptions().AddBroker(broker.URL()).SetClientID(testkit.RandID("sdev-")).SetCleanSession(true)
		gw(o)
		c := mqtt.NewClient(o)
		if tok := c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
			t.Fatal(tok.Error())
		}
		subs := map[string]byte{topic("properties/write"): 1, topic("shadow/delta"): 1, topic("shadow/get/reply"): 1}
		tok := c.SubscribeMultiple(subs, func(c mqtt.Client, m mqtt.Message) {
			var msg map[string]any
			if json.Unmarshal(m.Payload(), &msg) != nil {
				return
			}
			if strings.HasSuffix(m.Topic(), "/properties/write") {
				body, _ := json.Marshal(map[string]any{"messageId": msg["messageId"], "success": true, "properties": msg["properties"]})
				c.Publish(topic("properties/write/reply"), 1, false, body)
				return
			}
			mu.Lock()
			got = append(got, msg)
			mu.Unlock()
		})
		if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
			t.Fatal(tok.Error())
		}
		if tok := c.Publish(topic("online"), 1, false, `{}`); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
			t.Fatal(tok.Error())
		}
		return c
	}
	received := func() []map[string]any {
		mu.Lock()
		defer mu.Unlock()
		return append([]map[string]any(nil), got...)
	}

	// A write through the binary, answered by the device.
	dev := connect()
	var written map[string]any
	testkit.Eventually(t, 15*time.Second, "the write answered", func() bool {
		return srv.api(token).Try("PUT", "/api/device/instance/"+device+"/property", `{"target":21.5}`, &written) == nil
	})
	if written["target"] != 21.5 {
		t.Fatalf("write answered %v", written)
	}
	dev.Publish(topic("offline"), 1, false, `{}`).WaitTimeout(5 * time.Second)
	dev.Disconnect(0)

	// A live stream of the device sees each change of its desired state.
	shadowEvents := liveEvents(t, srv.base, token, device, "shadow")
	for _, body := range []string{`{"desired":{"target":20}}`, `{"desired":{"target":21}}`, `{"desired":{"target":22.5}}`} {
		srv.call(t, token, "PUT", "/api/device/instance/"+device+"/shadow", body)
	}
	for want := 1.0; want <= 3; want++ {
		select {
		case data := <-shadowEvents:
			var e struct {
				DeviceID string             `json:"deviceId"`
				Version  float64            `json:"version"`
				Delta    map[string]float64 `json:"delta"`
			}
			if err := json.Unmarshal([]byte(data), &e); err != nil || e.DeviceID != device || e.Version != want || len(e.Delta) != 1 {
				t.Fatalf("shadow event %d: %s", int(want), data)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no shadow event for version %d on /api/live", int(want))
		}
	}
	srv.signal(syscall.SIGTERM)
	if code, ok := srv.wait(20 * time.Second); !ok || code != 0 {
		t.Fatalf("stop: exited %v, code %d\n%s", ok, code, srv.logTail())
	}
	dev = connect() // its birth waits in ingest's session
	defer dev.Disconnect(0)
	srv = startServer(t, bin, env, "shadow")
	testkit.Eventually(t, 30*time.Second, "the delta after the restart", func() bool { return len(received()) > 0 })
	dev.Publish(topic("shadow/get"), 1, false, `{"messageId":"after-restart"}`)
	testkit.Eventually(t, 15*time.Second, "the answer to shadow/get", func() bool {
		for _, m := range received() {
			if m["messageId"] == "after-restart" {
				return true
			}
		}
		return false
	})
	var deltas []map[string]any
	for _, m := range received() {
		if m["messageType"] == "SHADOW_DELTA" {
			deltas = append(deltas, m)
		}
	}
	if len(deltas) != 1 {
		t.Fatalf("%d deltas after the restart, want one: %v", len(deltas), deltas)
	}
	state, _ := deltas[0]["state"].(map[string]any)
	if deltas[0]["version"] != 3.0 || len(state) != 1 || state["target"] != 22.5 {
		t.Fatalf("delta: %v", deltas[0])
	}
}

// liveEvents follows device on base's /api/live and sends the data of
// each event of kind to the channel returned, until the test ends.
func liveEvents(t *testing.T, base, token, device, kind string) <-chan string {
	t.Helper()
	events := make(chan string, 64)
	req, _ := http.NewRequest("GET", base+"/api/live?deviceId="+url.QueryEscape(device)+"&token="+token, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Fatalf("live: %d %s", resp.StatusCode, b)
	}
	t.Cleanup(func() { resp.Body.Close() })
	go func() {
		sc := bufio.NewScanner(resp.Body)
		var ev string
		for sc.Scan() {
			l := sc.Text()
			if v, ok := strings.CutPrefix(l, "event: "); ok {
				ev = v
			}
			if v, ok := strings.CutPrefix(l, "data: "); ok && ev == kind {
				select {
				case events <- v:
				default:
				}
			}
		}
	}()
	return events
}
