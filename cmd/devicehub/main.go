// Command devicehub runs the platform: the HTTP API and MQTT ingest, in one
// process by default; -roles lets an instance run only one of them. Configuration comes from DEVICEHUB_*
// environment variables; flags of the same name override them.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/pprof"
	"net/netip"
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
	"devicehub/ingest/alarm"
	"devicehub/ingest/devauth"
	"devicehub/ingest/forward"
	"devicehub/ingest/link"
	"devicehub/ingest/mqttconn"
	"devicehub/ingest/notify"
	"devicehub/meta"
	"devicehub/tsdb"
)

func main() {
	cfg, code := parseCommandLine(os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	if code >= 0 {
		os.Exit(code)
	}
	log := newLogger(os.Stderr, cfg.LogFormat, cfg.LogLevel)
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

// parseCommandLine loads the configuration. It returns the exit code when
// the process ends here: 0 after -h, -help or -version, 2 after a malformed
// setting; -1 when the server should start.
func parseCommandLine(args []string, getenv func(string) string, stdout, stderr io.Writer) (config, int) {
	cfg, err := loadConfig(args, getenv)
	switch {
	case errors.Is(err, flag.ErrHelp):
		writeUsage(stdout)
		return config{}, 0
	case errors.Is(err, errVersion):
		fmt.Fprintln(stdout, versionText())
		return config{}, 0
	case err != nil:
		fmt.Fprintf(stderr, "devicehub: %v\nRun devicehub -h for the settings.\n", err)
		return config{}, 2
	}
	return cfg, -1
}

// devAdminPassword is the admin's password on a first start without
// DEVICEHUB_ADMIN_PASSWORD: the one README's `make run` signs in with.
const devAdminPassword = "admin123"

// warnDefaultAdmin logs a warning at every start while the admin user's
// password is still devAdminPassword (one bcrypt check), whatever the
// setting says now: anyone who read README can sign in as administrator.
func warnDefaultAdmin(ctx context.Context, store *meta.Store, log *slog.Logger) {
	def, err := store.HasPassword(ctx, "admin", devAdminPassword)
	if err != nil {
		log.Warn("could not check the admin password against the development default", "err", err)
		return
	}
	if def {
		// The password itself is not logged: no password ever is.
		log.Warn("the admin user's password is the development default, the one README gives: " +
			"change it (PUT /api/user/passwd, or the console: your account) before anyone else can reach this server")
	}
}

// tsdbConvertLock is the advisory lock key of tsdb's conversions.
const tsdbConvertLock = 0x636f6e76657274 // "convert"

// run starts every component and stops them in reverse order when ctx ends.
func run(ctx context.Context, cfg config, log *slog.Logger) error {
	mopt := meta.DefaultOptions()
	mopt.DSN, mopt.MaxOpenConns, mopt.QueryTimeout = cfg.PostgresDSN, cfg.PostgresMaxConns, cfg.QueryTimeout
	mopt.LoginMaxFailures, mopt.LoginLockout = cfg.LoginMaxFailures, cfg.LoginLockout
	mopt.PageCacheTTL = cfg.PageCacheTTL
	// No device's secureId may be devicehub's own broker login.
	mopt.ReservedLogins = []string{cfg.MQTTLogin.Username}
	store, err := meta.Open(ctx, mopt)
	if err != nil {
		return err
	}
	defer store.Close()
	if err := store.EnsureAdmin(ctx, cfg.AdminPassword); err != nil {
		return err
	}
	warnDefaultAdmin(ctx, store, log)

	loc := time.Local
	if cfg.TimeZone != "" && cfg.TimeZone != "Local" {
		if loc, err = time.LoadLocation(cfg.TimeZone); err != nil {
			return fmt.Errorf("time zone: %w", err)
		}
	}
	topt := tsdb.DefaultOptions()
	topt.Addr, topt.Database, topt.TimeZone = cfg.ClickHouseAddr, cfg.ClickHouseDB, loc
	topt.Username, topt.Password = cfg.ClickHouseUser, cfg.ClickHousePassword
	topt.Cluster = cfg.ClickHouseCluster
	// Instances starting together on a database still in an older layout
	// take turns converting it (tsdb/convert.go): PostgreSQL is what they
	// all share.
	topt.ConvertLock = func(ctx context.Context) (<-chan struct{}, func(), error) {
		return store.Lock(ctx, tsdbConvertLock)
	}
	ts, err := tsdb.Open(ctx, topt)
	if err != nil {
		return err
	}
	defer ts.Close()
	if cfg.Roles["api"] {
		// The dashboards' kept months, loaded before they are asked for
		// (tsdb/warm.go), off the start's path.
		go func() {
			st, err := ts.Warm(ctx)
			if err != nil && ctx.Err() == nil {
				log.Warn("tsdb: warming the kept months stopped; questions load the rest", "err", err, "months", st.Chunks)
				return
			}
			log.Info("tsdb: kept months warmed", "months", st.Chunks, "took", st.Took.Round(time.Millisecond))
		}()
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), buildInfo())

	// Every instance keeps the device link (presence view and commands);
	// only the ingest role builds the uplink pipeline and stores traffic.
	popt := link.DefaultPresenceOptions()
	popt.BrokerURL, popt.Login, popt.Logger, popt.Registerer = cfg.MQTTURL, cfg.MQTTLogin, log, reg
	presence, err := link.NewPresence(ctx, popt, store)
	if err != nil {
		return err
	}
	defer presence.Close()
	// Live updates: this instance's stored values and presence changes,
	// and through PostgreSQL the values other instances store (live.go).
	hub, stopLive, err := startLive(ctx, cfg.PostgresDSN, log, reg)
	if err != nil {
		return err
	}
	defer stopLive()
	presence.OnPresenceChange(hub.PresenceChanged)
	// Alarm transitions and shadow changes reach every instance's live
	// subscribers over PostgreSQL (alarms.go).
	relay, stopRelay, err := startEventRelay(ctx, cfg.PostgresDSN, hub, log)
	if err != nil {
		return err
	}
	defer stopRelay()
	// Devices' shadows (cmd/devicehub/shadow.go): closed after ingest.
	// They and firmware updates send once the command path is built
	// (late.go).
	late := newLateCommands()
	shadows := newShadows(store, ts, cfg, late, relay.shadowChanged)
	defer shadows.Close()
	// Firmware updates (cmd/devicehub/firmware.go): reports from ingest.
	fw, err := newFirmware(ctx, store, cfg, log, reg, late, relay.firmwareChanged)
	if err != nil {
		return err
	}
	defer fw.Close()
	var ing *ingest.Ingester
	// With one ingest session for the installation (no share group), the
	// alarm evaluator reads what ingest reads (alarm.Feed) instead of a
	// second session of its own.
	var alarmFeed *alarm.Feed
	if cfg.Alarms && cfg.Roles["ingest"] && cfg.MQTTShareGroup == ingest.NoShareGroup {
		alarmFeed = alarm.NewFeed(0)
	}
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
		iopt.Live = hub
		iopt.Shadow = shadows // births and shadow requests
		iopt.Firmware = fw    // firmware progress and versions
		if alarmFeed != nil {
			iopt.Alarms = alarmFeed // reports, events, births and wills
		}
		iopt.Writer.MaxRows, iopt.Writer.MaxBytes, iopt.Writer.FlushInterval = cfg.BatchRows, int(cfg.BatchBytes), cfg.FlushInterval
		if ing, err = ingest.New(ctx, iopt, ts, store, store); err != nil {
			return err
		}
	}

	// Commands ride on this instance's presence client; downlinks are
	// recorded through the ingest batcher when this instance ingests.
	var rec link.DownlinkRecorder
	if ing != nil {
		rec = ing
	}
	copt := link.DefaultCommandOptions()
	copt.Timeout, copt.Registerer = cfg.CommandTimeout, reg
	cmds, err := link.NewCommands(presence, rec, copt)
	if err != nil {
		return err
	}
	go cmds.RunExpiry(ctx, time.Second)
	late.set(cmds)
	// The firmware engine: one instance at a time paces rollouts.
	fwDone := make(chan struct{})
	fctx, stopFirmware := context.WithCancel(ctx)
	go func() { defer close(fwDone); fw.Run(fctx) }()
	defer func() { stopFirmware(); <-fwDone }()

	// The broker's device logins follow PostgreSQL: one instance feeds
	// devicehub's broker plugin at a time (the others wait to take over);
	// every instance hears what it applied, so that a device write answers
	// once the broker holds it.
	var logins api.LoginWaiter
	if cfg.DeviceAuth == "plugin" {
		syncer := devauth.New(store, devauth.Options{BrokerURL: cfg.MQTTURL, Username: cfg.MQTTLogin.Username,
			Password: cfg.MQTTLogin.Password, CheckInterval: cfg.LoginCheckInterval, Logger: log, Registerer: reg})
		logins = syncer
		syncDone := make(chan struct{})
		sctx, stopSync := context.WithCancel(ctx)
		go func() { defer close(syncDone); syncer.Run(sctx) }()
		defer func() { stopSync(); <-syncDone }()
	}

	// Alarm rules: one instance with the ingest role evaluates at a time,
	// on ingest's session without a share group, else on its own broker
	// session (ingest/alarm's doc says why either is exact).
	var alarms *alarm.Runner
	if cfg.Alarms && ing != nil {
		aopt := alarm.Options{BrokerURL: cfg.MQTTURL, Login: cfg.MQTTLogin, Retention: cfg.AlarmRetention,
			Logger: log, Registerer: reg, OnTransitions: relay.alarmTransitions}
		if alarmFeed != nil {
			aopt.Feed, aopt.FeedReady = alarmFeed, ing.BacklogDrained
		}
		if alarms, err = alarm.NewRunner(store, aopt); err != nil {
			return err
		}
		alarmDone := make(chan struct{})
		actx, stopAlarms := context.WithCancel(ctx)
		go func() { defer close(alarmDone); alarms.Run(actx) }()
		defer func() { stopAlarms(); <-alarmDone }()
	}

	// Alarm notifications: every instance with -notify delivers from the
	// shared outbox (ingest/notify's doc says why none is lost or doubled).
	if cfg.Notify {
		nopt := notify.DefaultOptions()
		nopt.Workers, nopt.MaxAttempts, nopt.Logger, nopt.Registerer = cfg.NotifyWorkers, cfg.NotifyMaxAttempts, log, reg
		nopt.DSN = cfg.PostgresDSN // woken by the outbox trigger
		dispatcher := notify.NewDispatcher(store, nopt)
		notifyDone := make(chan struct{})
		nctx, stopNotify := context.WithCancel(ctx)
		go func() { defer close(notifyDone); dispatcher.Run(nctx) }()
		defer func() { stopNotify(); <-notifyDone }()
	}

	// Forwarding telemetry: one instance with the ingest role forwards at
	// a time, on its own broker session (ingest/forward's doc says why
	// nothing is lost).
	if cfg.Forward && ing != nil {
		fwd, err := forward.New(store, forward.Options{BrokerURL: cfg.MQTTURL, Login: cfg.MQTTLogin, Dir: cfg.ForwardDir,
			MaxBytes: cfg.ForwardSpoolBytes, Logger: log, Registerer: reg})
		if err != nil {
			return err
		}
		fwdDone := make(chan struct{})
		fctx, stopForward := context.WithCancel(ctx)
		go func() { defer close(fwdDone); fwd.Run(fctx) }()
		defer func() { stopForward(); <-fwdDone }()
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
		apiOpts.CORSOrigins = cfg.CORSOrigins
		apiOpts.MetricsAllow, apiOpts.MetricsToken = cfg.MetricsAllow, cfg.MetricsToken
		apiOpts.AccessLog = cfg.AccessLog
		apiOpts.LoginWait = cfg.LoginWait
		// Readiness (/readyz): the stores, and the broker connections of
		// the roles this instance runs (brokerChecks).
		ready := map[string]func(context.Context) error{
			"postgres":   store.Ping,
			"clickhouse": func(ctx context.Context) error { return ts.Conn().Ping(ctx) },
		}
		brokerChecks(ready, presence, ing)
		srv = api.New(apiOpts, api.Deps{
			Auth:      store,
			Products:  store,
			Roles:     store,
			Devices:   store,
			Dashboard: ts,
			Models:    store,
			Commands:  cmds,
			Shadows:   shadows, // desired state (api/shadow.go)
			Logins:    logins,
			Audit:     store, // writes and logins (api/audit.go)
			Alarms:    alarm.NewStore(store),
			Health:    ready,
			Logger:    log,
			Registry:  reg,
			Gatherer:  reg,

			Live:        hub, // GET /api/live (api/live.go)
			LiveDevices: store,
			// acks and clears by hand (api/alarms.go), announced as the
			// evaluator's transitions are
			AlarmHandled: func(t alarm.Transition) { relay.alarmTransitions([]alarm.Transition{t}) },

			Notify:  notify.NewStore(store),  // channels, subscriptions, dead letters (api/notify.go)
			Forward: forward.NewStore(store), // forwarding rules and their status (api/forward.go)

			Firmware:        fw, // packages, rollouts, downloads (api/firmware.go)
			FirmwareMaxSize: int(cfg.FirmwareMaxSize),
		})
		srv.SetUserLimits(api.UserLimits{LiveStreams: cfg.LiveStreamsPerUser, Exports: cfg.ExportsPerUser})
		if cfg.AuditRetention > 0 {
			go store.RunAuditRetention(ctx, cfg.AuditRetention, time.Hour, log)
		}
		go func() { errc <- srv.Listen(cfg.HTTPAddr) }()
		log.Info("devicehub listening", "http", cfg.HTTPAddr)
	}
	log.Info("devicehub started", "roles", cfg.RolesText, "mqtt", redactURL(cfg.MQTTURL), "clickhouse", cfg.ClickHouseAddr)

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

// config is every setting, each with a default that works with `make run`;
// the table in settings.go binds each field to its flag and variable.
type config struct {
	HTTPAddr         string
	PostgresDSN      string
	PostgresMaxConns int
	QueryTimeout     time.Duration
	PageCacheTTL     time.Duration
	AdminPassword    string
	TokenLifetime    time.Duration
	ShutdownTimeout  time.Duration
	LogLevel         string
	LogFormat        string
	AccessLog        bool
	CommandTimeout   time.Duration
	LoginWait        time.Duration
	LoginMaxFailures int
	LoginLockout     time.Duration

	ClickHouseAddr     string
	ClickHouseDB       string
	ClickHouseUser     string
	ClickHousePassword string
	ClickHouseCluster  string
	TimeZone           string
	MQTTURL            string
	MQTTClientID       string
	MQTTLogin          mqttconn.Login
	DeviceAuth         string
	LoginCheckInterval time.Duration
	MQTTShareGroup     string
	IngestConnections  int
	IngestWriters      int
	BatchRows          int
	BatchBytes         int64
	FlushInterval      time.Duration
	RetentionMonths    int
	AuditRetention     time.Duration
	Alarms             bool
	AlarmRetention     time.Duration
	Notify             bool
	NotifyWorkers      int
	NotifyMaxAttempts  int
	Forward            bool
	ForwardDir         string
	ForwardSpoolBytes  int64
	PprofAddr          string
	CORSOrigins        []string
	MetricsAllow       []netip.Prefix
	MetricsToken       string
	MemoryLimit        int64

	FirmwareDir         string // firmware.go
	FirmwareMaxSize     int64
	FirmwarePublicURL   string
	FirmwareURLLifetime time.Duration

	LiveStreamsPerUser int // api.UserLimits
	ExportsPerUser     int

	RolesText string
	Roles     map[string]bool
}

// connected turns a client's connection state into a readiness check.
func connected(open func() bool) func(context.Context) error {
	return func(context.Context) error {
		if !open() {
			return errors.New("not connected to the broker")
		}
		return nil
	}
}

// brokerChecks adds the readiness checks of the broker connections: the
// presence and command client ("mqtt") and, with the ingest role (ing not
// nil), every subscriber connection ("mqtt_ingest") and their backlogs
// ("mqtt_backlog"). With a broker pool each check is per broker, named
// after it: "mqtt@host:port", "mqtt_ingest@host:port", ...
func brokerChecks(ready map[string]func(context.Context) error, presence *link.Presence, ing *ingest.Ingester) {
	brokers := presence.Brokers()
	for i, b := range brokers {
		suffix := ""
		if len(brokers) > 1 {
			suffix = "@" + mqttconn.BrokerName(b)
		}
		ready["mqtt"+suffix] = connected(func() bool { return presence.ConnectedTo(i) })
		if ing == nil {
			continue
		}
		ready["mqtt_ingest"+suffix] = connected(func() bool { return ing.ConnectedTo(i) })
		ready["mqtt_backlog"+suffix] = func(context.Context) error {
			if !ing.BacklogDrainedAt(i) {
				return errors.New("ingest: storing the backlog the broker kept")
			}
			return nil
		}
	}
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
