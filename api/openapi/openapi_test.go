package openapi_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"devicehub/api"
	"devicehub/api/live"
	"devicehub/api/openapi"
	"devicehub/bench/testkit"
	"devicehub/ingest/notify"
	"devicehub/meta/metatest"
	"devicehub/tsdb"
	"devicehub/tsdb/tsdbtest"
)

// methods are the operation keys of an OpenAPI path item.
var methods = []string{"get", "put", "post", "delete", "options", "head", "patch", "trace"}

func loadDoc(t *testing.T) (map[string]any, *checker) {
	t.Helper()
	v, err := decodeJSON(openapi.Document())
	if err != nil {
		t.Fatalf("openapi.json: %v", err)
	}
	doc := v.(map[string]any)
	return doc, &checker{doc: doc}
}

// fiberParam is a Fiber path parameter: :name.
var fiberParam = regexp.MustCompile(`:([A-Za-z0-9_]+)`)

// docPath is the document's form of a Fiber route path: parameters in
// braces, no trailing slash (routes are not strict about it, and the
// document keeps the specification's slashes), "" when the route is one
// the document leaves out by rule (openapi.StaticPrefixes).
func docPath(t *testing.T, fiberPath string) string {
	t.Helper()
	for _, p := range openapi.StaticPrefixes {
		if strings.HasPrefix(fiberPath, p) {
			return ""
		}
	}
	if strings.ContainsAny(fiberPath, "*+?") {
		t.Errorf("route %s has a wildcard or optional parameter: give it a documented form here", fiberPath)
	}
	return normalPath(fiberParam.ReplaceAllString(fiberPath, "{$1}"))
}

func normalPath(p string) string {
	if len(p) > 1 {
		p = strings.TrimSuffix(p, "/")
	}
	return p
}

// routesOf returns srv's routes as "METHOD /path" in the document's form.
// GET routes answer HEAD too (Fiber registers both): a HEAD beside a GET of
// the same path is the GET's.
func routesOf(t *testing.T, srv *api.Server) map[string]bool {
	t.Helper()
	routes := srv.App().GetRoutes(true) // without Use middleware
	gets := map[string]bool{}
	for _, r := range routes {
		if r.Method == http.MethodGet {
			gets[r.Path] = true
		}
	}
	out := map[string]bool{}
	for _, r := range routes {
		if r.Method == http.MethodHead && gets[r.Path] {
			continue
		}
		if p := docPath(t, r.Path); p != "" {
			out[r.Method+" "+p] = true
		}
	}
	return out
}

// documentedOperations are the document's operations as "METHOD /path",
// with their operation objects.
func documentedOperations(doc map[string]any) map[string]map[string]any {
	out := map[string]map[string]any{}
	for path, item := range doc["paths"].(map[string]any) {
		for _, m := range methods {
			if op, ok := item.(map[string]any)[m].(map[string]any); ok {
				out[strings.ToUpper(m)+" "+normalPath(path)] = op
			}
		}
	}
	return out
}

// TestEveryRouteDocumented walks the routes the server registers: each is
// documented, and each documented operation is registered.
func TestEveryRouteDocumented(t *testing.T) {
	doc, _ := loadDoc(t)
	srv := api.New(api.DefaultOptions(), api.Deps{Registry: prometheus.NewRegistry()})
	registered := routesOf(t, srv)
	documented := documentedOperations(doc)
	if len(registered) < 30 {
		t.Fatalf("only %d routes registered: %v", len(registered), registered)
	}
	var missing, extra []string
	for r := range registered {
		if documented[r] == nil {
			missing = append(missing, r)
		}
	}
	for r := range documented {
		if !registered[r] {
			extra = append(extra, r)
		}
	}
	sort.Strings(missing)
	sort.Strings(extra)
	if len(missing) > 0 {
		t.Errorf("routes not in api/openapi/openapi.json:\n  %s", strings.Join(missing, "\n  "))
	}
	if len(extra) > 0 {
		t.Errorf("documented but not registered:\n  %s", strings.Join(extra, "\n  "))
	}
}

