package meta

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/lib/pq"
)

func TestExtensionHint(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		err  error
		want string // a part of the hint; "" for none
	}{
		{"not installed", &pq.Error{Code: "58P01", Message: `could not open extension control file "/usr/share/postgresql/15/extension/pg_trgm.control": No such file or directory`}, "not installed"},
		{"wrapped by goose", fmt.Errorf("failed to run SQL migration 00002: %w", &pq.Error{Code: "0A000", Message: `extension "pg_trgm" is not available`}), "contrib"},
		{"no privilege", &pq.Error{Code: "42501", Message: `permission denied to create extension "pg_trgm"`}, "as a superuser"},
		{"operator class", &pq.Error{Code: "42704", Message: `operator class "gin_trgm_ops" does not exist for access method "gin"`}, "not installed"},
		{"other SQL error", &pq.Error{Code: "42P07", Message: `relation "devices" already exists`}, ""},
		{"other privilege error", &pq.Error{Code: "42501", Message: `permission denied for table devices`}, ""},
		{"not PostgreSQL's", errors.New("connection refused"), ""},
	}
	for _, c := range cases {
		got := extensionHint(c.err)
		if c.want == "" && got != "" || c.want != "" && !strings.Contains(got, c.want) {
			t.Errorf("%s: hint %q, want one with %q", c.name, got, c.want)
		}
	}
}
