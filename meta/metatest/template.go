package metatest

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"fmt"
	"io/fs"
	"strconv"
	"time"

	"devicehub/meta"
	"devicehub/schema"
)

// templateLock is the advisory lock (of the maintenance database) under
// which templates are built and dropped (exclusive) and copied (shared):
// test processes of every package, and of other checkouts, share them.
const templateLock = 0x64657669636568 // "deviceh"

// staleTemplate is how old a template of other migrations must be before
// building one drops it: another checkout running its tests at the same
// time keeps its own.
const staleTemplate = time.Hour

// templateName is the template of the embedded migrations: a change of
// any of them, or of what the template holds beyond them, names a new one.
func templateName() (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "admin123 %d\n", PasswordCost) // the template's admin
	err := fs.WalkDir(schema.Postgres, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(schema.Postgres, path)
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "%s %d\n", path, len(b))
		h.Write(b)
		return nil
	})
	if err != nil {
		return "", err
	}
	return "devicehub_tmpl_" + hex.EncodeToString(h.Sum(nil)[:6]), nil
}

// copyTemplate creates database name as a copy of the template, building
// the template first if the server has none for these migrations, and
// gives the copy an installation id of its own.
func copyTemplate(admin *sql.DB, name string) error {
	tmpl, err := templateName()
	if err != nil {
		return fmt.Errorf("template: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	conn, err := admin.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	ready := func() (bool, error) {
		var ok bool
		err := conn.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1 AND datistemplate)`, tmpl).Scan(&ok)
		return ok, err
	}
	if _, err := conn.ExecContext(ctx, `SELECT pg_advisory_lock_shared($1)`, templateLock); err != nil {
		return err
	}
	ok, err := ready()
	if err == nil && !ok {
		// Build it, alone: the exclusive lock waits for the copies under way.
		if _, err = conn.ExecContext(ctx, `SELECT pg_advisory_unlock_shared($1)`, templateLock); err != nil {
			return err
		}
		if _, err = conn.ExecContext(ctx, `SELECT pg_advisory_lock($1)`, templateLock); err != nil {
			return err
		}
		if ok, err = ready(); err == nil && !ok {
			err = buildTemplate(ctx, conn, tmpl)
		}
		// Downgrade to shared: a lock taken twice is held until released twice.
		if err == nil {
			_, err = conn.ExecContext(ctx, `SELECT pg_advisory_lock_shared($1)`, templateLock)
		}
		if _, uerr := conn.ExecContext(ctx, `SELECT pg_advisory_unlock($1)`, templateLock); err == nil {
			err = uerr
		}
		if err != nil {
			return fmt.Errorf("template %s: %w", tmpl, err)
		}
	}
	if err == nil {
		err = createIn(conn, "CREATE DATABASE "+name+" TEMPLATE "+tmpl)
	}
	if _, uerr := conn.ExecContext(ctx, `SELECT pg_advisory_unlock_shared($1)`, templateLock); err == nil {
		err = uerr
	}
	if err != nil {
		return err
	}
	// The migration gives each database its own installation id (00006).
	db, err := sql.Open("postgres", fmt.Sprintf("%s/%s?sslmode=disable", ServerDSN(), name))
	if err != nil {
		return err
	}
	defer db.Close()
	_, err = db.ExecContext(ctx, `UPDATE installation SET id = substr(replace(gen_random_uuid()::text, '-', ''), 1, 12)`)
	return err
}

// buildTemplate migrates a new database tmpl, adds the admin (password
// "admin123" hashed at PasswordCost), and marks it a template (no connections
// allowed), dropping the templates of other migrations built more than
// staleTemplate ago. conn holds the exclusive templateLock.
func buildTemplate(ctx context.Context, conn *sql.Conn, tmpl string) error {
	rows, err := conn.QueryContext(ctx, `SELECT datname, datistemplate, coalesce(shobj_description(oid, 'pg_database'), '')
		FROM pg_database WHERE datname LIKE 'devicehub\_tmpl\_%'`)
	if err != nil {
		return err
	}
	var drop []string
	for rows.Next() {
		var name, built string
		var isTemplate bool
		if err := rows.Scan(&name, &isTemplate, &built); err != nil {
			rows.Close()
			return err
		}
		unix, _ := strconv.ParseInt(built, 10, 64)
		if name == tmpl || !isTemplate || time.Since(time.Unix(unix, 0)) > staleTemplate {
			drop = append(drop, name) // a half-built one of an interrupted run, too
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	for _, name := range drop {
		if _, err := conn.ExecContext(ctx, "ALTER DATABASE "+name+" WITH IS_TEMPLATE false"); err != nil {
			return err
		}
		if _, err := conn.ExecContext(ctx, "DROP DATABASE "+name+" WITH (FORCE)"); err != nil {
			return err
		}
	}
	if _, err := conn.ExecContext(ctx, "CREATE DATABASE "+tmpl); err != nil {
		return err
	}
	opts := meta.DefaultOptions()
	opts.DSN = fmt.Sprintf("%s/%s?sslmode=disable", ServerDSN(), tmpl)
	opts.MaxOpenConns = 2
	opts.PasswordCost = PasswordCost
	s, err := meta.Open(ctx, opts)
	if err != nil {
		return err
	}
	err = s.EnsureAdmin(ctx, "admin123")
	s.Close()
	if err != nil {
		return err
	}
	// A copy needs the template free of sessions: the store's listeners
	// may still be closing theirs.
	for _, q := range []string{
		"ALTER DATABASE " + tmpl + " WITH ALLOW_CONNECTIONS false",
		"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '" + tmpl + "'",
		fmt.Sprintf("COMMENT ON DATABASE %s IS '%d'", tmpl, time.Now().Unix()),
		"ALTER DATABASE " + tmpl + " WITH IS_TEMPLATE true",
	} {
		if _, err := conn.ExecContext(ctx, q); err != nil {
			return err
		}
	}
	return nil
}
