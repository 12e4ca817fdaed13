package meta

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"sync"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
	"golang.org/x/crypto/bcrypt"

	"devicehub/schema"
)

// Options configures the metadata store.
type Options struct {
	// DSN of the PostgreSQL database.
	DSN string
	// MaxOpenConns bounds the connection pool.
	MaxOpenConns int
	// QueryTimeout bounds every statement: fasthttp does not cancel a
	// request's context when its client goes away.
	QueryTimeout time.Duration
	// LoginMaxFailures failed logins in a row, for one username from one
	// client address, lock that address out of it for LoginLockout; 0
	// disables the lockout.
	LoginMaxFailures int
	LoginLockout     time.Duration
	// ExactTotalLimit is how many matches a product or device page counts
	// exactly (0: DefaultExactTotalLimit); past it, the page's total is an
	// estimate (Page.TotalExact false).
	ExactTotalLimit int
	// TotalEstimateTTL is how long such an estimate is kept for the same
	// terms, which then read only their page; 0 keeps none.
	TotalEstimateTTL time.Duration
	// PageCacheTTL bounds how long a product or device page is kept for
	// the same query while no table it reads changes (meta/pagecache.go);
	// 0 or less keeps none.
	PageCacheTTL time.Duration
	// ReservedLogins are the broker logins of services and operators (the
	// service login's username, say): no device's secureId may name one,
	// in any case, nor "admin" or a name starting with "$" whatever this
	// holds (meta/device_input.go).
	ReservedLogins []string
	// PasswordCost is the bcrypt cost of the passwords the store hashes,
	// and of the dummy hash an unknown username is checked against
	// (0: bcrypt.DefaultCost). The tests' stores (meta/metatest) use
	// bcrypt.MinCost: under the race detector one hash at the default
	// cost takes about a second of CPU.
	PasswordCost int
}

// DefaultOptions returns options that work with `make run`.
func DefaultOptions() Options {
	return Options{
		DSN:          "postgres://postgres@127.0.0.1:5432/devicehub?sslmode=disable",
		MaxOpenConns: 32,
		QueryTimeout: 5 * time.Second,
		// Five failures from one address lock it out of the username for ten minutes.
		LoginMaxFailures: 5,
		LoginLockout:     10 * time.Minute,
		ExactTotalLimit:  DefaultExactTotalLimit,
		TotalEstimateTTL: DefaultTotalEstimateTTL,
		PageCacheTTL:     DefaultPageCacheTTL,
		ReservedLogins:   []string{"devicehub"}, // the service login of `make run`
		PasswordCost:     bcrypt.DefaultCost,
	}
}

// Store is the PostgreSQL-backed metadata store.
type Store struct {
	db     *sqlx.DB
	opts   Options
	totals *totalCache // estimated list totals (list.go)
	pages  *pageCache  // product and device pages (pagecache.go)
	tokens *tokenWatch // ended tokens, announced (tokenwatch.go)

	oneTripOnce sync.Once
	oneTrip     *sqlx.DB // OneTrip's pool, opened on first use
}

// Open connects to PostgreSQL and applies pending migrations.
func Open(ctx context.Context, opts Options) (*Store, error) {
	db, err := sqlx.Open("postgres", opts.DSN)
	if err != nil {
		return nil, fmt.Errorf("meta: open: %w", err)
	}
	db.SetMaxOpenConns(opts.MaxOpenConns)
	db.SetMaxIdleConns(opts.MaxOpenConns)
	db.SetConnMaxIdleTime(5 * time.Minute)
	s := &Store{db: db, opts: opts, totals: newTotalCache(opts.TotalEstimateTTL),
		pages: newPageCache(opts.DSN, opts.PageCacheTTL), tokens: newTokenWatch(opts.DSN)}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := db.PingContext(pctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("meta: connect: %w", err)
	}
	if err := s.Migrate(ctx); err != nil {
		db.Close()
		return nil, err
	}
	return s, nil
}

