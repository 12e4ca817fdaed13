// Package metatest gives tests a fresh, migrated PostgreSQL database of
// their own on the real server, dropped when the test ends.
//
// NewStore's database is a copy (CREATE DATABASE ... TEMPLATE) of a
// template migrated once: devicehub_tmpl_<digest of the migrations>,
// kept on the server between runs and shared by every test process. Under
// the race detector the migrations cost seconds a database; the copy a
// fraction of one. The copy gets an installation id of its own, as a
// migrated database does. Passwords are hashed at bcrypt's lowest cost
// (PasswordCost), the template's admin's too. NewDatabase stays an empty
// database, for the tests of migrating and of the server starting on a
// new database. Both are created in a tablespace on tmpfs when this
// process can set one up (tablespace.go).
package metatest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"testing"

	_ "github.com/lib/pq" // PostgreSQL driver
	"github.com/pressly/goose/v3"
	"golang.org/x/crypto/bcrypt"

	"devicehub/meta"
	"devicehub/schema"
)

// ServerDSN is the maintenance database of the test server; override with
// DEVICEHUB_TEST_POSTGRES (a DSN without a database path component).
func ServerDSN() string {
	if v := os.Getenv("DEVICEHUB_TEST_POSTGRES"); v != "" {
		return v
	}
	return "postgres://postgres@127.0.0.1:5432"
}

// NewStore creates database devicehub_test_<random>, opens a migrated
// store on it with an admin user (password "admin123"), and drops the
// database in t.Cleanup.
func NewStore(t testing.TB) *meta.Store {
	t.Helper()
	opts := meta.DefaultOptions()
	opts.DSN = NewMigratedDatabase(t)
	return openStore(t, opts)
}

// PasswordCost is the bcrypt cost of the passwords of the tests' stores:
// the lowest, as one hash at the default cost takes about a second of CPU
// under the race detector (and a login checks one).
const PasswordCost = bcrypt.MinCost

// openStore opens a migrated store with opts (8 connections, passwords
// hashed at PasswordCost) and an admin user (password "admin123"), closed
// when the test ends.
func openStore(t testing.TB, opts meta.Options) *meta.Store {
	t.Helper()
	opts.MaxOpenConns = 8
	opts.PasswordCost = PasswordCost
	s, err := meta.Open(context.Background(), opts)
	if err != nil {
		t.Fatalf("metatest: open store: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.EnsureAdmin(context.Background(), "admin123"); err != nil {
		t.Fatalf("metatest: ensure admin: %v", err)
	}
	return s
}

// NewDatabase creates an empty database and returns its DSN.
func NewDatabase(t testing.TB) string {
	t.Helper()
	return newDatabase(t, "")
}

// NewMigratedDatabase creates a database with every migration applied and
// the admin user (password "admin123"), copied from the template, and
// returns its DSN.
func NewMigratedDatabase(t testing.TB) string {
	t.Helper()
	return newDatabase(t, "template")
}

// newDatabase creates database devicehub_test_<random>, empty or (from
// "template") a copy of the template, dropped in t.Cleanup.
func newDatabase(t testing.TB, from string) string {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "devicehub_test_" + hex.EncodeToString(b[:])
	admin, err := sql.Open("postgres", ServerDSN()+"/postgres?sslmode=disable")
	if err != nil {
		t.Fatalf("metatest: %v", err)
	}
	defer admin.Close()
	if from == "" {
		err = createIn(admin, "CREATE DATABASE "+name)
	} else {
		err = copyTemplate(admin, name)
	}
	if err != nil {
		t.Fatalf("metatest: create database (is PostgreSQL up? run `make services`): %v", err)
	}
	t.Cleanup(func() {
		admin, err := sql.Open("postgres", ServerDSN()+"/postgres?sslmode=disable")
		if err != nil {
			return
		}
		defer admin.Close()
		_, _ = admin.Exec("DROP DATABASE IF EXISTS " + name + " WITH (FORCE)")
	})
	return fmt.Sprintf("%s/%s?sslmode=disable", ServerDSN(), name)
}

// Migration is an empty database of a test's own (NewDatabase), goose's
// provider of the PostgreSQL migrations (schema/postgres) over it, and
// the versions of one migration and of the one before it: for the tests
// of that migration (up to Before, data in the old layout, then up and
// down).
type Migration struct {
	DSN             string
	DB              *sql.DB
	Provider        *goose.Provider
	Before, Version int64
}

// Migrations returns the Migration of the migration whose file name ends
// in suffix (e.g. "_alarm_state.sql"); the test fails if there is none.
func Migrations(t testing.TB, suffix string) Migration {
	t.Helper()
	m := Migration{DSN: NewDatabase(t)}
	var err error
	if m.DB, err = sql.Open("postgres", m.DSN); err != nil {
		t.Fatalf("metatest: %v", err)
	}
	t.Cleanup(func() { m.DB.Close() })
	sub, err := fs.Sub(schema.Postgres, "postgres")
	if err != nil {
		t.Fatalf("metatest: %v", err)
	}
	if m.Provider, err = goose.NewProvider(goose.DialectPostgres, m.DB, sub); err != nil {
		t.Fatalf("metatest: %v", err)
	}
	srcs := m.Provider.ListSources()
	for i, src := range srcs {
		if strings.HasSuffix(src.Path, suffix) && i > 0 {
			m.Before, m.Version = srcs[i-1].Version, src.Version
		}
	}
	if m.Version == 0 {
		t.Fatalf("metatest: no migration *%s", suffix)
	}
	return m
}
