package bench

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"

	"devicehub/ingest"
	"devicehub/ingest/mqttconn"
)

// envDefault is $name, else def.
func envDefault(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// childAPIConfig configures startChildAPI.
type childAPIConfig struct {
	Binary         string      // a built cmd/devicehub
	LogDir         string      // the child's devicehub.log goes here
	DB             *pgDatabase // the child's PostgreSQL database (it migrates it at start)
	ClickHouseAddr string      // the child gets a ClickHouse database of its own there, named as DB
	BrokerURL      string
	Roles          string   // DEVICEHUB_ROLES: api, or api,ingest
	Args           []string // extra flags of the child; they override the variables
	Conns          int      // keep-alive connections of the load client
	// DeviceLogins makes the child keep the broker's device logins
	// (-device-auth plugin), for scenarios whose devices connect as
	// themselves; off, seeded fleets (the api scenario's 66,000 deployed
	// devices) would cost the broker a plugin file rewrite each.
	DeviceLogins bool
	// Env adds DEVICEHUB_* variables (names without the prefix).
	Env map[string]string
	// AdminPassword is the admin's password, set when the child creates
	// DB's admin; empty: one chosen for this child. Children started one
	// after another on one DB share one.
	AdminPassword string
}

// childAPI is the devicehub binary as a child process serving a
// scenario's databases, and a keep-alive client logged in as its admin
// (with a password chosen for this run).
type childAPI struct {
	apiClient
	proc     *serverProc
	cfg      childAPIConfig
	clientID string // MQTT client id prefix of its ingest connections
	stopOnce func() error
}

// startChildAPI starts the child configured through DEVICEHUB_* variables,
// as an operator would, waits until /healthz answers and logs in. Its
// stop ends it (SIGTERM), removes the broker sessions of its ingest
// connections and drops its ClickHouse database; the caller drops cfg.DB.
func startChildAPI(ctx context.Context, cfg childAPIConfig) (_ *childAPI, err error) {
	c := &childAPI{cfg: cfg, clientID: "bench-" + cfg.DB.name}
	c.stopOnce = sync.OnceValue(c.shutdown)
	defer func() {
		if err != nil {
			_ = c.stop()
		}
	}()
	password := cfg.AdminPassword
	if password == "" {
		password = "bench-" + randHex(8)
	}
	deviceAuth := "none"
	if cfg.DeviceLogins {
		deviceAuth = "plugin"
	}
	env := map[string]string{
		"POSTGRES_DSN":     cfg.DB.dsn(),
		"CLICKHOUSE_ADDR":  cfg.ClickHouseAddr,
		"CLICKHOUSE_DB":    cfg.DB.name,
		"TIMEZONE":         "UTC",
		"MQTT_URL":         cfg.BrokerURL,
		"MQTT_CLIENT_ID":   c.clientID,
		"MQTT_SHARE_GROUP": "bench" + randHex(4), // its own group: no other instance takes a share
		"ROLES":            cfg.Roles,
		"ADMIN_PASSWORD":   password,
		"LOG_LEVEL":        "warn",
		"DEVICE_AUTH":      deviceAuth,
	}
	for k, v := range cfg.Env {
		env[k] = v
	}
	c.proc, err = startServer(ctx, cfg.Binary, cfg.LogDir, serverConfig{Args: cfg.Args, Env: env})
	if err != nil {
		return nil, err
	}
	c.base, c.http = c.proc.base, newLoadClient(c.proc.base, cfg.Conns)
	if err = c.login(ctx, "admin", password); err != nil {
		return nil, fmt.Errorf("%w\n%s", err, c.proc.logTail())
	}
	return c, nil
}

func (c *childAPI) pid() int { return c.proc.pid() }

// stop ends the child with SIGTERM (killing it if it does not exit within
// 20 s) and cleans up after it; it returns an error if the child did not
// exit 0. Later calls return the first one's result.
func (c *childAPI) stop() error { return c.stopOnce() }

func (c *childAPI) shutdown() error {
	var err error
	if c.http != nil {
		c.http.close()
	}
	if c.proc != nil {
		err = c.proc.stop(20 * time.Second)
	}
	if strings.Contains(childRoles(c.cfg.Roles, c.cfg.Args), "ingest") { // its persistent sessions
		n := ingest.DefaultOptions().Connections
		if v, ok := childFlag(c.cfg.Args, "ingest-connections"); ok {
			if k, e := strconv.Atoi(v); e == nil && k > 0 {
				n = k
			}
		}
		for _, b := range mqttconn.MustBrokers(c.cfg.BrokerURL) {
			purgeSessions(b, c.clientID, n)
		}
	}
	dropClickHouseDatabase(c.cfg.ClickHouseAddr, c.cfg.DB.name)
	return err
}

// childRoles are the child's roles: roles, unless args set -roles.
func childRoles(roles string, args []string) string {
	if v, ok := childFlag(args, "roles"); ok {
		return v
	}
	return roles
}

// childFlag is the value of the last -name=v, --name=v or -name v in args.
func childFlag(args []string, name string) (string, bool) {
	var v string
	found := false
	for i := 0; i < len(args); i++ {
		a := strings.TrimPrefix(strings.TrimPrefix(args[i], "-"), "-")
		if k, val, ok := strings.Cut(a, "="); ok && k == name {
			v, found = val, true
		} else if a == name && i+1 < len(args) {
			v, found = args[i+1], true
			i++
		}
	}
	return v, found
}

// dropClickHouseDatabase drops a database the child created.
func dropClickHouseDatabase(addr, name string) {
	conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{addr}})
	if err != nil {
		return
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = conn.Exec(ctx, "DROP DATABASE IF EXISTS `"+name+"`")
}

