package meta

import (
	"errors"
	"strings"

	"github.com/lib/pq"
)

// The terms of list queries are served by indexes of the migrations
// (pg_trgm's for like/nlike): a GiST trigram index on device names, which
// serves eq and in on name too (00007, 00033), GIN trigram indexes on device ids and
// product names (00002), btree indexes for the default order (createTime
// desc, id) and a product's devices, and btree indexes in the collation of
// Natural for the id and name sorts of devices (a product's too) and
// products (00032). like is
// case-insensitive (ILIKE), which a text_pattern_ops btree cannot serve;
// the trigram indexes serve prefixes ('x%') as well. No index holds state
// (00015: presence changes stay HOT updates): a state filter is read
// through the order's index, and its total from the product counts
// (deviceTotal, devices.go).

// extensionHint explains a migration error caused by the pg_trgm
// extension, which the server must ship (Debian: in postgresql-15, from
// postgresql-contrib elsewhere) and the database owner may create (it is
// trusted since PostgreSQL 13); "" for other errors.
func extensionHint(err error) string {
	var pe *pq.Error
	if !errors.As(err, &pe) || !strings.Contains(pe.Message, "pg_trgm") && !strings.Contains(pe.Message, "gin_trgm_ops") &&
		!strings.Contains(pe.Message, "extension") {
		return ""
	}
	switch pe.Code {
	case "58P01", "0A000", "42704": // control file missing, extension not available, operator class missing
		return " (the pg_trgm extension is not installed on the PostgreSQL server: install its contrib modules, " +
			"e.g. Debian's postgresql-contrib, or create the extension as a superuser)"
	case "42501": // insufficient privilege
		return " (devicehub's PostgreSQL role may not create the pg_trgm extension: create it once as a superuser, " +
			"CREATE EXTENSION pg_trgm, in devicehub's database)"
	}
	return ""
}

// Natural is expr in the natural, case-insensitive order of migration
// 00032's devicehub_natural collation (ICU, numeric: "dev-1, dev-2, Dev-3,
// dev-10"; where PostgreSQL has no ICU, the database's own order). The
// lists' id and name sorts and their tie-break use it, and so do the
// indexes of 00032, which the expression must match word for word for
// PostgreSQL to read a page in order. The collation is deterministic:
// distinct ids never compare equal, so an id key makes an order total.
func Natural(expr string) string { return expr + " COLLATE devicehub_natural" }
