package api_test

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"devicehub/api"
	"devicehub/bench/testkit"
	"devicehub/meta"
	"devicehub/tsdb"
)

// Tests of the data-path rows of "Hardening, round three" (issue 41):
// each fails without its fix.

// TestHardening3ExportFormulaGuard: a CSV export writes after a ' the
// texts a spreadsheet takes for formulas beyond OWASP's leading = + - @:
// those after leading spaces (ASCII, no-break) and the fullwidth forms.
func TestHardening3ExportFormulaGuard(t *testing.T) {
	t.Parallel()
	e, db := dashEnv(t)
	t0 := time.Now().Truncate(time.Second).Add(-time.Hour)
	attacks := []string{" =1+1", "  @SUM(1)", "\u00a0=HYPERLINK(\"http://evil.example\")", "＝1+1", "＋1+1", "－1+1", "＠SUM(1)", "\u3000＝1"}
	plain := []string{" plain", "-3.5", "a＝b"}
	var props []tsdb.PropertyValue
	for i, v := range append(append([]string(nil), attacks...), plain...) {
		props = append(props, tsdb.PropertyValue{Time: t0.Add(time.Duration(i) * time.Second), ProductID: "dp", DeviceID: "dd",
			Property: "mode", ValueType: "string", Str: v})
	}
	if err := db.Insert(context.Background(), nil, props); err != nil {
		t.Fatal(err)
	}
	got, _ := e.exportText("?format=csv", "", map[string]any{"dashboard": "device", "object": "dp", "measurement": "properties",
		"dimension": "history", "params": map[string]any{"deviceId": "dd", "properties": []string{"mode"}, "history": 100}})
	records, err := csv.NewReader(strings.NewReader(got)).ReadAll()
	if err != nil {
		t.Fatalf("%v:\n%s", err, got)
	}
	cells := map[string]string{} // value as sent -> cell
	for _, r := range records[1:] {
		cells[strings.TrimPrefix(r[5], "'")] = r[5]
	}
	for _, a := range attacks {
		if c, ok := cells[a]; !ok || c != "'"+a {
			t.Errorf("%q written %q (found %v), want it after a '", a, c, ok)
		}
	}
	for _, v := range plain {
		if c := cells[v]; c != v {
			t.Errorf("%q written %q", v, c)
		}
	}
}

// TestHardening3ImportBOM: a file saved with a UTF-8 byte order mark (as
// Windows editors and Excel save them) imports through the console's
// multipart upload, JSON and CSV alike.
func TestHardening3ImportBOM(t *testing.T) {
	t.Parallel()
	e, _ := newBulkEnv(t)
	e.createProduct("meter", "Meter", nil)
	for _, f := range []struct{ name, content, id string }{
		{"fleet.json", "\ufeff[{\"id\":\"bom-j1\",\"name\":\"J 1\"}]", "bom-j1"},
		{"fleet2.json", "\ufeff \r\n[{\"id\":\"bom-j2\",\"name\":\"J 2\"}]", "bom-j2"},
		{"fleet.csv", "\ufeffid,name\r\nbom-c1,C 1\r\n", "bom-c1"},
	} {
		var res bulkCreated
		r := e.upload("/api/device/instance/meter/import", f.name, []byte(f.content), nil)
		if r.HTTPStatus != 200 || json.Unmarshal(r.Result, &res) != nil || res.Total != 1 || len(res.Devices) != 1 || res.Devices[0].ID != f.id {
			t.Fatalf("%s with a BOM: %d %s", f.name, r.HTTPStatus, r.raw)
		}
	}
}

// bigModel is a valid thing model of n properties, each with a
// description of 1,000 characters: about n KiB.
func bigModel(n int) string {
	var b strings.Builder
	b.WriteString(`{"properties":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"id":"p%d","name":"P %d","description":"%s","valueType":{"type":"int"}}`, i, i, strings.Repeat("x", 1000))
	}
	b.WriteString(`]}`)
	return b.String()
}

