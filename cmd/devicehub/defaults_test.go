package main

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	"devicehub/meta/metatest"
)

// TestWarnDefaultAdmin: while the admin's password is the development
// default, every start logs a warning saying so; once it is changed, none.
func TestWarnDefaultAdmin(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := metatest.NewStore(t) // the admin, with admin123
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	warnDefaultAdmin(ctx, store, log)
	if out := buf.String(); !strings.Contains(out, "level=WARN") || !strings.Contains(out, "development default") {
		t.Fatalf("admin with the default password: logged %q, want a warning", out)
	} else if strings.Contains(out, devAdminPassword) {
		t.Fatalf("the warning holds the password: %q", out)
	}
	if err := store.SetPassword(ctx, "admin", "not-the-default-1"); err != nil {
		t.Fatal(err)
	}
	buf.Reset()
	warnDefaultAdmin(ctx, store, log)
	if buf.Len() != 0 {
		t.Fatalf("admin with another password: logged %q, want nothing", buf.String())
	}
}
