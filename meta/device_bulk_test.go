package meta_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"devicehub/meta"
	"devicehub/meta/metatest"
	"devicehub/schema"
)

// Bulk device writes (device_bulk.go) against a real PostgreSQL.

// bulkRows returns the rows of a BulkError, failing otherwise.
func bulkRows(t *testing.T, err error) []meta.BulkRowError {
	t.Helper()
	var be *meta.BulkError
	if !errors.As(err, &be) || !errors.Is(err, schema.ErrIllegalArgument) {
		t.Fatalf("error %v, want a BulkError", err)
	}
	return be.Rows
}

// TestCreateDevicesSameRulesAsCreateDevice: a device that CreateDevice
// refuses, a bulk create refuses as a bad row naming the same field, for
// the same reason; one it accepts, a bulk create accepts. Random devices
// from values that break each rule of a new device (device_input.go's
// included: ids, secureIds and keys of every kind), each sent both ways.
func TestCreateDevicesSameRulesAsCreateDevice(t *testing.T) {
	t.Parallel()
	s := metatest.NewStore(t)
	ctx := context.Background()
	createTestProduct(t, s, "p", false)
	long := func(n int) string { return strings.Repeat("x", n) }
	str := func(v string) *string { return &v }
	var (
		ids     = []string{"ok", "", "ok", "ok", "a b", long(64), long(65), "with/slash", "plus+", "hash#", "ünï", "_.:-", "$SYS", "dollar$", "UPPER"}
		names   = []string{"N", "N", "N", "", long(128), long(129), "名前"}
		prods   = []string{"p", "p", "p", "", "nope", long(65)}
		descs   = []string{"d", "", long(2048), long(2049)}
		secIDs  = []*string{nil, nil, nil, str(""), str("sid"), str(long(128)), str(long(129)), str("devicehub"), str("$SYS"), str("a/b"), str("+"), str("admin"), str("#")}
		keys    = []*string{nil, nil, nil, str(""), str("******"), str("k"), str("1234567"), str("12345678"), str(long(16)), str(long(32)), str(long(128)), str(long(129)), str("ключ-ключ-ключ-ключ")}
		chans   = []*string{nil, str("ch"), str(""), str(long(129))}
		confs   = []string{"", "", "null", `{"a":1}`, `[1]`, `"x"`}
		tags    = []string{"", "[]", `[{"key":"k"}]`, `{"a":1}`, "[" + strings.Repeat("1,", 256) + "1]"}
		feats   = [][]meta.DeviceFeature{nil, {{ID: "f"}}, {{Name: "no id"}}}
		rels    = [][]meta.DeviceRelation{nil, {{ObjectID: "o", Relation: "r"}}, {{Relation: "r"}}}
		orgs    = []string{"", "o", long(65)}
		accepts = 0
	)
	r := rand.New(rand.NewPCG(7, 11))
	// Half the devices take each field's first value (valid) but one or
	// two, the others any value of every field.
	var odd map[int]bool
	field := 0
	pick := func(n int) int {
		field++
		if odd != nil && !odd[field] {
			return 0
		}
		return r.IntN(n)
	}
	for i := range 400 {
		field, odd = 0, nil
		if r.IntN(2) == 0 {
			odd = map[int]bool{1 + r.IntN(14): true, 1 + r.IntN(14): true}
		}
		n := meta.NewDevice{ID: ids[pick(len(ids))], Name: names[pick(len(names))], ProductID: prods[pick(len(prods))],
			Description: descs[pick(len(descs))], Features: feats[pick(len(feats))], Relations: rels[pick(len(rels))],
			OrgID: orgs[pick(len(orgs))], DeviceConfiguration: []byte(confs[pick(len(confs))]), Tags: []byte(tags[pick(len(tags))])}
		if n.ID == "ok" {
			n.ID = fmt.Sprint("ok-", i)
		}
		if sid, key, ch := secIDs[pick(len(secIDs))], keys[pick(len(keys))], chans[pick(len(chans))]; sid != nil || key != nil || ch != nil {
			n.Configuration = &meta.DeviceConfigInput{SecureID: sid, SecureKey: key, ChannelID: ch}
			if sid != nil && *sid == "sid" {
				n.Configuration.SecureID = str(fmt.Sprint("sid-", i))
			}
		}
		// Bulk first, alone in its request (row 1); an accepted device is
		// deleted again before the single create of the same input.
		res, bulkErr := s.CreateDevices(ctx, meta.BulkCreate{Devices: []meta.NewDevice{n}}, lcAdmin)
		if bulkErr == nil {
			if _, err := s.DeleteDevices(ctx, []string{res.Devices[0].ID}); err != nil {
				t.Fatal(err)
			}
		}
		d, err := s.CreateDevice(ctx, n, lcAdmin)
		what := fmt.Sprintf("device %d %+v (configuration %+v)", i, n, n.Configuration)
		switch {
		case err == nil && bulkErr == nil:
			accepts++
			if got := res.Devices[0]; got.SecureKey == "" || (n.ID != "" && (got.ID != d.ID || got.SecureID != d.Configuration.SecureID)) {
				t.Fatalf("%s: bulk created %+v, single %+v", what, got, d.Configuration)
			}
			if _, err := s.DeleteDevices(ctx, []string{d.ID}); err != nil {
				t.Fatal(err)
			}
		case err == nil:
			t.Fatalf("%s: CreateDevice accepts it, the bulk create refuses it: %v", what, bulkErr)
		case bulkErr == nil:
			t.Fatalf("%s: the bulk create accepts it, CreateDevice refuses it: %v", what, err)
		default:
			rows := bulkRows(t, bulkErr)
			var ae *schema.ArgError
			switch {
			case errors.As(err, &ae):
				if len(rows) != 1 || rows[0].Row != 1 || rows[0].Field != ae.Field || rows[0].Reason != ae.Msg {
					t.Fatalf("%s: CreateDevice: %v; bulk: %+v", what, err, rows)
				}
			case errors.Is(err, meta.ErrNotFound): // the product
				if len(rows) != 1 || rows[0].Field != "productId" {
					t.Fatalf("%s: CreateDevice: %v; bulk: %+v", what, err, rows)
				}
			default:
				t.Fatalf("%s: CreateDevice: %v", what, err)
			}
		}
	}
	if n := countRows(t, s, "devices"); n != 0 {
		t.Fatalf("%d devices left", n)
	}
	t.Logf("400 random devices, %d accepted both ways", accepts)
	if accepts < 20 {
		t.Fatalf("only %d of 400 devices were valid: the test checks too little", accepts)
	}
}

