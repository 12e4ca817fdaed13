package api_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// TestNaturalOrder checks the order of the lists' id and name sorts over
// HTTP (devices, products, roles): natural and case-insensitive (dev-1, dev-2, Dev-3, dev-10, not
// the text order Dev-3, dev-1, dev-10, dev-2), ids equal but for case in
// a fixed order, descending the exact reverse, and pages of every size that
// concatenate to the whole order with no repeat and no gap: on a match
// small enough to be sorted after counting it and on one past the exact
// total's bound (1,000), which is read page by page in the database's
// order.
func TestNaturalOrder(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.createProduct("nat", "Natural", nil)
	ids := []string{"dev-10", "Dev-3", "dev-2", "dev-1", "dev-3", "DEV-20", "dev-02", "dev-1a"}
	names := map[string]string{"dev-10": "Meter 10", "Dev-3": "meter 2", "dev-2": "Meter 2", "dev-1": "meter 1",
		"dev-3": "Meter 1", "DEV-20": "Meter 9", "dev-02": "meter 10", "dev-1a": "Meter 1"}
	for _, id := range ids {
		e.createDevice(id, names[id], "nat", nil)
	}
	// ICU's numeric order reads "02" as 2, and its secondary strength
	// ignores case; its ties ("dev-02" and "dev-2", "Dev-3" and "dev-3")
	// are ordered by their bytes.
	wantIDs := []string{"dev-1", "dev-1a", "dev-02", "dev-2", "Dev-3", "dev-3", "dev-10", "DEV-20"}
	// Names (equal but for case: by their bytes, "Meter 1" before "meter
	// 1"), then ids for equal names.
	wantByName := []string{"dev-1a", "dev-3", "dev-1", "dev-2", "Dev-3", "DEV-20", "dev-10", "dev-02"}
	mine := map[string]any{"column": "productId", "value": "nat"}
	sorted := func(name, order string, size int) []string {
		t.Helper()
		var all []string
		for page := 0; ; page++ {
			got := e.deviceIDs(map[string]any{"pageIndex": page, "pageSize": size, "terms": []any{mine},
				"sorts": []map[string]string{{"name": name, "order": order}}})
			all = append(all, got...)
			if len(got) < size || len(all) == len(ids) {
				return all
			}
		}
	}
	reversed := func(s []string) []string { r := slices.Clone(s); slices.Reverse(r); return r }
	for _, size := range []int{1, 2, 3, 5, 8, 25} {
		for _, c := range []struct {
			name, order string
			want        []string
		}{
			{"id", "asc", wantIDs},
			{"id", "desc", reversed(wantIDs)},
			{"name", "asc", wantByName},
		} {
			if got := sorted(c.name, c.order, size); !slices.Equal(got, c.want) {
				t.Fatalf("devices by %s %s, pages of %d: %v, want %v", c.name, c.order, size, got, c.want)
			}
		}
	}

	// Products by id, and by name.
	for _, p := range []struct{ id, name string }{{"p-10", "Meter 10"}, {"P-3", "meter 3"}, {"p-2", "Meter 2"}} {
		e.createProduct(p.id, p.name, nil)
	}
	var products struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	for sort, want := range map[string][]string{"id": {"p-2", "P-3", "p-10"}, "name": {"p-2", "P-3", "p-10"}} {
		e.ok("POST", "/api/device-product/_query", map[string]any{"sorts": []map[string]string{{"name": sort}},
			"terms": []map[string]any{{"column": "id", "value": "p-%", "termType": "like"}}}, &products)
		var got []string
		for _, p := range products.Data {
			got = append(got, p.ID)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("products by %s: %v, want %v", sort, got, want)
		}
	}

	// Roles by id and by name (lists of other tables sort alike).
	for _, r := range []struct{ id, name string }{{"r-10", "Shift 10"}, {"R-3", "shift 3"}, {"r-2", "Shift 2"}} {
		if _, err := e.store.DB().Exec(`INSERT INTO roles (id, name, description) VALUES ($1, $2, '')`, r.id, r.name); err != nil {
			t.Fatal(err)
		}
	}
	for sort, want := range map[string][]string{"id": {"r-2", "R-3", "r-10"}, "name": {"r-2", "R-3", "r-10"}} {
		e.ok("POST", "/api/role/_query", map[string]any{"sorts": []map[string]string{{"name": sort}},
			"terms": []map[string]any{{"column": "id", "value": "r-%", "termType": "like"}}}, &products)
		var got []string
		for _, p := range products.Data {
			got = append(got, p.ID)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("roles by %s: %v, want %v", sort, got, want)
		}
	}

	// Past the exact total's bound: 1,200 devices, some ids in capitals.
	if _, err := e.store.DB().Exec(`INSERT INTO devices (id, name, product_id, secure_id)
		SELECT CASE WHEN i % 7 = 0 THEN 'BIG-' ELSE 'big-' END || i, 'Big ' || i, 'nat', 'big-' || i
		FROM generate_series(1, 1200) AS i`); err != nil {
		t.Fatal(err)
	}
	var want []string
	for i := 1; i <= 1200; i++ {
		prefix := "big-"
		if i%7 == 0 {
			prefix = "BIG-"
		}
		want = append(want, fmt.Sprintf("%s%d", prefix, i))
	}
	big := map[string]any{"column": "id", "value": "big-%", "termType": "like"}
	for _, size := range []int{100, 70} {
		var all []string
		for page := 0; len(all) < len(want); page++ {
			got := e.deviceIDs(map[string]any{"pageIndex": page, "pageSize": size, "terms": []any{big},
				"sorts": []map[string]string{{"name": "id"}}})
			if len(got) == 0 {
				break
			}
			all = append(all, got...)
		}
		if !slices.Equal(all, want) {
			i := 0
			for i < min(len(all), len(want)) && all[i] == want[i] {
				i++
			}
			t.Fatalf("1,200 devices by id, pages of %d: %d ids, first difference at %d: %s, want %s",
				size, len(all), i, strings.Join(all[i:min(i+5, len(all))], " "), strings.Join(want[i:min(i+5, len(want))], " "))
		}
	}
}