// TestHardening3MetadataBounds: a thing model written through the API,
// a device's (endpoint 9) or a product's (endpoint 4), has only the four
// arrays at its top (an unknown key is refused, named) and at most
// 256 KiB as stored; endpoint 7's rows carry no device's own model unless
// asked for (?deviceMetadata=true), so that a list of devices with large
// models answers small.
func TestHardening3MetadataBounds(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	p := e.createProduct("p", "P", nil)
	for i := range 20 {
		e.createDevice(fmt.Sprintf("d%02d", i), "D", "p", nil)
	}
	// Unknown top-level keys, named; keys elsewhere are the document's own
	// (valueType may carry more fields, the spec says).
	for _, c := range []struct{ body, key string }{
		{`{"properties":[],"junk":"x"}`, "junk"},
		{`{"blob":"` + strings.Repeat("y", 800_000) + `"}`, "blob"},
		{`{"properties":[],"events":[],"functions":[],"tags":[],"zzz":1,"aaa":2}`, "aaa"},
	} {
		r := e.fails("PUT", "/api/device/instance/d00/metadata", c.body, 400, "illegal_argument")
		if !strings.Contains(r.Message, c.key+": ") || !strings.Contains(r.Message, "unknown") {
			t.Errorf("%.40s: message %q does not name %s as unknown", c.body, r.Message, c.key)
		}
		p["metadata"] = c.body
		r = e.fails("PATCH", "/api/device-product", p, 400, "illegal_argument")
		if !strings.Contains(r.Message, c.key+": ") {
			t.Errorf("product %.40s: message %q does not name %s", c.body, r.Message, c.key)
		}
	}
	e.ok("PUT", "/api/device/instance/d00/metadata", `{"properties":[{"id":"a","name":"A","valueType":{"type":"int","extra":1},"more":2}]}`, nil)
	// A product model stored before the bounds, with a key of its own at
	// the top, may be sent back unchanged (the spec's usage rule of
	// endpoint 4), not changed.
	legacy := `{"properties":[],"events":[],"functions":[],"tags":[],"vendor":"x"}`
	if _, err := e.store.DB().Exec(`UPDATE products SET metadata = $1 WHERE id = 'p'`, legacy); err != nil {
		t.Fatal(err)
	}
	e.ok("GET", "/api/device-product/p", nil, &p)
	p["name"] = "P renamed"
	e.ok("PATCH", "/api/device-product", p, nil)
	p["metadata"] = `{"properties":[{"id":"n","name":"N","valueType":{"type":"int"}}],"vendor":"x"}`
	if r := e.fails("PATCH", "/api/device-product", p, 400, "illegal_argument"); !strings.Contains(r.Message, "vendor: ") {
		t.Errorf("a changed legacy model: %s", r.raw)
	}
	e.ok("GET", "/api/device-product/p", nil, &p)
	if p["name"] != "P renamed" || p["metadata"] != legacy {
		t.Fatalf("product after the patches: %v %v", p["name"], p["metadata"])
	}
	// Size: 300 KiB refused, 200 KiB taken.
	over, under := bigModel(300), bigModel(200)
	r := e.fails("PUT", "/api/device/instance/d00/metadata", over, 400, "illegal_argument")
	if !strings.Contains(r.Message, "262144") {
		t.Errorf("oversized model: message %q does not say the limit", r.Message)
	}
	p["metadata"] = over
	if r := e.fails("PATCH", "/api/device-product", p, 400, "illegal_argument"); !strings.Contains(r.Message, "262144") {
		t.Errorf("oversized product model: message %q does not say the limit", r.Message)
	}
	for i := range 20 {
		e.ok("PUT", fmt.Sprintf("/api/device/instance/d%02d/metadata", i), under, nil)
	}
	// The list: small by default, the models when asked for.
	body := map[string]any{"pageSize": 50}
	plain := e.call("POST", "/api/device-instance/_query/", body)
	if plain.HTTPStatus != 200 || len(plain.raw) > 32<<10 {
		t.Fatalf("a list of 20 devices with 200 KiB models answers %d bytes (%d)", len(plain.raw), plain.HTTPStatus)
	}
	var page devicePage
	if err := json.Unmarshal(plain.Result, &page); err != nil || len(page.Data) != 20 {
		t.Fatalf("list: %v %d", err, len(page.Data))
	}
	for _, d := range page.Data {
		if _, ok := d["deviceMetadata"]; ok {
			t.Fatalf("device %v has deviceMetadata without asking", d["id"])
		}
	}
	full := e.call("POST", "/api/device-instance/_query/?deviceMetadata=true", body)
	if err := json.Unmarshal(full.Result, &page); err != nil || full.HTTPStatus != 200 || len(page.Data) != 20 {
		t.Fatalf("list with models: %d %v", full.HTTPStatus, err)
	}
	t.Logf("a page of 20 devices with 200 KiB models: %d bytes, %d with ?deviceMetadata=true", len(plain.raw), len(full.raw))
	for _, d := range page.Data {
		m, _ := d["deviceMetadata"].(string)
		if !strings.Contains(m, `"p199"`) {
			t.Fatalf("device %v: deviceMetadata %.80q, want its model", d["id"], m)
		}
	}
	if r := e.call("POST", "/api/device-instance/_query/?deviceMetadata=maybe", body); r.HTTPStatus != 400 || !strings.Contains(r.Message, "deviceMetadata") {
		t.Fatalf("?deviceMetadata=maybe: %d %s", r.HTTPStatus, r.raw)
	}
}

