package meta_test

import (
	"context"
	"testing"

	"devicehub/meta"
	"devicehub/meta/metatest"
)

// TestQueryDevicesWithModels: a device page carries no device's own thing
// model; QueryDevicesWithModels adds them for the page's devices, within
// the caller's products, and leaves the page cache's page without them.
func TestQueryDevicesWithModels(t *testing.T) {
	t.Parallel()
	s := metatest.NewStore(t)
	ctx := context.Background()
	createTestProduct(t, s, "p", false)
	createTestProduct(t, s, "q", false)
	for _, d := range []struct{ id, product string }{{"d1", "p"}, {"d2", "p"}, {"d3", "p"}, {"e1", "q"}} {
		createTestDevice(t, s, d.id, d.product)
	}
	models := map[string]string{
		"d1": `{"properties":[{"id":"a","name":"A","valueType":{"type":"int"}}],"events":[],"functions":[],"tags":[]}`,
		"d2": `{"properties":[{"id":"b","name":"B","valueType":{"type":"int"}}],"events":[],"functions":[],"tags":[]}`,
		"e1": `{"properties":[{"id":"c","name":"C","valueType":{"type":"int"}}],"events":[],"functions":[],"tags":[]}`,
	}
	for id, m := range models {
		if err := s.SetDeviceMetadata(ctx, id, m, lcAdmin); err != nil {
			t.Fatal(err)
		}
	}
	plain := func(ctx context.Context) {
		t.Helper()
		p, err := s.QueryDevices(ctx, &meta.Query{})
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range p.Data {
			if d.DeviceMetadata != "" {
				t.Fatalf("device %s: a page carries its model", d.ID)
			}
		}
	}
	with := func(ctx context.Context, want int) {
		t.Helper()
		p, err := s.QueryDevicesWithModels(ctx, &meta.Query{})
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Data) != want {
			t.Fatalf("%d devices, want %d", len(p.Data), want)
		}
		for _, d := range p.Data {
			if d.DeviceMetadata != models[d.ID] {
				t.Fatalf("device %s: model %q, want %q", d.ID, d.DeviceMetadata, models[d.ID])
			}
		}
	}
	plain(ctx)
	with(ctx, 4)
	plain(ctx) // the kept page was not changed by the copy
	onlyP := meta.LimitProducts(ctx, false, []string{"p"})
	with(onlyP, 3)
	plain(onlyP)
}
