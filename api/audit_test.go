package api_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"devicehub/api"
	"devicehub/bench/testkit"
	"devicehub/meta"
)

// The audit trail (audit.go, auditlog.go), through HTTP.

type auditJSON struct {
	ID       int64  `json:"id"`
	Time     int64  `json:"time"`
	UserID   string `json:"userId"`
	Username string `json:"username"`
	Address  string `json:"address"`
	Method   string `json:"method"`
	Route    string `json:"route"`
	ObjectID string `json:"objectId"`
	Status   int    `json:"status"`
	Code     string `json:"code"`
	KeyID    string `json:"keyId"`
}

// newAuditEnv is a server whose audit writer flushes every 20 ms.
func newAuditEnv(t *testing.T) *env {
	opts := api.DefaultOptions()
	opts.AuditFlushInterval = 20 * time.Millisecond
	return newEnvOpts(t, opts, nil)
}

// audit returns the entries matching terms (a JSON array), newest first.
func (e *env) audit(terms string) []auditJSON {
	e.t.Helper()
	var page struct {
		Total int         `json:"total"`
		Data  []auditJSON `json:"data"`
	}
	e.ok("POST", "/api/audit/_query", `{"pageSize":1000,"terms":`+terms+`}`, &page)
	if page.Total != len(page.Data) {
		e.t.Fatalf("audit: total %d, %d entries", page.Total, len(page.Data))
	}
	return page.Data
}

// waitAudit waits (up to 5 s) for n entries matching terms.
func (e *env) waitAudit(terms string, n int) []auditJSON {
	e.t.Helper()
	var got []auditJSON
	if !testkit.Within(5*time.Second, func() bool { got = e.audit(terms); return len(got) >= n }) {
		e.t.Fatalf("audit %s: %d entries after 5 s, want %d: %+v", terms, len(got), n, got)
	}
	if len(got) != n {
		e.t.Fatalf("audit %s: %d entries, want %d: %+v", terms, len(got), n, got)
	}
	return got
}

func TestAuditWrites(t *testing.T) {
	t.Parallel()
	e := newAuditEnv(t)
	start := time.Now().UnixMilli()
	e.createProduct("audited", "Audited", nil)
	e.ok("POST", "/api/device-product/audited/deploy", nil, nil)
	e.fails("DELETE", "/api/device-product/nothing-here", nil, 404, "not_found")
	// Reads are not audited; a write after them is the signal that
	// everything recorded before it is stored (one writer, in order).
	e.ok("POST", "/api/device-product/_query", `{}`, nil)
	e.ok("GET", "/api/device-product/audited", nil, nil)
	e.ok("POST", "/api/device-product/_count", `{}`, nil)
	e.ok("POST", "/api/device-product/audited/undeploy", nil, nil)
	end := time.Now().UnixMilli()

	got := e.waitAudit(`[{"column":"route","value":"/api/device-product/:id/undeploy"}]`, 1)
	all := e.audit(fmt.Sprintf(`[{"column":"time","termType":"btw","value":[%d,%d]},{"column":"route","termType":"nlike","value":"/api/authorize/%%"}]`, start, end))
	if len(all) != 4 {
		t.Fatalf("want 4 writes audited (create, deploy, failed delete, undeploy), got %+v", all)
	}
	// Newest first, with who, where, what and how it ended.
	want := []auditJSON{
		{Method: "POST", Route: "/api/device-product/:id/undeploy", ObjectID: "audited", Status: 200},
		{Method: "DELETE", Route: "/api/device-product/:id", ObjectID: "nothing-here", Status: 404, Code: "not_found"},
		{Method: "POST", Route: "/api/device-product/:id/deploy", ObjectID: "audited", Status: 200},
		{Method: "POST", Route: "/api/device/product", Status: 200},
	}
	for i, w := range want {
		g := all[i]
		if g.Method != w.Method || g.Route != w.Route || g.ObjectID != w.ObjectID || g.Status != w.Status || g.Code != w.Code ||
			g.UserID != "admin" || g.Username != "admin" || g.Address != "127.0.0.1" || g.Time < start || g.Time > end {
			t.Errorf("entry %d: got %+v, want %+v by admin from 127.0.0.1", i, g, w)
		}
	}
	if got[0].ID != all[0].ID {
		t.Errorf("newest entry %+v, want %+v", all[0], got[0])
	}

	// A write refused by its permission is audited, as the user's; and a
	// user's logout.
	opID, opTok := e.addUser("op", meta.RoleOperator)
	if r := e.do("POST", "/api/device-product/audited/deploy", nil, opTok); r.HTTPStatus != 403 {
		t.Fatalf("operator deploys a product: %s", r.raw)
	}
	if r := e.do("POST", "/api/authorize/logout", nil, opTok); r.HTTPStatus != 200 {
		t.Fatalf("logout: %s", r.raw)
	}
	got = e.waitAudit(`[{"column":"userId","value":"`+opID+`"},{"column":"route","termType":"not","value":"/api/authorize/login"}]`, 2)
	if g := got[1]; g.Route != "/api/device-product/:id/deploy" || g.Status != 403 || g.Code != "access_denied" || g.Username != "op" {
		t.Errorf("refused write: %+v", g)
	}
	if g := got[0]; g.Route != "/api/authorize/logout" || g.Status != 200 || g.Method != "POST" {
		t.Errorf("logout: %+v", g)
	}
	// A request without a token is not: nobody's, and refused before
	// its route.
	if r := e.do("DELETE", "/api/device-product/audited", nil, ""); r.HTTPStatus != 401 {
		t.Fatalf("no token: %s", r.raw)
	}
	e.ok("POST", "/api/device-product/audited/undeploy", nil, nil)
	e.waitAudit(`[{"column":"route","value":"/api/device-product/:id/undeploy"}]`, 2)
	if got := e.audit(`[{"column":"method","value":"DELETE"},{"column":"objectId","value":"audited"}]`); len(got) != 0 {
		t.Errorf("a request without a token is audited: %+v", got)
	}
}

