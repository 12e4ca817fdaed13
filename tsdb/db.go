package tsdb

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"devicehub/schema"
)

// ErrClosed is returned by Writer.Add after Close. Input errors (bad
// interval, bad option, a row that cannot be stored) wrap
// schema.ErrIllegalArgument, shared with api and meta.
var ErrClosed = errors.New("tsdb: writer closed")

// Options configure Open.
type Options struct {
	// Addr is host:port of the native protocol. Default "127.0.0.1:9000".
	// A comma-separated list names fallbacks: new connections go to the
	// first that answers (a cluster's nodes, say: see Cluster).
	Addr string
	// Database is created if missing. Default "devicehub".
	Database string
	// Username and Password authenticate. Default "default" and "".
	Username, Password string
	// TimeZone is the platform time zone: day boundaries of the per-day
	// counts and of every bucket. Default time.Local (resolved to its IANA
	// name through $TZ or /etc/localtime, since ClickHouse needs a name).
	TimeZone *time.Location
	// DialTimeout bounds connecting. Default 5s.
	DialTimeout time.Duration
	// QueryTimeout bounds every call that does not carry an earlier
	// deadline (fasthttp does not cancel request contexts). Default 30s.
	QueryTimeout time.Duration
	// MaxOpenConns bounds the connection pool. Default 8.
	MaxOpenConns int
	// ResultTTL is how long a dashboard answer (message counts, property
	// aggregates) is served again to identical queries, counted from the
	// start of its ClickHouse query (cache.go): a row another instance
	// stores shows in answers at most this much later; rows stored
	// through this DB show at once. Default 1s; negative: no cache.
	ResultTTL time.Duration
	// Cluster names a cluster of the servers' remote_servers to spread the
	// tables over (cluster.go): replicated tables created ON CLUSTER
	// behind Distributed ones that every insert and query goes through,
	// one device's rows on one shard. The servers need ZooKeeper and the
	// {shard} and {replica} macros. Default "": one server, plain
	// MergeTree tables.
	Cluster string
	// ConvertLock, when set, is taken by Open around its DDL when a
	// conversion (convert.go) is still to run, and released when Open
	// returns: a lock that every instance on this ClickHouse database
	// takes, so that only one converts at a time (devicehub passes
	// meta's PostgreSQL advisory lock; tsdb cannot reach PostgreSQL). It
	// returns lost, closed when the lock is gone (Open then stops), and
	// release. Nil: the caller makes sure one instance converts.
	ConvertLock func(ctx context.Context) (lost <-chan struct{}, release func(), err error)
	// NoRollup makes every property aggregate read device_property, also
	// where the hourly rollup or the kept partials (propaggs.go) answer
	// the same (rollup.go): for comparisons (tests, the bench). Both are
	// kept either way.
	NoRollup bool
	// SchemaVersion applies the DDL files numbered up to it only (0: all):
	// a database as an older version left it, for the conversion test and
	// the bench's before-figures. A DB opened so may lack what queries of
	// this version read.
	SchemaVersion int
}

// DefaultOptions returns the options that work with `make run`.
func DefaultOptions() Options {
	return Options{
		Addr:         "127.0.0.1:9000", // .ci/services ClickHouse
		Database:     "devicehub",      // created by Open
		Username:     "default",        // ClickHouse's built-in user
		Password:     "",               // no password in development
		TimeZone:     time.Local,       // the machine's zone is the platform's
		DialTimeout:  5 * time.Second,  // a local server answers in ms
		QueryTimeout: 30 * time.Second, // dashboard queries read pre-aggregated days
		MaxOpenConns: 8,                // ingest writer + a few dashboard queries
		ResultTTL:    time.Second,      // a late row shows within 1 s everywhere
		Cluster:      "",               // one server
	}
}

// Version is a ClickHouse server version, kept to gate newer features.
type Version struct{ Major, Minor, Patch uint64 }

func (v Version) String() string { return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Patch) }