// TestDocumentConsistent checks the document against itself: every
// operation has a unique operationId, a summary, a declared tag and a 2xx
// response; those that need a token document 401; the path's parameters
// are declared and declared ones are in the path; every $ref resolves;
// and every example conforms to its schema.
func TestDocumentConsistent(t *testing.T) {
	doc, c := loadDoc(t)
	if v, _ := doc["openapi"].(string); !strings.HasPrefix(v, "3.") {
		t.Fatalf("openapi %q, want 3.x", v)
	}
	tags := map[string]bool{}
	for _, tg := range asSlice(doc["tags"]) {
		tags[tg.(map[string]any)["name"].(string)] = true
	}
	ids := map[string]string{}
	templateParam := regexp.MustCompile(`\{([^}]+)\}`)
	for path, itemNode := range doc["paths"].(map[string]any) {
		item := itemNode.(map[string]any)
		for _, m := range methods {
			op, ok := item[m].(map[string]any)
			if !ok {
				continue
			}
			name := strings.ToUpper(m) + " " + path
			id, _ := op["operationId"].(string)
			if id == "" || ids[id] != "" {
				t.Errorf("%s: operationId %q missing or also on %s", name, id, ids[id])
			}
			ids[id] = name
			if s, _ := op["summary"].(string); s == "" {
				t.Errorf("%s: no summary", name)
			}
			for _, tg := range asSlice(op["tags"]) {
				if !tags[tg.(string)] {
					t.Errorf("%s: tag %v is not declared", name, tg)
				}
			}
			if len(asSlice(op["tags"])) == 0 {
				t.Errorf("%s: no tag", name)
			}
			responses, _ := op["responses"].(map[string]any)
			has2xx := false
			for status := range responses {
				has2xx = has2xx || strings.HasPrefix(status, "2")
			}
			if !has2xx {
				t.Errorf("%s: no 2xx response", name)
			}
			security, own := op["security"]
			if !own {
				security = doc["security"]
			}
			if len(asSlice(security)) > 0 && responses["401"] == nil {
				t.Errorf("%s needs a token but documents no 401", name)
			}
			if !own && !strings.HasPrefix(path, "/api/") {
				t.Errorf("%s is outside /api but does not say whether it needs a token (security)", name)
			}
			declared := map[string]bool{}
			for _, pn := range append(asSlice(item["parameters"]), asSlice(op["parameters"])...) {
				p, err := c.deref(pn.(map[string]any))
				if err != nil {
					t.Errorf("%s: %v", name, err)
					continue
				}
				if p["in"] == "path" {
					declared[p["name"].(string)] = true
					if p["required"] != true {
						t.Errorf("%s: path parameter %v is not required", name, p["name"])
					}
				}
			}
			inPath := map[string]bool{}
			for _, mm := range templateParam.FindAllStringSubmatch(path, -1) {
				inPath[mm[1]] = true
				if !declared[mm[1]] {
					t.Errorf("%s: path parameter {%s} is not declared", name, mm[1])
				}
			}
			for p := range declared {
				if !inPath[p] {
					t.Errorf("%s: declares path parameter %s that is not in the path", name, p)
				}
			}
		}
	}
	n := 0
	walk(doc, "$", func(at string, node map[string]any) {
		if ref, ok := node["$ref"].(string); ok {
			if _, err := c.resolve(ref); err != nil {
				t.Errorf("%s: %v", at, err)
			}
		}
		// A media type object with a schema and an example: they agree.
		schema, hasSchema := node["schema"]
		example, hasExample := node["example"]
		if hasSchema && hasExample && !strings.Contains(at, ".parameters") {
			n++
			for _, e := range c.check(schema, example, "example") {
				t.Errorf("%s: %s", at, e)
			}
		}
	})
	if n < 30 {
		t.Errorf("only %d examples checked against their schemas", n)
	}
	// Every component is used: the page shows only what operations reach.
	refs := map[string]bool{}
	walk(doc, "$", func(_ string, node map[string]any) {
		if ref, ok := node["$ref"].(string); ok {
			refs[ref] = true
		}
	})
	for kind, defs := range doc["components"].(map[string]any) {
		if kind == "securitySchemes" {
			continue
		}
		for name := range defs.(map[string]any) {
			if !refs["#/components/"+kind+"/"+name] {
				t.Errorf("components.%s.%s is not used", kind, name)
			}
		}
	}
}