// TestAuditLogins: every login attempt, successful or not, with the
// username tried; a failure names no user id.
func TestAuditLogins(t *testing.T) {
	t.Parallel()
	e := newAuditEnv(t)
	annID, _ := e.addUser("ann", meta.RoleViewer) // a password hashed at bcrypt's lowest cost: fast under -race
	if r := e.do("POST", "/api/authorize/login", map[string]string{"username": "ann", "password": "wrong-password"}, ""); r.HTTPStatus != 400 {
		t.Fatalf("wrong password: %s", r.raw)
	}
	if r := e.do("POST", "/api/authorize/login", map[string]string{"username": "mallory", "password": "guess-guess"}, ""); r.HTTPStatus != 400 {
		t.Fatalf("unknown user: %s", r.raw)
	}
	e.login("ann", "password-ann")
	got := e.waitAudit(`[{"column":"route","value":"/api/authorize/login"}]`, 5) // newEnv's and addUser's logins too
	if g := got[0]; g.UserID != annID || g.Username != "ann" || g.Status != 200 || g.Code != "" || g.Method != "POST" || g.Address != "127.0.0.1" {
		t.Errorf("successful login: %+v", g)
	}
	if g := got[1]; g.UserID != "" || g.Username != "mallory" || g.Status != 400 || g.Code != "illegal_password" {
		t.Errorf("login of an unknown user: %+v", g)
	}
	if g := got[2]; g.UserID != "" || g.Username != "ann" || g.Status != 400 || g.Code != "illegal_password" {
		t.Errorf("login with a wrong password: %+v", g)
	}
	// Terms on the user and the outcome.
	if got := e.audit(`[{"column":"code","value":"illegal_password"},{"column":"username","value":"mallory"}]`); len(got) != 1 {
		t.Errorf("failed logins of mallory: %+v", got)
	}
	if got := e.audit(`[{"column":"status","termType":"gte","value":400}]`); len(got) != 2 {
		t.Errorf("failures: %+v", got)
	}
}

// TestAuditAdminsOnly: the trail is read with user:admin only, and its
// query body is checked.
func TestAuditAdminsOnly(t *testing.T) {
	t.Parallel()
	e := newAuditEnv(t)
	_, opTok := e.addUser("op", meta.RoleOperator)
	_, viewTok := e.addUser("viewer", meta.RoleViewer)
	for _, tok := range []string{opTok, viewTok} {
		if r := e.do("POST", "/api/audit/_query", `{}`, tok); r.HTTPStatus != 403 || r.Code != "access_denied" {
			t.Errorf("a non-administrator reads the audit trail: %d %s", r.HTTPStatus, r.raw)
		}
	}
	if r := e.do("POST", "/api/audit/_query", `{}`, ""); r.HTTPStatus != 401 {
		t.Errorf("no token: %d %s", r.HTTPStatus, r.raw)
	}
	f := func(body string) {
		t.Helper()
		e.fails("POST", "/api/audit/_query", body, 400, "illegal_argument")
	}
	f(`{"terms":[{"column":"password_hash","value":"x"}]}`)
	f(`{"terms":[{"column":"time","termType":"btw","value":["yesterday","today"]}]}`)
	f(`{"terms":[{"column":"status","value":"ok"}]}`)
	f(`{"terms":[{"column":"route","termType":"sounds-like","value":"x"}]}`)
	f(`{"sorts":[{"name":"address"}]}`)
	f(`{"pageSize":-1}`)
	f(`[1,2]`)
}

// TestAuditRetention: the sweep deletes the entries older than the
// retention, and only those.
func TestAuditRetention(t *testing.T) {
	t.Parallel()
	e := newAuditEnv(t)
	ctx := context.Background()
	// Whole milliseconds: PostgreSQL rounds a time to microseconds, which
	// can carry a time within half a microsecond below a millisecond into
	// the next one (the check of the round trip below).
	now := time.Now().Truncate(time.Millisecond)
	entry := func(age time.Duration, object string) meta.AuditEntry {
		return meta.AuditEntry{Time: meta.Millis(now.Add(-age)), UserID: "admin", Username: "admin", Method: "DELETE",
			Route: "/api/device/instance/:id", ObjectID: object, Status: 200}
	}
	if err := e.store.InsertAudit(ctx, []meta.AuditEntry{
		entry(91*24*time.Hour, "old-1"), entry(400*24*time.Hour, "old-2"),
		entry(89*24*time.Hour, "kept-1"), entry(time.Minute, "kept-2"),
	}); err != nil {
		t.Fatal(err)
	}
	n, err := e.store.SweepAudit(ctx, now.Add(-90*24*time.Hour))
	if err != nil || n != 2 {
		t.Fatalf("sweep: %d, %v; want 2 deleted", n, err)
	}
	got := e.audit(`[{"column":"route","value":"/api/device/instance/:id"}]`)
	if len(got) != 2 || got[0].ObjectID != "kept-2" || got[1].ObjectID != "kept-1" {
		t.Fatalf("after the sweep: %+v", got)
	}
	if n, err := e.store.SweepAudit(ctx, now.Add(-90*24*time.Hour)); err != nil || n != 0 {
		t.Fatalf("second sweep: %d, %v", n, err)
	}
	// The time column's epoch milliseconds survive the round trip.
	if want := now.Add(-time.Minute).UnixMilli(); got[0].Time != want {
		t.Errorf("time %d, want %d", got[0].Time, want)
	}
}