// Migrate applies the embedded goose migrations, holding a PostgreSQL
// advisory lock (of this database) so that instances starting together
// take turns: the first migrates, the others then find nothing to do.
// A waiting instance tries the lock every second (goose's default, every
// 5 s, held each back 5 s after the first was done), for up to 5 minutes.
// The lock is a session's: an instance that dies while migrating frees it.
func (s *Store) Migrate(ctx context.Context) error {
	sub, err := fs.Sub(schema.Postgres, "postgres")
	if err != nil {
		return fmt.Errorf("meta: migrations: %w", err)
	}
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockTimeout(1, 300))
	if err != nil {
		return fmt.Errorf("meta: migrations: %w", err)
	}
	p, err := goose.NewProvider(goose.DialectPostgres, s.db.DB, sub, goose.WithSessionLocker(locker))
	if err != nil {
		return fmt.Errorf("meta: migrations: %w", err)
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("meta: migrate: %w%s", err, extensionHint(err))
	}
	return nil
}

// Close stops the page cache's and the tokens' watchers and closes the
// connection pools.
func (s *Store) Close() error {
	s.pages.close()
	s.tokens.close()
	s.oneTripOnce.Do(func() {}) // none opened after this
	if s.oneTrip != nil {
		_ = s.oneTrip.Close()
	}
	return s.db.Close()
}

// OneTrip is a second, small pool on the same database whose statements
// with parameters take one round trip instead of two. Without lib/pq's
// binary_parameters a statement with parameters is prepared, answered,
// and then executed; with it Parse, Bind and Execute go together. On a
// busy machine each round trip waits for PostgreSQL's backend to be
// scheduled, so a writer of several statements a transaction (the alarm
// evaluator's, ingest/alarm Store.Write) commits sooner. Its statements
// must not pass []byte parameters: those go in binary, which a json,
// jsonb or uuid parameter does not read (strings and pq's arrays go as
// text, as in the main pool). Closed with the Store.
func (s *Store) OneTrip() *sqlx.DB {
	s.oneTripOnce.Do(func() {
		db, err := sqlx.Open("postgres", oneTripDSN(s.opts.DSN))
		if err != nil { // only for an unknown driver name
			return
		}
		db.SetMaxOpenConns(oneTripConns)
		db.SetMaxIdleConns(oneTripConns)
		db.SetConnMaxIdleTime(5 * time.Minute)
		s.oneTrip = db
	})
	if s.oneTrip == nil {
		return s.db
	}
	return s.oneTrip
}

// oneTripConns bounds OneTrip's pool: its users are a few writer
// goroutines.
const oneTripConns = 4

// oneTripDSN is dsn with binary_parameters on, in either of lib/pq's
// forms (a URL, or key=value pairs).
func oneTripDSN(dsn string) string {
	if u, err := url.Parse(dsn); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		q := u.Query()
		q.Set("binary_parameters", "yes")
		u.RawQuery = q.Encode()
		return u.String()
	}
	return dsn + " binary_parameters=yes"
}

// DB exposes the pool, for tests and health checks.
func (s *Store) DB() *sqlx.DB { return s.db }

// Ping reports whether PostgreSQL answers.
func (s *Store) Ping(ctx context.Context) error {
	ctx, cancel := s.timeout(ctx)
	defer cancel()
	return s.db.PingContext(ctx)
}

func (s *Store) timeout(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.opts.QueryTimeout)
}

// bulkTimeout bounds a bulk write of n rows: one QueryTimeout, and one
// more per bulkChunk rows. A 10,000-device create is several statements
// that each touch every row's indexes and triggers; under load it took
// longer than one QueryTimeout (TestShadowBulk, 57014 under make test).
func (s *Store) bulkTimeout(ctx context.Context, n int) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.opts.QueryTimeout*time.Duration(1+(n+bulkChunk-1)/bulkChunk))
}

// inTx runs f in a transaction, committed if f returns nil.
func (s *Store) inTx(ctx context.Context, f func(tx *sqlx.Tx) error) error {
	tx, err := s.db.BeginTxx(ctx, nil)
	if err != nil {
		return fmt.Errorf("meta: begin: %w", err)
	}
	defer tx.Rollback()
	if err := f(tx); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("meta: commit: %w", err)
	}
	return nil
}

// IsStatementCanceled reports PostgreSQL's query_canceled (57014): what
// lib/pq returns when a statement's context ended (it cancels the
// statement and returns the server's error, not the context's). Callers
// treat it as that context's deadline.
func IsStatementCanceled(err error) bool {
	var pe *pq.Error
	return errors.As(err, &pe) && pe.Code == "57014"
}

// isUniqueViolation reports a PostgreSQL unique_violation (23505).
func isUniqueViolation(err error) bool {
	pe, ok := err.(*pq.Error)
	return ok && pe.Code == "23505"
}
