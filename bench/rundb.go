package bench

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/lib/pq"

	"devicehub/meta"
	"devicehub/tsdb"
)

// runDB is one run's own PostgreSQL and ClickHouse databases (both named
// name), with one deployed product and its devices, written before the
// server starts (its device cache keeps misses for a while).
type runDB struct {
	name  string
	dsn   string // the PostgreSQL database, for the server
	store *meta.Store
	ch    *tsdb.DB
	admin *sql.DB
}

// openRunDB creates the databases, migrated, on pgServer (a DSN without a
// database) and at chAddr (on cluster chCluster, if not empty), and adds
// product with devices ids, offline. close drops both.
func openRunDB(ctx context.Context, pgServer, chAddr, chCluster, prefix, product string, ids []string) (_ *runDB, err error) {
	db := &runDB{name: prefix + randHex(4)}
	defer func() {
		if err != nil {
			db.close()
		}
	}()
	if db.admin, err = sql.Open("postgres", pgServer+"/postgres?sslmode=disable"); err != nil {
		return nil, err
	}
	if _, err := db.admin.ExecContext(ctx, "CREATE DATABASE "+db.name); err != nil {
		return nil, fmt.Errorf("bench: create PostgreSQL database: %w", err)
	}
	mopt := meta.DefaultOptions()
	mopt.DSN = pgServer + "/" + db.name + "?sslmode=disable"
	mopt.MaxOpenConns = 2
	db.dsn = mopt.DSN
	if db.store, err = meta.Open(ctx, mopt); err != nil {
		return nil, err
	}
	topt := tsdb.DefaultOptions()
	topt.Addr, topt.Database, topt.TimeZone, topt.Cluster = chAddr, db.name, time.UTC, chCluster
	if db.ch, err = tsdb.Open(ctx, topt); err != nil {
		return nil, err
	}
	if _, err := db.store.DB().ExecContext(ctx, `INSERT INTO products (id, name, device_type, state) VALUES ($1, $1, 'device', 1)`, product); err != nil {
		return nil, err
	}
	if _, err := db.store.DB().ExecContext(ctx, `INSERT INTO devices (id, name, product_id, state)
		SELECT id, id, $2, 'offline' FROM unnest($1::text[]) AS id`, pq.StringArray(ids), product); err != nil {
		return nil, err
	}
	return db, nil
}

// close drops the ClickHouse database (again, if it was dropped already)
// and the PostgreSQL one.
func (db *runDB) close() {
	if db.ch != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_ = db.ch.DropDatabase(ctx)
		cancel()
		db.ch.Close()
	}
	if db.store != nil {
		db.store.Close()
	}
	if db.admin != nil {
		_, _ = db.admin.Exec("DROP DATABASE IF EXISTS " + db.name + " WITH (FORCE)")
		db.admin.Close()
	}
}