// childProcs are the processes whose CPU a phase with the child accounts
// for: this process (what it runs named by self), the child, the
// PostgreSQL backends of the child's database (pgBackends, if not nil),
// the broker and ClickHouse.
func childProcs(self string, child int, pgBackends func() []int, brokerURL, clickhouseAddr string) []namedProc {
	ps := []namedProc{{Name: "bench (" + self + ")", PID: 0}, {Name: "devicehub (server)", PID: child}}
	if pgBackends != nil {
		ps = append(ps, namedProc{Name: "postgres (backends of the run's db)", Members: pgBackends})
	}
	if pid := brokerPID(brokerURL); pid > 0 {
		ps = append(ps, namedProc{Name: "mosquitto", PID: pid})
	}
	if pid := clickhousePID(clickhouseAddr); pid > 0 {
		ps = append(ps, namedProc{Name: "clickhouse-server", PID: pid})
	}
	return ps
}

// ChildParams are the settings of a scenario's devicehub child, the same
// in every scenario that starts one (cmd/bench fills them from one set of
// flags). Zero fields take the defaults noted.
type ChildParams struct {
	// PostgresDSN is the PostgreSQL server, a DSN without database (the
	// run creates a database of its own there, dropped at the end);
	// default $DEVICEHUB_TEST_POSTGRES or local.
	PostgresDSN string `json:"postgresDsn"`
	// ClickHouseAddr is where the child gets a ClickHouse database of its
	// own; default $DEVICEHUB_CLICKHOUSE_ADDR or 127.0.0.1:9000.
	ClickHouseAddr string `json:"clickhouseAddr"`
	// ServerBinary is a built cmd/devicehub; empty: the scenario builds
	// one into a temporary directory (the working directory must be inside
	// the repository).
	ServerBinary string `json:"-"`
	// ServerArgs are extra flags of the child; they override its
	// DEVICEHUB_* configuration (e.g. -roles=api,ingest).
	ServerArgs []string `json:"serverArgs,omitempty"`
	// Logf, if set, receives the setup steps.
	Logf func(format string, args ...any) `json:"-"`
}

// childDefaults fills the fields left empty.
func (c *ChildParams) childDefaults() {
	c.PostgresDSN = pgServerDSN(c.PostgresDSN)
	if c.ClickHouseAddr == "" {
		c.ClickHouseAddr = envDefault("DEVICEHUB_CLICKHOUSE_ADDR", "127.0.0.1:9000")
	}
	if c.Logf == nil {
		c.Logf = func(string, ...any) {}
	}
}

// workDir makes a temporary folder devicehub-bench-<name>-* for the child
// (its log, and the binary when none is given) and returns the binary:
// ServerBinary, else one built there. The caller removes tmp.
func (c *ChildParams) workDir(ctx context.Context, name string) (tmp, bin string, err error) {
	if tmp, err = os.MkdirTemp("", "devicehub-bench-"+name+"-"); err != nil {
		return "", "", err
	}
	if bin = c.ServerBinary; bin != "" {
		return tmp, bin, nil
	}
	c.Logf("%s: building cmd/devicehub", name)
	if bin, err = BuildServer(ctx, tmp); err != nil {
		os.RemoveAll(tmp)
		return "", "", err
	}
	return tmp, bin, nil
}

// prepare makes what a scenario with a devicehub child needs first: the
// work folder and the binary (workDir), and a PostgreSQL database
// devicehub_bench_<name>_<random> on PostgresDSN. cleanup drops the
// database and removes the folder.
func (c *ChildParams) prepare(ctx context.Context, name string) (tmp, bin string, db *pgDatabase, cleanup func(), err error) {
	if tmp, bin, err = c.workDir(ctx, name); err != nil {
		return "", "", nil, nil, err
	}
	if db, err = createPGDatabase(ctx, c.PostgresDSN, "devicehub_bench_"+name); err != nil {
		os.RemoveAll(tmp)
		return "", "", nil, nil, err
	}
	return tmp, bin, db, func() { db.drop(); os.RemoveAll(tmp) }, nil
}

// prepareBroker is prepare and a private broker with devicehub's plugin
// (startFleetBroker) for the child; cleanup stops the broker, then drops
// the database and the directory.
func (c *ChildParams) prepareBroker(ctx context.Context, name string) (tmp, bin string, db *pgDatabase, broker *fleetBroker, cleanup func(), err error) {
	tmp, bin, db, drop, err := c.prepare(ctx, name)
	if err != nil {
		return "", "", nil, nil, nil, err
	}
	if broker, err = startFleetBroker(ctx, brokerPlugin, nil); err != nil {
		drop()
		return "", "", nil, nil, nil, err
	}
	return tmp, bin, db, broker, func() { broker.stop(); drop() }, nil
}

// brokerChild is what a scenario with a devicehub child on a private
// broker runs on (prepareBroker's): the work folder, the binary, the
// database, the broker; cleanup removes them.
type brokerChild struct {
	tmp, bin string
	db       *pgDatabase
	broker   *fleetBroker
	cleanup  func()
}

// withBroker fills c's defaults (childDefaults), then prepares a devicehub
// child on a private broker (prepareBroker). c's defaults are filled even
// when it fails.
func (c *ChildParams) withBroker(ctx context.Context, name string) (b brokerChild, err error) {
	c.childDefaults()
	b.tmp, b.bin, b.db, b.broker, b.cleanup, err = c.prepareBroker(ctx, name)
	return b, err
}
