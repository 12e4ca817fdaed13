package meta

import "testing"

func TestOneTripDSN(t *testing.T) {
	for _, tc := range []struct{ dsn, want string }{
		{"postgres://postgres@127.0.0.1:5432/devicehub?sslmode=disable", "postgres://postgres@127.0.0.1:5432/devicehub?binary_parameters=yes&sslmode=disable"},
		{"postgresql://u:p@h/db", "postgresql://u:p@h/db?binary_parameters=yes"},
		{"postgres://h/db?binary_parameters=no", "postgres://h/db?binary_parameters=yes"},
		{"host=127.0.0.1 dbname=devicehub sslmode=disable", "host=127.0.0.1 dbname=devicehub sslmode=disable binary_parameters=yes"},
	} {
		if got := oneTripDSN(tc.dsn); got != tc.want {
			t.Errorf("oneTripDSN(%q) = %q, want %q", tc.dsn, got, tc.want)
		}
	}
}