// bigExportEnv is dashEnv with n values of temp stored for "dd", a
// millisecond apart: about n x 67 bytes of CSV, more than the sockets'
// buffers hold for n of 300,000. ClickHouse generates them (INSERT ...
// SELECT FROM numbers(), as BenchmarkExport does): the tests using it are
// about cutting an export, not about how values are stored, and building
// and sending 300,000 rows from this race-instrumented process cost
// seconds of make test's CPU per test.
func bigExportEnv(t *testing.T, n int) *env {
	t.Helper()
	e, db := dashEnv(t)
	base := time.Now().Add(-time.Hour).UnixMilli()
	if err := db.Conn().Exec(context.Background(), fmt.Sprintf(`INSERT INTO device_property (ts, product_id, device_id, property, value_type, num_value, str_value)
		SELECT %d + number, 'dp', 'dd', 'temp', 'number', number, '' FROM numbers(%d)`, base, n)); err != nil {
		t.Fatal(err)
	}
	return e
}

var bigExportQuery = map[string]any{"dashboard": "device", "object": "dp", "measurement": "properties", "dimension": "history",
	"params": map[string]any{"deviceId": "dd"}}

// startExport posts bigExportQuery with token and returns the response
// (status and headers read, body not); the test closes it.
func startExport(t *testing.T, base, token string) *http.Response {
	t.Helper()
	body, _ := json.Marshal(bigExportQuery)
	req, _ := http.NewRequest("POST", base+"/api/dashboard/_export?format=csv", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Access-Token", token)
	client := &http.Client{Transport: &http.Transport{}} // a connection of its own
	res, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { res.Body.Close() })
	return res
}

// startedExport is startExport that requires 200 and reads the first
// 64 KiB: the export is under way, held by a client that reads no more.
func startedExport(t *testing.T, base, token string) *http.Response {
	t.Helper()
	res := startExport(t, base, token)
	if res.StatusCode != 200 {
		b, _ := io.ReadAll(res.Body)
		t.Fatalf("export: %d %s", res.StatusCode, b)
	}
	if _, err := io.ReadFull(res.Body, make([]byte, 64<<10)); err != nil {
		t.Fatal(err)
	}
	return res
}