// DB is a handle on the time-series database. It is safe for concurrent use.
type DB struct {
	conn    driver.Conn
	opt     Options
	loc     *time.Location
	tzName  string // IANA name of loc, as written into SQL
	version Version
	hints   historyHints     // per device, where PropertyHistory starts
	cache   *resultCache     // dashboard answers (cache.go)
	days    *dayCounts       // message counts per day (daycounts.go)
	props   *keeper[partial] // product-wide property partials per hour (propaggs.go)
	// converted is what Open's conversion did (convert.go).
	converted ConvertStats
	// oldLayout: device_property is still in the layout before schema 00006
	// (time and ts; Options.SchemaVersion below 6 only): see tsRange.
	oldLayout bool
}

// codeUnknownDatabase is ClickHouse's UNKNOWN_DATABASE error code.
const codeUnknownDatabase = 81

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// Open connects, creates the database if needed, applies the embedded DDL
// (idempotent) and makes sure the per-day view counts days in
// Options.TimeZone, rebuilding it if it was created for another zone.
func Open(ctx context.Context, opt Options) (*DB, error) {
	opt = withDefaults(opt)
	if !identRE.MatchString(opt.Database) {
		return nil, fmt.Errorf("tsdb: database name %q: %w", opt.Database, schema.ErrIllegalArgument)
	}
	if opt.Cluster != "" && !clusterNameRE.MatchString(opt.Cluster) {
		return nil, fmt.Errorf("tsdb: cluster name %q: %w", opt.Cluster, schema.ErrIllegalArgument)
	}
	tzName, loc, err := zoneName(opt.TimeZone)
	if err != nil {
		return nil, err
	}
	admin, err := connect(opt, "default")
	if err != nil {
		return nil, err
	}
	err = func() error {
		defer admin.Close()
		cctx, cancel := withTimeout(ctx, opt.QueryTimeout)
		defer cancel()
		create := "CREATE DATABASE IF NOT EXISTS `" + opt.Database + "`"
		if opt.Cluster != "" {
			// Only where the node lacks it: ON CLUSTER waits for every
			// node, and a start must not wait for one that is down.
			var n uint64
			if err := admin.QueryRow(cctx, "SELECT count() FROM system.databases WHERE name = ?", opt.Database).Scan(&n); err != nil {
				return fmt.Errorf("tsdb: look up database %s: %w", opt.Database, err)
			}
			if n > 0 {
				return nil
			}
			create += " ON CLUSTER `" + opt.Cluster + "`"
		}
		if err := admin.Exec(cctx, create); err != nil {
			return fmt.Errorf("tsdb: create database %s: %w", opt.Database, err)
		}
		return nil
	}()
	if err != nil {
		return nil, err
	}
	conn, err := connect(opt, opt.Database)
	if err != nil {
		return nil, err
	}
	db := &DB{conn: conn, opt: opt, loc: loc, tzName: tzName, cache: newResultCache(opt.ResultTTL)}
	db.days, db.props = db.newDayCounts(), db.newPropAggs()
	if err := db.init(ctx); err != nil {
		conn.Close()
		return nil, err
	}
	return db, nil
}

func withDefaults(opt Options) Options {
	d := DefaultOptions()
	if opt.Addr == "" {
		opt.Addr = d.Addr
	}
	if opt.Database == "" {
		opt.Database = d.Database
	}
	if opt.Username == "" {
		opt.Username = d.Username
	}
	if opt.TimeZone == nil {
		opt.TimeZone = d.TimeZone
	}
	if opt.DialTimeout <= 0 {
		opt.DialTimeout = d.DialTimeout
	}
	if opt.QueryTimeout <= 0 {
		opt.QueryTimeout = d.QueryTimeout
	}
	if opt.MaxOpenConns <= 0 {
		opt.MaxOpenConns = d.MaxOpenConns
	}
	if opt.ResultTTL == 0 {
		opt.ResultTTL = d.ResultTTL
	}
	return opt
}

