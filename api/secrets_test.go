package api_test

import (
	"strings"
	"testing"
)

// TestSecureKeyMasked: no response of any product or device endpoint holds
// a stored secureKey, but the one that creates the device and the one that
// rotates its key.
func TestSecureKeyMasked(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var bodies, shown []string
	show := func(r response) {
		t.Helper()
		if r.HTTPStatus != 200 {
			t.Fatalf("%d %s", r.HTTPStatus, r.raw)
		}
		shown = append(shown, string(r.raw))
	}
	keep := func(r response) {
		t.Helper()
		if r.HTTPStatus != 200 {
			t.Fatalf("%d %s", r.HTTPStatus, r.raw)
		}
		bodies = append(bodies, string(r.raw))
	}
	keep(e.call("POST", "/api/device/product", map[string]any{"id": "sk", "name": "N", "classifiedId": "c", "modelFrom": "custom", "accessId": "a", "deviceType": "device"}))
	keep(e.call("POST", "/api/device-product/sk/deploy", nil))
	show(e.call("POST", "/api/device/instance", map[string]any{"id": "sk-1", "name": "D", "productId": "sk"}))
	keep(e.call("POST", "/api/device/instance/sk-1/deploy", nil))
	keep(e.call("GET", "/api/device-product/sk", nil))
	keep(e.call("POST", "/api/device-product/_query/", `{}`))
	keep(e.call("GET", "/api/device/instance/sk-1/detail", nil))
	keep(e.call("GET", "/api/device/instance/sk-1", nil))
	keep(e.call("POST", "/api/device-instance/_query/", `{}`))
	keep(e.call("POST", "/api/device/instance/sk-1/undeploy", nil))
	keep(e.call("DELETE", "/api/device/instance/sk-1", nil))
	keep(e.call("DELETE", "/api/device-product/sk", nil))
	// The first pair is deleted; a second pair stays to compare with.
	keep(e.call("POST", "/api/device/product", map[string]any{"id": "sk2", "name": "N", "classifiedId": "c", "modelFrom": "custom", "accessId": "a", "deviceType": "device"}))
	show(e.call("POST", "/api/device/instance", map[string]any{"id": "sk2-1", "name": "D", "productId": "sk2"}))
	show(e.call("POST", "/api/device/instance/sk2-1/secret", nil))
	keep(e.call("GET", "/api/device-product/sk2", nil))
	keep(e.call("GET", "/api/device/instance/sk2-1/detail", nil))
	keep(e.call("POST", "/api/device-instance/_query/", `{}`))
	var keys []string
	if err := e.store.DB().Select(&keys, `SELECT secure_key FROM products UNION ALL SELECT secure_key FROM devices`); err != nil {
		t.Fatal(err)
	}
	if len(keys) != 2 {
		t.Fatalf("keys: %v", keys)
	}
	for _, k := range keys {
		if len(k) < 16 {
			t.Fatalf("stored key %q is too short to be a secret", k)
		}
		for _, b := range bodies {
			if strings.Contains(b, k) {
				t.Fatalf("a response holds secureKey %s: %s", k, b)
			}
		}
	}
	// The device key (the second) is in its last create response and
	// rotation's only: the rotated key is the stored one.
	if strings.Contains(shown[1], keys[1]) || !strings.Contains(shown[2], keys[1]) {
		t.Fatalf("create or rotate response: key %s not where expected:\n%s\n%s", keys[1], shown[1], shown[2])
	}
	if !strings.Contains(bodies[len(bodies)-1], `"secureKey":"******"`) {
		t.Fatalf("device list does not show the masked key: %s", bodies[len(bodies)-1])
	}
}
