package api_test

import (
	"encoding/json"
	"fmt"
	"sync"
	"testing"
)

// TestConcurrentProductPatches: twenty clients each read a product, add a
// property to its thing model and send it back (the spec's usage rule for
// endpoint 4), all at once. Each either succeeds or gets 409 conflict, and
// every property whose PATCH succeeded is in the stored model: no update
// is lost. Retrying on conflict, every client's property gets in.
func TestConcurrentProductPatches(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.createProduct("cc", "Concurrent", nil)
	addProperty := func(i int) (status int, code string) {
		var p map[string]any
		e.ok("GET", "/api/device-product/cc", nil, &p)
		var m struct {
			Properties []map[string]any `json:"properties"`
			Events     []any            `json:"events"`
			Functions  []any            `json:"functions"`
			Tags       []any            `json:"tags"`
		}
		if err := json.Unmarshal([]byte(p["metadata"].(string)), &m); err != nil {
			t.Error(err)
			return 0, ""
		}
		m.Properties = append(m.Properties, map[string]any{"id": fmt.Sprintf("p%d", i), "name": "P",
			"valueType": map[string]any{"type": "int"}})
		b, _ := json.Marshal(m)
		p["metadata"] = string(b)
		r := e.call("PATCH", "/api/device-product", p)
		return r.HTTPStatus, r.Code
	}
	properties := func() map[string]bool {
		var p map[string]any
		e.ok("GET", "/api/device-product/cc", nil, &p)
		var m struct {
			Properties []struct{ ID string } `json:"properties"`
		}
		_ = json.Unmarshal([]byte(p["metadata"].(string)), &m)
		got := map[string]bool{}
		for _, q := range m.Properties {
			got[q.ID] = true
		}
		return got
	}

	const n = 20
	var wg sync.WaitGroup
	var mu sync.Mutex
	won := map[int]bool{}
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			status, code := addProperty(i)
			switch {
			case status == 200:
				mu.Lock()
				won[i] = true
				mu.Unlock()
			case status == 409 && code == "conflict":
			default:
				t.Errorf("PATCH %d: %d %s", i, status, code)
			}
		}()
	}
	wg.Wait()
	got := properties()
	if len(got) != len(won) {
		t.Fatalf("%d PATCHes succeeded, %d properties stored: %v", len(won), len(got), got)
	}
	for i := range won {
		if !got[fmt.Sprintf("p%d", i)] {
			t.Fatalf("p%d was acknowledged and lost: %v", i, got)
		}
	}

	// Clients that read again on conflict all get in.
	for i := n; i < 2*n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				status, code := addProperty(i)
				if status == 200 {
					return
				}
				if status != 409 || code != "conflict" {
					t.Errorf("PATCH %d: %d %s", i, status, code)
					return
				}
			}
			t.Errorf("PATCH %d: still in conflict after 100 tries", i)
		}()
	}
	wg.Wait()
	if got := properties(); len(got) != len(won)+n {
		t.Fatalf("%d properties stored, want %d", len(got), len(won)+n)
	}
}

// TestStaleDeviceUpdate: a device update that sends back an old modifyTime
// is refused with 409 and changes nothing; without modifyTime it applies.
func TestStaleDeviceUpdate(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.createProduct("su", "Stale", nil)
	var d map[string]any
	e.ok("POST", "/api/device/instance", map[string]any{"id": "su-1", "name": "first", "productId": "su"}, &d)
	e.ok("PUT", "/api/device/instance/su-1", map[string]any{"name": "second", "modifyTime": d["modifyTime"]}, nil)
	r := e.call("PUT", "/api/device/instance/su-1", map[string]any{"name": "third", "modifyTime": d["modifyTime"]})
	if r.HTTPStatus != 409 || r.Code != "conflict" {
		t.Fatalf("stale update: %d %s", r.HTTPStatus, r.raw)
	}
	var now map[string]any
	e.ok("GET", "/api/device/instance/su-1/detail", nil, &now)
	if now["name"] != "second" {
		t.Fatalf("name %v after a refused update", now["name"])
	}
	e.ok("PUT", "/api/device/instance/su-1", map[string]any{"name": "fourth"}, nil)
}