// walk calls f on every object in v, depth first, with its path.
func walk(v any, at string, f func(string, map[string]any)) {
	switch x := v.(type) {
	case map[string]any:
		f(at, x)
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if k == "example" {
				continue // examples are data, not document
			}
			walk(x[k], at+"."+k, f)
		}
	case []any:
		for i, e := range x {
			walk(e, fmt.Sprintf("%s[%d]", at, i), f)
		}
	}
}

// responseSchema is the schema the document gives for method path's
// response with status (JSON bodies).
func responseSchema(t *testing.T, doc map[string]any, c *checker, method, path string, status int) any {
	t.Helper()
	item, ok := doc["paths"].(map[string]any)[path].(map[string]any)
	if !ok {
		t.Fatalf("no path %s in the document", path)
	}
	op, ok := item[strings.ToLower(method)].(map[string]any)
	if !ok {
		t.Fatalf("no %s %s in the document", method, path)
	}
	resp, ok := op["responses"].(map[string]any)[strconv.Itoa(status)].(map[string]any)
	if !ok {
		t.Fatalf("%s %s: status %d is not documented", method, path, status)
	}
	resp, err := c.deref(resp)
	if err != nil {
		t.Fatal(err)
	}
	media, ok := resp["content"].(map[string]any)["application/json"].(map[string]any)
	if !ok {
		t.Fatalf("%s %s %d: no application/json content", method, path, status)
	}
	return media["schema"]
}

// liveServer is an API server on real PostgreSQL and ClickHouse.
type liveServer struct {
	base string
}