// TestCreateDevicesTriggers: a bulk create and deploy fires the row
// triggers as single writes do: the broker's syncer hears of every
// deployed device (and of no undeployed one), each product's device
// count follows, and the login versions returned are the stored ones.
// Bulk undeploy and deploy return new versions for the changed rows only.
func TestCreateDevicesTriggers(t *testing.T) {
	t.Parallel()
	s := metatest.NewStore(t)
	ctx := context.Background()
	createTestProduct(t, s, "p", true)
	createTestProduct(t, s, "q", true)

	heard := make(chan string, 1000)
	listening := make(chan struct{}, 1)
	wctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		_ = s.WatchDevices(wctx, func(ids ...string) {
			if len(ids) == 0 {
				select {
				case listening <- struct{}{}:
				default:
				}
			}
			for _, id := range ids {
				heard <- id
			}
		})
	})
	t.Cleanup(func() { stop(); wg.Wait() })
	select {
	case <-listening:
	case <-time.After(5 * time.Second):
		t.Fatal("WatchDevices did not listen")
	}
	devices := func(product string, n, from int) []meta.NewDevice {
		out := make([]meta.NewDevice, n)
		for i := range out {
			out[i] = meta.NewDevice{ID: fmt.Sprintf("%s-%03d", product, from+i), Name: "D", ProductID: product}
		}
		return out
	}
	quiet, err := s.CreateDevices(ctx, meta.BulkCreate{Devices: devices("q", 5, 0)}, lcAdmin)
	if err != nil || len(quiet.Logins) != 0 {
		t.Fatalf("undeployed create: %v, logins %v", err, quiet.Logins)
	}
	res, err := s.CreateDevices(ctx, meta.BulkCreate{Devices: append(devices("p", 150, 0), devices("q", 50, 5)...), Deploy: true}, lcAdmin)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{}
	for _, d := range res.Devices {
		want[d.ID] = true
	}
	for len(want) > 0 {
		select {
		case id := <-heard:
			if !want[id] {
				t.Fatalf("heard of %s, not created deployed (or twice)", id)
			}
			delete(want, id)
		case <-time.After(5 * time.Second):
			t.Fatalf("the syncer never heard of %d deployed devices", len(want))
		}
	}
	wantVersions := func(what string, logins []meta.LoginChange, ids ...string) {
		t.Helper()
		got := []string{}
		for _, c := range logins {
			l, err := s.DeviceLogins(ctx, []string{c.ID})
			if err != nil || len(l) != 1 || l[0].Version != c.Version {
				t.Fatalf("%s: login change %+v, stored %+v %v", what, c, l, err)
			}
			got = append(got, c.ID)
		}
		slices.Sort(got)
		if !slices.Equal(got, ids) {
			t.Fatalf("%s: login changes of %v, want %v", what, got, ids)
		}
	}
	if len(res.Logins) != 200 {
		t.Fatalf("%d login changes, want 200", len(res.Logins))
	}
	wantVersions("create", res.Logins[:2], "p-000", "p-001")
	counts := map[string]int{}
	var rows []struct {
		P string `db:"product_id"`
		N int    `db:"devices"`
	}
	if err := s.DB().Select(&rows, `SELECT product_id, devices FROM product_device_counts`); err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		counts[r.P] = r.N
	}
	if counts["p"] != 150 || counts["q"] != 55 {
		t.Fatalf("device counts %v", counts)
	}

	ch, err := s.UndeployDevices(ctx, []string{"p-000", "q-000", "p-001"}, lcAdmin)
	if err != nil || ch.Changed != 2 || ch.Total != 3 {
		t.Fatalf("undeploy: %+v %v", ch, err)
	}
	wantVersions("undeploy", ch.Logins, "p-000", "p-001")
	ch, err = s.DeployDevices(ctx, []string{"p-000", "q-000", "p-002"}, lcAdmin)
	if err != nil || ch.Changed != 2 {
		t.Fatalf("deploy: %+v %v", ch, err)
	}
	wantVersions("deploy", ch.Logins, "p-000", "q-000")
	var changed []string
	for len(changed) < 4 {
		select {
		case id := <-heard:
			changed = append(changed, id)
		case <-time.After(5 * time.Second):
			t.Fatalf("the syncer heard of %v only", changed)
		}
	}
	if slices.Sort(changed); fmt.Sprint(changed) != "[p-000 p-000 p-001 q-000]" { // undeployed, deployed
		t.Fatalf("the syncer heard of %v", changed)
	}
	// A modifier is recorded as for single writes.
	if d := deviceDetail(t, s, "q-000"); d.ModifierName != lcAdmin.Name || millis(d.RegisterTime) == 0 {
		t.Fatalf("deployed q-000: modifier %q, registered %d", d.ModifierName, millis(d.RegisterTime))
	}
}

