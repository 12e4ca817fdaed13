package meta

import "github.com/jmoiron/sqlx"

// StateChangeSQL are the statements of ApplyStateChanges in their order,
// with their parameters for changes: benchmarks EXPLAIN them.
func StateChangeSQL(changes []StateChange) (setup, lock, update string, args []any) {
	return noTrigramEquality, stateLockSQL, stateUpdateSQL, stateChangeArgs(changes)
}

// OpenUnmigrated opens a Store on dsn without applying migrations, for
// benchmarks that compare a database left at an earlier migration.
func OpenUnmigrated(dsn string, conns int) (*Store, error) {
	db, err := sqlx.Open("postgres", dsn)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(conns)
	opts := DefaultOptions()
	opts.DSN, opts.MaxOpenConns, opts.PageCacheTTL, opts.TotalEstimateTTL = dsn, conns, 0, 0
	return &Store{db: db, opts: opts, totals: newTotalCache(0), pages: newPageCache(dsn, 0), tokens: newTokenWatch(dsn)}, nil
}