func startServer(t *testing.T) (*liveServer, *tsdb.DB, *live.Hub) {
	t.Helper()
	store := metatest.NewStore(t)
	db := tsdbtest.NewDB(t, time.UTC)
	reg := prometheus.NewRegistry()
	hub, err := live.New(context.Background(), live.DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(hub.Close)
	srv := api.New(api.DefaultOptions(), api.Deps{
		Auth: store, Products: store, Roles: store, Devices: store, Dashboard: db, Models: store,
		Live: hub, LiveDevices: store,
		Notify:   notify.NewStore(store),
		Health:   map[string]func(context.Context) error{"postgres": store.Ping},
		Registry: reg, Gatherer: reg,
	})
	base := testkit.Serve(t, srv.App().Listener, srv.Shutdown)
	return &liveServer{base: base}, db, hub
}

// send makes a request and returns the status, headers and body.
func (s *liveServer) send(t *testing.T, method, path, token string, body any) (int, http.Header, []byte) {
	t.Helper()
	r := testkit.API{Base: s.base, Token: token}.Send(t, method, path, body)
	return r.HTTPStatus, r.Header, r.Raw
}

// TestResponsesMatchDocument sends real requests and checks each response
// body against the schema the document gives for its operation and status.
func TestResponsesMatchDocument(t *testing.T) {
	doc, c := loadDoc(t)
	s, db, hub := startServer(t)

	var token string
	type request struct {
		method, path string // the request
		docPath      string // its operation in the document
		body         any
		noToken      bool
		status       int
	}
	metadata := `{"properties":[{"id":"temperature","name":"Temperature","valueType":{"type":"float","scale":1,"unit":"percent"}},` +
		`{"id":"mode","name":"Mode","valueType":{"type":"string","expands":{"maxLength":16}}}],"events":[],"functions":[],"tags":[]}`
	product := map[string]any{}
	now := time.Now()
	requests := []request{
		{method: "POST", path: "/api/authorize/login", body: map[string]string{"username": "admin", "password": "admin123"}, noToken: true, status: 200},
		{method: "POST", path: "/api/authorize/login", body: map[string]string{"username": "admin", "password": "wrong"}, noToken: true, status: 400},
		{method: "GET", path: "/api/authorize/me", status: 200},
		{method: "GET", path: "/api/authorize/me", noToken: true, status: 401},
		{method: "GET", path: "/api/settings", status: 200},
		{method: "GET", path: "/api/settings", noToken: true, status: 401},
		{method: "POST", path: "/api/device/product", body: map[string]any{"id": "oa-meter", "name": "Meter", "classifiedId": "energy",
			"modelFrom": "custom", "accessId": "mqtt", "deviceType": "device"}, status: 200},
		{method: "POST", path: "/api/device/product", body: map[string]any{"name": "No class"}, status: 400},
		{method: "GET", path: "/api/device-product/oa-meter", docPath: "/api/device-product/{id}", status: 200},
		{method: "PATCH", path: "/api/device-product", body: product, status: 200},
		{method: "POST", path: "/api/device-product/oa-meter/deploy", docPath: "/api/device-product/{id}/deploy", status: 200},
		{method: "POST", path: "/api/device/instance", body: map[string]any{"id": "oa-1", "name": "Meter 1", "productId": "oa-meter"}, status: 200},
		{method: "POST", path: "/api/device/instance/oa-1/deploy", docPath: "/api/device/instance/{id}/deploy", status: 200},
		{method: "POST", path: "/api/device/instance/batch/_create?deploy=true", docPath: "/api/device/instance/batch/_create",
			body: []map[string]any{{"id": "oa-2", "name": "Meter 2", "productId": "oa-meter"}}, status: 200},
		{method: "POST", path: "/api/device/instance/batch/_create", body: []map[string]any{{"id": "oa-2", "name": "Meter 2", "productId": "oa-meter"}}, status: 400},
		{method: "POST", path: "/api/device/instance/oa-meter/import", docPath: "/api/device/instance/{productId}/import",
			body: []map[string]any{{"id": "oa-3", "name": "Meter 3"}}, status: 200},
		{method: "POST", path: "/api/device/instance/batch/_undeploy", body: []string{"oa-2"}, status: 200},
		{method: "POST", path: "/api/device/instance/batch/_deploy", body: []string{"oa-2", "nope"}, status: 400},
		{method: "POST", path: "/api/device/instance/batch/_delete", body: []string{"oa-2", "oa-3"}, status: 200},
		{method: "POST", path: "/api/device-product/_query/", body: map[string]any{"pageSize": 5, "terms": []any{map[string]any{"column": "id", "value": "oa-meter"}}}, status: 200},
		{method: "POST", path: "/api/device-product/_query/", body: map[string]any{"terms": []any{map[string]any{"column": "secret", "value": "x"}}}, status: 400},
		{method: "POST", path: "/api/device-product/_count", status: 200},
		{method: "GET", path: "/api/device-product/nope", docPath: "/api/device-product/{id}", status: 404},
		{method: "POST", path: "/api/device-instance/_query/", body: map[string]any{"pageIndex": 0, "pageSize": 10}, status: 200},
		{method: "GET", path: "/api/device/instance/oa-1/detail", docPath: "/api/device/instance/{id}/detail", status: 200},
		{method: "GET", path: "/api/device/instance/oa-1", docPath: "/api/device/instance/{id}", status: 200},
		{method: "POST", path: "/api/role/_query/", status: 200},
		{method: "POST", path: "/api/role", body: map[string]any{"id": "oa-role", "name": "Meter operators", "permissions": []string{"device:read"},
			"products": []string{"oa-meter"}}, status: 200},
		{method: "POST", path: "/api/role", body: map[string]any{"id": "oa-role2", "name": "Bad", "permissions": []string{"device:fly"}}, status: 400},
		{method: "PUT", path: "/api/role/oa-role", docPath: "/api/role/{id}", body: map[string]any{"products": nil}, status: 200},
		{method: "PUT", path: "/api/role/nope", docPath: "/api/role/{id}", body: map[string]any{"name": "n"}, status: 404},
		{method: "DELETE", path: "/api/role/oa-role", docPath: "/api/role/{id}", status: 200},
		{method: "POST", path: "/api/dashboard/_multi", body: []map[string]any{
			{"dashboard": "device", "object": "message", "measurement": "quantity", "dimension": "agg", "group": "msgs",
				"params": map[string]any{"time": "1d", "limit": 3, "to": "now"}},
			{"dashboard": "device", "object": "oa-meter", "measurement": "properties", "dimension": "history", "group": "hist",
				"params": map[string]any{"deviceId": "oa-1", "history": 2}},
			{"dashboard": "device", "object": "oa-meter", "measurement": "properties", "dimension": "agg", "group": "avg",
				"params": map[string]any{"deviceId": "oa-1", "properties": []string{"temperature"}, "agg": "avg", "time": "1h", "limit": 3, "to": "now"}},
		}, status: 200},
		{method: "POST", path: "/api/dashboard/_multi", body: []map[string]any{{"dashboard": "device"}}, status: 400},
		// Notifications: the channel's receiver is a closed port, so _test answers delivered false.
		{method: "POST", path: "/api/notify/channel", body: map[string]any{"id": "oa-hook", "name": "Hook", "secret": "s",
			"webhook": map[string]any{"url": "http://127.0.0.1:9/h", "timeoutMs": 1000}}, status: 200},
		{method: "POST", path: "/api/notify/channel", body: map[string]any{"name": "Bad", "webhook": map[string]any{"url": "ftp://x"}}, status: 400},
		{method: "PUT", path: "/api/notify/channel/oa-hook", docPath: "/api/notify/channel/{id}", body: map[string]any{"name": "Hook 2",
			"email": map[string]any{"host": "127.0.0.1", "port": 9, "from": "a@example.com", "to": []string{"b@example.com"}, "timeoutMs": 1000}}, status: 200},
		{method: "PUT", path: "/api/notify/channel/nope", docPath: "/api/notify/channel/{id}", body: map[string]any{"name": "N",
			"webhook": map[string]any{"url": "http://x"}}, status: 404},
		{method: "POST", path: "/api/notify/channel/_query", status: 200},
		{method: "POST", path: "/api/notify/channel/oa-hook/_test", docPath: "/api/notify/channel/{id}/_test", status: 200},
		{method: "POST", path: "/api/notify/subscription", body: map[string]any{"id": "oa-sub", "name": "Sub", "products": []string{"oa-meter"},
			"channels": []string{"oa-hook"}, "quietMs": 60000}, status: 200},
		{method: "POST", path: "/api/notify/subscription", body: map[string]any{"name": "Sub", "products": []string{"oa-meter"}, "channels": []string{"nope"}}, status: 400},
		{method: "PUT", path: "/api/notify/subscription/oa-sub", docPath: "/api/notify/subscription/{id}", body: map[string]any{"name": "Sub 2",
			"products": []string{"oa-meter"}, "channels": []string{"oa-hook"}}, status: 200},
		{method: "POST", path: "/api/notify/subscription/_query", status: 200},
		{method: "DELETE", path: "/api/notify/channel/oa-hook", docPath: "/api/notify/channel/{id}", status: 409},
		{method: "POST", path: "/api/notify/dead/_query", body: map[string]any{"pageSize": 10}, status: 200},
		{method: "POST", path: "/api/notify/dead/7/_replay", docPath: "/api/notify/dead/{id}/_replay", status: 404},
		{method: "DELETE", path: "/api/notify/subscription/oa-sub", docPath: "/api/notify/subscription/{id}", status: 200},
		{method: "DELETE", path: "/api/notify/channel/oa-hook", docPath: "/api/notify/channel/{id}", status: 200},
		{method: "GET", path: "/healthz", noToken: true, status: 200},
		{method: "GET", path: "/readyz", noToken: true, status: 200},
		{method: "POST", path: "/api/authorize/logout", status: 200},
	}
	for i, r := range requests {
		if r.method == "PATCH" {
			// Endpoint 4's usage: the whole detail back, with a thing model.
			code, _, raw := s.send(t, "GET", "/api/device-product/oa-meter", token, nil)
			var env struct{ Result map[string]any }
			if code != 200 || json.Unmarshal(raw, &env) != nil {
				t.Fatalf("product detail: %d %s", code, raw)
			}
			for k, v := range env.Result {
				product[k] = v
			}
			product["metadata"] = metadata
		}
		if r.path == "/api/dashboard/_multi" && r.status == 200 {
			// Something to count and a history to read.
			if err := db.Insert(context.Background(),
				[]tsdb.Message{{Time: now, ProductID: "oa-meter", DeviceID: "oa-1", Direction: "up", MessageType: "REPORT_PROPERTY",
					MessageID: "m1", Topic: "/oa-meter/oa-1/properties/report", Payload: []byte(`{}`)}},
				[]tsdb.PropertyValue{
					{Time: now, ProductID: "oa-meter", DeviceID: "oa-1", Property: "temperature", ValueType: "number", Num: 21.5},
					{Time: now, ProductID: "oa-meter", DeviceID: "oa-1", Property: "mode", ValueType: "string", Str: "eco"},
				}); err != nil {
				t.Fatal(err)
			}
		}
		tok := token
		if r.noToken {
			tok = ""
		}
		code, _, raw := s.send(t, r.method, r.path, tok, r.body)
		name := fmt.Sprintf("[%d] %s %s", i, r.method, r.path)
		if code != r.status {
			t.Fatalf("%s: %d, want %d: %s", name, code, r.status, raw)
		}
		body, err := decodeJSON(raw)
		if err != nil {
			t.Fatalf("%s: %v: %s", name, err, raw)
		}
		p := r.docPath
		if p == "" {
			p = r.path
		}
		for _, e := range c.check(responseSchema(t, doc, c, r.method, p, code), body, "body") {
			t.Errorf("%s: %d response differs from the document: %s\n%s", name, code, e, raw)
		}
		if token == "" && r.path == "/api/authorize/login" && code == 200 {
			token = body.(map[string]any)["result"].(map[string]any)["token"].(string)
		}
		if r.path == "/api/dashboard/_multi" && code == 200 {
			items := asSlice(body.(map[string]any)["result"])
			if len(items) != 3+2+3 {
				t.Errorf("%s: %d items, want 3 counts, 2 history values and 3 aggregates: %s", name, len(items), raw)
			}
		}
	}

	// The live stream's events against the document's x-events, its
	// refusals against the document's 400 (logged out above: a new login).
	code, _, raw := s.send(t, "POST", "/api/authorize/login", "", map[string]string{"username": "admin", "password": "admin123"})
	var login struct {
		Result struct{ Token string } `json:"result"`
	}
	if code != 200 || json.Unmarshal(raw, &login) != nil {
		t.Fatalf("login: %d %s", code, raw)
	}
	token = login.Result.Token
	code, _, raw = s.send(t, "GET", "/api/live?deviceId=nope&token="+token, "", nil)
	body, err := decodeJSON(raw)
	if code != 400 || err != nil {
		t.Fatalf("live with an unknown device: %d %s", code, raw)
	}
	for _, e := range c.check(responseSchema(t, doc, c, "GET", "/api/live", 400), body, "body") {
		t.Errorf("live 400: %s", e)
	}
	events := liveEvents(t, s.base+"/api/live?deviceId=oa-1&token="+token, 2, func() {
		hub.PresenceChanged("oa-1", true)
		hub.Stored([]tsdb.PropertyValue{{Time: now, ProductID: "oa-meter", DeviceID: "oa-1", Property: "temperature", ValueType: "number", Num: 22.5}})
	})
	op := doc["paths"].(map[string]any)["/api/live"].(map[string]any)["get"].(map[string]any)
	schemas := op["responses"].(map[string]any)["200"].(map[string]any)["x-events"].(map[string]any)
	for _, ev := range events {
		schema, ok := schemas[ev.name]
		if !ok {
			t.Errorf("live event %q is not in x-events", ev.name)
			continue
		}
		data, err := decodeJSON([]byte(ev.data))
		if err != nil {
			t.Fatalf("live event %s: %v: %s", ev.name, err, ev.data)
		}
		for _, e := range c.check(schema, data, ev.name) {
			t.Errorf("live event differs from the document: %s\n%s", e, ev.data)
		}
	}
}

type sseEvent struct{ name, data string }

// liveEvents opens url's event stream, calls feed once it is open, and
// returns the first n events.
func liveEvents(t *testing.T, url string, n int, feed func()) []sseEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != 200 || !strings.HasPrefix(res.Header.Get("Content-Type"), "text/event-stream") {
		b, _ := io.ReadAll(res.Body)
		t.Fatalf("live: %d %s: %s", res.StatusCode, res.Header.Get("Content-Type"), b)
	}
	sc := bufio.NewScanner(res.Body)
	var events []sseEvent
	var cur sseEvent
	fed := false
	for len(events) < n && sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, ": "): // the first comment: the stream is open
			if !fed {
				fed = true
				feed()
			}
		case strings.HasPrefix(line, "event: "):
			cur.name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			cur.data = strings.TrimPrefix(line, "data: ")
		case line == "" && cur.name != "":
			events = append(events, cur)
			cur = sseEvent{}
		}
	}
	if len(events) < n {
		t.Fatalf("live: %d events of %d: %v", len(events), n, sc.Err())
	}
	return events
}