// TestHardening3ExportsPerUser: a user holds at most 2 exports at once
// (429 too_many_requests for a third), while another user still gets one
// of the instance's 4; a finished export gives its slot back.
func TestHardening3ExportsPerUser(t *testing.T) {
	t.Parallel()
	e := bigExportEnv(t, 300_000)
	if _, err := e.store.CreateUser(context.Background(), "vera", "password-vera", meta.RoleViewer); err != nil {
		t.Fatal(err)
	}
	vera := e.login("vera", "password-vera")
	held := []*http.Response{startedExport(t, e.base, vera), startedExport(t, e.base, vera)}
	third := startExport(t, e.base, vera)
	if third.StatusCode == 200 {
		t.Fatalf("a third export of one user started")
	}
	r := e.envelope("POST", "export", third)
	if r.HTTPStatus != 429 || r.Code != "too_many_requests" || !strings.Contains(r.Message, "per user") || third.Header.Get("Retry-After") == "" {
		t.Fatalf("a third export of one user: %d %s (Retry-After %q)", r.HTTPStatus, r.raw, third.Header.Get("Retry-After"))
	}
	// Another user, even with the same role, is not held back by vera's.
	admin := startedExport(t, e.base, e.token)
	admin.Body.Close()
	// One of vera's ends: she may start another.
	held[0].Body.Close()
	var again *http.Response
	if !testkit.Within(5*time.Second, func() bool {
		res := startExport(t, e.base, vera)
		if res.StatusCode == 200 {
			again = res
			return true
		}
		res.Body.Close()
		return false
	}) {
		t.Fatal("vera's export slot was not given back after her export ended")
	}
	again.Body.Close()
	held[1].Body.Close()
}

// cutWithin reads the rest of res's body and requires it to end broken
// (not a complete file) within d of from.
func cutWithin(t *testing.T, what string, res *http.Response, from time.Time, d time.Duration) {
	t.Helper()
	done := make(chan error, 1)
	var n int64
	go func() {
		var err error
		n, err = io.Copy(io.Discard, res.Body)
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Fatalf("%s: the export ran to its end (%d more bytes) after its token ended", what, n)
		}
		if took := time.Since(from); took > d {
			t.Fatalf("%s: the export was cut %s after its token ended, want within %s", what, took, d)
		}
		t.Logf("%s: cut after %s, %d bytes after the end: %v", what, time.Since(from).Round(time.Millisecond), n, err)
	case <-time.After(time.Until(from.Add(d))):
		res.Body.Close()
		<-done
		t.Fatalf("%s: the export still runs %s after its token ended (%d bytes read)", what, d, n)
	}
}

// TestHardening3ExportEndsWithToken: an export in progress is cut within
// 1 s of its user's disabling, and of its API key's revocation, like a
// live stream; the client sees a broken transfer, never a complete file.
func TestHardening3ExportEndsWithToken(t *testing.T) {
	t.Parallel()
	e := bigExportEnv(t, 300_000)
	for _, u := range []string{"dora", "kim"} {
		if _, err := e.store.CreateUser(context.Background(), u, "password-"+u, meta.RoleViewer); err != nil {
			t.Fatal(err)
		}
	}
	dora := e.login("dora", "password-dora")
	res := startedExport(t, e.base, dora)
	if _, err := e.store.DB().Exec(`UPDATE users SET state = 'disabled' WHERE username = 'dora'`); err != nil {
		t.Fatal(err)
	}
	cutWithin(t, "user disabled", res, time.Now(), time.Second)

	kim := e.login("kim", "password-kim")
	key := e.createKey(kim, map[string]any{"name": "exports", "permissions": []string{"dashboard:read"}})
	res = startedExport(t, e.base, key.Key)
	if r := e.do("DELETE", "/api/user/key/"+key.ID, nil, kim); r.HTTPStatus != 200 {
		t.Fatalf("revoke: %d %s", r.HTTPStatus, r.raw)
	}
	cutWithin(t, "key revoked", res, time.Now(), time.Second)

	// kim's own login still exports, to its end.
	got, _ := (&env{t: t, base: e.base, token: kim}).exportText("?format=csv", "", map[string]any{"dashboard": "device", "object": "dp",
		"measurement": "properties", "dimension": "history", "params": map[string]any{"deviceId": "dd", "history": 10}})
	if n := strings.Count(got, "\r\n"); n != 11 {
		t.Fatalf("kim's export: %d lines", n)
	}
}

