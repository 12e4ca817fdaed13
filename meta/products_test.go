package meta_test

import (
	"context"
	"io/fs"
	"testing"

	"github.com/pressly/goose/v3"

	"devicehub/meta"
	"devicehub/schema"
)

// TestProductDeviceNum checks deviceNum (kept by triggers, 00007) against
// a count of the devices after each kind of write: single and bulk
// inserts, deletes, a device moved to another product, TRUNCATE.
func TestProductDeviceNum(t *testing.T) {
	t.Parallel()
	s := openListStore(t, 0, 0)
	ctx := context.Background()
	listExec(t, s, `INSERT INTO products (id, name, device_type, create_time) VALUES
		('a', 'A', 'device', now()), ('b', 'B', 'device', now() - interval '1 s'), ('c', 'C', 'device', now() - interval '2 s')`)
	check := func(step string) {
		t.Helper()
		want := map[string]int{}
		rows, err := s.DB().Query(`SELECT p.id, count(d.id) FROM products p LEFT JOIN devices d ON d.product_id = p.id GROUP BY p.id`)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var id string
			var n int
			if err := rows.Scan(&id, &n); err != nil {
				t.Fatal(err)
			}
			want[id] = n
		}
		rows.Close()
		page, err := s.QueryProducts(ctx, &meta.Query{})
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Data) != len(want) {
			t.Fatalf("%s: %d products, want %d", step, len(page.Data), len(want))
		}
		for _, p := range page.Data {
			if p.DeviceNum != want[p.ID] {
				t.Fatalf("%s: product %s deviceNum %d in the list, want %d", step, p.ID, p.DeviceNum, want[p.ID])
			}
			one, err := s.GetProduct(ctx, p.ID)
			if err != nil {
				t.Fatal(err)
			}
			if one.DeviceNum != want[p.ID] {
				t.Fatalf("%s: product %s deviceNum %d in the detail, want %d", step, p.ID, one.DeviceNum, want[p.ID])
			}
		}
	}
	admin := meta.User{ID: "admin", Name: "admin"}
	steps := []struct {
		name string
		do   func()
	}{
		{"none", func() {}},
		{"create", func() {
			for _, id := range []string{"d1", "d2", "d3"} {
				if _, err := s.CreateDevice(ctx, meta.NewDevice{ID: id, Name: id, ProductID: "a"}, admin); err != nil {
					t.Fatal(err)
				}
			}
		}},
		{"bulk insert over two products", func() {
			listExec(t, s, `INSERT INTO devices (id, name, product_id, secure_id)
				SELECT 'bulk' || i, 'bulk', (ARRAY['a','b'])[i % 2 + 1], 'bulk' || i FROM generate_series(1, 101) AS i`)
		}},
		{"delete one", func() {
			if _, err := s.DeleteDevice(ctx, "d2"); err != nil {
				t.Fatal(err)
			}
		}},
		{"bulk delete", func() { listExec(t, s, `DELETE FROM devices WHERE id LIKE 'bulk1%'`) }},
		{"move", func() { listExec(t, s, `UPDATE devices SET product_id = 'c' WHERE id IN ('d1', 'bulk2')`) }},
		{"update without a move", func() { listExec(t, s, `UPDATE devices SET product_id = product_id, name = 'x'`) }},
		{"truncate", func() { listExec(t, s, `TRUNCATE devices CASCADE`) }}, // device_shadows refers to devices
		{"after truncate", func() {
			listExec(t, s, `INSERT INTO devices (id, name, product_id, secure_id) VALUES ('e1', 'e', 'b', 'e1')`)
		}},
	}
	for _, st := range steps {
		st.do()
		check(st.name)
	}
	// A product with devices is refused; without, deleted with its count.
	if _, err := s.DeleteProduct(ctx, "b"); err == nil {
		t.Fatal("deleted a product with a device")
	}
	if _, err := s.DeleteProduct(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	check("product deleted")
}