func connect(opt Options, database string) (driver.Conn, error) {
	var settings clickhouse.Settings
	if opt.Cluster != "" {
		// An INSERT into a Distributed table returns once each shard has
		// stored its rows (one replica each), not once they are queued on
		// the node it was sent to: an acknowledged message is in a
		// replicated table. A retried insert is not stored twice: each
		// shard drops a block identical to one it already has.
		settings = clickhouse.Settings{"insert_distributed_sync": 1}
	}
	conn, err := clickhouse.Open(&clickhouse.Options{
		Protocol: clickhouse.Native,
		Addr:     splitAddrs(opt.Addr),
		Settings: settings,
		Auth: clickhouse.Auth{
			Database: database,
			Username: opt.Username,
			Password: opt.Password,
		},
		Compression:  &clickhouse.Compression{Method: clickhouse.CompressionLZ4},
		DialTimeout:  opt.DialTimeout,
		ReadTimeout:  opt.QueryTimeout,
		MaxOpenConns: opt.MaxOpenConns,
		MaxIdleConns: opt.MaxOpenConns,
	})
	if err != nil {
		return nil, fmt.Errorf("tsdb: open %s: %w", opt.Addr, err)
	}
	return conn, nil
}

// splitAddrs splits a comma-separated address list.
func splitAddrs(s string) []string {
	var out []string
	for _, a := range strings.Split(s, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	return out
}

var zoneNameRE = regexp.MustCompile(`^[A-Za-z0-9_+\-/]+$`)

// zoneName returns the IANA name ClickHouse understands for loc, and the
// location loaded from that name (so Go and ClickHouse use the same rules).
func zoneName(loc *time.Location) (string, *time.Location, error) {
	name := loc.String()
	if loc == time.Local || name == "Local" {
		name = strings.TrimPrefix(os.Getenv("TZ"), ":")
		if name == "" {
			if target, err := filepath.EvalSymlinks("/etc/localtime"); err == nil {
				if i := strings.Index(target, "zoneinfo/"); i >= 0 {
					name = target[i+len("zoneinfo/"):]
				}
			}
		}
		if name == "" {
			if b, err := os.ReadFile("/etc/timezone"); err == nil {
				name = strings.TrimSpace(string(b))
			}
		}
		if name == "" {
			name = "UTC" // no zone configured anywhere: Go's Local is UTC too
		}
	}
	if !zoneNameRE.MatchString(name) {
		return "", nil, fmt.Errorf("tsdb: time zone %q is not an IANA name; set Options.TimeZone: %w", name, schema.ErrIllegalArgument)
	}
	l, err := time.LoadLocation(name)
	if err != nil {
		return "", nil, fmt.Errorf("tsdb: time zone %q: %w", name, err)
	}
	if loc != time.Local {
		l = loc // the caller's own value: same rules, and Location() == loc
	}
	return name, l, nil
}

func withTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) <= d {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, d)
}

func (db *DB) ctx(ctx context.Context) (context.Context, context.CancelFunc) {
	return withTimeout(ctx, db.opt.QueryTimeout)
}

func (db *DB) init(parent context.Context) error {
	v, err := db.conn.ServerVersion()
	if err != nil {
		return fmt.Errorf("tsdb: server version: %w", err)
	}
	db.version = Version{v.Version.Major, v.Version.Minor, v.Version.Patch}
	stmts, err := db.statements()
	if err != nil {
		return err
	}
	if db.clustered() {
		if stmts, err = clusterStatements(stmts, db.opt.Cluster, db.opt.Database); err != nil {
			return err
		}
	}
	parent, unlock, err := db.convertLock(parent, stmts)
	if err != nil {
		return err
	}
	defer unlock()
	var sqls []string
	for _, s := range stmts {
		// Each statement has its own timeout (an ON CLUSTER one waits for
		// every node), except a fill, which reads a whole table (00003:
		// the rollup's, once) as long as it takes, bounded by the
		// caller's ctx only.
		if s.convert != "" {
			if err := db.convert(parent, s); err != nil {
				return err
			}
			continue
		}
		sctx := parent
		if !strings.HasPrefix(s.sql, "INSERT") {
			var scancel context.CancelFunc
			sctx, scancel = db.ctx(parent)
			defer scancel()
		}
		if err := db.apply(sctx, s); err != nil {
			return err
		}
		sqls = append(sqls, s.sql)
	}
	ctx, cancel := db.ctx(parent)
	defer cancel()
	var oldLayout uint64
	if err := db.conn.QueryRow(ctx, "SELECT count() FROM system.columns WHERE database = currentDatabase() AND table = ? AND name = 'time'",
		db.storageTable("device_property")).Scan(&oldLayout); err != nil {
		return fmt.Errorf("tsdb: read device_property's layout: %w", err)
	}
	db.oldLayout = oldLayout > 0
	return db.checkDailyZone(ctx, sqls)
}

