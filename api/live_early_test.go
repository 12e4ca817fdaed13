package api_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"devicehub/api"
	"devicehub/api/live"
	"devicehub/ingest/mqtttest"
	"devicehub/meta"
	"devicehub/tsdb/tsdbtest"
)

// TestLiveBeforeStorage: a value reaches /api/live as ingest decodes it,
// marked "stored": false, while its row is not in ClickHouse yet (ingest
// here inserts once an hour, so nothing is stored while the test runs);
// a message that fails to decode never shows, not even the values before
// its error.
func TestLiveBeforeStorage(t *testing.T) {
	t.Parallel()
	product := "lb" + liveSuffix()
	dev := product + "-1"
	ch := tsdbtest.NewDB(t, time.UTC)
	e := newEnvWith(t, func(store *meta.Store, deps *api.Deps) {
		addLiveDevices(t, store, product, dev)
		inst := startLiveInstanceFlush(t, store, ch, product, live.Options{}, false, true, time.Hour)
		deps.Live, deps.LiveDevices = inst.hub, store
	})
	s := openLive(t, e.base, liveQuery(e.token, []string{dev}), "")
	gw := mqtttest.Gateway(t, brokerURL())
	pub := mqtttest.ConnectDevice(t, brokerURL(), "live-dev-"+liveSuffix(), gw)
	topic := "/" + product + "/" + dev + "/properties/report"

	value := func(ev sseEvent) live.PropertyEvent {
		t.Helper()
		var pe live.PropertyEvent
		if ev.Name != "property" || json.Unmarshal([]byte(ev.Data), &pe) != nil {
			t.Fatalf("unexpected event %s %s", ev.Name, ev.Data)
		}
		return pe
	}
	published := time.Now()
	pub.MustPublish(t, topic, 1, `{"properties":{"temp":1.5}}`)
	ev := s.next(10 * time.Second)
	if pe := value(ev); pe.DeviceID != dev || pe.Property != "temp" || pe.Value != 1.5 || pe.Stored {
		t.Fatalf("event %s", ev.Data)
	}
	var n uint64
	if err := ch.Conn().QueryRow(context.Background(), "SELECT count() FROM device_property WHERE device_id = ?", dev).Scan(&n); err != nil || n != 0 {
		t.Fatalf("ClickHouse holds %d rows of the device (%v): want none before ingest's flush", n, err)
	}
	t.Logf("published -> received %s, before storage", ev.At.Sub(published).Round(time.Microsecond))

	// Two messages that fail to decode (the first after one good value),
	// then a good one: a device's messages are decoded in order, so the
	// next event is the good one's.
	pub.MustPublish(t, topic, 1, `{"properties":{"temp":2.5,"hum":}}`)
	pub.MustPublish(t, topic, 1, `{"properties":{"temp":`)
	pub.MustPublish(t, topic, 1, `{"properties":{"temp":3.5}}`)
	if pe := value(s.next(10 * time.Second)); pe.Value != 3.5 || pe.Stored {
		t.Fatalf("after two malformed messages: %+v, want temp 3.5", pe)
	}
}
