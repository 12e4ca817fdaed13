package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"devicehub/api"
	"devicehub/bench/testkit"
	"devicehub/ingest"
	"devicehub/ingest/wire"
	"devicehub/meta"
	"devicehub/tsdb/tsdbtest"
)

// outsideItem is a value of endpoint 14's property history, with its
// outside-model mark.
type outsideItem struct {
	Data struct {
		Value struct {
			Property     string          `json:"property"`
			Value        json.RawMessage `json:"value"`
			OutsideModel *struct {
				Text  string `json:"text"`
				Value string `json:"value"`
			} `json:"outsideModel"`
		} `json:"value"`
	} `json:"data"`
}

// TestOutsideModelPolicy: values outside the thing model, reported over
// MQTT, are kept and marked (per reason) under a product's default
// policy, and neither stored nor marked under "drop"; both are counted in
// devicehub_ingest_outside_model_values_total by reason and action. The
// policy is set through the product API, which refuses another value
// naming the field. Each device reports one message holding a value that
// fits (temp) and one outside the model per reason: an undeclared
// property (switch), an enum value none of the elements has (mode
// "boost"), a string for a float (target "hot"); the value that fits is
// the sign that the message is stored.
func TestOutsideModelPolicy(t *testing.T) {
	t.Parallel()
	var reg prometheus.Registerer
	var store *meta.Store
	ch := tsdbtest.NewDB(t, time.UTC)
	le := newLinkEnv(t, func(s *meta.Store, deps *api.Deps) {
		store, reg = s, deps.Registry
		deps.Dashboard = ch
	})
	keepP, dropP := le.product, le.product+"-drop"

	// The product API: keep by default, drop on request, anything else
	// 400 naming the field, with nothing written.
	var p map[string]any
	le.ok("GET", "/api/device-product/"+keepP, nil, &p)
	if pol, _ := p["outsideModelPolicy"].(map[string]any); pol["value"] != "keep" || pol["text"] == "" {
		t.Fatalf("default policy: %v", p["outsideModelPolicy"])
	}
	r := le.fails("POST", "/api/device/product", map[string]any{"id": dropP, "name": "D", "classifiedId": "meter", "modelFrom": "custom",
		"accessId": "mqtt-direct", "deviceType": "device", "outsideModelPolicy": "sometimes"}, 400, "illegal_argument")
	if !strings.Contains(r.Message, "outsideModelPolicy") {
		t.Fatalf("refusal does not name the field: %s", r.raw)
	}
	le.fails("GET", "/api/device-product/"+dropP, nil, 404, "not_found")
	d := le.createProduct(dropP, "Thermostat (drop)", map[string]any{"metadata": thermostatModel, "outsideModelPolicy": "drop"})
	if pol, _ := d["outsideModelPolicy"].(map[string]any); pol["value"] != "drop" {
		t.Fatalf("created with drop: %v", d["outsideModelPolicy"])
	}
	p["outsideModelPolicy"] = "never"
	r = le.fails("PATCH", "/api/device-product", p, 400, "illegal_argument")
	if !strings.Contains(r.Message, "outsideModelPolicy") {
		t.Fatalf("refusal does not name the field: %s", r.raw)
	}
	p["outsideModelPolicy"] = map[string]any{"text": "Drop", "value": "drop"}
	le.ok("PATCH", "/api/device-product", p, nil)
	le.ok("GET", "/api/device-product/"+keepP, nil, &p)
	if pol, _ := p["outsideModelPolicy"].(map[string]any); pol["value"] != "drop" {
		t.Fatalf("patched to drop: %v", p["outsideModelPolicy"])
	}
	p["outsideModelPolicy"] = "keep" // a bare string, as deviceType may be
	le.ok("PATCH", "/api/device-product", p, nil)
	le.ok("GET", "/api/device-product/"+keepP, nil, &p)
	if pol, _ := p["outsideModelPolicy"].(map[string]any); pol["value"] != "keep" {
		t.Fatalf("patched back to keep: %v", p["outsideModelPolicy"])
	}

	for _, id := range []string{keepP, dropP} {
		le.ok("POST", "/api/device-product/"+id+"/deploy", nil, nil)
	}
	le.ok("POST", "/api/device/instance", map[string]any{"id": "keeper", "name": "keeper", "productId": keepP}, nil)
	le.ok("POST", "/api/device/instance", map[string]any{"id": "dropper", "name": "dropper", "productId": dropP}, nil)
	for _, id := range []string{"keeper", "dropper"} {
		le.ok("POST", "/api/device/instance/"+id+"/deploy", nil, nil)
	}

	opt := ingest.DefaultOptions()
	opt.BrokerURL = le.broker.URL()
	opt.ClientID = testkit.RandID("outside-ingest-")
	opt.ProductIDs = []string{keepP, dropP}
	opt.Writer.FlushInterval = 50 * time.Millisecond
	opt.Registerer = reg
	opt.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ing, err := ingest.New(ctx, opt, ch, store, store)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = ing.Close(ctx)
	})

	const report = `{"properties":{"temp":21.5,"switch":true,"mode":"boost","target":"hot"}}`
	history := func(product, device string) map[string]outsideItem {
		t.Helper()
		var items []outsideItem
		testkit.Eventually(t, 15*time.Second, device+"'s values stored", func() bool {
			body := []map[string]any{{"dashboard": "device", "object": product, "measurement": "properties", "dimension": "history",
				"group": "latest", "params": map[string]any{"deviceId": device, "history": 1}}}
			items = nil
			le.ok("POST", "/api/dashboard/_multi", body, &items)
			return len(items) > 0
		})
		got := make(map[string]outsideItem)
		for _, it := range items {
			got[it.Data.Value.Property] = it
		}
		return got
	}
	mark := func(it outsideItem) string {
		if it.Data.Value.OutsideModel == nil {
			return ""
		}
		return it.Data.Value.OutsideModel.Value + "/" + it.Data.Value.OutsideModel.Text
	}

	keeper := connectTestDevice(t, le.broker.URL(), keepP, "keeper", le.gateway)
	keeper.publish(wire.LevelReport, report)
	got := history(keepP, "keeper")
	want := map[string]string{"temp": "", "switch": "undeclared/", "mode": "not_in_enum/", "target": "wrong_type/"}
	if len(got) != len(want) {
		t.Fatalf("keep: stored %v, want %v", got, want)
	}
	for prop, w := range want {
		it, ok := got[prop]
		m := mark(it)
		if !ok || !strings.HasPrefix(m, w) || (w == "") != (m == "") || w != "" && strings.HasSuffix(m, "/") {
			t.Fatalf("keep: %s marked %q, want %q with a text (stored %v)", prop, m, w, ok)
		}
	}

	dropper := connectTestDevice(t, le.broker.URL(), dropP, "dropper", le.gateway)
	dropper.publish(wire.LevelReport, report)
	got = history(dropP, "dropper")
	if len(got) != 1 || mark(got["temp"]) != "" {
		t.Fatalf("drop: stored %v, want temp alone, unmarked", got)
	}

	// Counted by reason and action, once each.
	metrics := le.metrics()
	for _, reason := range []string{"undeclared", "not_in_enum", "wrong_type"} {
		for _, action := range []string{"kept", "dropped"} {
			re := regexp.MustCompile(fmt.Sprintf(`(?m)^devicehub_ingest_outside_model_values_total\{action="%s",reason="%s"\} (\S+)$`, action, reason))
			m := re.FindStringSubmatch(metrics)
			if m == nil || m[1] != "1" {
				t.Fatalf("%s %s: %v in\n%s", reason, action, m, metrics)
			}
		}
	}
}
