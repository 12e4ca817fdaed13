package meta_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lib/pq"

	"devicehub/meta"
	"devicehub/meta/metatest"
	"devicehub/schema"
)

// openStore opens a migrated store on a fresh database with the list
// options given (the rest as DefaultOptions).
func openListStore(t *testing.T, exactLimit int, estimateTTL time.Duration) *meta.Store {
	t.Helper()
	opts := meta.DefaultOptions()
	opts.DSN = metatest.NewDatabase(t)
	opts.MaxOpenConns = 4
	opts.ExactTotalLimit, opts.TotalEstimateTTL = exactLimit, estimateTTL
	s, err := meta.Open(context.Background(), opts)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func listExec(t *testing.T, s *meta.Store, sql string, args ...any) {
	t.Helper()
	if _, err := s.DB().Exec(sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	// Written past the Store: its page cache hears of it by announcement.
	if err := s.SyncLists(context.Background()); err != nil {
		t.Fatalf("sync lists: %v", err)
	}
}

// listDevice is a seeded device, as the list should show it.
type listDevice struct {
	id, name, product, state string
	created                  int64 // epoch ms
}

// listBase is the seeds' creation time; device i is created i minutes later.
var listBase = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC).UnixMilli()

// seedDevices writes two products (p1: device, class c1; p2: gateway, class
// c2) and the devices named, in SQL, with distinct creation times.
func seedListDevices(t *testing.T, s *meta.Store, names []string) []listDevice {
	t.Helper()
	listExec(t, s, `INSERT INTO products (id, name, device_type, classified_id) VALUES
		('p1', 'Meter', 'device', 'c1'), ('p2', 'Gateway', 'gateway', 'c2')`)
	states := []string{meta.StateNotActive, meta.StateOffline, meta.StateOnline}
	var devs []listDevice
	for i, name := range names {
		d := listDevice{id: fmt.Sprintf("d%02d", i+1), name: name, product: []string{"p1", "p2"}[i%2],
			state: states[i%3], created: listBase + int64(i)*60_000}
		listExec(t, s, `INSERT INTO devices (id, name, product_id, state, secure_id, create_time)
			VALUES ($1, $2, $3, $4, $1, to_timestamp($5::bigint / 1000.0))`, d.id, d.name, d.product, d.state, d.created)
		devs = append(devs, d)
	}
	return devs
}

var listNames = []string{
	"Kitchen meter 1", "kitchen METER 2", "Garage meter 10", "Attic_sensor", "AtticXsensor",
	"100% sure", `back\slash`, "", "Żółw <&> meter", "Hall\u2028line", "Office lamp", "Roof meter 11",
}

// newestFirst is the default order: createTime desc, then id.
func newestFirst(devs []listDevice) []listDevice {
	out := slices.Clone(devs)
	slices.SortFunc(out, func(a, b listDevice) int {
		if a.created != b.created {
			return int(b.created - a.created)
		}
		return strings.Compare(a.id, b.id)
	})
	return out
}

func listIDs(devs []listDevice) []string {
	out := make([]string, len(devs))
	for i, d := range devs {
		out[i] = d.id
	}
	return out
}

func pageIDs(p meta.Page[meta.Device]) []string {
	out := make([]string, len(p.Data))
	for i, d := range p.Data {
		out[i] = d.ID
	}
	return out
}

func listQuery(t *testing.T, s *meta.Store, body string) meta.Page[meta.Device] {
	t.Helper()
	q, err := meta.DecodeQuery([]byte(body))
	if err != nil {
		t.Fatalf("%s: %v", body, err)
	}
	p, err := s.QueryDevices(context.Background(), q)
	if err != nil {
		t.Fatalf("%s: %v", body, err)
	}
	return p
}

// TestQueryDevicesTermTypes checks every termType against a model of the
// seeded devices, with the total counted exactly (a large limit) and with
// it estimated past a limit of 2 (pages of 3): the same rows either way.
func TestQueryDevicesTermTypes(t *testing.T) {
	t.Parallel()
	exact, estimated := openListStore(t, 10_000, 0), openListStore(t, 2, 0)
	devs := seedListDevices(t, exact, listNames)
	seedListDevices(t, estimated, listNames)
	has := func(sub string) func(d listDevice) bool {
		return func(d listDevice) bool { return strings.Contains(strings.ToLower(d.name), strings.ToLower(sub)) }
	}
	not := func(f func(listDevice) bool) func(listDevice) bool { return func(d listDevice) bool { return !f(d) } }
	at := func(i int) int64 { return listBase + int64(i)*60_000 }
	cases := []struct {
		name, terms string
		match       func(d listDevice) bool
	}{
		{"none", ``, func(listDevice) bool { return true }},
		{"eq", `{"column":"name","value":"Attic_sensor"}`, func(d listDevice) bool { return d.name == "Attic_sensor" }},
		{"eq empty", `{"column":"name","value":""}`, func(d listDevice) bool { return d.name == "" }},
		{"not", `{"column":"name","value":"Attic_sensor","termType":"not"}`, func(d listDevice) bool { return d.name != "Attic_sensor" }},
		{"like substring", `{"column":"name","value":"meter","termType":"like"}`, has("meter")},
		{"like prefix", `{"column":"name","value":"kitchen%","termType":"like"}`, func(d listDevice) bool {
			return strings.HasPrefix(strings.ToLower(d.name), "kitchen")
		}},
		{"like suffix", `{"column":"name","value":"%1","termType":"like"}`, func(d listDevice) bool { return strings.HasSuffix(d.name, "1") }},
		{"like underscore literal", `{"column":"name","value":"c_s","termType":"like"}`, has("c_s")},
		{"like underscore wildcard", `{"column":"name","value":"%c_s%","termType":"like"}`, func(d listDevice) bool {
			return strings.Contains(d.name, "c_s") || strings.Contains(d.name, "cXs")
		}},
		{"like percent literal kept", `{"column":"name","value":"100%","termType":"like"}`, func(d listDevice) bool {
			return strings.HasPrefix(d.name, "100")
		}},
		{"like backslash", `{"column":"name","value":"k\\s","termType":"like"}`, has(`k\s`)},
		{"like html", `{"column":"name","value":"<&>","termType":"like"}`, has("<&>")},
		{"like short", `{"column":"name","value":"of","termType":"like"}`, has("of")},
		{"like column suffix", `{"column":"name$like","value":"garage"}`, has("garage")},
		{"like id", `{"column":"id","value":"d1","termType":"like"}`, func(d listDevice) bool { return strings.Contains(d.id, "d1") }},
		{"nlike", `{"column":"name","value":"meter","termType":"nlike"}`, not(has("meter"))},
		{"in", `{"column":"name","value":["Attic_sensor","Office lamp","nothing"],"termType":"in"}`, func(d listDevice) bool {
			return d.name == "Attic_sensor" || d.name == "Office lamp"
		}},
		{"in text", `{"column":"id","value":"d01, d03","termType":"in"}`, func(d listDevice) bool { return d.id == "d01" || d.id == "d03" }},
		{"nin", `{"column":"state","value":["online","offline"],"termType":"nin"}`, func(d listDevice) bool { return d.state == meta.StateNotActive }},
		{"gt", `{"column":"id","value":"d10","termType":"gt"}`, func(d listDevice) bool { return d.id > "d10" }},
		{"gte", `{"column":"id","value":"d10","termType":"gte"}`, func(d listDevice) bool { return d.id >= "d10" }},
		{"lt", `{"column":"id","value":"d03","termType":"lt"}`, func(d listDevice) bool { return d.id < "d03" }},
		{"lte", `{"column":"id","value":"d03","termType":"lte"}`, func(d listDevice) bool { return d.id <= "d03" }},
		{"btw time", fmt.Sprintf(`{"column":"createTime","value":[%d,%d],"termType":"btw"}`, at(2), at(5)), func(d listDevice) bool {
			return d.created >= at(2) && d.created <= at(5)
		}},
		{"nbtw time", fmt.Sprintf(`{"column":"createTime","value":"%d,%d","termType":"nbtw"}`, at(2), at(5)), func(d listDevice) bool {
			return d.created < at(2) || d.created > at(5)
		}},
		{"gt time", fmt.Sprintf(`{"column":"createTime","value":%d,"termType":"gt"}`, at(9)), func(d listDevice) bool { return d.created > at(9) }},
		{"isnull", `{"column":"name","termType":"isnull"}`, func(listDevice) bool { return false }},
		{"notnull", `{"column":"name","termType":"notnull"}`, func(listDevice) bool { return true }},
		{"empty", `{"column":"name","termType":"empty"}`, func(d listDevice) bool { return d.name == "" }},
		{"nempty", `{"column":"name","termType":"nempty"}`, func(d listDevice) bool { return d.name != "" }},
		{"product eq", `{"column":"productId","value":"p2"}`, func(d listDevice) bool { return d.product == "p2" }},
		{"deviceType (product column)", `{"column":"deviceType","value":"gateway"}`, func(d listDevice) bool { return d.product == "p2" }},
		{"classifiedId (product column)", `{"column":"classifiedId","value":"c1","termType":"eq"}`, func(d listDevice) bool { return d.product == "p1" }},
		{"and", `{"column":"productId","value":"p1"},{"column":"name","value":"meter","termType":"like"}`, func(d listDevice) bool {
			return d.product == "p1" && has("meter")(d)
		}},
		{"or group", `{"terms":[{"column":"state","value":"online"},{"column":"name","value":"attic","termType":"like","type":"or"}]}`,
			func(d listDevice) bool { return d.state == meta.StateOnline || has("attic")(d) }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var want []listDevice
			for _, d := range newestFirst(devs) {
				if c.match(d) {
					want = append(want, d)
				}
			}
			p := listQuery(t, exact, `{"pageSize":100,"terms":[`+c.terms+`]}`)
			if !p.TotalExact || p.Total != len(want) || !slices.Equal(pageIDs(p), listIDs(want)) {
				t.Fatalf("exact: total %d (exact %v), ids %v; want %d, %v", p.Total, p.TotalExact, pageIDs(p), len(want), listIDs(want))
			}
			p = listQuery(t, estimated, `{"pageSize":3,"terms":[`+c.terms+`]}`)
			first := want[:min(3, len(want))]
			if !slices.Equal(pageIDs(p), listIDs(first)) {
				t.Fatalf("estimated: ids %v, want %v", pageIDs(p), listIDs(first))
			}
			if len(want) <= 3 && (!p.TotalExact || p.Total != len(want)) {
				t.Fatalf("estimated: total %d (exact %v), want exactly %d", p.Total, p.TotalExact, len(want))
			}
			// Terms the product counts answer (none, state, productId:
			// schema 00015) have an exact total at any size.
			if len(want) > 3 && (p.TotalExact && p.Total != len(want) || !p.TotalExact && p.Total < 4) {
				t.Fatalf("estimated: total %d (exact %v), want %d or an estimate of at least 4", p.Total, p.TotalExact, len(want))
			}
		})
	}
}

