// Package metatest gives tests a fresh, migrated PostgreSQL database of
// their own on the real server, dropped when the test ends.
package metatest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"os"
	"testing"

	_ "github.com/lib/pq" // PostgreSQL driver

	"devicehub/meta"
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
	opts.DSN = NewDatabase(t)
	return openStore(t, opts)
}

// openStore opens a migrated store with opts (8 connections) and an admin
// user (password "admin123"), closed when the test ends.
func openStore(t testing.TB, opts meta.Options) *meta.Store {
	t.Helper()
	opts.MaxOpenConns = 8
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
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "devicehub_test_" + hex.EncodeToString(b[:])
	admin, err := sql.Open("postgres", ServerDSN()+"/postgres?sslmode=disable")
	if err != nil {
		t.Fatalf("metatest: %v", err)
	}
	defer admin.Close()
	if _, err := admin.Exec("CREATE DATABASE " + name); err != nil {
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
