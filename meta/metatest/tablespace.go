package metatest

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
)

// The tests' databases are created in tablespace devicehub_test, whose
// directory is in tmpfs (/dev/shm), when the server runs on this machine
// and this process can give it a directory owned by the server's user (as
// root: make test and CI); otherwise in the server's default tablespace.
// The template itself stays in the default tablespace.
//
// Why: a copy of the template is about 480 files, and every test creates
// one and drops it. On the test machines' ext4 (where the kernel checks
// each free inode for a recent deletion before reusing it: ext4's
// recently_deleted, minutes long), with a test run's hundreds of databases
// created and dropped, a copy and its drop cost PostgreSQL 0.2 to 0.45 s
// of CPU, nearly all of it in the kernel; in tmpfs 0.025 s. The server,
// catalogs, SQL and WAL are the same; only the databases' files are in
// memory (about 10 MB each while its test runs).

const (
	testTablespace = "devicehub_test"
	tablespaceDir  = "/dev/shm/devicehub-test-pg"
)

var tablespace struct {
	once   sync.Once
	clause string // " TABLESPACE devicehub_test", or "" for the default
}

// tablespaceClause is the TABLESPACE clause for the tests' CREATE
// DATABASE, creating the tablespace (or its directory, gone with a reboot)
// on first use; "" when it cannot be had.
func tablespaceClause(admin execer) string {
	tablespace.once.Do(func() {
		if err := ensureTablespace(admin); err == nil {
			tablespace.clause = " TABLESPACE " + testTablespace
		}
	})
	return tablespace.clause
}

// createIn runs create, a CREATE DATABASE, in the tests' tablespace, or
// in the default one when the tablespace cannot be had or refuses it.
func createIn(admin execer, create string) error {
	ctx := context.Background()
	if clause := tablespaceClause(admin); clause != "" {
		if _, err := admin.ExecContext(ctx, create+clause); err == nil {
			return nil
		}
	}
	_, err := admin.ExecContext(ctx, create)
	return err
}

// execer is a *sql.DB or a *sql.Conn of the maintenance database.
type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

func ensureTablespace(admin execer) error {
	ctx := context.Background()
	// The server's version directory in a tablespace (PG_15_202209061), and
	// its data directory, whose owner the tablespace's directory needs.
	var version, dataDir string
	if err := admin.QueryRowContext(ctx, `SELECT 'PG_' || (current_setting('server_version_num')::int / 10000) || '_' || catalog_version_no,
		current_setting('data_directory') FROM pg_control_system()`).Scan(&version, &dataDir); err != nil {
		return err
	}
	fi, err := os.Stat(dataDir)
	if err != nil {
		return err // not this machine's server
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("no owner of %s", dataDir)
	}
	var location string
	err = admin.QueryRowContext(ctx, `SELECT pg_tablespace_location(oid) FROM pg_tablespace WHERE spcname = $1`, testTablespace).Scan(&location)
	switch {
	case err == sql.ErrNoRows:
		if err := ownedDir(tablespaceDir, int(st.Uid), int(st.Gid)); err != nil {
			return err
		}
		if _, err := admin.ExecContext(ctx, "CREATE TABLESPACE "+testTablespace+" LOCATION '"+tablespaceDir+"'"); err != nil {
			// Another test process may have created it meanwhile.
			if qerr := admin.QueryRowContext(ctx, `SELECT pg_tablespace_location(oid) FROM pg_tablespace WHERE spcname = $1`,
				testTablespace).Scan(&location); qerr != nil {
				return err
			}
		}
		return nil
	case err != nil:
		return err
	}
	// It exists: after a reboot its directory is gone and is made again.
	if location != tablespaceDir {
		return fmt.Errorf("tablespace %s is at %s", testTablespace, location)
	}
	if err := ownedDir(tablespaceDir, int(st.Uid), int(st.Gid)); err != nil {
		return err
	}
	return ownedDir(filepath.Join(tablespaceDir, version), int(st.Uid), int(st.Gid))
}

// ownedDir makes dir (mode 0700) owned by uid:gid if it is missing.
func ownedDir(dir string, uid, gid int) error {
	if _, err := os.Stat(dir); err == nil {
		return nil
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !os.IsExist(err) {
		return err
	}
	return os.Chown(dir, uid, gid)
}
