package meta_test

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"devicehub/meta"
	"devicehub/meta/metatest"
)

// Roles (roles.go) against a real PostgreSQL database.

func TestCreateRole(t *testing.T) {
	t.Parallel()
	s := metatest.NewStore(t)
	ctx := context.Background()

	before := time.Now().Add(-time.Second)
	if err := s.CreateRole(ctx, meta.Role{ID: "reader", Name: "Reader", Description: "reads", CreatorID: "admin"}); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateRole(ctx, meta.Role{ID: "old", Name: "Old", State: "disabled"}); err != nil {
		t.Fatal(err)
	}
	page, err := s.QueryRoles(ctx, queryBody(t, `{"sorts":[{"name":"id"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]meta.Role{}
	for _, r := range page.Data {
		got[r.ID] = r
	}
	v := got["reader"]
	if v.Name != "Reader" || v.Description != "reads" || v.CreatorID != "admin" || v.State != "enabled" || time.Time(v.CreateTime).Before(before) {
		t.Fatalf("reader %+v: want state enabled by default and a create time", v)
	}
	if got["old"].State != "disabled" {
		t.Fatalf("old %+v: want the given state kept", got["old"])
	}

	roles := countRows(t, s, "roles")
	for _, c := range []struct {
		name  string
		r     meta.Role
		field string
		is    error
	}{
		{name: "no id", r: meta.Role{Name: "n"}, field: "id"},
		{name: "bad id", r: meta.Role{ID: "a/b", Name: "n"}, field: "id"},
		{name: "id too long", r: meta.Role{ID: strings.Repeat("i", 65), Name: "n"}, field: "id"},
		{name: "no name", r: meta.Role{ID: "r1"}, field: "name"},
		{name: "name too long", r: meta.Role{ID: "r1", Name: strings.Repeat("n", 129)}, field: "name"},
		{name: "id taken", r: meta.Role{ID: "reader", Name: "Another"}, is: meta.ErrDuplicateKey},
		{name: "admin taken", r: meta.Role{ID: "admin", Name: "Another"}, is: meta.ErrDuplicateKey},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := s.CreateRole(ctx, c.r)
			if c.field != "" {
				wantArgField(t, err, c.field)
			} else if !errors.Is(err, c.is) {
				t.Fatalf("error %v, want %v", err, c.is)
			}
			if n := countRows(t, s, "roles"); n != roles {
				t.Fatalf("%d roles after a refused create, want %d", n, roles)
			}
		})
	}
}

// queryBody decodes a query body, which must be valid.
func queryBody(t *testing.T, body string) *meta.Query {
	t.Helper()
	q, err := meta.DecodeQuery([]byte(body))
	if err != nil {
		t.Fatalf("query %s: %v", body, err)
	}
	return q
}

func TestQueryRoles(t *testing.T) {
	t.Parallel()
	s := metatest.NewStore(t) // has role admin
	ctx := context.Background()
	// Of the built-in roles, admin only here.
	if _, err := s.DB().Exec(`DELETE FROM roles WHERE id IN ('operator', 'viewer')`); err != nil {
		t.Fatal(err)
	}
	for _, r := range []meta.Role{
		{ID: "r1", Name: "Operator", Description: "runs devices"},
		{ID: "r2", Name: "Viewer", Description: "reads"},
		{ID: "r3", Name: "Auditor", Description: "reads logs", State: "disabled"},
		{ID: "r4", Name: "Operator night", Description: "runs devices at night"},
	} {
		if err := s.CreateRole(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	// Distinct create times, r4 the newest.
	if _, err := s.DB().Exec(`UPDATE roles SET create_time = now() - (5 - substr(id, 2)::int) * interval '1 minute' WHERE id LIKE 'r_'`); err != nil {
		t.Fatal(err)
	}
	if _, err := s.DB().Exec(`UPDATE roles SET create_time = now() - interval '1 hour' WHERE id = 'admin'`); err != nil {
		t.Fatal(err)
	}

	for _, c := range []struct {
		name, body string
		ids        []string
		total      int
		pageIndex  int
	}{
		{name: "default: newest first", body: `{}`, ids: []string{"r4", "r3", "r2", "r1", "admin"}, total: 5},
		{name: "sort by name", body: `{"sorts":[{"name":"name","order":"asc"}]}`, ids: []string{"admin", "r3", "r1", "r4", "r2"}, total: 5},
		{name: "sort by createTime asc", body: `{"sorts":[{"name":"createTime","order":"asc"}]}`, ids: []string{"admin", "r1", "r2", "r3", "r4"}, total: 5},
		{name: "sort by description", body: `{"sorts":[{"name":"description","order":"desc"}]}`, ids: []string{"r4", "r1", "r3", "r2", "admin"}, total: 5},
		{name: "sort by id desc", body: `{"sorts":[{"name":"id","order":"desc"}]}`, ids: []string{"r4", "r3", "r2", "r1", "admin"}, total: 5},
		{name: "like, case-insensitive", body: `{"terms":[{"column":"name","value":"operator","termType":"like"}],"sorts":[{"name":"id"}]}`, ids: []string{"r1", "r4"}, total: 2},
		{name: "eq on state", body: `{"terms":[{"column":"state","value":"disabled"}]}`, ids: []string{"r3"}, total: 1},
		{name: "group of or", body: `{"terms":[{"terms":[{"column":"id","value":"r1"},{"column":"description","value":"reads","type":"or"}]}],"sorts":[{"name":"id"}]}`, ids: []string{"r1", "r2"}, total: 2},
		{name: "in", body: `{"terms":[{"column":"id","value":["r2","r3","nope"],"termType":"in"}],"sorts":[{"name":"id"}]}`, ids: []string{"r2", "r3"}, total: 2},
		{name: "no match", body: `{"terms":[{"column":"name","value":"nobody"}]}`, ids: []string{}, total: 0},
		{name: "first page", body: `{"pageIndex":0,"pageSize":2,"sorts":[{"name":"id"}]}`, ids: []string{"admin", "r1"}, total: 5},
		{name: "second page", body: `{"pageIndex":1,"pageSize":2,"sorts":[{"name":"id"}]}`, ids: []string{"r2", "r3"}, total: 5, pageIndex: 1},
		{name: "last page, short", body: `{"pageIndex":2,"pageSize":2,"sorts":[{"name":"id"}]}`, ids: []string{"r4"}, total: 5, pageIndex: 2},
		{name: "past the end gives the last page", body: `{"pageIndex":9,"pageSize":2,"sorts":[{"name":"id"}]}`, ids: []string{"r4"}, total: 5, pageIndex: 2},
		{name: "current is 1-based", body: `{"current":2,"pageSize":2,"sorts":[{"name":"id"}]}`, ids: []string{"r2", "r3"}, total: 5, pageIndex: 1},
		{name: "paging false", body: `{"paging":false,"pageSize":2,"sorts":[{"name":"id"}]}`, ids: []string{"admin", "r1", "r2", "r3", "r4"}, total: 5},
	} {
		t.Run(c.name, func(t *testing.T) {
			page, err := s.QueryRoles(ctx, queryBody(t, c.body))
			if err != nil {
				t.Fatal(err)
			}
			ids := []string{}
			for _, r := range page.Data {
				ids = append(ids, r.ID)
			}
			if !reflect.DeepEqual(ids, c.ids) || page.Total != c.total || page.PageIndex != c.pageIndex {
				t.Fatalf("page %d of %v (total %d), want page %d of %v (total %d)", page.PageIndex, ids, page.Total, c.pageIndex, c.ids, c.total)
			}
		})
	}

	// Columns and sorts outside the whitelist are input errors.
	for body, field := range map[string]string{
		`{"terms":[{"column":"password","value":"x"}]}`: "terms[0].column",
		`{"sorts":[{"name":"state"}]}`:                  "sorts[0].name",
	} {
		_, err := s.QueryRoles(ctx, queryBody(t, body))
		wantArgField(t, err, field)
	}
}
