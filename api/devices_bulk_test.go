package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"mime/multipart"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"devicehub/api"
	"devicehub/meta"
)

// Bulk provisioning (api/devices_bulk.go, meta/device_bulk.go) over HTTP
// against a real PostgreSQL.

// loginRecorder is the broker's side of awaitLogins: it records the login
// changes each write waits for, and confirms them at once.
type loginRecorder struct {
	mu    sync.Mutex
	calls [][]meta.LoginChange
}

func (r *loginRecorder) Await(_ context.Context, changes []meta.LoginChange) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, slices.Clone(changes))
	return nil
}

// take returns the changes awaited since the last take, in one list.
func (r *loginRecorder) take() []meta.LoginChange {
	r.mu.Lock()
	defer r.mu.Unlock()
	var all []meta.LoginChange
	for _, c := range r.calls {
		all = append(all, c...)
	}
	r.calls = nil
	return all
}

func newBulkEnv(t *testing.T) (*env, *loginRecorder) {
	t.Helper()
	rec := &loginRecorder{}
	e := newEnvWith(t, func(_ *meta.Store, deps *api.Deps) { deps.Logins = rec })
	return e, rec
}

type bulkCreated struct {
	Total    int  `json:"total"`
	Deployed bool `json:"deployed"`
	Devices  []struct {
		ID        string `json:"id"`
		SecureID  string `json:"secureId"`
		SecureKey string `json:"secureKey"`
	} `json:"devices"`
}

type bulkChanged struct {
	Total   int `json:"total"`
	Changed int `json:"changed"`
}

type rowError struct {
	Row    int    `json:"row"`
	ID     string `json:"id"`
	Field  string `json:"field"`
	Reason string `json:"reason"`
}

// badRows requires a 400 illegal_argument listing bad rows and returns them.
func (e *env) badRows(r response) []rowError {
	e.t.Helper()
	if r.HTTPStatus != 400 || r.Code != "illegal_argument" {
		e.t.Fatalf("want 400 illegal_argument, got %d: %.2000s", r.HTTPStatus, r.raw)
	}
	var rows []rowError
	if err := json.Unmarshal(r.Result, &rows); err != nil || len(rows) == 0 {
		e.t.Fatalf("result does not list the bad rows (%v): %.2000s", err, r.raw)
	}
	return rows
}

// wantRows requires exactly these bad rows (row, field and a word of the reason).
func wantRows(t *testing.T, got []rowError, want ...rowError) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("bad rows %+v, want %+v", got, want)
	}
	for i, w := range want {
		g := got[i]
		if g.Row != w.Row || g.Field != w.Field || (w.ID != "" && g.ID != w.ID) || !strings.Contains(g.Reason, w.Reason) {
			t.Fatalf("bad row %d: %+v, want %+v (reason containing %q)", i, g, w, w.Reason)
		}
	}
}

func fleet(product string, n int, from int) []map[string]any {
	devs := make([]map[string]any, n)
	for i := range devs {
		devs[i] = map[string]any{"id": fmt.Sprintf("dev-%05d", from+i), "name": fmt.Sprintf("Meter %d", from+i), "productId": product,
			"description": "basement, row " + strings.Repeat("x", 100)}
	}
	return devs
}

func (e *env) deviceStates() map[string]string {
	e.t.Helper()
	var rows []struct {
		ID    string `db:"id"`
		State string `db:"state"`
	}
	if err := e.store.DB().Select(&rows, `SELECT id, state FROM devices`); err != nil {
		e.t.Fatal(err)
	}
	m := map[string]string{}
	for _, r := range rows {
		m[r.ID] = r.State
	}
	return m
}

var hex32 = regexp.MustCompile(`^[0-9a-f]{32}$`)