// apply runs s unless its condition says it is done. When s fails and its
// condition then says it is done, another instance applied it meanwhile.
func (db *DB) apply(ctx context.Context, s ddl) error {
	due, err := db.due(ctx, s)
	if err != nil || !due {
		return err
	}
	if err := db.conn.Exec(ctx, s.sql); err != nil {
		if due, cerr := db.due(ctx, s); cerr == nil && !due {
			return nil
		}
		return fmt.Errorf("tsdb: apply DDL %q: %w", firstLine(s.sql), err)
	}
	return nil
}

// due reports whether s is to run: always, unless its condition counts 0.
func (db *DB) due(ctx context.Context, s ddl) (bool, error) {
	if s.cond == "" {
		return true, nil
	}
	var n uint64
	if err := db.conn.QueryRow(ctx, s.cond).Scan(&n); err != nil {
		return false, fmt.Errorf("tsdb: DDL condition %q: %w", s.cond, err)
	}
	return n > 0, nil
}

// Close releases the connections.
func (db *DB) Close() error { return db.conn.Close() }

// Conn returns the underlying driver connection (tests, ad-hoc queries).
func (db *DB) Conn() driver.Conn { return db.conn }

// ServerVersion is the version of the ClickHouse server, read at Open.
func (db *DB) ServerVersion() Version { return db.version }

// Location is the platform time zone all buckets are computed in.
func (db *DB) Location() *time.Location { return db.loc }

// Database is the database name in use.
func (db *DB) Database() string { return db.opt.Database }

// Cluster is the cluster the tables are spread over; "" on one server.
func (db *DB) Cluster() string { return db.opt.Cluster }

// DropDatabase drops the whole database; meant for tests.
func (db *DB) DropDatabase(ctx context.Context) error {
	ctx, cancel := db.ctx(ctx)
	defer cancel()
	err := db.conn.Exec(ctx, "DROP DATABASE IF EXISTS `"+db.opt.Database+"`"+db.onCluster())
	// ON CLUSTER, 18.16 reports a node that had no such database
	// (IF EXISTS notwithstanding): dropped is dropped.
	var ex *clickhouse.Exception
	if db.clustered() && errors.As(err, &ex) && ex.Code == codeUnknownDatabase {
		err = nil
	}
	if err != nil {
		return fmt.Errorf("tsdb: drop database %s: %w", db.opt.Database, err)
	}
	return nil
}

var stmtEndRE = regexp.MustCompile(`(?m);[ \t]*$`)

// ddl is one statement of the embedded DDL. Most are idempotent and run at
// every start; one that is not (ClickHouse 18.16 has no DROP COLUMN IF
// EXISTS) carries a condition, a query counting what it has still to do,
// written as a "--@if <query>" line before it.
// A "--@convert <from> <to>" line is a statement of its own: the
// conversion of convert.go.
type ddl struct{ sql, cond, convert string }

const (
	condPrefix    = "--@if "
	convertPrefix = "--@convert "
)

