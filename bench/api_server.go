package bench

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/lib/pq"
	"github.com/prometheus/client_golang/prometheus"

	"devicehub/api"
	"devicehub/meta"
)

// pgServerDSN is the PostgreSQL server (a DSN without database): dsn, else
// $DEVICEHUB_TEST_POSTGRES, else the local server of `make services`.
func pgServerDSN(dsn string) string {
	if dsn != "" {
		return dsn
	}
	if v := os.Getenv("DEVICEHUB_TEST_POSTGRES"); v != "" {
		return v
	}
	return "postgres://postgres@127.0.0.1:5432"
}

// openPG is bench's one way to a PostgreSQL database: a pool of at most
// conns connections (0: unbounded) to the database of dsn, dialled when
// first used.
func openPG(dsn string, conns int) (*sql.DB, error) {
	db, err := sql.Open("postgres", dsn)
	if err != nil {
		return nil, fmt.Errorf("bench: postgres: %w", err)
	}
	if conns > 0 {
		db.SetMaxOpenConns(conns)
	}
	return db, nil
}

// openPGAdmin opens a pool of conns to the maintenance database of the
// server (a DSN without database), to create and drop others.
func openPGAdmin(server string, conns int) (*sql.DB, error) {
	return openPG(server+"/postgres?sslmode=disable", conns)
}