// TestQueryDevicesSorts checks each sort against the model, on both paths.
func TestQueryDevicesSorts(t *testing.T) {
	t.Parallel()
	exact, estimated := openListStore(t, 10_000, 0), openListStore(t, 2, 0)
	devs := seedListDevices(t, exact, listNames)
	seedListDevices(t, estimated, listNames)
	var collate string
	if err := exact.DB().Get(&collate, `SELECT datcollate FROM pg_database WHERE datname = current_database()`); err != nil {
		t.Fatal(err)
	}
	byteOrder := collate == "C" || collate == "POSIX" || strings.HasPrefix(collate, "C.")
	// Names sort in the natural order of migration 00032's collation
	// (meta.Natural): the model takes its ranks from PostgreSQL, and the
	// test checks that both paths page through them alike.
	var natural []string
	if err := exact.DB().Select(&natural, `SELECT n FROM unnest($1::text[]) AS n ORDER BY n COLLATE devicehub_natural`, pq.Array(listNames)); err != nil {
		t.Fatal(err)
	}
	nameRank := func(n string) int { return slices.Index(natural, n) }
	cases := []struct {
		name, sorts string
		cmp         func(a, b listDevice) int
		textual     bool // compares text: only under a byte-order collation
	}{
		{"default", ``, nil, false},
		{"createTime asc", `{"name":"createTime","order":"asc"}`, func(a, b listDevice) int { return int(a.created - b.created) }, false},
		{"id desc", `{"name":"id","order":"desc"}`, func(a, b listDevice) int { return strings.Compare(b.id, a.id) }, false},
		{"state then id", `{"name":"state"}`, func(a, b listDevice) int { return strings.Compare(a.state, b.state) }, true},
		{"name", `{"name":"name"}`, func(a, b listDevice) int { return nameRank(a.name) - nameRank(b.name) }, false},
		{"productId desc", `{"name":"productId","order":"desc"}`, func(a, b listDevice) int { return strings.Compare(b.product, a.product) }, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.textual && !byteOrder {
				t.Skipf("database collation %s does not sort as bytes", collate)
			}
			want := newestFirst(devs)
			if c.cmp != nil {
				slices.SortStableFunc(want, func(a, b listDevice) int {
					if r := c.cmp(a, b); r != 0 {
						return r
					}
					return strings.Compare(a.id, b.id)
				})
			}
			for i, s := range []*meta.Store{exact, estimated} {
				for page := 0; page*3 < len(want); page++ {
					p := listQuery(t, s, fmt.Sprintf(`{"pageIndex":%d,"pageSize":3,"sorts":[%s]}`, page, c.sorts))
					if w := listIDs(want[page*3 : min(page*3+3, len(want))]); !slices.Equal(pageIDs(p), w) {
						t.Fatalf("store %d page %d: %v, want %v", i, page, pageIDs(p), w)
					}
				}
			}
		})
	}
}