// statements returns the embedded DDL in file order, comments removed and
// {{TZ}} replaced by the platform zone.
func (db *DB) statements() ([]ddl, error) {
	files, err := fs.Glob(schema.ClickHouse, "clickhouse/*.sql")
	if err != nil {
		return nil, err
	}
	sort.Strings(files)
	layout := layoutReplacer(db.version)
	var out []ddl
	for _, f := range files {
		if v := db.opt.SchemaVersion; v > 0 {
			var n int
			if _, err := fmt.Sscanf(path.Base(f), "%d_", &n); err != nil {
				return nil, fmt.Errorf("tsdb: DDL file %s has no number", f)
			}
			if n > v {
				continue
			}
		}
		b, err := fs.ReadFile(schema.ClickHouse, f)
		if err != nil {
			return nil, fmt.Errorf("tsdb: read %s: %w", f, err)
		}
		out = append(out, splitDDL(layout.Replace(string(b)), db.tzName)...)
	}
	return out, nil
}

func splitDDL(src, tz string) []ddl {
	var (
		out   []ddl
		cond  string
		lines []string
	)
	for _, l := range strings.Split(strings.ReplaceAll(src, "{{TZ}}", tz), "\n") {
		t := strings.TrimSpace(l)
		switch {
		case strings.HasPrefix(t, convertPrefix):
			out = append(out, ddl{convert: strings.TrimSpace(strings.TrimPrefix(t, convertPrefix))})
			continue
		case strings.HasPrefix(t, condPrefix):
			cond = strings.TrimSpace(strings.TrimPrefix(t, condPrefix))
		case strings.HasPrefix(t, "--"):
		default:
			lines = append(lines, l)
		}
		if !stmtEndRE.MatchString(l) || strings.HasPrefix(t, "--") {
			continue
		}
		if s := strings.TrimSpace(stmtEndRE.ReplaceAllString(strings.Join(lines, "\n"), "")); s != "" {
			out = append(out, ddl{sql: s, cond: cond})
		}
		cond, lines = "", nil
	}
	if s := strings.TrimSpace(strings.Join(lines, "\n")); s != "" {
		out = append(out, ddl{sql: s, cond: cond})
	}
	return out
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

const dailyMV = "device_message_daily_mv"

// checkDailyZone rebuilds the per-day view when it was created for another
// time zone: drop the view, empty device_message_daily, recreate the view
// and recount every stored message with the new day boundaries. Rows
// inserted by another process while this runs may be counted twice or not
// at all, so change the zone with ingest stopped.
func (db *DB) checkDailyZone(ctx context.Context, stmts []string) error {
	// SHOW CREATE TABLE reads this view's definition only: a query of
	// system.tables' create_table_query reads every table's, and fails
	// (UNKNOWN_TABLE) when another instance's Open drops a table of the
	// database meanwhile (the conversion's record table, TestCluster).
	var create string
	err := db.conn.QueryRow(ctx, "SHOW CREATE TABLE `"+db.opt.Database+"`."+dailyMV).Scan(&create)
	if err != nil {
		return fmt.Errorf("tsdb: read %s definition: %w", dailyMV, err)
	}
	if strings.Contains(create, "'"+db.tzName+"'") {
		return nil
	}
	var mv string
	for _, s := range stmts {
		if strings.Contains(s, "MATERIALIZED VIEW") && strings.Contains(s, dailyMV) {
			mv = s
		}
	}
	if mv == "" {
		return fmt.Errorf("tsdb: no DDL for %s", dailyMV)
	}
	steps := []string{
		"DROP TABLE IF EXISTS " + dailyMV,
		"TRUNCATE TABLE device_message_daily",
		mv,
		"INSERT INTO device_message_daily (day, product_id, messages) " +
			"SELECT toDate(time, '" + db.tzName + "') AS day, product_id, count() AS messages " +
			"FROM device_message GROUP BY day, product_id",
	}
	if db.clustered() {
		// The same on every node; the recount goes through the
		// Distributed tables (its rows land on any shard: every query
		// sums the days over all of them).
		steps[0] = "DROP TABLE IF EXISTS " + db.alterTarget(dailyMV)
		steps[1] = "TRUNCATE TABLE " + db.alterTarget(db.storageTable("device_message_daily"))
	}
	for _, s := range steps {
		if err := db.conn.Exec(ctx, s); err != nil {
			return fmt.Errorf("tsdb: rebuild %s for time zone %s (%q): %w", dailyMV, db.tzName, firstLine(s), err)
		}
	}
	return nil
}
