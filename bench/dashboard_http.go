package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"devicehub/api"
	"devicehub/meta"
	"devicehub/tsdb"
)

// dashSwitch is the server's DashboardStore: the database of the size
// being measured.
type dashSwitch struct{ db atomic.Pointer[tsdb.DB] }

func (d *dashSwitch) MessageCounts(ctx context.Context, q tsdb.CountQuery) ([]tsdb.Bucket, error) {
	return d.db.Load().MessageCounts(ctx, q)
}

func (d *dashSwitch) PropertyHistory(ctx context.Context, productID, deviceID string, properties []string, n int) ([]tsdb.PropertyValue, error) {
	return d.db.Load().PropertyHistory(ctx, productID, deviceID, properties, n)
}

func (d *dashSwitch) Location() *time.Location { return d.db.Load().Location() }

// dashAPI is the real API server (benchServer: a fresh metadata database,
// dropped by close, and a logged-in client) whose dashboard store can be
// switched between the generated sizes, with the history device created.
type dashAPI struct {
	*benchServer
	dash dashSwitch
}

// dashThingModel declares the 14 properties of the history product.
func dashThingModel() string {
	var ps []string
	for i, id := range dashPropNames {
		var vt string
		switch {
		case id == "mode":
			vt = `{"type":"enum","elements":[{"value":"1","text":"Eco"},{"value":"2","text":"Boost"}]}`
		case id == "online":
			vt = `{"type":"boolean","trueText":"Online","trueValue":true,"falseText":"Offline","falseValue":false}`
		case i%2 == 0:
			vt = `{"type":"float","scale":2,"unit":"percent"}`
		default:
			vt = `{"type":"double","scale":1,"unit":"meter"}`
		}
		ps = append(ps, fmt.Sprintf(`{"id":%q,"name":%q,"valueType":%s}`, id, strings.ToUpper(id[:1])+id[1:], vt))
	}
	return `{"properties":[` + strings.Join(ps, ",") + `]}`
}

func startDashAPI(ctx context.Context, p DashboardParams) (_ *dashAPI, err error) {
	a := &dashAPI{}
	a.benchServer, err = startBenchServer(ctx, p.PostgresDSN, p.Prefix+"_meta", 64, func(_ *meta.Store, deps *api.Deps, _ *benchServer) error {
		deps.Dashboard = &a.dash
		return nil
	})
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			a.close()
		}
	}()
	var prod map[string]any
	if err = a.call(ctx, "POST", "/api/device/product", map[string]any{"id": dashHistoryProduct, "name": "Bench product",
		"classifiedId": "meter", "modelFrom": "custom", "accessId": "mqtt-direct", "deviceType": "device"}, &prod); err != nil {
		return nil, err
	}
	prod["metadata"] = dashThingModel()
	if err = a.call(ctx, "PATCH", "/api/device-product", prod, nil); err != nil {
		return nil, err
	}
	if err = a.call(ctx, "POST", "/api/device/instance", map[string]any{"id": dashHistoryDevice, "name": "Bench device", "productId": dashHistoryProduct}, nil); err != nil {
		return nil, err
	}
	return a, nil
}

func (a *dashAPI) setDashboard(db *tsdb.DB) { a.dash.db.Store(db) }

// check runs one _multi query and returns its item count and, for
// aggregates, the sum of the bucket values.
func (a *dashAPI) check(ctx context.Context, body []byte) (items int, total uint64, err error) {
	var res []struct {
		Data struct {
			Value json.RawMessage `json:"value"`
		} `json:"data"`
	}
	if err := a.call(ctx, "POST", "/api/dashboard/_multi", json.RawMessage(body), &res); err != nil {
		return 0, 0, err
	}
	for _, r := range res {
		var v uint64
		if json.Unmarshal(r.Data.Value, &v) == nil {
			total += v
		}
	}
	return len(res), total, nil
}

// measure sends body n times with conc clients (n/conc each) and
// summarises the latencies.
func (a *dashAPI) measure(ctx context.Context, body []byte, n, conc int) (Latency, error) {
	conc = max(conc, 1)
	per := max(n/conc, 1)
	lat := make([][]time.Duration, conc)
	errs := make([]error, conc)
	var wg sync.WaitGroup
	start := time.Now()
	for c := range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ds := make([]time.Duration, 0, per)
			for range per {
				t0 := time.Now()
				if _, err := a.do(ctx, "POST", "/api/dashboard/_multi", body); err != nil {
					errs[c] = err
					return
				}
				ds = append(ds, time.Since(t0))
			}
			lat[c] = ds
		}()
	}
	wg.Wait()
	wall := time.Since(start)
	var all []time.Duration
	for c := range conc {
		if errs[c] != nil {
			return Latency{}, errs[c]
		}
		all = append(all, lat[c]...)
	}
	return summarize(all, wall), nil
}
