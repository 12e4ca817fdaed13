// Command devicehub runs the platform: the HTTP API and MQTT ingest, in one
// process by default; -roles lets an instance run only one of them. Configuration comes from DEVICEHUB_*
// environment variables; flags of the same name override them.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"devicehub/api"
	"devicehub/ingest"
	"devicehub/ingest/dynsec"
	"devicehub/meta"
	"devicehub/tsdb"
)

func main() {
	cfg, err := loadConfig(os.Args[1:], os.Getenv)
	if err != nil {
		fmt.Fprintln(os.Stderr, "devicehub:", err)
		os.Exit(2)
	}
	log := newLogger(cfg.LogLevel)
	slog.SetDefault(log)
	// The soft limit makes the collector work harder as the heap nears it,
	// instead of letting RSS grow to twice the live heap (GOGC=100).
	if os.Getenv("GOMEMLIMIT") == "" && cfg.MemoryLimit > 0 {
		debug.SetMemoryLimit(cfg.MemoryLimit)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg, log); err != nil {
		log.Error("devicehub stopped", "err", err)
		os.Exit(1)
	}
}

func newLogger(level string) *slog.Logger {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		l = slog.LevelInfo
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: l}))
}

// run starts every component and stops them in reverse order when ctx ends.
func run(ctx context.Context, cfg config, log *slog.Logger) error {
	mopt := meta.DefaultOptions()
	mopt.DSN, mopt.MaxOpenConns, mopt.QueryTimeout = cfg.PostgresDSN, cfg.PostgresMaxConns, cfg.QueryTimeout
	mopt.LoginMaxFailures, mopt.LoginLockout = cfg.LoginMaxFailures, cfg.LoginLockout
	store, err := meta.Open(ctx, mopt)
	if err != nil {
		return err
	}
	defer store.Close()
	if err := store.EnsureAdmin(ctx, cfg.AdminPassword); err != nil {
		return err
	}

	loc := time.Local
	if cfg.TimeZone != "" && cfg.TimeZone != "Local" {
		if loc, err = time.LoadLocation(cfg.TimeZone); err != nil {
			return fmt.Errorf("time zone: %w", err)
		}
	}
	topt := tsdb.DefaultOptions()
	topt.Addr, topt.Database, topt.TimeZone = cfg.ClickHouseAddr, cfg.ClickHouseDB, loc
	ts, err := tsdb.Open(ctx, topt)
	if err != nil {
		return err
	}
	defer ts.Close()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	// Every instance keeps the presence view (commands read it); only the
	// ingest role stores uplink traffic.
	popt := ingest.DefaultPresenceOptions()
	popt.BrokerURL, popt.Login, popt.Logger = cfg.MQTTURL, cfg.MQTTLogin, log
	presence, err := ingest.NewPresence(ctx, popt, store)
	if err != nil {
		return err
	}
	defer presence.Close()
	var ing *ingest.Ingester
	if cfg.Roles["ingest"] {
		iopt := ingest.DefaultOptions()
		iopt.BrokerURL, iopt.Login, iopt.Logger, iopt.Registerer = cfg.MQTTURL, cfg.MQTTLogin, log, reg
		if cfg.MQTTClientID != "" {
			iopt.ClientID = cfg.MQTTClientID
		}
		if cfg.IngestConnections > 0 {
			iopt.Connections = cfg.IngestConnections
		}
		if cfg.IngestWriters > 0 {
			iopt.Writers = cfg.IngestWriters
		}
		iopt.ShareGroup = cfg.MQTTShareGroup
		iopt.Writer.MaxRows, iopt.Writer.MaxBytes, iopt.Writer.FlushInterval = cfg.BatchRows, int(cfg.BatchBytes), cfg.FlushInterval
		if ing, err = ingest.New(ctx, iopt, ts, store, store); err != nil {
			return err
		}
	}

	// Commands ride on this instance's presence client; downlinks are
	// recorded through the ingest batcher when this instance ingests.
	var rec ingest.DownlinkRecorder
	if ing != nil {
		rec = ing
	}
	copt := ingest.DefaultCommandOptions()
	copt.Timeout = cfg.CommandTimeout
	cmds, err := ingest.NewCommands(presence, rec, copt)
	if err != nil {
		return err
	}
	go cmds.RunExpiry(ctx, time.Second)

	// The broker's device logins follow PostgreSQL; one instance writes
	// them at a time (the others wait to take over).
	if cfg.DeviceAuth == "dynsec" {
		syncer := dynsec.New(store, dynsec.Options{BrokerURL: cfg.MQTTURL, Username: cfg.MQTTLogin.Username,
			Password: cfg.MQTTLogin.Password, Logger: log, Registerer: reg})
		syncDone := make(chan struct{})
		sctx, stopSync := context.WithCancel(ctx)
		go func() { defer close(syncDone); syncer.Run(sctx) }()
		defer func() { stopSync(); <-syncDone }()
	}

	if cfg.RetentionMonths > 0 && ing != nil {
		go ts.RunRetention(ctx, cfg.RetentionMonths, time.Hour, log)
	}
	if cfg.PprofAddr != "" {
		go servePprof(cfg.PprofAddr, log)
	}

	var srv *api.Server
	errc := make(chan error, 1)
	if cfg.Roles["api"] {
		apiOpts := api.DefaultOptions()
		apiOpts.TokenLifetime = cfg.TokenLifetime
		srv = api.New(apiOpts, api.Deps{
			Auth:      store,
			Products:  store,
			Roles:     store,
			Devices:   store,
			Dashboard: ts,
			Models:    store,
			Commands:  cmds,
			Health: map[string]func(context.Context) error{
				"postgres":   store.Ping,
				"clickhouse": func(ctx context.Context) error { return ts.Conn().Ping(ctx) },
			},
			Logger:   log,
			Registry: reg,
			Gatherer: reg,
		})
		go func() { errc <- srv.Listen(cfg.HTTPAddr) }()
		log.Info("devicehub listening", "http", cfg.HTTPAddr)
	}
	log.Info("devicehub started", "roles", cfg.RolesText, "mqtt", cfg.MQTTURL, "clickhouse", cfg.ClickHouseAddr)

	var runErr error
	select {
	case err := <-errc:
		runErr = fmt.Errorf("http: %w", err)
	case <-ctx.Done():
	}
	// Stop in order: HTTP, then ingest (drain, flush, ack), then the
	// deferred presence client and database handles.
	log.Info("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	if srv != nil && runErr == nil {
		if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
			runErr = err
		}
	}
	if ing != nil {
		if err := ing.Close(sctx); err != nil {
			runErr = errors.Join(runErr, err)
		}
	}
	return runErr
}

