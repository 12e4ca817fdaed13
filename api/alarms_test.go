package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"devicehub/api"
	"devicehub/ingest/alarm"
	"devicehub/meta"
	"devicehub/tsdb/tsdbtest"
)

const alarmModel = `{"properties":[{"id":"temp","name":"Temperature","valueType":{"type":"float"}},
 {"id":"mode","name":"Mode","valueType":{"type":"enum","elements":[{"value":"auto","text":"Auto"},{"value":"manual","text":"Manual"}]}},
 {"id":"label","name":"Label","valueType":{"type":"string"}}],
 "events":[{"id":"fault","name":"Fault","valueType":{"type":"object","properties":[{"id":"code","name":"Code","valueType":{"type":"int"}}]}}],
 "functions":[],"tags":[]}`

type alarmEnv struct {
	*env
	alarms *alarm.Store
	epoch  int64
}

// newAlarmEnv is a server with the alarm store, products pa and pb with
// a thing model, and the audit writer flushing every 20 ms.
func newAlarmEnv(t *testing.T) *alarmEnv {
	t.Helper()
	var as *alarm.Store
	opts := api.DefaultOptions()
	opts.AuditFlushInterval = 20 * time.Millisecond
	e := newEnvOpts(t, opts, func(store *meta.Store, deps *api.Deps) {
		as = alarm.NewStore(store)
		deps.Alarms = as
		deps.Dashboard, deps.Models = tsdbtest.NewDB(t, time.UTC), store
	})
	for _, p := range []string{"pa", "pb"} {
		e.createProduct(p, "Product "+p, map[string]any{"metadata": alarmModel})
	}
	epoch, err := as.Claim(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return &alarmEnv{env: e, alarms: as, epoch: epoch}
}

func hotRule(id, product string) map[string]any {
	return map[string]any{"id": id, "name": "Hot " + id, "productId": product, "severity": "major", "enabled": true,
		"trigger": map[string]any{"type": "property", "all": []any{map[string]any{"property": "temp", "op": "gt", "value": 30}}},
		"clear":   map[string]any{"type": "condition", "all": []any{map[string]any{"property": "temp", "op": "lt", "value": 28}}}}
}

// raise writes alarms as the evaluator's owner would, of enabled rules
// (made here when absent: the owner's writes of other rules are refused).
func (e *alarmEnv) raise(trs ...alarm.Transition) {
	e.t.Helper()
	ctx := context.Background()
	for _, t := range trs {
		if _, err := e.alarms.GetRule(ctx, t.RuleID); err == nil {
			continue
		}
		r := alarm.Rule{ID: t.RuleID, Name: t.RuleID, ProductID: t.ProductID, Severity: alarm.SeverityMajor, Enabled: true,
			Trigger: alarm.Trigger{Type: alarm.TriggerNoData, For: alarm.Duration(time.Minute)}}
		if _, err := e.alarms.PutRule(ctx, r, true, alarm.Actor{}); err != nil {
			e.t.Fatal(err)
		}
	}
	if _, err := e.alarms.Write(context.Background(), e.epoch, trs, nil); err != nil {
		e.t.Fatal(err)
	}
}

type recordOut struct {
	ID           string `json:"id"`
	RuleID       string `json:"ruleId"`
	ProductID    string `json:"productId"`
	DeviceID     string `json:"deviceId"`
	Severity     string `json:"severity"`
	State        string `json:"state"`
	Count        int    `json:"count"`
	Acked        bool   `json:"acknowledged"`
	AckedBy      string `json:"acknowledgedBy"`
	AckComment   string `json:"ackComment"`
	ClearedBy    string `json:"clearedBy"`
	ClearValue   string `json:"clearValue"`
	RaisedTime   int64  `json:"raisedTime"`
	ClearedTime  int64  `json:"clearedTime"`
	AckedTime    int64  `json:"acknowledgedTime"`
	SeverityRank int    `json:"severityRank"`
	Transitions  []struct {
		Kind     string `json:"kind"`
		Severity string `json:"severity"`
		Username string `json:"username"`
		Comment  string `json:"comment"`
		Value    string `json:"value"`
	} `json:"transitions"`
}

func (e *alarmEnv) records(token string, body string) []recordOut {
	e.t.Helper()
	r := e.do("POST", "/api/alarm/record/_query", json.RawMessage(body), token)
	if r.HTTPStatus != 200 {
		e.t.Fatalf("records: %d %s", r.HTTPStatus, r.raw)
	}
	var page struct {
		Total int         `json:"total"`
		Data  []recordOut `json:"data"`
	}
	if err := json.Unmarshal(r.Result, &page); err != nil {
		e.t.Fatal(err)
	}
	return page.Data
}

// TestAlarmRulesAPI: create, read, update, enable, disable, query,
// delete; export and import as one document, all or nothing; bad rules
// refused naming the field.
func TestAlarmRulesAPI(t *testing.T) {
	t.Parallel()
	e := newAlarmEnv(t)
	var got map[string]any
	e.ok("POST", "/api/alarm/config", hotRule("hot", "pa"), &got)
	if got["id"] != "hot" || got["enabled"] != true || got["createTime"].(float64) == 0 {
		t.Fatalf("created %v", got)
	}
	e.fails("POST", "/api/alarm/config", hotRule("hot", "pa"), 400, "duplicate_key")
	e.fails("POST", "/api/alarm/config", hotRule("x", "nosuch"), 404, "not_found")
	// bad rules: 400 naming the field
	bad := func(mut func(r map[string]any), field string) {
		t.Helper()
		r := hotRule("bad", "pa")
		mut(r)
		res := e.fails("POST", "/api/alarm/config", r, 400, "illegal_argument")
		if !strings.HasPrefix(res.Message, field+": ") {
			t.Errorf("want the message to name %s: %s", field, res.Message)
		}
	}
	leaf := func(l map[string]any) func(r map[string]any) {
		return func(r map[string]any) { r["trigger"] = map[string]any{"type": "property", "all": []any{l}} }
	}
	bad(leaf(map[string]any{"property": "pressure", "op": "gt", "value": 1}), "trigger.all[0].property")
	bad(leaf(map[string]any{"property": "label", "op": "gt", "value": 1}), "trigger.all[0].op")
	bad(leaf(map[string]any{"property": "mode", "op": "eq", "value": "turbo"}), "trigger.all[0].value")
	bad(leaf(map[string]any{"property": "temp", "op": "gt", "value": "hot"}), "trigger.all[0].value")
	bad(func(r map[string]any) { r["severity"] = "urgent" }, "severity")
	bad(func(r map[string]any) { r["duration"] = "soon" }, "duration")
	bad(func(r map[string]any) { r["trigger"] = map[string]any{"type": "event", "event": "reboot"} }, "trigger.event")
	bad(func(r map[string]any) { r["trigger"] = map[string]any{"type": "offline"} }, "trigger.for")
	bad(func(r map[string]any) { r["treshold"] = 3 }, "treshold")
	bad(func(r map[string]any) { r["clear"] = map[string]any{"type": "condition"} }, "clear.all")
	bad(func(r map[string]any) { delete(r, "productId") }, "productId")
	// update (the path names it), enable, disable, get, query
	up := hotRule("", "pa")
	delete(up, "id")
	up["severity"] = "critical"
	e.ok("PUT", "/api/alarm/config/hot", up, &got)
	if got["severity"] != "critical" || got["id"] != "hot" {
		t.Errorf("updated %v", got)
	}
	e.fails("PUT", "/api/alarm/config/hot", hotRule("other", "pa"), 400, "illegal_argument")
	e.fails("PUT", "/api/alarm/config/nosuch", hotRule("nosuch", "pa"), 404, "not_found")
	e.ok("POST", "/api/alarm/config/hot/_disable", nil, &got)
	if got["enabled"] != false {
		t.Errorf("disabled %v", got)
	}
	e.ok("POST", "/api/alarm/config/hot/_enable", nil, nil)
	e.ok("GET", "/api/alarm/config/hot", nil, &got)
	if got["enabled"] != true {
		t.Errorf("enabled %v", got)
	}
	e.ok("POST", "/api/alarm/config", hotRule("hot-b", "pb"), nil)
	var page struct {
		Total int              `json:"total"`
		Data  []map[string]any `json:"data"`
	}
	e.ok("POST", "/api/alarm/config/_query", `{"terms":[{"column":"productId","value":"pa"}]}`, &page)
	if page.Total != 1 || page.Data[0]["id"] != "hot" {
		t.Errorf("query %+v", page)
	}
	e.fails("POST", "/api/alarm/config/_query", `{"terms":[{"column":"body","value":"x"}]}`, 400, "illegal_argument")
	// export pa, import into pb: all or nothing
	var doc struct {
		ProductID string            `json:"productId"`
		Rules     []json.RawMessage `json:"rules"`
	}
	e.ok("GET", "/api/alarm/config/_export/pa", nil, &doc)
	if doc.ProductID != "pa" || len(doc.Rules) != 1 {
		t.Fatalf("export %+v", doc)
	}
	badRule := hotRule("broken", "pa")
	badRule["trigger"] = map[string]any{"type": "property", "all": []any{map[string]any{"property": "nope", "op": "gt", "value": 1}}}
	var copied map[string]any
	_ = json.Unmarshal(doc.Rules[0], &copied)
	copied["id"] = "hot-copy"
	res := e.fails("POST", "/api/alarm/config/_import/pb", map[string]any{"rules": []any{copied, badRule, hotRule("hot", "pb")}}, 400, "illegal_argument")
	var refused []struct {
		Index int    `json:"index"`
		Field string `json:"field"`
	}
	_ = json.Unmarshal(res.Result, &refused)
	if len(refused) != 2 || refused[0].Index != 1 || refused[0].Field != "trigger.all[0].property" || refused[1].Index != 2 || refused[1].Field != "id" {
		t.Errorf("import refusals %s", res.Result)
	}
	e.fails("GET", "/api/alarm/config/hot-copy", nil, 404, "not_found") // nothing imported
	var imported map[string]int
	e.ok("POST", "/api/alarm/config/_import/pb", map[string]any{"rules": []any{copied}}, &imported)
	e.ok("GET", "/api/alarm/config/hot-copy", nil, &got)
	if imported["imported"] != 1 || got["productId"] != "pb" {
		t.Errorf("imported %v: %v", imported, got)
	}
	e.ok("DELETE", "/api/alarm/config/hot-copy", nil, nil)
	e.fails("GET", "/api/alarm/config/hot-copy", nil, 404, "not_found")
	// every rule change audited
	e.waitAudit(`[{"column":"route","termType":"like","value":"/api/alarm/config%"},{"column":"status","value":200}]`, 7)
}

// TestAlarmRecordsAPI: records queried by state, severity, product,
// device, rule and time, newest first; acknowledged and cleared by hand
// with a comment, every transition kept and audited.
func TestAlarmRecordsAPI(t *testing.T) {
	t.Parallel()
	e := newAlarmEnv(t)
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tr := func(kind, rule, product, dev, sev, val string, sec int) alarm.Transition {
		return alarm.Transition{Kind: kind, RuleID: rule, RuleName: rule, ProductID: product, DeviceID: dev, Severity: sev, Value: val, At: base.Add(time.Duration(sec) * time.Second)}
	}
	e.raise(tr("raised", "hot", "pa", "d1", "major", "temp=31", 1), tr("repeated", "hot", "pa", "d1", "major", "temp=41", 2),
		tr("escalated", "hot", "pa", "d1", "critical", "temp=41", 2),
		tr("raised", "hot", "pa", "d2", "major", "temp=32", 3), tr("cleared", "hot", "pa", "d2", "major", "temp=20", 4),
		tr("raised", "cold", "pb", "d3", "minor", "temp=1", 5))
	all := e.records(e.token, `{}`)
	if len(all) != 3 || all[0].DeviceID != "d3" || all[2].DeviceID != "d1" {
		t.Fatalf("newest first: %+v", all)
	}
	f := func(body string, want ...string) {
		t.Helper()
		var got []string
		for _, r := range e.records(e.token, body) {
			got = append(got, r.DeviceID)
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: %v, want %v", body, got, want)
		}
	}
	f(`{"terms":[{"column":"state","value":"active"}]}`, "d3", "d1")
	f(`{"terms":[{"column":"severity","value":"critical"}]}`, "d1")
	f(`{"terms":[{"column":"productId","value":"pa"}]}`, "d2", "d1")
	f(`{"terms":[{"column":"deviceId","value":"d2"}]}`, "d2")
	f(`{"terms":[{"column":"ruleId","value":"cold"}]}`, "d3")
	f(fmt.Sprintf(`{"terms":[{"column":"raisedTime","termType":"btw","value":[%d,%d]}]}`, base.Add(2*time.Second).UnixMilli(), base.Add(6*time.Second).UnixMilli()), "d3", "d2")
	e.fails("POST", "/api/alarm/record/_query", `{"terms":[{"column":"secret","value":1}]}`, 400, "illegal_argument")

	d1 := all[2]
	if d1.Count != 2 || d1.Severity != "critical" || d1.SeverityRank != 5 {
		t.Errorf("d1 %+v", d1)
	}
	var rec recordOut
	e.ok("POST", "/api/alarm/record/"+d1.ID+"/_ack", map[string]string{"comment": "looking"}, &rec)
	if !rec.Acked || rec.AckedBy != "admin" || rec.AckComment != "looking" || rec.AckedTime == 0 || rec.State != "active" {
		t.Errorf("acked %+v", rec)
	}
	e.ok("POST", "/api/alarm/record/"+d1.ID+"/_clear", map[string]string{"comment": "fan fixed"}, &rec)
	if rec.State != "cleared" || rec.ClearedBy != "admin" || rec.ClearValue != "fan fixed" || rec.ClearedTime == 0 {
		t.Errorf("cleared %+v", rec)
	}
	e.fails("POST", "/api/alarm/record/"+d1.ID+"/_clear", nil, 400, "illegal_argument")
	e.fails("POST", "/api/alarm/record/"+d1.ID+"/_ack", map[string]string{"comment": strings.Repeat("x", 1025)}, 400, "illegal_argument")
	e.fails("POST", "/api/alarm/record/999999/_ack", nil, 404, "not_found")
	e.fails("GET", "/api/alarm/record/abc", nil, 404, "not_found")
	e.ok("GET", "/api/alarm/record/"+d1.ID, nil, &rec)
	var kinds []string
	for _, t := range rec.Transitions {
		kinds = append(kinds, t.Kind+" "+t.Severity+" "+t.Value+t.Username+" "+t.Comment)
	}
	if want := "[raised major temp=31  escalated critical temp=41  acknowledged critical admin looking cleared critical admin fan fixed]"; fmt.Sprint(kinds) != want {
		t.Errorf("transitions %q\nwant %s", kinds, want)
	}
	var counts map[string]int
	e.ok("GET", "/api/alarm/record/_active", nil, &counts)
	if counts["minor"] != 1 || counts["critical"] != 0 || len(counts) != 5 {
		t.Errorf("active %v", counts)
	}
	e.waitAudit(`[{"column":"route","termType":"like","value":"/api/alarm/record/:id/%"},{"column":"status","value":200}]`, 2)
}

// TestAlarmScope: a user limited to product pa sees nothing of pb's
// rules and records anywhere (404 as if absent, lists and counts without
// them); a viewer reads alarms but neither handles them nor writes rules.
func TestAlarmScope(t *testing.T) {
	t.Parallel()
	e := newAlarmEnv(t)
	e.ok("POST", "/api/alarm/config", hotRule("ra", "pa"), nil)
	e.ok("POST", "/api/alarm/config", hotRule("rb", "pb"), nil)
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	e.raise(alarm.Transition{Kind: "raised", RuleID: "ra", RuleName: "ra", ProductID: "pa", DeviceID: "da", Severity: "major", At: base},
		alarm.Transition{Kind: "raised", RuleID: "rb", RuleName: "rb", ProductID: "pb", DeviceID: "db", Severity: "critical", At: base})
	all := e.records(e.token, `{}`)
	ids := map[string]string{}
	for _, r := range all {
		ids[r.ProductID] = r.ID
	}
	e.ok("POST", "/api/role", map[string]any{"id": "alarms-a", "name": "Alarms A", "products": []string{"pa"},
		"permissions": []string{"product:read", "alarm:read", "alarm:write", "rule:write"}}, nil)
	_, alice := e.addUser("alice", "alarms-a")
	_, viewer := e.addUser("vic", "viewer")

	if got := e.records(alice, `{}`); len(got) != 1 || got[0].ProductID != "pa" {
		t.Errorf("alice's records %+v", got)
	}
	if got := e.records(alice, `{"terms":[{"column":"productId","value":"pb"}]}`); len(got) != 0 {
		t.Errorf("alice asked for pb's: %+v", got)
	}
	status := func(token, method, path string, body any) (int, string) {
		r := e.do(method, path, body, token)
		return r.HTTPStatus, r.Code
	}
	for _, c := range []struct {
		method, path string
		body         any
	}{
		{"GET", "/api/alarm/config/rb", nil},
		{"PUT", "/api/alarm/config/rb", hotRule("rb", "pa")},
		{"DELETE", "/api/alarm/config/rb", nil},
		{"POST", "/api/alarm/config/rb/_disable", nil},
		{"POST", "/api/alarm/config", hotRule("new", "pb")},
		{"GET", "/api/alarm/config/_export/pb", nil},
		{"POST", "/api/alarm/config/_import/pb", map[string]any{"rules": []any{}}},
		{"GET", "/api/alarm/record/" + ids["pb"], nil},
		{"POST", "/api/alarm/record/" + ids["pb"] + "/_ack", nil},
		{"POST", "/api/alarm/record/" + ids["pb"] + "/_clear", nil},
	} {
		if st, code := status(alice, c.method, c.path, c.body); st != 404 || code != "not_found" {
			t.Errorf("alice %s %s: %d %s, want 404", c.method, c.path, st, code)
		}
	}
	var page struct {
		Total int `json:"total"`
	}
	r := e.do("POST", "/api/alarm/config/_query", nil, alice)
	_ = json.Unmarshal(r.Result, &page)
	if page.Total != 1 {
		t.Errorf("alice sees %d rules", page.Total)
	}
	var counts map[string]int
	_ = json.Unmarshal(e.do("GET", "/api/alarm/record/_active", nil, alice).Result, &counts)
	if counts["critical"] != 0 || counts["major"] != 1 {
		t.Errorf("alice's counts %v", counts)
	}
	// her own product's work
	if st, _ := status(alice, "POST", "/api/alarm/record/"+ids["pa"]+"/_ack", nil); st != 200 {
		t.Errorf("alice's ack of pa's alarm: %d", st)
	}
	// a viewer reads, and is refused the rest
	if got := e.records(viewer, `{}`); len(got) != 2 {
		t.Errorf("viewer's records: %d", len(got))
	}
	for _, c := range [][2]string{{"POST", "/api/alarm/record/" + ids["pa"] + "/_clear"}, {"POST", "/api/alarm/config/ra/_disable"}} {
		if st, code := status(viewer, c[0], c[1], nil); st != 403 || code != "access_denied" {
			t.Errorf("viewer %s: %d %s, want 403", c[1], st, code)
		}
	}
}

// TestAlarmCountsDashboard: endpoint 14 answers alarm counts per bucket
// as it answers message counts, narrowed by product, device, severity and
// state, within the caller's products.
func TestAlarmCountsDashboard(t *testing.T) {
	t.Parallel()
	e := newAlarmEnv(t)
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(h, m int) time.Time { return base.Add(time.Duration(h)*time.Hour + time.Duration(m)*time.Minute) }
	e.raise(alarm.Transition{Kind: "raised", RuleID: "r1", ProductID: "pa", DeviceID: "d1", Severity: "major", At: at(0, 5)},
		alarm.Transition{Kind: "raised", RuleID: "r2", ProductID: "pa", DeviceID: "d1", Severity: "critical", At: at(0, 59)},
		alarm.Transition{Kind: "raised", RuleID: "r1", ProductID: "pa", DeviceID: "d2", Severity: "major", At: at(2, 0)},
		alarm.Transition{Kind: "cleared", RuleID: "r1", ProductID: "pa", DeviceID: "d2", Severity: "major", At: at(2, 1)},
		alarm.Transition{Kind: "raised", RuleID: "r3", ProductID: "pb", DeviceID: "d3", Severity: "minor", At: at(1, 30)},
		alarm.Transition{Kind: "raised", RuleID: "r3", ProductID: "pb", DeviceID: "d4", Severity: "minor", At: at(3, 0)}) // past the range
	query := func(token string, params map[string]any) (response, []int) {
		t.Helper()
		p := map[string]any{"time": "1h", "format": "HH", "from": base.UnixMilli(), "to": at(2, 59).UnixMilli()}
		for k, v := range params {
			p[k] = v
		}
		r := e.do("POST", "/api/dashboard/_multi", []map[string]any{{"dashboard": "device", "object": "alarm", "measurement": "quantity",
			"dimension": "agg", "group": "alarms", "params": p}}, token)
		var items []struct {
			Group string `json:"group"`
			Data  struct {
				Value      int    `json:"value"`
				TimeString string `json:"timeString"`
				Timestamp  int    `json:"timestamp"`
			} `json:"data"`
		}
		_ = json.Unmarshal(r.Result, &items)
		var values []int
		for i, it := range items {
			if it.Group != "alarms" || it.Data.Timestamp != i {
				t.Errorf("item %d: %+v", i, it)
			}
			values = append(values, it.Data.Value)
		}
		if len(items) == 3 && (items[0].Data.TimeString != "02" || items[2].Data.TimeString != "00") {
			t.Errorf("newest first: %+v", items)
		}
		return r, values
	}
	f := func(params map[string]any, want ...int) {
		t.Helper()
		r, got := query(e.token, params)
		if r.HTTPStatus != 200 || fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%v: %d %v, want %v", params, r.HTTPStatus, got, want)
		}
	}
	f(nil, 1, 1, 2)
	f(map[string]any{"productId": "pa"}, 1, 0, 2)
	e.createDevice("d1", "d1", "pa", nil)
	f(map[string]any{"deviceId": "d1"}, 0, 0, 2)
	f(map[string]any{"severity": "critical"}, 0, 0, 1)
	f(map[string]any{"state": "cleared"}, 1, 0, 0)
	for _, bad := range []map[string]any{{"severity": "urgent"}, {"state": "open"}, {"time": "1x"}, {"tz": "UTC"}} {
		if r, _ := query(e.token, bad); r.HTTPStatus != 400 || r.Code != "illegal_argument" {
			t.Errorf("%v: %d %s", bad, r.HTTPStatus, r.raw)
		}
	}
	// a user limited to pa counts pa's only; pb is absent
	e.ok("POST", "/api/role", map[string]any{"id": "dash-a", "name": "Dashboards A", "products": []string{"pa"},
		"permissions": []string{"dashboard:read"}}, nil)
	_, alice := e.addUser("alice", "dash-a")
	if _, got := query(alice, nil); fmt.Sprint(got) != "[1 0 2]" {
		t.Errorf("alice's counts %v", got)
	}
	if r, _ := query(alice, map[string]any{"productId": "pb"}); r.HTTPStatus != 404 {
		t.Errorf("alice asking for pb: %d", r.HTTPStatus)
	}
	if r, _ := query(e.token, map[string]any{"productId": "nope"}); r.HTTPStatus != 404 {
		t.Errorf("a product that does not exist: %d", r.HTTPStatus)
	}
	// not exported
	r := e.call("POST", "/api/dashboard/_export", map[string]any{"dashboard": "device", "object": "alarm", "measurement": "quantity", "dimension": "agg"})
	if r.HTTPStatus != 400 {
		t.Errorf("export of alarm counts: %d %s", r.HTTPStatus, r.raw)
	}
}