// addDevices adds devices of product, offline, to the database of dsn,
// and the product, deployed, unless it exists (a product deployed through
// the API, with its thing model, is kept).
func addDevices(ctx context.Context, dsn, product string, ids []string) error {
	db, err := openPG(dsn, 1)
	if err != nil {
		return err
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, `INSERT INTO products (id, name, device_type, state) VALUES ($1, $1, 'device', 1)
		ON CONFLICT (id) DO NOTHING`, product); err != nil {
		return fmt.Errorf("bench: add product: %w", err)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO devices (id, name, product_id, state)
		SELECT id, id, $2, 'offline' FROM unnest($1::text[]) AS id`, pq.StringArray(ids), product); err != nil {
		return fmt.Errorf("bench: add devices: %w", err)
	}
	return nil
}

// pgDatabase is a fresh PostgreSQL database of one run on a server;
// drop removes it (and ends its connections).
type pgDatabase struct {
	server string // DSN without database
	name   string
}

// createPGDatabase creates <prefix>_<random> on the server pgServer (a
// DSN without database); the caller drops it.
func createPGDatabase(ctx context.Context, pgServer, prefix string) (*pgDatabase, error) {
	admin, err := openPGAdmin(pgServer, 1)
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	d := &pgDatabase{server: pgServer, name: prefix + "_" + randHex(4)}
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+d.name); err != nil {
		return nil, fmt.Errorf("bench: create PostgreSQL database (is it up? `make services`): %w", err)
	}
	return d, nil
}

// open opens a pool of at most conns connections to the database.
func (d *pgDatabase) open(conns int) (*sql.DB, error) { return openPG(d.dsn(), conns) }

// dsn is the database's DSN.
func (d *pgDatabase) dsn() string { return d.server + "/" + d.name + "?sslmode=disable" }

func (d *pgDatabase) drop() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if admin, err := openPGAdmin(d.server, 1); err == nil {
		_, _ = admin.ExecContext(ctx, "DROP DATABASE IF EXISTS "+d.name+" WITH (FORCE)")
		admin.Close()
	}
}

// backends returns a lister of the PostgreSQL server processes connected
// to the database (pg_stat_activity), for a CPU span's group, and the
// function that closes its connection (to the postgres database, so it is
// not one of them).
func (d *pgDatabase) backends() (list func() []int, closeFn func()) {
	admin, err := openPGAdmin(d.server, 1)
	if err != nil {
		return func() []int { return nil }, func() {}
	}
	return func() []int {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		rows, err := admin.QueryContext(ctx, `SELECT pid FROM pg_stat_activity WHERE datname = $1`, d.name)
		if err != nil {
			return nil
		}
		defer rows.Close()
		var pids []int
		for rows.Next() {
			var pid int
			if rows.Scan(&pid) == nil {
				pids = append(pids, pid)
			}
		}
		return pids
	}, func() { admin.Close() }
}

// apiClient is a keep-alive HTTP client of one API server, logged in once
// login has run.
type apiClient struct {
	base  string // http://host:port
	token string
	http  *loadClient
}

// login logs in through POST /api/authorize/login and keeps the token.
func (c *apiClient) login(ctx context.Context, username, password string) error {
	var login struct {
		Token string `json:"token"`
	}
	if err := c.call(ctx, "POST", "/api/authorize/login", map[string]string{"username": username, "password": password}, &login); err != nil {
		return err
	}
	if login.Token == "" {
		return errors.New("bench: login: no token")
	}
	c.token = login.Token
	return nil
}

// benchServer is the real API server, in this process, on 127.0.0.1:0
// over a fresh, migrated PostgreSQL database of its own (dropped by
// close), with a logged-in keep-alive HTTP client sized for the load.
type benchServer struct {
	apiClient
	store   *meta.Store
	srv     *api.Server
	db      *pgDatabase
	closers []func()
	// opts are the server's options: api.DefaultOptions(), which with may
	// change.
	opts api.Options
}

// startBenchServer creates the database, lets with add dependencies
// (it may register closers, run after the server stops), serves and logs
// in as admin. conns sizes the client's keep-alive pool.
func startBenchServer(ctx context.Context, pgServer, prefix string, conns int, with func(store *meta.Store, deps *api.Deps, s *benchServer) error) (_ *benchServer, err error) {
	s := &benchServer{opts: api.DefaultOptions()}
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	if s.db, err = createPGDatabase(ctx, pgServer, prefix); err != nil {
		return nil, err
	}
	mo := meta.DefaultOptions()
	mo.DSN = s.db.dsn()
	if s.store, err = meta.Open(ctx, mo); err != nil {
		return nil, err
	}
	if err = s.store.EnsureAdmin(ctx, "admin123"); err != nil {
		return nil, err
	}
	reg := prometheus.NewRegistry()
	deps := api.Deps{
		Auth: s.store, Products: s.store, Roles: s.store, Devices: s.store, Models: s.store,
		Health: map[string]func(context.Context) error{"postgres": s.store.Ping},
		// Errors only (a 500's cause), to stderr.
		Logger:   slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})),
		Registry: reg, Gatherer: reg,
	}
	if with != nil {
		if err = with(s.store, &deps, s); err != nil {
			return nil, err
		}
	}
	s.srv = api.New(s.opts, deps)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	go func() { _ = s.srv.App().Listener(ln) }()
	s.base = "http://" + ln.Addr().String()
	s.http = newLoadClient(s.base, conns)
	if err = s.login(ctx, "admin", "admin123"); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *benchServer) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if s.srv != nil {
		_ = s.srv.Shutdown(ctx)
	}
	if s.http != nil {
		s.http.close()
	}
	for i := len(s.closers) - 1; i >= 0; i-- {
		s.closers[i]()
	}
	if s.store != nil {
		s.store.Close()
	}
	if s.db != nil {
		s.db.drop()
	}
}

// call sends a JSON body (nil: none) and decodes the envelope's result
// into out (if not nil); anything but 200 is an error.
func (s *apiClient) call(ctx context.Context, method, path string, body, out any) error {
	var js []byte
	if body != nil {
		var err error
		if js, err = json.Marshal(body); err != nil {
			return err
		}
	}
	raw, err := s.do(ctx, method, path, js)
	if err != nil {
		return err
	}
	if out == nil {
		return nil
	}
	var env struct {
		Result json.RawMessage `json:"result"`
	}
	if err := json.Unmarshal(raw, &env); err != nil {
		return fmt.Errorf("bench: %s %s: %w", method, path, err)
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(env.Result, out)
}

// deployProduct creates product id, named name (a custom product of
// devices that reach the broker directly), with the thing model metadata
// ("": none), and deploys it.
func (s *apiClient) deployProduct(ctx context.Context, id, name, metadata string) error {
	var prod map[string]any
	if err := s.call(ctx, "POST", "/api/device/product", map[string]any{"id": id, "name": name,
		"classifiedId": "meter", "modelFrom": "custom", "accessId": "mqtt-direct", "deviceType": "device"}, &prod); err != nil {
		return err
	}
	if metadata != "" {
		prod["metadata"] = metadata
		if err := s.call(ctx, "PATCH", "/api/device-product", prod, nil); err != nil {
			return err
		}
	}
	return s.call(ctx, "POST", "/api/device-product/"+id+"/deploy", nil, nil)
}

// do sends one request (body nil: none) and returns the body of a 200
// answer.
func (s *apiClient) do(ctx context.Context, method, path string, body []byte) ([]byte, error) {
	headers := s.headers(body)
	status, raw, err := s.http.do(ctx, method, s.base+path, headers, body)
	if err != nil {
		return nil, err
	}
	if status != http.StatusOK {
		return raw, fmt.Errorf("bench: %s %s: HTTP %d: %.200s", method, path, status, raw)
	}
	return raw, nil
}

// send is do for a load that needs the answer to be 200 only: its body is
// not copied (but quoted in the error of any other status).
func (s *apiClient) send(ctx context.Context, method, path string, body []byte) error {
	var bad error
	err := s.http.send(ctx, method, s.base+path, s.headers(body), body, func(status int, raw []byte) {
		if status != http.StatusOK {
			bad = fmt.Errorf("bench: %s %s: HTTP %d: %.200s", method, path, status, raw)
		}
	})
	if err != nil {
		return err
	}
	return bad
}

// headers are a request's: its Content-Type with a body, the token once
// logged in.
func (s *apiClient) headers(body []byte) []string {
	headers := make([]string, 0, 4)
	if body != nil {
		headers = append(headers, "Content-Type", "application/json")
	}
	if s.token != "" {
		headers = append(headers, "X-Access-Token", s.token)
	}
	return headers
}