// TestCreateDevicesImportProduct: an import names its product: rows
// without one get it, a row naming another is bad, an unknown one is
// not found; deploying needs the products deployed.
func TestCreateDevicesImportProduct(t *testing.T) {
	t.Parallel()
	s := metatest.NewStore(t)
	ctx := context.Background()
	createTestProduct(t, s, "p", false)
	createTestProduct(t, s, "q", true)
	rows := []meta.NewDevice{{ID: "a", Name: "A"}, {ID: "b", Name: "B", ProductID: "p"}, {ID: "c", Name: "C", ProductID: "q"}}
	_, err := s.CreateDevices(ctx, meta.BulkCreate{Devices: rows, ProductID: "p"}, lcAdmin)
	if r := bulkRows(t, err); len(r) != 1 || r[0].Row != 3 || r[0].Field != "productId" {
		t.Fatalf("rows %+v", r)
	}
	if _, err := s.CreateDevices(ctx, meta.BulkCreate{Devices: rows[:1], ProductID: "nope"}, lcAdmin); !errors.Is(err, meta.ErrNotFound) {
		t.Fatalf("unknown product: %v", err)
	}
	_, err = s.CreateDevices(ctx, meta.BulkCreate{Devices: rows, Deploy: true}, lcAdmin)
	if r := bulkRows(t, err); len(r) != 2 || r[0].Row != 1 || r[1].Row != 2 || !strings.Contains(r[1].Reason, "not deployed") {
		t.Fatalf("deploy with undeployed products: %+v", r)
	}
	if n := countRows(t, s, "devices"); n != 0 {
		t.Fatalf("%d devices stored by refused requests", n)
	}
	res, err := s.CreateDevices(ctx, meta.BulkCreate{Devices: rows[:2], ProductID: "p"}, lcAdmin)
	if err != nil || res.Total != 2 || deviceDetail(t, s, "a").ProductID != "p" {
		t.Fatalf("import: %+v %v", res, err)
	}
	// Bad rows found while reading are reported with the store's own.
	_, err = s.CreateDevices(ctx, meta.BulkCreate{Devices: []meta.NewDevice{{}, {ID: "a", Name: "again"}}, ProductID: "p",
		Bad: []meta.BulkRowError{{Row: 1, Field: "name", Reason: "must be valid UTF-8"}}}, lcAdmin)
	if r := bulkRows(t, err); len(r) != 2 || r[0].Reason != "must be valid UTF-8" || r[1].Field != "id" {
		t.Fatalf("rows %+v", r)
	}
}