// TestServed: /openapi.json is the embedded document and /docs a page
// whose script and style are served beside it, none with a token; other
// files under /docs/ are not found.
func TestServed(t *testing.T) {
	srv := api.New(api.DefaultOptions(), api.Deps{Registry: prometheus.NewRegistry()})
	app := srv.App()
	get := func(path string, header ...string) (*http.Response, []byte) {
		t.Helper()
		req, _ := http.NewRequest("GET", path, nil)
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		res, err := app.Test(req, 5000)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		return res, body
	}
	res, body := get("/openapi.json")
	if res.StatusCode != 200 || !bytes.Equal(body, openapi.Document()) || !strings.HasPrefix(res.Header.Get("Content-Type"), "application/json") {
		t.Errorf("/openapi.json: %d %s, %d bytes", res.StatusCode, res.Header.Get("Content-Type"), len(body))
	}
	if res, _ := get("/openapi.json", "If-None-Match", res.Header.Get("ETag")); res.StatusCode != 304 {
		t.Errorf("/openapi.json with its ETag: %d, want 304", res.StatusCode)
	}
	res, body = get("/docs")
	if res.StatusCode != 200 || !strings.HasPrefix(res.Header.Get("Content-Type"), "text/html") ||
		!strings.Contains(res.Header.Get("Content-Security-Policy"), "script-src 'self'") {
		t.Fatalf("/docs: %d %v", res.StatusCode, res.Header)
	}
	page := string(body)
	// Everything the page loads is served here: no CDN.
	refs := regexp.MustCompile(`(?:src|href)="([^"]+)"`).FindAllStringSubmatch(page, -1)
	if len(refs) < 3 {
		t.Fatalf("/docs links %v", refs)
	}
	for _, m := range refs {
		ref := m[1]
		if !strings.HasPrefix(ref, "/") || strings.HasPrefix(ref, "//") {
			t.Errorf("/docs loads %s from elsewhere", ref)
			continue
		}
		if res, _ := get(ref); res.StatusCode != 200 {
			t.Errorf("/docs links %s: %d", ref, res.StatusCode)
		}
	}
	for _, ref := range []string{"/docs/docs.js", "/docs/docs.css"} {
		if !slices.ContainsFunc(refs, func(m []string) bool { return m[1] == ref }) {
			t.Errorf("/docs does not load %s", ref)
		}
	}
	if res, body := get("/docs/nothing.js"); res.StatusCode != 404 || !strings.Contains(string(body), `"not_found"`) {
		t.Errorf("/docs/nothing.js: %d %s", res.StatusCode, body)
	}
}