// TestBulkCreateDeploy10000: 10,000 devices (a body over the 1 MiB of
// other routes) created and deployed in one call: all stored, offline,
// counted on their product, each key returned once (and masked after),
// and the broker waited for on every one at its stored login version.
func TestBulkCreateDeploy10000(t *testing.T) {
	t.Parallel()
	e, rec := newBulkEnv(t)
	e.createProduct("meter", "Meter", nil)
	e.ok("POST", "/api/device-product/meter/deploy", nil, nil)
	devs := fleet("meter", meta.MaxBulkDevices, 0)
	body, _ := json.Marshal(devs)
	if len(body) <= 1<<20 {
		t.Fatalf("body of %d bytes: want more than 1 MiB", len(body))
	}
	var res bulkCreated
	start := time.Now()
	e.ok("POST", "/api/device/instance/batch/_create?deploy=true", body, &res)
	t.Logf("10,000 devices created and deployed in one request: %v", time.Since(start))
	if res.Total != 10_000 || !res.Deployed || len(res.Devices) != 10_000 {
		t.Fatalf("result: total %d, deployed %v, %d devices", res.Total, res.Deployed, len(res.Devices))
	}
	var stored []struct {
		ID, SecureID, SecureKey, State string
		LoginVersion                   int64 `db:"login_version"`
		Registered                     bool
	}
	if err := e.store.DB().Select(&stored, `SELECT id, secure_id AS secureid, secure_key AS securekey, state, login_version,
		registry_time IS NOT NULL AS registered FROM devices ORDER BY id`); err != nil {
		t.Fatal(err)
	}
	if len(stored) != 10_000 {
		t.Fatalf("%d devices stored, want 10000", len(stored))
	}
	versions := map[string]int64{}
	for i, d := range stored {
		r := res.Devices[i] // in request order, which is id order here
		if d.ID != devs[i]["id"] || r.ID != d.ID || r.SecureID != d.ID || d.SecureID != d.ID || !hex32.MatchString(r.SecureKey) ||
			r.SecureKey != d.SecureKey || d.State != meta.StateOffline || !d.Registered {
			t.Fatalf("device %d: stored %+v, returned %+v", i, d, r)
		}
		versions[d.ID] = d.LoginVersion
	}
	var counted int
	if err := e.store.DB().Get(&counted, `SELECT devices FROM product_device_counts WHERE product_id = 'meter'`); err != nil || counted != 10_000 {
		t.Fatalf("product device count %d %v, want 10000", counted, err)
	}
	// The key is shown once: the detail masks it.
	if conf := e.deviceDetail("dev-00042")["configuration"].(map[string]any); conf["secureKey"] != "******" {
		t.Fatalf("detail shows the key: %v", conf)
	}
	// The answer came once the broker held every login at its version.
	changes := rec.take()
	if len(changes) != 10_000 {
		t.Fatalf("awaited %d login changes, want 10000", len(changes))
	}
	for _, c := range changes {
		if versions[c.ID] != c.Version || c.Version == 0 {
			t.Fatalf("awaited %+v, stored version %d", c, versions[c.ID])
		}
	}

	// Without deploy: notActive, and nothing for the broker.
	e.ok("POST", "/api/device/instance/batch/_create", fleet("meter", 3, 20_000), &res)
	if res.Deployed || res.Total != 3 || e.deviceStates()["dev-20001"] != meta.StateNotActive {
		t.Fatalf("created without deploy: %+v, state %s", res, e.deviceStates()["dev-20001"])
	}
	if c := rec.take(); len(c) != 0 {
		t.Fatalf("created undeployed devices awaited the broker for %v", c)
	}
}

// TestBulkCreateBadRowNothingStored: one bad row of 10,000 (row 9,999)
// refuses them all, naming that row; nothing is stored.
func TestBulkCreateBadRowNothingStored(t *testing.T) {
	t.Parallel()
	e, _ := newBulkEnv(t)
	e.createProduct("meter", "Meter", nil)
	devs := fleet("meter", meta.MaxBulkDevices, 0)
	devs[9998]["name"] = ""
	rows := e.badRows(e.call("POST", "/api/device/instance/batch/_create", devs))
	wantRows(t, rows, rowError{Row: 9999, ID: "dev-09998", Field: "name", Reason: "required"})
	if r := e.call("POST", "/api/device/instance/batch/_create", devs); !strings.Contains(r.Message, "1 of 10000 rows") ||
		!strings.Contains(r.Message, "row 9999") {
		t.Fatalf("message %q does not say how many rows are bad and which", r.Message)
	}
	if n := e.countRows("devices"); n != 0 {
		t.Fatalf("%d devices stored by a refused request", n)
	}
	// Many bad rows: the first 1,000 listed, the message counts them all.
	for _, d := range devs {
		d["name"] = ""
	}
	r := e.call("POST", "/api/device/instance/batch/_create", devs)
	if rows := e.badRows(r); len(rows) != meta.MaxBulkErrors || rows[0].Row != 1 || rows[999].Row != 1000 ||
		!strings.Contains(r.Message, "10000 of 10000") {
		t.Fatalf("%d rows listed (first %d), message %q", len(rows), rows[0].Row, r.Message)
	}
}