// TestHardening3LiveStreamsPerUser: one user opens at most 20 live streams
// on an instance (429 too_many_requests for the 21st, whatever token of
// theirs it comes with), another user still opens one; a closed stream
// gives its place back.
func TestHardening3LiveStreamsPerUser(t *testing.T) {
	t.Parallel()
	product := "lu" + liveSuffix()
	dev := product + "-1"
	var hub interface{ Subscribers() int }
	e := newEnvWith(t, func(store *meta.Store, deps *api.Deps) {
		addLiveDevices(t, store, product, dev)
		h := newLiveHub(t)
		hub = h
		deps.Live, deps.LiveDevices = h, store
	})
	if _, err := e.store.CreateUser(context.Background(), "lou", "password-lou", meta.RoleViewer); err != nil {
		t.Fatal(err)
	}
	lou, lou2 := e.login("lou", "password-lou"), e.login("lou", "password-lou")
	var streams []*sseStream
	for i := range 20 {
		tok := lou
		if i%2 == 1 {
			tok = lou2
		}
		streams = append(streams, openLiveWithin(t, e.base, liveQuery(tok, []string{dev}), "", 5*time.Second))
	}
	for _, tok := range []string{lou, lou2} {
		res, err := liveClient.Get(e.base + "/api/live?" + liveQuery(tok, []string{dev}))
		if err != nil {
			t.Fatal(err)
		}
		if res.StatusCode == 200 { // a stream: never read to its end
			res.Body.Close()
			t.Fatalf("lou's 21st stream opened")
		}
		r := e.envelope("GET", "/api/live", res)
		if r.HTTPStatus != 429 || r.Code != "too_many_requests" || !strings.Contains(r.Message, "per user") {
			t.Fatalf("lou's 21st stream: %d %s", r.HTTPStatus, r.raw)
		}
	}
	openLiveWithin(t, e.base, liveQuery(e.token, []string{dev}), "", 5*time.Second) // another user's
	streams[0].body.Close()
	if !testkit.Within(5*time.Second, func() bool { return hub.Subscribers() == 20 }) {
		t.Fatalf("subscribers %d after one of lou's closed, want 20", hub.Subscribers())
	}
	openLiveWithin(t, e.base, liveQuery(lou, []string{dev}), "", 5*time.Second)
}

