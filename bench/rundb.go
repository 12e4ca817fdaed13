package bench

import (
	"context"
	"strings"
	"time"

	"devicehub/meta"
	"devicehub/tsdb"
)

// runDB is one run's own PostgreSQL and ClickHouse databases (both named
// name), with one deployed product and its devices, written before the
// server starts (its device cache keeps misses for a while).
type runDB struct {
	name  string
	dsn   string // the PostgreSQL database, for the server
	pg    *pgDatabase
	store *meta.Store
	ch    *tsdb.DB
}

// openRunDB creates the databases, migrated, on pgServer (a DSN without a
// database) and at chAddr (on cluster chCluster, if not empty), and adds
// product with devices ids, offline. close drops both.
func openRunDB(ctx context.Context, pgServer, chAddr, chCluster, prefix, product string, ids []string) (_ *runDB, err error) {
	db := &runDB{}
	defer func() {
		if err != nil {
			db.close()
		}
	}()
	if db.pg, err = createPGDatabase(ctx, pgServer, strings.TrimSuffix(prefix, "_")); err != nil {
		return nil, err
	}
	db.name, db.dsn = db.pg.name, db.pg.dsn()
	mopt := meta.DefaultOptions()
	mopt.DSN = db.dsn
	mopt.MaxOpenConns = 2
	if db.store, err = meta.Open(ctx, mopt); err != nil {
		return nil, err
	}
	topt := tsdb.DefaultOptions()
	topt.Addr, topt.Database, topt.TimeZone, topt.Cluster = chAddr, db.name, time.UTC, chCluster
	if db.ch, err = tsdb.Open(ctx, topt); err != nil {
		return nil, err
	}
	if err := addDevices(ctx, db.dsn, product, ids); err != nil {
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
	if db.pg != nil {
		db.pg.drop()
	}
}