// TestBulkCreateDuplicates: an id or secureId twice in the request, and
// ones that exist already, are bad rows; nothing is stored.
func TestBulkCreateDuplicates(t *testing.T) {
	t.Parallel()
	e, _ := newBulkEnv(t)
	e.createProduct("meter", "Meter", nil)
	e.createDevice("old", "Old", "meter", map[string]any{"configuration": map[string]any{"secureId": "old-login"}})
	devs := []map[string]any{
		{"id": "a", "name": "A", "productId": "meter"},
		{"id": "b", "name": "B", "productId": "meter"},
		{"id": "a", "name": "A again", "productId": "meter"},                                                     // 3: id twice
		{"id": "old", "name": "Old again", "productId": "meter"},                                                 // 4: exists
		{"id": "c", "name": "C", "productId": "meter", "configuration": map[string]any{"secureId": "b"}},         // 5: b's secureId
		{"id": "d", "name": "D", "productId": "meter", "configuration": map[string]any{"secureId": "old-login"}}, // 6: taken
		{"id": "e", "name": "E", "productId": "nope"},                                                            // 7: no such product
		{"name": "generated id", "productId": "meter"},
	}
	wantRows(t, e.badRows(e.call("POST", "/api/device/instance/batch/_create", devs)),
		rowError{Row: 3, ID: "a", Field: "id", Reason: "row 1"},
		rowError{Row: 4, ID: "old", Field: "id", Reason: "already exists"},
		rowError{Row: 5, ID: "c", Field: "configuration.secureId", Reason: "row 2"},
		rowError{Row: 6, ID: "d", Field: "configuration.secureId", Reason: "another device's"},
		rowError{Row: 7, ID: "e", Field: "productId", Reason: "does not exist"},
	)
	if n := e.countRows("devices"); n != 1 {
		t.Fatalf("%d devices after a refused request, want 1", n)
	}
	// Without the bad rows: stored, the missing id generated.
	var res bulkCreated
	e.ok("POST", "/api/device/instance/batch/_create", []map[string]any{devs[0], devs[1], devs[7]}, &res)
	if res.Total != 3 || len(res.Devices[2].ID) != 16 || res.Devices[2].SecureID != res.Devices[2].ID {
		t.Fatalf("created %+v", res)
	}
}

