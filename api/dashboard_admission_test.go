package api_test

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"devicehub/api"
	"devicehub/meta"
	"devicehub/tsdb"
	"devicehub/tsdb/tsdbtest"
)

// preparingStore holds every PrepareExport call until release closes.
type preparingStore struct {
	*tsdb.DB
	entered chan struct{}
	release chan struct{}
}

func (p *preparingStore) PrepareExport(ctx context.Context, q tsdb.ExportQuery) (*tsdb.Export, error) {
	p.entered <- struct{}{}
	select {
	case <-p.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return p.DB.PrepareExport(ctx, q)
}

// Exports have their own slots of the dashboard's admission gate (4 per
// instance): with 4 exports holding theirs, a fifth waits its bounded
// time and is refused with 503 too_many_requests and Retry-After, while
// endpoint 14's requests, whose slots are apart, still answer.
func TestExportConcurrencyLimit(t *testing.T) {
	t.Parallel()
	db := tsdbtest.NewDB(t, shanghai)
	ps := &preparingStore{DB: db, entered: make(chan struct{}, 8), release: make(chan struct{})}
	e := newEnvWith(t, func(store *meta.Store, deps *api.Deps) { deps.Dashboard, deps.Models = ps, store })
	e.server.SetUserLimits(api.UserLimits{LiveStreams: 20, Exports: 10})
	e.createProduct("dp", "Dash product", nil)
	e.ok("POST", "/api/device/instance", map[string]any{"id": "dd", "name": "Dash device", "productId": "dp"}, nil)
	history := map[string]any{"dashboard": "device", "object": "dp", "measurement": "properties", "dimension": "history", "params": map[string]any{"deviceId": "dd"}}

	var wg sync.WaitGroup
	statuses := make(chan int, 4)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res := e.export("?format=csv", "", history)
			defer res.Body.Close()
			statuses <- res.StatusCode
		}()
	}
	for range 4 {
		<-ps.entered // each of the four holds a slot
	}
	start := time.Now()
	res := e.export("?format=csv", "", history)
	r := e.envelope("POST", "/api/dashboard/_export", res)
	if r.HTTPStatus != http.StatusServiceUnavailable || r.Code != "too_many_requests" || res.Header.Get("Retry-After") != "1" ||
		r.Message != "too many exports in progress; retry later" {
		t.Errorf("fifth export: %d %q %q Retry-After %q, want 503 too_many_requests with Retry-After 1",
			r.HTTPStatus, r.Code, r.Message, res.Header.Get("Retry-After"))
	}
	if waited := time.Since(start); waited < time.Second {
		t.Errorf("refused after %v, want after its wait (2 s)", waited)
	}
	e.ok("POST", "/api/dashboard/_multi", []any{countQuery(map[string]any{"limit": 1})}, nil) // endpoint 14's slots are apart

	close(ps.release)
	wg.Wait()
	for range 4 {
		if s := <-statuses; s != http.StatusOK {
			t.Errorf("an admitted export: %d", s)
		}
	}
	text, _ := e.exportText("?format=csv", "", history) // the slots are free again
	if text == "" {
		t.Error("no header row")
	}
}
