package bench

// Device list benchmark: PostgreSQL through the HTTP API, as a client sees it.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"devicehub/api"
	"devicehub/bench/testkit"
	"devicehub/meta"
	"devicehub/meta/metatest"
)

const benchDevices = 100_000

// seedDevices inserts n devices over 10 products in one statement, then
// vacuums so that the trigram indexes' pending lists are merged, as on a
// settled database.
func seedDevices(b *testing.B, store *meta.Store, n int) {
	b.Helper()
	stmts := []string{
		`INSERT INTO products (id, name, device_type, state, classified_id)
			SELECT 'product-' || i, 'Product ' || i, (ARRAY['device','gateway'])[i % 2 + 1], 1, 'class-' || (i % 3)
			FROM generate_series(0, 9) AS i`,
		seedDevicesSQL(n),
		`VACUUM ANALYZE devices`,
		`VACUUM ANALYZE products`,
	}
	for _, s := range stmts {
		if _, err := store.DB().Exec(s); err != nil {
			b.Fatalf("seed: %v", err)
		}
	}
}

// client is the API server on store, reached over real HTTP.
type client struct {
	b     *testing.B
	base  string
	token string
	http  *http.Client
}

func startAPI(b *testing.B, store *meta.Store) *client {
	b.Helper()
	reg := prometheus.NewRegistry()
	srv := api.New(api.DefaultOptions(), api.Deps{
		Auth: store, Products: store, Roles: store, Devices: store,
		Registry: reg, Gatherer: reg,
	})
	base := testkit.Serve(b, srv.App().Listener, srv.Shutdown)
	c := &client{b: b, base: base, http: &http.Client{Timeout: 30 * time.Second}}
	var login struct {
		Token string `json:"token"`
	}
	c.post("/api/authorize/login", `{"username":"admin","password":"admin123"}`, &login)
	c.token = login.Token
	return c
}

// post sends body and decodes the envelope's result into out.
func (c *client) post(path, body string, out any) {
	req, err := http.NewRequest("POST", c.base+path, bytes.NewBufferString(body))
	if err != nil {
		c.b.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if c.token != "" {
		req.Header.Set("X-Access-Token", c.token)
	}
	res, err := c.http.Do(req)
	if err != nil {
		c.b.Fatal(err)
	}
	raw, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 200 {
		c.b.Fatalf("POST %s: %d %s", path, res.StatusCode, raw)
	}
	var env struct {
		Result json.RawMessage `json:"result"`
	}
	if err := json.Unmarshal(raw, &env); err != nil {
		c.b.Fatal(err)
	}
	if out != nil {
		if err := json.Unmarshal(env.Result, out); err != nil {
			c.b.Fatal(err)
		}
	}
}

// BenchmarkQueryDevicesLike measures endpoint 7 on 100k devices: one page
// of 25 with a like term on name, newest first (the default sort), with its
// total (exact up to meta's bound, an estimate past it). "selective"
// searches a number (about 100 matches, a different one each iteration);
// "broad" searches a room word (1/8 of all devices).
func BenchmarkQueryDevicesLike(b *testing.B) {
	store := metatest.NewStore(b)
	start := time.Now()
	seedDevices(b, store, benchDevices)
	b.Logf("seeded %d devices in %s", benchDevices, time.Since(start).Round(time.Millisecond))
	c := startAPI(b, store)

	run := func(b *testing.B, value func(i int) string, minTotal int) {
		lat := make([]time.Duration, 0, b.N)
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			body := fmt.Sprintf(`{"pageIndex":0,"pageSize":25,"terms":[{"column":"name","termType":"like","value":%q}]}`, value(i))
			var page struct {
				Total      int               `json:"total"`
				TotalExact bool              `json:"totalExact"`
				Data       []json.RawMessage `json:"data"`
			}
			t0 := time.Now()
			c.post("/api/device-instance/_query/", body, &page)
			lat = append(lat, time.Since(t0))
			// Past meta's bound the total is an estimate above it.
			low := minTotal
			if !page.TotalExact {
				low = min(minTotal, meta.DefaultExactTotalLimit+1)
			}
			if page.Total < low || len(page.Data) != 25 {
				b.Fatalf("%s: total %d (exact %v), %d items", body, page.Total, page.TotalExact, len(page.Data))
			}
		}
		b.StopTimer()
		sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
		pct := func(p float64) float64 {
			return float64(lat[int(p*float64(len(lat)-1))].Microseconds()) / 1000
		}
		b.ReportMetric(pct(0.50), "p50-ms")
		b.ReportMetric(pct(0.99), "p99-ms")
	}
	// Each query as the administrator, then as a user whose role reads
	// devices of the 10 products only (the same answers: every device is
	// in one of them), so that the two rows show what the product scope
	// costs a request (the request's limit, the bound condition, the
	// longer page-cache key).
	admin := c.token
	limited := limitedToken(b, store, c)
	for _, who := range []struct{ name, token string }{{"admin", admin}, {"limited", limited}} {
		b.Run(who.name+"/selective", func(b *testing.B) {
			c.token = who.token
			run(b, func(i int) string { return fmt.Sprintf("meter %d", 100+i%900) }, 100)
		})
		b.Run(who.name+"/broad", func(b *testing.B) {
			c.token = who.token
			rooms := []string{"kitchen", "garage", "attic", "office", "basement", "roof", "hall"}
			run(b, func(i int) string { return "%" + rooms[i%len(rooms)] + "%" }, benchDevices/8)
		})
	}
}

// limitedToken signs in a user holding device:read on the 10 seeded
// products only (a role limited to them).
func limitedToken(b *testing.B, store *meta.Store, c *client) string {
	b.Helper()
	ctx := context.Background()
	var products []string
	for i := 0; i < 10; i++ {
		products = append(products, fmt.Sprintf("product-%d", i))
	}
	name, perms := "Ten products", []meta.Permission{meta.PermDeviceRead}
	role, err := store.AddRole(ctx, meta.RoleInput{ID: "bench-ten", Name: &name, Permissions: &perms,
		Products: meta.ProductList{Set: true, IDs: products}}, "admin", "enabled")
	if err != nil {
		b.Fatalf("role: %v", err)
	}
	if _, err := store.AddUser(ctx, meta.NewUser{Username: "bench-limited", Name: "Limited", Password: "bench-limited-1",
		Roles: []string{role.ID}}); err != nil {
		b.Fatalf("user: %v", err)
	}
	saved := c.token
	defer func() { c.token = saved }()
	c.token = ""
	var login struct {
		Token string `json:"token"`
	}
	c.post("/api/authorize/login", `{"username":"bench-limited","password":"bench-limited-1"}`, &login)
	return login.Token
}