// TestBulkLimits: more than 10,000 devices is refused, in JSON and CSV,
// on every bulk route; an empty list too; a bulk body may be up to 16
// MiB, every other route's stays 1 MiB.
func TestBulkLimits(t *testing.T) {
	t.Parallel()
	e, _ := newBulkEnv(t)
	e.createProduct("meter", "Meter", nil)
	devs := fleet("meter", meta.MaxBulkDevices+1, 0)
	r := e.fails("POST", "/api/device/instance/batch/_create", devs, 400, "illegal_argument")
	if !strings.Contains(r.Message, "10001") || !strings.Contains(r.Message, "at most 10000") {
		t.Fatalf("message %q", r.Message)
	}
	var csv strings.Builder
	csv.WriteString("id,name\n")
	for i := range meta.MaxBulkDevices + 1 {
		fmt.Fprintf(&csv, "d%d,D %d\n", i, i)
	}
	if r := e.send("POST", "/api/device/instance/meter/import", "text/csv", csv.String()); r.HTTPStatus != 400 ||
		!strings.Contains(r.Message, "at most 10000") {
		t.Fatalf("CSV of 10,001 rows: %d %s", r.HTTPStatus, r.raw)
	}
	ids := make([]string, meta.MaxBulkDevices+1)
	for i := range ids {
		ids[i] = fmt.Sprint("d", i)
	}
	for _, op := range []string{"_deploy", "_undeploy", "_delete"} {
		if r := e.call("POST", "/api/device/instance/batch/"+op, ids); r.HTTPStatus != 400 || !strings.Contains(r.Message, "at most 10000") {
			t.Fatalf("%s of 10,001 ids: %d %s", op, r.HTTPStatus, r.raw)
		}
		e.fails("POST", "/api/device/instance/batch/"+op, []string{}, 400, "illegal_argument")
	}
	e.fails("POST", "/api/device/instance/batch/_create", []any{}, 400, "illegal_argument")
	if n := e.countRows("devices"); n != 0 {
		t.Fatalf("%d devices stored", n)
	}

	// Body limits, refused from the declared length before any is read.
	for _, c := range []struct {
		path string
		n    int
	}{
		{"/api/device/instance", 1<<20 + 1},
		{"/api/device/product", 2 << 20},
		{"/api/device/instance/dev-1/properties/_read", 1<<20 + 1},
		{"/api/device/instance/batch/_create", 16<<20 + 1},
		{"/api/device/instance/meter/import", 16<<20 + 1},
		{"/API/device/instance/batch/_deploy/", 16<<20 + 1},
	} {
		if r := e.doOversized("POST", c.path, c.n); r.HTTPStatus != 400 || !strings.Contains(r.Message, "too large") {
			t.Errorf("POST %s of %d bytes: %d %s, want 400 too large", c.path, c.n, r.HTTPStatus, r.raw)
		}
	}
	// A body over 1 MiB is read on a bulk route (and refused there only
	// for what it says).
	big := `["` + strings.Repeat("x", 1<<20) + `"]`
	if r := e.call("POST", "/api/device/instance/batch/_deploy", big); r.HTTPStatus != 400 || !strings.Contains(r.Message, "does not exist") {
		t.Fatalf("bulk deploy with a 1 MiB id: %d %.300s", r.HTTPStatus, r.raw)
	}
}