// TestQueryDevicesTotal checks the bounded total: exact up to the limit or
// to the end of the page asked for, an estimate past it, and a pageIndex
// past the end giving the last page.
func TestQueryDevicesTotal(t *testing.T) {
	t.Parallel()
	s := openListStore(t, 5, 0)
	var names []string
	for i := range 12 {
		names = append(names, fmt.Sprintf("Lamp %d", i))
	}
	devs := newestFirst(seedListDevices(t, s, names))
	const lamps = `"terms":[{"column":"name","value":"lamp","termType":"like"}]` // every device
	cases := []struct {
		name, body string
		index      int
		exact      bool
		total      int // exact: the total; else a lower bound
		want       []listDevice
	}{
		{"up to the limit", `{"pageSize":2,"terms":[{"column":"id","value":["d01","d02","d03","d04","d05"],"termType":"in"}]}`,
			0, true, 5, newestFirst(devs[7:9])},
		{"past the limit", `{"pageSize":2,` + lamps + `}`, 0, false, 6, devs[:2]},
		{"second page past the limit", `{"pageIndex":1,"pageSize":2,` + lamps + `}`, 1, false, 6, devs[2:4]},
		{"page beyond the limit, before the end", `{"pageIndex":4,"pageSize":2,` + lamps + `}`, 4, false, 11, devs[8:10]},
		{"page ending at the end", `{"pageIndex":5,"pageSize":2,` + lamps + `}`, 5, true, 12, devs[10:12]},
		{"page past the end: the last", `{"pageIndex":9,"pageSize":2,` + lamps + `}`, 5, true, 12, devs[10:12]},
		// No terms (or state, productId): the product counts' exact total.
		{"counted past the limit", `{"pageSize":2}`, 0, true, 12, devs[:2]},
		{"counted, page past the end", `{"pageIndex":9,"pageSize":2}`, 5, true, 12, devs[10:12]},
		{"current past the end", `{"current":40,"pageSize":5}`, 2, true, 12, devs[10:12]},
		{"paging false", `{"paging":false}`, 0, true, 12, devs},
		{"pageSize above the limit", `{"pageSize":20}`, 0, true, 12, devs},
		{"no match", `{"terms":[{"column":"name","value":"nothing"}]}`, 0, true, 0, nil},
		{"no match, page past the end", `{"pageIndex":3,"terms":[{"column":"name","value":"nothing"}]}`, 0, true, 0, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := listQuery(t, s, c.body)
			if p.PageIndex != c.index || p.TotalExact != c.exact || !slices.Equal(pageIDs(p), listIDs(c.want)) {
				t.Fatalf("pageIndex %d, exact %v, ids %v; want %d, %v, %v", p.PageIndex, p.TotalExact, pageIDs(p), c.index, c.exact, listIDs(c.want))
			}
			if c.exact && p.Total != c.total || !c.exact && p.Total < c.total {
				t.Fatalf("total %d (exact %v), want %d", p.Total, p.TotalExact, c.total)
			}
			if p.Data == nil {
				t.Fatal("data is nil, want []")
			}
		})
	}
}