// config is every setting, each with a default that works with `make run`.
type config struct {
	HTTPAddr         string
	PostgresDSN      string
	PostgresMaxConns int
	QueryTimeout     time.Duration
	AdminPassword    string
	TokenLifetime    time.Duration
	ShutdownTimeout  time.Duration
	LogLevel         string
	CommandTimeout   time.Duration
	LoginMaxFailures int
	LoginLockout     time.Duration

	ClickHouseAddr    string
	ClickHouseDB      string
	TimeZone          string
	MQTTURL           string
	MQTTClientID      string
	MQTTLogin         ingest.Login
	DeviceAuth        string
	MQTTShareGroup    string
	IngestConnections int
	IngestWriters     int
	BatchRows         int
	BatchBytes        int64
	FlushInterval     time.Duration
	RetentionMonths   int
	PprofAddr         string
	MemoryLimit       int64
	RolesText         string
	Roles             map[string]bool
}

// loadConfig reads DEVICEHUB_* variables through getenv, then flags.
func loadConfig(args []string, getenv func(string) string) (config, error) {
	fs := flag.NewFlagSet("devicehub", flag.ContinueOnError)
	env := func(name, def string) string {
		if v := getenv("DEVICEHUB_" + name); v != "" {
			return v
		}
		return def
	}
	envDur := func(name string, def time.Duration) time.Duration {
		if d, err := time.ParseDuration(getenv("DEVICEHUB_" + name)); err == nil {
			return d
		}
		return def
	}
	envInt := func(name string, def int) int {
		if n, err := strconv.Atoi(getenv("DEVICEHUB_" + name)); err == nil {
			return n
		}
		return def
	}
	var c config
	fs.StringVar(&c.HTTPAddr, "http-addr", env("HTTP_ADDR", "127.0.0.1:8848"), "HTTP listen address (DEVICEHUB_HTTP_ADDR)")
	fs.StringVar(&c.PostgresDSN, "postgres-dsn", env("POSTGRES_DSN", meta.DefaultOptions().DSN), "PostgreSQL DSN (DEVICEHUB_POSTGRES_DSN)")
	fs.IntVar(&c.PostgresMaxConns, "postgres-max-conns", 32, "PostgreSQL connection pool size")
	fs.DurationVar(&c.QueryTimeout, "query-timeout", envDur("QUERY_TIMEOUT", 5*time.Second), "timeout of each database call (DEVICEHUB_QUERY_TIMEOUT)")
	fs.StringVar(&c.AdminPassword, "admin-password", env("ADMIN_PASSWORD", "admin123"), "password of the admin user created on first start (DEVICEHUB_ADMIN_PASSWORD)")
	fs.DurationVar(&c.TokenLifetime, "token-lifetime", envDur("TOKEN_LIFETIME", 30*time.Minute), "sliding lifetime of a login token (DEVICEHUB_TOKEN_LIFETIME)")
	fs.DurationVar(&c.ShutdownTimeout, "shutdown-timeout", envDur("SHUTDOWN_TIMEOUT", 15*time.Second), "how long shutdown may drain (DEVICEHUB_SHUTDOWN_TIMEOUT)")
	fs.IntVar(&c.LoginMaxFailures, "login-max-failures", envInt("LOGIN_MAX_FAILURES", 5), "failed logins in a row, for one username from one client address, that lock that address out of it; 0 disables (DEVICEHUB_LOGIN_MAX_FAILURES)")
	fs.DurationVar(&c.LoginLockout, "login-lockout", envDur("LOGIN_LOCKOUT", 10*time.Minute), "how long a login lock lasts (DEVICEHUB_LOGIN_LOCKOUT)")
	fs.DurationVar(&c.CommandTimeout, "command-timeout", envDur("COMMAND_TIMEOUT", 10*time.Second), "default wait for a device's reply (DEVICEHUB_COMMAND_TIMEOUT)")
	fs.StringVar(&c.LogLevel, "log-level", env("LOG_LEVEL", "info"), "debug, info, warn or error (DEVICEHUB_LOG_LEVEL)")
	fs.StringVar(&c.ClickHouseAddr, "clickhouse-addr", env("CLICKHOUSE_ADDR", tsdb.DefaultOptions().Addr), "ClickHouse native address (DEVICEHUB_CLICKHOUSE_ADDR)")
	fs.StringVar(&c.ClickHouseDB, "clickhouse-db", env("CLICKHOUSE_DB", tsdb.DefaultOptions().Database), "ClickHouse database (DEVICEHUB_CLICKHOUSE_DB)")
	fs.StringVar(&c.TimeZone, "timezone", env("TIMEZONE", "Local"), "platform time zone, an IANA name (DEVICEHUB_TIMEZONE)")
	fs.StringVar(&c.MQTTURL, "mqtt-url", env("MQTT_URL", ingest.DefaultOptions().BrokerURL), "MQTT broker (DEVICEHUB_MQTT_URL)")
	fs.StringVar(&c.MQTTLogin.Username, "mqtt-username", env("MQTT_USERNAME", ingest.DefaultLogin.Username), "devicehub's login at the broker, with the dynamic-security plugin's admin rights (DEVICEHUB_MQTT_USERNAME)")
	fs.StringVar(&c.MQTTLogin.Password, "mqtt-password", env("MQTT_PASSWORD", ingest.DefaultLogin.Password), "password of -mqtt-username (DEVICEHUB_MQTT_PASSWORD)")
	fs.StringVar(&c.DeviceAuth, "device-auth", env("DEVICE_AUTH", "dynsec"), "how the broker learns device logins: dynsec (devicehub keeps Mosquitto's dynamic-security plugin in sync) or none (the broker reads them itself, e.g. EMQX from PostgreSQL) (DEVICEHUB_DEVICE_AUTH)")
	fs.StringVar(&c.MQTTClientID, "mqtt-client-id", env("MQTT_CLIENT_ID", ""), "ingest client id prefix, stable per instance (DEVICEHUB_MQTT_CLIENT_ID; default devicehub-ingest-<hostname>)")
	fs.StringVar(&c.MQTTShareGroup, "mqtt-share-group", env("MQTT_SHARE_GROUP", ingest.NoShareGroup), "shared-subscription group that several ingest instances join to split the traffic; \"none\" (one instance) subscribes plainly with one connection, which Mosquitto keeps across its restarts (DEVICEHUB_MQTT_SHARE_GROUP)")
	fs.IntVar(&c.IngestConnections, "ingest-connections", envInt("INGEST_CONNECTIONS", 0), "subscriber connections sharing the uplink subscription; 0 is ingest's default, one per two cores (DEVICEHUB_INGEST_CONNECTIONS)")
	fs.IntVar(&c.IngestWriters, "ingest-writers", envInt("INGEST_WRITERS", 0), "concurrent ClickHouse insert streams; 0 is ingest's default, 1 (DEVICEHUB_INGEST_WRITERS)")
	fs.IntVar(&c.BatchRows, "ingest-batch-rows", envInt("INGEST_BATCH_ROWS", tsdb.DefaultWriterOptions().MaxRows), "ClickHouse insert at this many buffered rows (DEVICEHUB_INGEST_BATCH_ROWS)")
	fs.DurationVar(&c.FlushInterval, "ingest-flush-interval", envDur("INGEST_FLUSH_INTERVAL", tsdb.DefaultWriterOptions().FlushInterval), "ClickHouse insert at least this often (DEVICEHUB_INGEST_FLUSH_INTERVAL)")
	fs.IntVar(&c.RetentionMonths, "retention-months", envInt("RETENTION_MONTHS", 0), "drop monthly partitions of messages and property values older than this many months; 0 keeps everything (DEVICEHUB_RETENTION_MONTHS)")
	batchBytes := fs.String("ingest-batch-bytes", env("INGEST_BATCH_BYTES", "32MiB"), "ClickHouse insert as soon as the buffered rows take this much memory, payloads and unacknowledged QoS 1 messages included (KiB, MiB, GiB suffixes); raise it with -ingest-batch-rows (DEVICEHUB_INGEST_BATCH_BYTES)")
	memLimit := fs.String("memory-limit", env("MEMORY_LIMIT", "160MiB"), "soft memory limit of the Go runtime (KiB, MiB, GiB suffixes; 0: none); GOMEMLIMIT, when set, wins (DEVICEHUB_MEMORY_LIMIT)")
	fs.StringVar(&c.PprofAddr, "pprof-addr", env("PPROF_ADDR", ""), "serve net/http/pprof on this address, e.g. 127.0.0.1:6060; empty: off (DEVICEHUB_PPROF_ADDR)")
	fs.StringVar(&c.RolesText, "roles", env("ROLES", "api,ingest"), "comma-separated roles of this instance: api, ingest (DEVICEHUB_ROLES)")
	err := fs.Parse(args)
	if err != nil {
		return config{}, err
	}
	c.Roles = map[string]bool{}
	for _, r := range strings.Split(c.RolesText, ",") {
		switch r = strings.TrimSpace(r); r {
		case "api", "ingest":
			c.Roles[r] = true
		case "":
		default:
			return config{}, fmt.Errorf("unknown role %q (want api, ingest)", r)
		}
	}
	if c.DeviceAuth != "dynsec" && c.DeviceAuth != "none" {
		return config{}, fmt.Errorf("-device-auth must be dynsec or none, not %q", c.DeviceAuth)
	}
	if len(c.Roles) == 0 {
		return config{}, errors.New("no role: -roles needs api, ingest or both")
	}
	if c.IngestConnections < 0 || c.IngestWriters < 0 {
		return config{}, errors.New("-ingest-connections and -ingest-writers must be 0 (the default) or more")
	}
	if c.BatchRows <= 0 || c.FlushInterval <= 0 {
		return config{}, errors.New("-ingest-batch-rows and -ingest-flush-interval must be positive")
	}
	if c.BatchRows > tsdb.MaxBatchRows {
		return config{}, fmt.Errorf("-ingest-batch-rows must be at most %d (one ClickHouse INSERT stays one part)", tsdb.MaxBatchRows)
	}
	if c.BatchBytes, err = parseBytes(*batchBytes); err != nil {
		return config{}, fmt.Errorf("-ingest-batch-bytes: %w", err)
	}
	if c.BatchBytes <= 0 || c.BatchBytes > tsdb.MaxBatchBytes {
		return config{}, fmt.Errorf("-ingest-batch-bytes must be 1 to %d bytes (1GiB)", tsdb.MaxBatchBytes)
	}
	if c.MemoryLimit, err = parseBytes(*memLimit); err != nil {
		return config{}, fmt.Errorf("-memory-limit: %w", err)
	}
	if c.RetentionMonths < 0 {
		return config{}, errors.New("-retention-months must be 0 (keep everything) or more")
	}
	return c, nil
}

// servePprof serves the runtime profiles of net/http/pprof, for operators
// who opt in with -pprof-addr (keep it on loopback).
func servePprof(addr string, log *slog.Logger) {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	log.Info("pprof listening", "addr", addr)
	srv := &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	if err := srv.ListenAndServe(); err != nil {
		log.Error("pprof", "err", err)
	}
}

// parseBytes reads a size such as 192MiB, 1GiB, 512KiB or a plain byte
// count.
func parseBytes(s string) (int64, error) {
	orig := s
	s = strings.TrimSpace(s)
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}} {
		if v, ok := strings.CutSuffix(s, u.suffix); ok {
			s, mult = v, u.mult
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 || n > math.MaxInt64/mult {
		return 0, fmt.Errorf("%q is not a size like 192MiB", orig)
	}
	return n * mult, nil
}