// TestBulkImportCSV: a CSV import of one product, with optional columns
// and ?deploy=true; its refusals name the row (text that is not UTF-8,
// the wrong number of fields, another product) or the header (an unknown
// column), and store nothing.
func TestBulkImportCSV(t *testing.T) {
	t.Parallel()
	e, rec := newBulkEnv(t)
	e.createProduct("meter", "Meter", nil)
	e.createProduct("other", "Other", nil)
	e.ok("POST", "/api/device-product/meter/deploy", nil, nil)
	const header = "id,name,productId,secureId,secureKey,description,photoUrl,orgId,storePolicy,edge,mediaDevice\n"
	good := "\ufeff" + header +
		"m-1,Meter 1,meter,,,in the hall,,org-1,,true,0\n" +
		"m-2,\"Meter 2, \"\"east\"\"\",,login-2,key-2-0123456789ab,,/img/m.png,,policy,,\n" +
		",Meter 3,,,,,,,,,\n"
	var res bulkCreated
	r := e.send("POST", "/api/device/instance/meter/import?deploy=true", "text/csv; charset=utf-8", good)
	if r.HTTPStatus != 200 || json.Unmarshal(r.Result, &res) != nil {
		t.Fatalf("import: %d %s", r.HTTPStatus, r.raw)
	}
	if res.Total != 3 || !res.Deployed || res.Devices[1].SecureID != "login-2" || res.Devices[1].SecureKey != "key-2-0123456789ab" ||
		!hex32.MatchString(res.Devices[0].SecureKey) || len(res.Devices[2].ID) != 16 {
		t.Fatalf("imported %+v", res)
	}
	d := e.deviceDetail("m-2")
	if d["name"] != `Meter 2, "east"` || d["productId"] != "meter" || enumValue(d["state"]) != "offline" || d["devicePhotoUrl"] != "/img/m.png" ||
		d["storePolicy"] != "policy" {
		t.Fatalf("m-2: %v", d)
	}
	if d := e.deviceDetail("m-1"); d["edge"] != true || d["mediaDevice"] != false || d["orgId"] != "org-1" || d["description"] != "in the hall" {
		t.Fatalf("m-1: %v", d)
	}
	if c := rec.take(); len(c) != 3 {
		t.Fatalf("awaited %d login changes, want 3", len(c))
	}

	before := e.countRows("devices")
	bad := header +
		"x-1,X 1,,,,,,,,,\n" +
		"x-2,X \xff\xfe,,,,,,,,,\n" + // 2: not UTF-8
		"x-3,X 3,,\n" + // 3: too few fields
		"x-4,X 4,other,,,,,,,,\n" + // 4: another product
		"x-5,X 5,,,,,,,,maybe,\n" + // 5: not a boolean
		"x-6,X\x00 6,,,,,,,,,\n" + // 6: NUL
		"m-1,Again,,,,,,,,,\n" // 7: exists
	wantRows(t, e.badRows(e.send("POST", "/api/device/instance/meter/import", "text/csv", bad)),
		rowError{Row: 2, ID: "x-2", Field: "name", Reason: "UTF-8"},
		rowError{Row: 3, ID: "x-3", Reason: "4 fields, the header 11"},
		rowError{Row: 4, ID: "x-4", Field: "productId", Reason: `"meter"`},
		rowError{Row: 5, ID: "x-5", Field: "edge", Reason: "true or false"},
		rowError{Row: 6, ID: "x-6", Field: "name", Reason: "NUL"},
		rowError{Row: 7, ID: "m-1", Field: "id", Reason: "already exists"},
	)
	// A bad header: named, row 0.
	wantRows(t, e.badRows(e.send("POST", "/api/device/instance/meter/import", "text/csv", "id,name,colour\nx,X,red\n")),
		rowError{Row: 0, Field: "colour", Reason: "unknown column"})
	wantRows(t, e.badRows(e.send("POST", "/api/device/instance/meter/import", "text/csv", "id,secureKey\nx,k\n")),
		rowError{Row: 0, Field: "name", Reason: "no name column"})
	// Not CSV at all (a stray quote): the row, and where.
	wantRows(t, e.badRows(e.send("POST", "/api/device/instance/meter/import", "text/csv", "id,name\na,A\nb,B\"x\n")),
		rowError{Row: 2, Reason: "line 3"})
	if after := e.countRows("devices"); after != before {
		t.Fatalf("refused imports stored %d devices", after-before)
	}
	// An unknown product in the path is not found; a Content-Type neither
	// CSV nor JSON is 415.
	if r := e.send("POST", "/api/device/instance/nope/import", "text/csv", "id,name\nx,X\n"); r.HTTPStatus != 404 || r.Code != "not_found" {
		t.Fatalf("import into an unknown product: %d %s", r.HTTPStatus, r.raw)
	}
	if r := e.send("POST", "/api/device/instance/meter/import", "application/xml", "<x/>"); r.HTTPStatus != 415 {
		t.Fatalf("import of XML: %d %s", r.HTTPStatus, r.raw)
	}
	if r := e.send("POST", "/api/device/instance/meter/import", "text/csv; charset=latin1", "id,name\nx,X\n"); r.HTTPStatus != 415 {
		t.Fatalf("import of Latin-1 CSV: %d %s", r.HTTPStatus, r.raw)
	}
}

// upload sends a multipart/form-data import, as the console does.
func (e *env) upload(path, filename string, content []byte, fields map[string]string) response {
	e.t.Helper()
	var body bytes.Buffer
	w := multipart.NewWriter(&body)
	for k, v := range fields {
		_ = w.WriteField(k, v)
	}
	f, _ := w.CreateFormFile("file", filename)
	_, _ = f.Write(content)
	_ = w.Close()
	req, _ := http.NewRequest("POST", e.base+path, &body)
	req.Header.Set("Content-Type", w.FormDataContentType())
	req.Header.Set("X-Access-Token", e.token)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	return e.envelope("POST", path, res)
}

