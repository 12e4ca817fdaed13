package api_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"devicehub/api"
	"devicehub/bench/sim"
	"devicehub/bench/testkit"
	"devicehub/ingest/link"
	"devicehub/ingest/mqtttest"
	"devicehub/meta"
	"devicehub/schema"
)

type noOnline struct{}

func (noOnline) OnlineDeviceIDs(context.Context) ([]string, error) { return nil, nil }

func brokerURL() string { return mqtttest.SharedURL() }

// cmdEnv is a server with the command path on the real broker (its
// metrics in the server's registry, as cmd/devicehub wires them), a
// regulator product and a plain one, each with a device; product ids are
// unique so parallel test runs do not see each other's devices.
func cmdEnv(t *testing.T) (*env, string, *link.Presence) {
	t.Helper()
	var b [4]byte
	_, _ = rand.Read(b[:])
	suffix := hex.EncodeToString(b[:])
	var presence *link.Presence
	e := newEnvWith(t, func(store *meta.Store, deps *api.Deps) {
		popt := link.DefaultPresenceOptions()
		popt.BrokerURL, popt.ClientID, popt.Registerer = brokerURL(), "api-test-"+suffix, deps.Registry
		// This env's products only: tests running at once on the shared
		// broker use the same device ids ("mute", "c1"), and another
		// test's will would take this one's device offline.
		popt.ProductIDs = []string{"ctl" + suffix, "plain" + suffix}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var err error
		if presence, err = link.NewPresence(ctx, popt, noOnline{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(presence.Close)
		copt := link.DefaultCommandOptions()
		copt.Registerer = deps.Registry
		cmds, err := link.NewCommands(presence, nil, copt)
		if err != nil {
			t.Fatal(err)
		}
		deps.Models = store
		deps.Commands = cmds
	})
	product := "ctl" + suffix
	p := e.createProduct(product, "Controller", map[string]any{"regulator": true})
	p["metadata"] = `{"properties":[{"id":"temp","name":"T","valueType":{"type":"float"}},{"id":"mode","name":"M","valueType":{"type":"string"}}]}`
	e.ok("PATCH", "/api/device-product", p, nil)
	e.createProduct("plain"+suffix, "Plain", nil)
	for _, d := range []struct{ id, product string }{{"c1", product}, {"c2", product}, {"mute", product}, {"p1", "plain" + suffix}} {
		e.ok("POST", "/api/device/instance", map[string]any{"id": d.id, "name": d.id, "productId": d.product}, nil)
	}
	return e, product, presence
}

func startSim(t *testing.T, presence *link.Presence, product string, ids []string, opts sim.Options) {
	t.Helper()
	m, _ := schema.ParseThingModelString(`{"properties":[{"id":"temp","name":"T","valueType":{"type":"float"}},{"id":"mode","name":"M","valueType":{"type":"string"}}]}`)
	opts.BrokerURL, opts.ProductID, opts.DeviceIDs, opts.Model = brokerURL(), product, ids, m
	opts.ValueFunc = func(dev, prop string, vt *schema.ValueType) (any, bool) {
		if prop == "temp" {
			return 21.5, true
		}
		return dev + "-" + prop, true
	}
	mqtttest.StartFleet(t, opts)
	for _, id := range ids {
		testkit.Eventually(t, 5*time.Second, id+" online", func() bool { return presence.IsOnline(id) })
	}
}

func TestCommandEndpoints(t *testing.T) {
	t.Parallel()
	e, product, presence := cmdEnv(t)
	startSim(t, presence, product, []string{"c1"}, sim.Options{})
	startSim(t, presence, product, []string{"mute"}, sim.Options{Silent: true})

	// Endpoint 10.
	var one map[string]any
	e.ok("GET", "/api/device/standard/c1/property/temp", nil, &one)
	if len(one) != 1 || one["temp"] != 21.5 {
		t.Fatalf("endpoint 10: %v", one)
	}
	// Endpoint 11.
	var many map[string]any
	e.ok("POST", "/api/device/instance/c1/properties/_read", `["temp","mode"]`, &many)
	if len(many) != 2 || many["mode"] != "c1-mode" {
		t.Fatalf("endpoint 11: %v", many)
	}
	// Offline (c2 never connected): 500 client_offline, no result.
	for _, path := range []string{"/api/device/standard/c2/property/temp", "/api/device/instance/c2/properties/_read"} {
		method := "GET"
		var body any
		if path[len(path)-5:] == "_read" {
			method, body = "POST", `["temp"]`
		}
		r := e.fails(method, path, body, 500, "client_offline")
		if r.Result != nil {
			t.Fatalf("client_offline with a result: %s", r.raw)
		}
	}
	// Connected but silent, with a short timeout: 500 time_out, no result.
	start := time.Now()
	r := e.fails("GET", "/api/device/standard/mute/property/temp?timeout=300", nil, 500, "time_out")
	if r.Result != nil || time.Since(start) > 5*time.Second {
		t.Fatalf("time_out: %s after %v", r.raw, time.Since(start))
	}
	// Unknown device, bad timeout, bad body.
	e.fails("GET", "/api/device/standard/nope/property/temp", nil, 404, "not_found")
	e.fails("GET", "/api/device/standard/c1/property/temp?timeout=abc", nil, 400, "illegal_argument")
	e.fails("GET", "/api/device/standard/c1/property/temp?timeout=999999", nil, 400, "illegal_argument")
	e.fails("POST", "/api/device/instance/c1/properties/_read", `{"temp":1}`, 400, "illegal_argument")
	e.fails("POST", "/api/device/instance/c1/properties/_read", `[""]`, 400, "illegal_argument")

	// Endpoint 12.
	ctl := `{"Location":"room-1","ProductID":"edge-1","OperCode":{"Switch":"1","Temperature":22}}`
	r = e.call("POST", "/api/device/invoked/c1/function/DeviceCtrl", ctl)
	var id string
	if r.HTTPStatus != 200 || r.Code != "request_handling" || r.Status != 200 {
		t.Fatalf("endpoint 12: %d %s", r.HTTPStatus, r.raw)
	}
	if err := json.Unmarshal(r.Result, &id); err != nil || id == "" {
		t.Fatalf("endpoint 12 result is not a string: %s", r.raw)
	}
	e.fails("POST", "/api/device/invoked/c2/function/DeviceCtrl", ctl, 500, "client_offline")
	e.fails("POST", "/api/device/invoked/p1/function/DeviceCtrl", ctl, 400, "illegal_argument")
	e.fails("POST", "/api/device/invoked/nope/function/DeviceCtrl", ctl, 404, "not_found")
	for _, c := range []struct{ fn, body, mention string }{
		{"Reboot", ctl, "functionId"},
		{"DeviceCtrl", `{"ProductID":"e","OperCode":{"Switch":"1","Temperature":22}}`, "Location"},
		{"DeviceCtrl", `{"Location":"r","OperCode":{"Switch":"1","Temperature":22}}`, "ProductID"},
		{"DeviceCtrl", `{"Location":"r","ProductID":"e"}`, "OperCode"},
		{"DeviceCtrl", `{"Location":"r","ProductID":"e","OperCode":{"Switch":"on","Temperature":22}}`, "OperCode.Switch"},
		{"DeviceCtrl", `{"Location":"r","ProductID":"e","OperCode":{"Switch":1,"Temperature":22}}`, "Switch"},
		{"DeviceCtrl", `{"Location":"r","ProductID":"e","OperCode":{"Switch":"0"}}`, "OperCode.Temperature"},
		{"DeviceCtrl", `{"Location":"r","ProductID":"e","OperCode":{"Switch":"0","Temperature":22.5}}`, "OperCode.Temperature"},
		{"DeviceCtrl", `{"Location":"r","ProductID":"e","OperCode":{"Switch":"0","Temperature":"hot"}}`, "OperCode.Temperature"},
		{"DeviceCtrl", `not json`, "body"},
	} {
		r := e.fails("POST", "/api/device/invoked/c1/function/"+c.fn, c.body, 400, "illegal_argument")
		if !strings.Contains(r.Message, c.mention) {
			t.Errorf("%s %s: message %q does not mention %q", c.fn, c.body, r.Message, c.mention)
		}
	}
}

// A command caches the device's reference; a write through the API
// forgets it at once, so the next command sees the change.
func TestCommandSeesDeviceWrites(t *testing.T) {
	t.Parallel()
	e, _, _ := cmdEnv(t)
	e.fails("GET", "/api/device/standard/c2/property/temp", nil, 500, "client_offline") // c2 is now cached
	e.ok("DELETE", "/api/device/instance/c2", nil, nil)
	e.fails("GET", "/api/device/standard/c2/property/temp", nil, 404, "not_found")
	e.fails("POST", "/api/device/invoked/c2/function/DeviceCtrl",
		`{"Location":"r","ProductID":"e","OperCode":{"Switch":"1","Temperature":22}}`, 404, "not_found")
}

// TestCommandMetricsEndpoint: commands through the API show in /metrics
// by kind and outcome, with their latency, the downlinks sent, the reads
// pending and the devices online.
func TestCommandMetricsEndpoint(t *testing.T) {
	t.Parallel()
	e, product, presence := cmdEnv(t)
	startSim(t, presence, product, []string{"c1"}, sim.Options{})
	startSim(t, presence, product, []string{"mute"}, sim.Options{Silent: true})
	e.ok("GET", "/api/device/standard/c1/property/temp", nil, nil)
	e.ok("POST", "/api/device/instance/c1/properties/_read", `["temp","mode"]`, nil)
	e.fails("GET", "/api/device/standard/c2/property/temp", nil, 500, "client_offline")
	e.fails("GET", "/api/device/standard/mute/property/temp?timeout=300", nil, 500, "time_out")
	ctl := `{"Location":"room-1","ProductID":"edge-1","OperCode":{"Switch":"1","Temperature":22}}`
	if r := e.call("POST", "/api/device/invoked/c1/function/DeviceCtrl", ctl); r.Code != "request_handling" {
		t.Fatalf("invoke: %s", r.raw)
	}
	e.fails("POST", "/api/device/invoked/c2/function/DeviceCtrl", ctl, 500, "client_offline")

	text := e.metrics()
	for _, series := range []string{
		`devicehub_commands_total{kind="read",outcome="answered"} 2`,
		`devicehub_commands_total{kind="read",outcome="offline"} 1`,
		`devicehub_commands_total{kind="read",outcome="timeout"} 1`,
		`devicehub_commands_total{kind="read",outcome="failed"} 0`,
		`devicehub_commands_total{kind="read",outcome="busy"} 0`,
		`devicehub_commands_total{kind="invoke",outcome="sent"} 1`,
		`devicehub_commands_total{kind="invoke",outcome="offline"} 1`,
		`devicehub_command_duration_seconds_count{kind="read",outcome="answered"} 2`,
		`devicehub_command_duration_seconds_bucket{kind="read",outcome="timeout",le="0.25"} 0`,
		`devicehub_command_duration_seconds_bucket{kind="read",outcome="timeout",le="0.5"} 1`,
		`devicehub_commands_sent_total{kind="read"} 3`, // two to c1, one to mute
		`devicehub_commands_sent_total{kind="invoke"} 1`,
		`devicehub_commands_pending 0`,
		`devicehub_devices_online 2`,
	} {
		if !strings.Contains(text, series+"\n") {
			t.Errorf("no %s in /metrics", series)
		}
	}
}