// TestQueryDevicesTotalKept checks that an estimate is kept for the same
// terms (their pages read only the page), and what still makes the total
// exact: a short page, a page past the end, other terms.
func TestQueryDevicesTotalKept(t *testing.T) {
	t.Parallel()
	s := openListStore(t, 5, time.Hour)
	var names []string
	for i := range 12 {
		names = append(names, fmt.Sprintf("Lamp %d", i))
	}
	devs := newestFirst(seedListDevices(t, s, names))
	const terms = `"terms":[{"column":"name","value":"lamp","termType":"like"}]`
	p := listQuery(t, s, `{"pageSize":2,`+terms+`}`)
	if p.TotalExact || p.Total < 6 {
		t.Fatalf("total %d (exact %v), want an estimate", p.Total, p.TotalExact)
	}
	est := p.Total
	// Nine devices go: the kept estimate answers full pages of the same
	// terms, whatever their values of page and order.
	listExec(t, s, `DELETE FROM devices WHERE id > 'd03'`)
	kept := devs[9:]
	p = listQuery(t, s, `{"pageSize":2,`+terms+`}`)
	if p.TotalExact || p.Total != est || !slices.Equal(pageIDs(p), listIDs(kept[:2])) {
		t.Fatalf("kept: total %d (exact %v), ids %v; want %d estimated, %v", p.Total, p.TotalExact, pageIDs(p), est, listIDs(kept[:2]))
	}
	// A page shorter than its size is the end: exact.
	p = listQuery(t, s, `{"pageIndex":1,"pageSize":2,`+terms+`}`)
	if !p.TotalExact || p.Total != 3 || !slices.Equal(pageIDs(p), listIDs(kept[2:])) {
		t.Fatalf("short page: total %d (exact %v), ids %v", p.Total, p.TotalExact, pageIDs(p))
	}
	// Past the end: counted, the last page.
	p = listQuery(t, s, `{"pageIndex":7,"pageSize":2,`+terms+`}`)
	if !p.TotalExact || p.Total != 3 || p.PageIndex != 1 || !slices.Equal(pageIDs(p), listIDs(kept[2:])) {
		t.Fatalf("past the end: pageIndex %d, total %d (exact %v), ids %v", p.PageIndex, p.Total, p.TotalExact, pageIDs(p))
	}
	// Other values are other terms.
	p = listQuery(t, s, `{"pageSize":2,"terms":[{"column":"name","value":"lamp ","termType":"like"}]}`)
	if !p.TotalExact || p.Total != 3 {
		t.Fatalf("other terms: total %d (exact %v), want 3 exactly", p.Total, p.TotalExact)
	}
}

// TestQueryDevicesBadInput checks that a bad body is an input error.
func TestQueryDevicesBadInput(t *testing.T) {
	t.Parallel()
	s := openListStore(t, 0, 0)
	for _, body := range []string{
		`{"terms":[{"column":"secureKey","value":"x"}]}`,
		`{"terms":[{"column":"createTime","value":"soon","termType":"gt"}]}`,
		`{"sorts":[{"name":"secureKey"}]}`,
		`{"terms":[{"column":"name","value":"x","termType":"regex"}]}`,
	} {
		q, err := meta.DecodeQuery([]byte(body))
		if err == nil {
			_, err = s.QueryDevices(context.Background(), q)
		}
		if !errors.Is(err, schema.ErrIllegalArgument) {
			t.Errorf("%s: %v, want an illegal argument", body, err)
		}
	}
}