// TestBulkImportUploadAndJSON: the console's multipart upload (CSV or
// JSON, deploy as a form field) and a JSON body import alike.
func TestBulkImportUploadAndJSON(t *testing.T) {
	t.Parallel()
	e, _ := newBulkEnv(t)
	e.createProduct("meter", "Meter", nil)
	e.ok("POST", "/api/device-product/meter/deploy", nil, nil)
	var res bulkCreated
	r := e.upload("/api/device/instance/meter/import", "fleet.csv", []byte("id,name\r\nu-1,U 1\r\nu-2,U 2\r\n"), map[string]string{"deploy": "true"})
	if r.HTTPStatus != 200 || json.Unmarshal(r.Result, &res) != nil || res.Total != 2 || !res.Deployed {
		t.Fatalf("CSV upload: %d %s", r.HTTPStatus, r.raw)
	}
	if s := e.deviceStates(); s["u-1"] != meta.StateOffline || s["u-2"] != meta.StateOffline {
		t.Fatalf("states %v", s)
	}
	r = e.upload("/api/device/instance/meter/import", "fleet.json", []byte(` [{"id":"j-1","name":"J 1"},{"id":"j-2","name":"J 2","productId":"meter"}]`), nil)
	if r.HTTPStatus != 200 || json.Unmarshal(r.Result, &res) != nil || res.Total != 2 || res.Deployed {
		t.Fatalf("JSON upload: %d %s", r.HTTPStatus, r.raw)
	}
	wantRows(t, e.badRows(e.upload("/api/device/instance/meter/import", "bad.csv", []byte("id,name\nz-1,\xc3\n"), nil)),
		rowError{Row: 1, ID: "z-1", Field: "name", Reason: "UTF-8"})
	if r := e.upload("/api/device/instance/meter/import", "x.csv", nil, nil); r.HTTPStatus != 400 {
		t.Fatalf("empty upload: %d %s", r.HTTPStatus, r.raw)
	}
	// A JSON body: the rows' own problems (a wrong type, bad text) are bad
	// rows like the others.
	e.ok("POST", "/api/device/instance/meter/import", []map[string]any{{"id": "k-1", "name": "K 1"}}, &res)
	wantRows(t, e.badRows(e.call("POST", "/api/device/instance/meter/import",
		`[{"id":"k-2","name":"K"},{"id":"k-3","name":7},{"id":"k-4","name":"K\u0000"},{"id":"k-1","name":"K"}]`)),
		rowError{Row: 2, ID: "k-3", Field: "name", Reason: "a string"},
		rowError{Row: 3, Field: "name", Reason: "NUL"},
		rowError{Row: 4, ID: "k-1", Field: "id", Reason: "already exists"})
	if n := e.countRows("devices"); n != 5 {
		t.Fatalf("%d devices, want 5", n)
	}
}

