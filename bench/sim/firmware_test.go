package sim_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"devicehub/bench/fwdevice"
	"devicehub/bench/sim"
	"devicehub/bench/testkit"
	"devicehub/ingest/mqtttest"
)

func seenCopy(mu *sync.Mutex, seen *[]string) []string {
	mu.Lock()
	defer mu.Unlock()
	return append([]string(nil), *seen...)
}

// TestFirmware: a fleet's devices with updaters take an upgrade and
// reboot by reconnecting (offline "reboot", birth, version report); one
// that reboots into its old version comes back on it.
func TestFirmware(t *testing.T) {
	broker := mqtttest.SharedURL()
	gwOpts := mqtt.NewClientOptions()
	gw := mqtttest.Gateway(t, broker)
	gw(gwOpts)
	data := make([]byte, 100<<10)
	_, _ = rand.Read(data)
	sum := sha256.Sum256(data)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || p != "key-"+u {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(data))
	}))
	defer srv.Close()
	product := testkit.RandID("fwsim")
	var mu sync.Mutex
	var seen []string // "device level payload"
	side, err := mqtttest.Dial(broker, testkit.RandID("fwsim-side-"), gwOpts.Username, gwOpts.Password, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer side.Disconnect(0)
	side.Subscribe("/"+product+"/+/#", 1, func(_ mqtt.Client, m mqtt.Message) {
		parts := strings.SplitN(m.Topic(), "/", 4)
		mu.Lock()
		seen = append(seen, parts[2]+" "+parts[3]+" "+string(m.Payload()))
		mu.Unlock()
	}).Wait()
	ids := []string{"ok", "old"}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	f, err := sim.Start(ctx, sim.Options{BrokerURL: broker, ProductID: product, DeviceIDs: ids,
		Login: func(_ string, o *mqtt.ClientOptions) { gw(o) },
		Firmware: func(id string) *fwdevice.Options {
			return &fwdevice.Options{Version: "1.0.0", SecureID: id, SecureKey: "key-" + id, Faults: fwdevice.Faults{RebootOld: id == "old"}}
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, id := range ids {
		b, _ := json.Marshal(fwdevice.Upgrade{MessageID: "m-" + id, RolloutID: "r", Version: "2.0.0", Size: int64(len(data)),
			SHA256: hex.EncodeToString(sum[:]), URL: srv.URL + "/firmware/download/t-" + id})
		side.Publish("/"+product+"/"+id+"/firmware/upgrade", 1, false, b).Wait()
	}
	count := func(s string) int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, e := range seen {
			if strings.HasPrefix(e, s) {
				n++
			}
		}
		return n
	}
	// UPDATED is each device's last report (the old one's a false claim).
	testkit.Eventually(t, 20*time.Second, "both devices' UPDATED", func() bool {
		return count(`ok firmware/progress`) > 0 && count(`old firmware/progress`) > 0 &&
			strings.Count(strings.Join(seenCopy(&mu, &seen), "\n"), `"state":"UPDATED"`) == 2
	})
	for _, c := range []struct {
		prefix string
		want   int
	}{
		{`ok offline {"reason":"reboot"}`, 1}, {"ok online", 2}, {`ok firmware/version {"version":"2.0.0"`, 1},
		{`old offline {"reason":"reboot"}`, 1}, {"old online", 2}, {`old firmware/version {"version":"1.0.0"`, 2},
		{`old firmware/version {"version":"2.0.0"`, 0},
	} {
		if n := count(c.prefix); n != c.want {
			mu.Lock()
			t.Errorf("%d of %q, want %d in\n%s", n, c.prefix, c.want, strings.Join(seen, "\n"))
			mu.Unlock()
		}
	}
}
