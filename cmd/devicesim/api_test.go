package main

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"devicehub/api"
	"devicehub/bench/sim"
	"devicehub/bench/testkit"
	"devicehub/meta"
	"devicehub/meta/metatest"
)

// countingTransport counts the requests a client sends, by method and
// path (device ids in per-device paths as {id}).
type countingTransport struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	path := r.URL.Path
	if rest, ok := strings.CutPrefix(path, "/api/device/instance/sim-"); ok {
		path = "/api/device/instance/{id}" + rest[strings.IndexByte(rest+"/", '/'):]
	}
	c.mu.Lock()
	c.n[r.Method+" "+path]++
	c.mu.Unlock()
	return http.DefaultTransport.RoundTrip(r)
}

func (c *countingTransport) take() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.n
	c.n = map[string]int{}
	return n
}

// TestDeviceLogins: devicesim provisions its fleet through the bulk API,
// the missing devices created and deployed in one call with their logins
// in its answer; a second run gives the devices that exist new keys and
// deploys them in one call.
func TestDeviceLogins(t *testing.T) {
	store := metatest.NewStore(t)
	reg := prometheus.NewRegistry()
	srv := api.New(api.DefaultOptions(), api.Deps{Auth: store, Products: store, Roles: store, Devices: store, Registry: reg, Gatherer: reg})
	base := testkit.Serve(t, srv.App().Listener, srv.Shutdown)
	ctx := context.Background()
	c, err := login(ctx, base, "admin", "admin123")
	if err != nil {
		t.Fatal(err)
	}
	counts := &countingTransport{n: map[string]int{}}
	c.http.Transport = counts
	ids := make([]string, 1500)
	for i := range ids {
		ids[i] = fmt.Sprint("sim-", i+1)
	}
	check := func(run string, creds map[string]sim.Credential) {
		t.Helper()
		logins, err := store.DeviceLogins(ctx, ids)
		if err != nil || len(logins) != len(ids) {
			t.Fatalf("%s: %d logins stored, want %d (%v)", run, len(logins), len(ids), err)
		}
		for _, l := range logins {
			if c := creds[l.ID]; !l.Deployed || c.SecureID != l.SecureID || c.SecureKey != l.SecureKey {
				t.Fatalf("%s: device %s: stored %+v, devicesim has %+v", run, l.ID, l, c)
			}
		}
	}
	creds, err := c.deviceLogins(ctx, "demo", demoModel, ids)
	if err != nil {
		t.Fatal(err)
	}
	check("first run", creds)
	if n := counts.take(); n["POST /api/device/instance/batch/_create"] != 1 || n["POST /api/device/instance/{id}/secret"] != 0 ||
		len(n) != 5 { // product: read, create, deploy; which exist; bulk create
		t.Fatalf("first run's requests: %v", n)
	}

	// Some devices were undeployed meanwhile; one was deleted.
	if _, err := store.UndeployDevices(ctx, ids[:10], meta.User{ID: "admin"}); err != nil {
		t.Fatal(err)
	}
	if _, err := store.DeleteDevices(ctx, ids[:1]); err != nil {
		t.Fatal(err)
	}
	again, err := c.deviceLogins(ctx, "demo", demoModel, ids)
	if err != nil {
		t.Fatal(err)
	}
	check("second run", again)
	if again["sim-2"].SecureKey == creds["sim-2"].SecureKey {
		t.Fatal("second run: an existing device kept its key")
	}
	if n := counts.take(); n["POST /api/device/instance/batch/_create"] != 1 || n["POST /api/device/instance/batch/_deploy"] != 1 ||
		n["POST /api/device/instance/{id}/secret"] != len(ids)-1 {
		t.Fatalf("second run's requests: %v", n)
	}
}
