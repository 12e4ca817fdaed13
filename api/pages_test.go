package api_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"devicehub/bench/testkit"
)

// TestListTotals checks the page fields of endpoints 7 and 1 over HTTP:
// totalExact with the exact total up to the bound (meta's default, 1,000
// matches), an estimate past it (exact at any size for the terms the
// product counts answer), the last page for a pageIndex past the end,
// and illegal_argument for bad bodies.
func TestListTotals(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.createProduct("meter", "Meter", nil)
	if _, err := e.store.DB().Exec(`INSERT INTO devices (id, name, product_id, secure_id, create_time)
		SELECT 'dev-' || lpad(i::text, 4, '0'), CASE WHEN i <= 3 THEN 'Kitchen lamp ' ELSE 'Hall meter ' END || i,
			'meter', 'dev-' || i, now() - make_interval(secs => i)
		FROM generate_series(1, 1050) AS i`); err != nil {
		t.Fatal(err)
	}
	type page struct {
		PageIndex  int               `json:"pageIndex"`
		PageSize   int               `json:"pageSize"`
		Total      int               `json:"total"`
		TotalExact *bool             `json:"totalExact"`
		Data       []json.RawMessage `json:"data"`
	}
	const all = `"terms":[{"column":"id","value":"dev-","termType":"like"}]` // every device
	cases := []struct {
		name, path, body string
		index, size      int
		exact            bool
		total            int // exact: the total; else a lower bound
		items            int
	}{
		{"devices, a few match", "/api/device-instance/_query/", `{"terms":[{"column":"name","value":"kitchen","termType":"like"}]}`,
			0, 25, true, 3, 3},
		{"devices, more than the bound", "/api/device-instance/_query/", `{"pageSize":10,` + all + `}`, 0, 10, false, 1001, 10},
		// The estimate above is kept for the same terms: a full page, even
		// the last one, cannot tell the end.
		{"devices, the last page, full", "/api/device-instance/_query/", `{"pageIndex":104,"pageSize":10,` + all + `}`, 104, 10, false, 1050, 10},
		// No terms, or only state and productId: the product counts give
		// the exact total at any size.
		{"devices, all, counted", "/api/device-instance/_query/", `{"pageSize":10}`, 0, 10, true, 1050, 10},
		{"devices, a state, counted", "/api/device-instance/_query/", `{"pageSize":10,"terms":[{"column":"state","value":"notActive"},{"column":"productId","value":"meter"}]}`,
			0, 10, true, 1050, 10},
		{"devices, the last page, short", "/api/device-instance/_query/", `{"pageIndex":52,"pageSize":20}`, 52, 20, true, 1050, 10},
		{"devices, past the end", "/api/device-instance/_query/", `{"pageIndex":500,"pageSize":100}`, 10, 100, true, 1050, 50},
		{"devices, all on one page", "/api/device-instance/_query/", `{"paging":false,"terms":[{"column":"name","value":"lamp","termType":"like"}]}`,
			0, 1000, true, 3, 3},
		{"devices, none", "/api/device-instance/_query/", `{"terms":[{"column":"name","value":"garage","termType":"like"}]}`,
			0, 25, true, 0, 0},
		{"products", "/api/device-product/_query/", `{}`, 0, 25, true, 1, 1},
		{"products, past the end", "/api/device-product/_query/", `{"pageIndex":3,"pageSize":5}`, 0, 5, true, 1, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var p page
			e.ok("POST", c.path, c.body, &p)
			if p.TotalExact == nil {
				t.Fatal("no totalExact")
			}
			if p.PageIndex != c.index || p.PageSize != c.size || *p.TotalExact != c.exact || len(p.Data) != c.items {
				t.Fatalf("pageIndex %d, pageSize %d, totalExact %v, %d items; want %d, %d, %v, %d",
					p.PageIndex, p.PageSize, *p.TotalExact, len(p.Data), c.index, c.size, c.exact, c.items)
			}
			if c.exact && p.Total != c.total || !c.exact && p.Total < c.total {
				t.Fatalf("total %d (exact %v), want %d", p.Total, *p.TotalExact, c.total)
			}
		})
	}
	for _, body := range []string{
		`{"terms":[{"column":"secureKey","value":"x"}]}`,
		`{"pageSize":1001}`,
		`{"sorts":[{"name":"name","order":"up"}]}`,
		`{"terms":[{"column":"name","value":"x","termType":"like"}`,
	} {
		for _, path := range []string{"/api/device-instance/_query/", "/api/device-product/_query/"} {
			e.fails("POST", path, body, 400, "illegal_argument")
		}
	}
	// The product's deviceNum counts the devices written in SQL.
	var products page
	e.ok("POST", "/api/device-product/_query/", `{}`, &products)
	if len(products.Data) != 1 || !strings.Contains(string(products.Data[0]), `"deviceNum":1050`) {
		t.Fatalf("product: %s", products.Data)
	}
	// The detail's deviceNum agrees.
	var detail map[string]any
	e.ok("GET", "/api/device-product/meter", nil, &detail)
	if fmt.Sprint(detail["deviceNum"]) != "1050" {
		t.Fatalf("detail deviceNum %v", detail["deviceNum"])
	}
}

// TestListsShowWrites: product and device pages are kept between reads
// (meta's page cache), and every write shows on the next page a client
// reads: at once when it goes through this server, within a second when
// another instance (here: SQL on its own connection) commits it.
func TestListsShowWrites(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.createProduct("meter", "Meter", nil)
	names := func() string {
		var parts []string
		for _, d := range e.queryDevices(`{"sorts":[{"name":"id","order":"asc"}]}`).Data {
			parts = append(parts, fmt.Sprint(d["id"], "=", d["name"]))
		}
		var p struct {
			Data []struct {
				ID        string `json:"id"`
				DeviceNum int    `json:"deviceNum"`
			} `json:"data"`
		}
		e.ok("POST", "/api/device-product/_query/", `{}`, &p)
		for _, x := range p.Data {
			parts = append(parts, fmt.Sprint(x.ID, ":", x.DeviceNum))
		}
		return strings.Join(parts, " ")
	}
	steps := []struct {
		name  string
		write func()
		want  string
	}{
		{"nothing yet", func() {}, "meter:0"},
		{"create", func() { e.createDevice("d1", "Hall", "meter", nil) }, "d1=Hall meter:1"},
		{"create another", func() { e.createDevice("d2", "Attic", "meter", nil) }, "d1=Hall d2=Attic meter:2"},
		{"rename", func() { e.ok("PUT", "/api/device/instance/d1", map[string]any{"name": "Kitchen"}, nil) }, "d1=Kitchen d2=Attic meter:2"},
		{"delete", func() { e.ok("DELETE", "/api/device/instance/d2", nil, nil) }, "d1=Kitchen meter:1"},
	}
	for _, st := range steps {
		_ = names() // the page before the write, kept
		st.write()
		if got := names(); got != st.want {
			t.Fatalf("right after %s: %q, want %q", st.name, got, st.want)
		}
	}
	// Another instance's writes arrive by PostgreSQL's announcement.
	if _, err := e.store.DB().Exec(`UPDATE devices SET name = 'Garage' WHERE id = 'd1'`); err != nil {
		t.Fatal(err)
	}
	want := "d1=Garage meter:1"
	if !testkit.Within(time.Second, func() bool { return names() == want }) {
		t.Fatalf("a second after another instance's rename: %q, want %q", names(), want)
	}
}