// TestQueryProducts checks product pages: terms, the bounded total and a
// page past the end.
func TestQueryProducts(t *testing.T) {
	t.Parallel()
	s := openListStore(t, 3, 0)
	listExec(t, s, `INSERT INTO products (id, name, device_type, state, create_time)
		SELECT 'p' || i, 'Product ' || i, 'device', i % 2, now() - make_interval(secs => i) FROM generate_series(1, 9) AS i`)
	cases := []struct {
		name, body string
		index      int
		exact      bool
		total      int
		ids        string
	}{
		{"like", `{"terms":[{"column":"name","value":"product 1","termType":"like"}]}`, 0, true, 1, "p1"},
		{"state eq, counted to the page's end", `{"pageSize":10,"terms":[{"column":"state","value":1}]}`, 0, true, 5, "p1 p3 p5 p7 p9"},
		{"estimated", `{"pageSize":2}`, 0, false, 4, "p1 p2"},
		{"sorted by name desc", `{"pageSize":2,"sorts":[{"name":"name","order":"desc"}]}`, 0, false, 4, "p9 p8"},
		{"past the end", `{"pageIndex":30,"pageSize":4}`, 2, true, 9, "p9"},
		{"nin with state", `{"pageSize":20,"terms":[{"column":"id","value":"p1,p2","termType":"nin"},{"column":"state","value":"0"}]}`,
			0, true, 3, "p4 p6 p8"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			q, err := meta.DecodeQuery([]byte(c.body))
			if err != nil {
				t.Fatal(err)
			}
			p, err := s.QueryProducts(context.Background(), q)
			if err != nil {
				t.Fatal(err)
			}
			var got string
			for i, d := range p.Data {
				if i > 0 {
					got += " "
				}
				got += d.ID
			}
			if got != c.ids || p.PageIndex != c.index || p.TotalExact != c.exact {
				t.Fatalf("ids %q, pageIndex %d, exact %v; want %q, %d, %v", got, p.PageIndex, p.TotalExact, c.ids, c.index, c.exact)
			}
			if c.exact && p.Total != c.total || !c.exact && p.Total < c.total {
				t.Fatalf("total %d (exact %v), want %d", p.Total, p.TotalExact, c.total)
			}
		})
	}
	// The count (endpoint 6) stays exact.
	n, err := s.CountProducts(context.Background(), &meta.Query{})
	if err != nil || n != 9 {
		t.Fatalf("count %d, %v; want 9", n, err)
	}
}

// TestListCountsMigrationDown checks that 00007 goes down and up again on a
// database with devices, the counts taken anew.
func TestListCountsMigrationDown(t *testing.T) {
	t.Parallel()
	s := openListStore(t, 0, 0)
	ctx := context.Background()
	listExec(t, s, `INSERT INTO products (id, name, device_type) VALUES ('a', 'A', 'device')`)
	listExec(t, s, `INSERT INTO devices (id, name, product_id, secure_id) SELECT 'd' || i, 'd', 'a', 'd' || i FROM generate_series(1, 5) AS i`)
	sub, err := fs.Sub(schema.Postgres, "postgres")
	if err != nil {
		t.Fatal(err)
	}
	p, err := goose.NewProvider(goose.DialectPostgres, s.DB().DB, sub)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.DownTo(ctx, 6); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := s.DB().Get(&n, `SELECT count(*) FROM pg_indexes WHERE indexname = 'devices_name_trgm'`); err != nil || n != 1 {
		t.Fatalf("after down: GIN index %d, %v", n, err)
	}
	listExec(t, s, `INSERT INTO devices (id, name, product_id, secure_id) VALUES ('d6', 'd', 'a', 'd6')`)
	if _, err := p.Up(ctx); err != nil {
		t.Fatal(err)
	}
	one, err := s.GetProduct(ctx, "a")
	if err != nil || one.DeviceNum != 6 {
		t.Fatalf("after up: deviceNum %d, %v; want 6", one.DeviceNum, err)
	}
}