// TestDecodeDevicesCSV reads CSV rows into devices.
func TestDecodeDevicesCSV(t *testing.T) {
	t.Parallel()
	f := func(text string, wantRows int, wantBad string, wantErr string) {
		t.Helper()
		rows, bad, err := meta.DecodeDevicesCSV(strings.NewReader(text))
		if wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), wantErr) {
				t.Fatalf("%q: error %v, want one containing %q", text, err, wantErr)
			}
			return
		}
		if err != nil {
			t.Fatalf("%q: %v", text, err)
		}
		if len(rows) != wantRows || fmt.Sprint(bad) != wantBad {
			t.Fatalf("%q: %d rows, bad %v; want %d rows, bad %s", text, len(rows), bad, wantRows, wantBad)
		}
	}
	f("name\nA\n", 1, "[]", "")
	f("\ufeffName , ID\nA,a\n\nB,b", 2, "[]", "")
	f("id,name,edge\na,A,yes\nb,B,nope\n", 2, "[{2 b edge must be true or false}]", "")
	f("id,name\na,A,extra\n", 1, "[{1 a  has 3 fields, the header 2}]", "")
	f("id,name\na\xff,A\n", 1, "[{1  id must be valid UTF-8 (save the file as UTF-8)}]", "")
	f("id,name\na,A\x00\n", 1, "[{1 a name must not contain NUL}]", "")
	f("", 0, "", "is empty")
	f("id,name,name\n", 0, "", "column appears twice")
	f("id,colour\n", 0, "", "colour: unknown column")
	f("id\xff,name\n", 0, "", "column name must be valid UTF-8")
	f("id,name\n\"a,A\n", 0, "", "not CSV")

	rows, _, err := meta.DecodeDevicesCSV(strings.NewReader("id,name,productId,secureId,secureKey,channelId,description,photoUrl,orgId,storePolicy,edge,mediaDevice\n" +
		"a,A,p,s,k,c,d,u,o,sp,true,1\nb,B,,,,,,,,,,\n"))
	if err != nil {
		t.Fatal(err)
	}
	a, b := rows[0], rows[1]
	if a.ID != "a" || a.Name != "A" || a.ProductID != "p" || *a.Configuration.SecureID != "s" || *a.Configuration.SecureKey != "k" ||
		*a.Configuration.ChannelID != "c" || a.Description != "d" || a.PhotoURL != "u" || a.OrgID != "o" || a.StorePolicy != "sp" ||
		!a.Edge || !a.MediaDevice {
		t.Fatalf("row a: %+v %+v", a, a.Configuration)
	}
	if b.Configuration != nil || b.Edge {
		t.Fatalf("row b: empty cells set %+v", b)
	}
}

// FuzzDecodeDevicesCSV: any text decodes without panicking; rows and bad
// rows agree, and every accepted row's text can be stored.
func FuzzDecodeDevicesCSV(f *testing.F) {
	for _, s := range []string{"name\nA\n", "id,name,edge\na,A,yes\n", "id,name\n\"a\"\"b\",\"x\ny\"\n", "\ufeffname\r\n\xff\r\n", "name\n\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, text string) {
		rows, bad, err := meta.DecodeDevicesCSV(strings.NewReader(text))
		if err != nil {
			return
		}
		isBad := map[int]bool{}
		for _, b := range bad {
			if b.Row < 1 || b.Row > len(rows) || isBad[b.Row] || b.Reason == "" {
				t.Fatalf("bad row %+v of %d rows", b, len(rows))
			}
			isBad[b.Row] = true
		}
		for i, r := range rows {
			if isBad[i+1] {
				continue
			}
			for _, v := range []string{r.ID, r.Name, r.ProductID, r.Description, r.PhotoURL, r.OrgID, r.StorePolicy} {
				if !utf8.ValidString(v) || strings.IndexByte(v, 0) >= 0 {
					t.Fatalf("row %d keeps text %q", i+1, v)
				}
			}
		}
	})
}