// TestBulkDeployUndeployDelete: bulk deploy, undeploy and delete, each all
// or nothing: a device of an undeployed product refuses the deploy, a
// deployed device the delete, an unknown or repeated id any of them, and
// nothing changes. Only devices whose state changed count, and the broker
// is waited for on exactly those.
func TestBulkDeployUndeployDelete(t *testing.T) {
	t.Parallel()
	e, rec := newBulkEnv(t)
	e.createProduct("on", "On", nil)
	e.createProduct("off", "Off", nil)
	e.ok("POST", "/api/device-product/on/deploy", nil, nil)
	var res bulkCreated
	e.ok("POST", "/api/device/instance/batch/_create", append(fleet("on", 5, 0), fleet("off", 1, 5)...), &res)
	e.ok("POST", "/api/device/instance/dev-00000/deploy", nil, nil)
	rec.take()
	states := e.deviceStates()

	// Refusals: nothing changes.
	wantRows(t, e.badRows(e.call("POST", "/api/device/instance/batch/_deploy", []string{"dev-00001", "dev-00005", "nope", "dev-00001"})),
		rowError{Row: 2, ID: "dev-00005", Field: "productId", Reason: "not deployed"},
		rowError{Row: 3, ID: "nope", Field: "id", Reason: "does not exist"},
		rowError{Row: 4, ID: "dev-00001", Field: "id", Reason: "row 1"})
	wantRows(t, e.badRows(e.call("POST", "/api/device/instance/batch/_undeploy", []any{"dev-00000", 7, ""})),
		rowError{Row: 2, Field: "id", Reason: "a string"})
	wantRows(t, e.badRows(e.call("POST", "/api/device/instance/batch/_undeploy", []string{"dev-00000", "", "gone"})),
		rowError{Row: 2, Field: "id", Reason: "required"},
		rowError{Row: 3, ID: "gone", Field: "id", Reason: "does not exist"})
	wantRows(t, e.badRows(e.call("POST", "/api/device/instance/batch/_delete", []string{"dev-00001", "dev-00000"})),
		rowError{Row: 2, ID: "dev-00000", Field: "id", Reason: "deployed"})
	if got := e.deviceStates(); fmt.Sprint(got) != fmt.Sprint(states) {
		t.Fatalf("refused requests changed states: %v -> %v", states, got)
	}
	if c := rec.take(); len(c) != 0 {
		t.Fatalf("refused requests awaited the broker for %v", c)
	}

	// Deploy: dev-00000 was deployed already.
	var ch bulkChanged
	e.ok("POST", "/api/device/instance/batch/_deploy", []string{"dev-00000", "dev-00001", "dev-00002"}, &ch)
	if ch.Total != 3 || ch.Changed != 2 {
		t.Fatalf("deploy: %+v, want 2 of 3 changed", ch)
	}
	wantLogins := func(what string, ids ...string) {
		t.Helper()
		var got []string
		for _, c := range rec.take() {
			var v int64
			if err := e.store.DB().Get(&v, `SELECT login_version FROM devices WHERE id = $1`, c.ID); err != nil || v != c.Version {
				t.Fatalf("%s awaited %+v, stored version %d %v", what, c, v, err)
			}
			got = append(got, c.ID)
		}
		slices.Sort(got)
		if !slices.Equal(got, ids) {
			t.Fatalf("%s awaited the broker for %v, want %v", what, got, ids)
		}
	}
	wantLogins("deploy", "dev-00001", "dev-00002")
	if s := e.deviceStates(); s["dev-00001"] != meta.StateOffline || s["dev-00003"] != meta.StateNotActive {
		t.Fatalf("states after deploy: %v", s)
	}
	if d := e.deviceDetail("dev-00001"); d["registerTime"].(float64) == 0 {
		t.Fatalf("deployed without a registry time: %v", d)
	}

	// Undeploy: dev-00003 was not deployed.
	e.ok("POST", "/api/device/instance/batch/_undeploy", []string{"dev-00000", "dev-00001", "dev-00003"}, &ch)
	if ch.Total != 3 || ch.Changed != 2 {
		t.Fatalf("undeploy: %+v, want 2 of 3 changed", ch)
	}
	wantLogins("undeploy", "dev-00000", "dev-00001")
	if d := e.deviceDetail("dev-00001"); enumValue(d["state"]) != meta.StateNotActive || d["registerTime"].(float64) != 0 {
		t.Fatalf("undeployed: %v", d)
	}
	// JetLinks' spelling, _unDeploy, is the same route.
	e.ok("POST", "/api/device/instance/batch/_unDeploy", []string{"dev-00002"}, &ch)
	wantLogins("_unDeploy", "dev-00002")

	// Delete: all undeployed now; counts follow.
	e.ok("POST", "/api/device/instance/batch/_delete", []string{"dev-00000", "dev-00001", "dev-00005"}, &ch)
	if ch.Total != 3 || ch.Changed != 3 {
		t.Fatalf("delete: %+v", ch)
	}
	wantLogins("delete")
	if s := e.deviceStates(); len(s) != 3 || s["dev-00000"] != "" {
		t.Fatalf("after delete: %v", s)
	}
	var counts []struct {
		Product string `db:"product_id"`
		N       int    `db:"devices"`
	}
	if err := e.store.DB().Select(&counts, `SELECT product_id, devices FROM product_device_counts ORDER BY 1`); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(counts) != "[{off 0} {on 3}]" {
		t.Fatalf("product device counts %v", counts)
	}
	// The product list shows it at once (page cache).
	var page struct {
		Data []map[string]any `json:"data"`
	}
	e.ok("POST", "/api/device-product/_query/", map[string]any{"sorts": []any{map[string]any{"name": "id"}}}, &page)
	if len(page.Data) != 2 || page.Data[1]["deviceNum"] != 3.0 {
		t.Fatalf("product page %v", page.Data)
	}
}