// TestHardening3HiddenConflicts: a user limited to product sa who creates
// (one device, in bulk, by import) or updates a device with an id or
// secureId that a device of sb holds learns nothing of it from the answer:
// not that a device holds it, nor which; the answer is the same for both
// kinds of value and for every such device. A conflict with a device of
// sa is named as before, and an administrator still gets the precise
// message.
func TestHardening3HiddenConflicts(t *testing.T) {
	t.Parallel()
	e := newScopeEnv(t)
	// b1 is sb's; its secureId is "b1" (the id by default). sb-login is
	// the secureId of another device of sb.
	e.ok("POST", "/api/device/instance", map[string]any{"id": "b3", "name": "b3", "productId": "sb",
		"configuration": map[string]any{"secureId": "sb-login"}}, nil)
	for _, hidden := range []string{"b1", "sb-login"} {
		for _, c := range []struct {
			name, method, path string
			body               any
		}{
			{"create id", "POST", "/api/device/instance", map[string]any{"id": hidden, "name": "N", "productId": "sa"}},
			{"create secureId", "POST", "/api/device/instance", map[string]any{"id": "new-x", "name": "N", "productId": "sa",
				"configuration": map[string]any{"secureId": hidden}}},
			{"update secureId", "PUT", "/api/device/instance/a1", map[string]any{"configuration": map[string]any{"secureId": hidden}}},
			{"bulk id", "POST", "/api/device/instance/batch/_create", []map[string]any{{"id": hidden, "name": "N", "productId": "sa"}}},
			{"bulk secureId", "POST", "/api/device/instance/batch/_create", []map[string]any{{"id": "new-y", "name": "N", "productId": "sa",
				"configuration": map[string]any{"secureId": hidden}}}},
			{"import id", "POST", "/api/device/instance/sa/import", []map[string]any{{"id": hidden, "name": "N"}}},
			{"import secureId", "POST", "/api/device/instance/sa/import", []map[string]any{{"id": "new-z", "name": "N",
				"configuration": map[string]any{"secureId": hidden}}}},
		} {
			r := e.do(c.method, c.path, c.body, e.alice)
			if r.HTTPStatus != 400 {
				t.Fatalf("%s %q by alice: %d %s", c.name, hidden, r.HTTPStatus, r.raw)
			}
			text := r.Message + string(r.Result)
			if r.Code != "illegal_argument" {
				t.Errorf("%s %q by alice: code %s, want illegal_argument: %s", c.name, hidden, r.Code, r.raw)
			}
			for _, leak := range []string{"exist", "another device", "sb", "b3", "duplicate"} {
				if strings.Contains(strings.ReplaceAll(text, hidden, "X"), leak) {
					t.Errorf("%s %q by alice: the answer says %q: %s", c.name, hidden, leak, r.raw)
				}
			}
			if !strings.Contains(text, "not available") {
				t.Errorf("%s %q by alice: %s, want \"not available\"", c.name, hidden, r.raw)
			}
		}
	}
	// The same reason for sb's id as for sb's other device's secureId: no
	// telling which kind of value a device of sb holds.
	reason := func(r response) string {
		var rows []rowError
		if err := json.Unmarshal(r.Result, &rows); err != nil || len(rows) != 1 {
			t.Fatalf("bad rows: %s", r.raw)
		}
		return rows[0].Reason
	}
	id := e.do("POST", "/api/device/instance/batch/_create", []map[string]any{{"id": "new-v", "name": "N", "productId": "sa",
		"configuration": map[string]any{"secureId": "b1"}}}, e.alice)
	sec := e.do("POST", "/api/device/instance/batch/_create", []map[string]any{{"id": "new-v", "name": "N", "productId": "sa",
		"configuration": map[string]any{"secureId": "sb-login"}}}, e.alice)
	if a, b := strings.ReplaceAll(reason(id), "b1", "X"), strings.ReplaceAll(reason(sec), "sb-login", "X"); a != b {
		t.Errorf("a hidden device's id and a hidden device's secureId answer differently: %s / %s", a, b)
	}
	// Alice's own product: named as before.
	r := e.do("POST", "/api/device/instance/batch/_create", []map[string]any{{"id": "a2", "name": "N", "productId": "sa"}}, e.alice)
	if !strings.Contains(string(r.Result), "already exists") {
		t.Errorf("a duplicate of alice's own a2: %s", r.raw)
	}
	if r := e.do("POST", "/api/device/instance", map[string]any{"id": "a2", "name": "N", "productId": "sa"}, e.alice); r.Code != "duplicate_key" {
		t.Errorf("a duplicate of alice's own a2, one device: %s", r.raw)
	}
	// The administrator: precise.
	r = e.call("POST", "/api/device/instance/batch/_create", []map[string]any{{"id": "b1", "name": "N", "productId": "sa"},
		{"id": "new-w", "name": "N", "productId": "sa", "configuration": map[string]any{"secureId": "sb-login"}}})
	if !strings.Contains(string(r.Result), `device \"b1\" already exists`) || !strings.Contains(string(r.Result), "another device's secureId") {
		t.Errorf("the administrator's bulk create: %s", r.raw)
	}
	if r := e.call("POST", "/api/device/instance", map[string]any{"id": "b1", "name": "N", "productId": "sa"}); r.Code != "duplicate_key" {
		t.Errorf("the administrator's create of b1: %s", r.raw)
	}
	if n := e.countRows("devices"); n != 5 {
		t.Fatalf("%d devices, want 5", n)
	}
}
