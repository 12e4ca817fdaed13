package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"devicehub/api"
	"devicehub/ingest"
	"devicehub/ingest/mqttconn"
	"devicehub/meta"
	"devicehub/tsdb"
)

// A setting is one configuration value: its flag, the DEVICEHUB_* variable
// the flag overrides, its default and how its text is read into config.
type setting struct {
	name string // the flag, without its dash
	env  string // the variable
	def  string // the default, in the form parse reads
	help string
	parser
}

// A parser reads a setting's text into one config field.
type parser struct {
	kind  string             // string, duration, int, size, enum, bool, level, origins, addrs or roles
	want  string             // the expected form, as in "want a duration like 5s or 1m"
	parse func(string) error // any error means the text is not of the expected form
	get   func() string      // the field's value as text
}

// settings is the table of every setting, bound to the fields of c.
func settings(c *config) []setting {
	mo, to, wo, ing := meta.DefaultOptions(), tsdb.DefaultOptions(), tsdb.DefaultWriterOptions(), ingest.DefaultOptions()
	return []setting{
		{"http-addr", "DEVICEHUB_HTTP_ADDR", "127.0.0.1:8848", "HTTP listen address", str(&c.HTTPAddr)},
		{"postgres-dsn", "DEVICEHUB_POSTGRES_DSN", mo.DSN, "PostgreSQL DSN", str(&c.PostgresDSN)},
		{"postgres-max-conns", "DEVICEHUB_POSTGRES_MAX_CONNS", strconv.Itoa(mo.MaxOpenConns), "PostgreSQL connection pool size (0 or less: unbounded)",
			integer(&c.PostgresMaxConns, math.MinInt, math.MaxInt, "an integer")},
		{"query-timeout", "DEVICEHUB_QUERY_TIMEOUT", "5s", "timeout of each database call", duration(&c.QueryTimeout, false)},
		{"page-cache-ttl", "DEVICEHUB_PAGE_CACHE_TTL", mo.PageCacheTTL.String(), "longest a product or device page is kept for the same query; pages are dropped as soon as a table they read changes; 0 keeps none",
			duration(&c.PageCacheTTL, false)},
		{"admin-password", "DEVICEHUB_ADMIN_PASSWORD", devAdminPassword, "password of the admin user created on first start", str(&c.AdminPassword)},
		{"token-lifetime", "DEVICEHUB_TOKEN_LIFETIME", "30m0s", "sliding lifetime of a login token", duration(&c.TokenLifetime, false)},
		{"shutdown-timeout", "DEVICEHUB_SHUTDOWN_TIMEOUT", "15s", "how long shutdown may drain", duration(&c.ShutdownTimeout, false)},
		{"login-max-failures", "DEVICEHUB_LOGIN_MAX_FAILURES", "5", "failed logins in a row, for one username from one client address, that lock that address out of it; 0 disables",
			integer(&c.LoginMaxFailures, math.MinInt, math.MaxInt, "an integer")},
		{"login-lockout", "DEVICEHUB_LOGIN_LOCKOUT", "10m0s", "how long a login lock lasts", duration(&c.LoginLockout, false)},
		{"command-timeout", "DEVICEHUB_COMMAND_TIMEOUT", "10s", "default wait for a device's reply", duration(&c.CommandTimeout, false)},
		{"log-level", "DEVICEHUB_LOG_LEVEL", "info", "debug, info, warn or error", level(&c.LogLevel)},
		{"log-format", "DEVICEHUB_LOG_FORMAT", "text", "log lines as text (key=value) or json (one object a line)", enum(&c.LogFormat, "text", "json")},
		{"access-log", "DEVICEHUB_ACCESS_LOG", "false",
			"log every HTTP request at level info: method, path without its query, status, duration, bytes, remote address",
			boolean(&c.AccessLog)},
		{"clickhouse-addr", "DEVICEHUB_CLICKHOUSE_ADDR", to.Addr, "ClickHouse native address; a comma-separated list names fallbacks, tried in order", str(&c.ClickHouseAddr)},
		{"clickhouse-db", "DEVICEHUB_CLICKHOUSE_DB", to.Database, "ClickHouse database", str(&c.ClickHouseDB)},
		{"clickhouse-user", "DEVICEHUB_CLICKHOUSE_USER", to.Username, "ClickHouse user", str(&c.ClickHouseUser)},
		{"clickhouse-password", "DEVICEHUB_CLICKHOUSE_PASSWORD", to.Password, "password of -clickhouse-user", str(&c.ClickHousePassword)},
		{"clickhouse-cluster", "DEVICEHUB_CLICKHOUSE_CLUSTER", to.Cluster,
			"ClickHouse cluster (of the servers' remote_servers) to spread the tables over: replicated, sharded by device, behind Distributed tables; empty: one server",
			str(&c.ClickHouseCluster)},
		{"timezone", "DEVICEHUB_TIMEZONE", "Local", "platform time zone, an IANA name", str(&c.TimeZone)},
		{"mqtt-url", "DEVICEHUB_MQTT_URL", ing.BrokerURL,
			"MQTT broker; a comma-separated list is a broker pool, each broker holding a share of the devices (devicehub connects to every one)",
			brokerList(&c.MQTTURL)},
		{"mqtt-username", "DEVICEHUB_MQTT_USERNAME", ing.Login.Username, "devicehub's login at the broker, with the dynamic-security plugin's admin rights",
			str(&c.MQTTLogin.Username)},
		{"mqtt-password", "DEVICEHUB_MQTT_PASSWORD", ing.Login.Password, "password of -mqtt-username", str(&c.MQTTLogin.Password)},
		{"device-auth", "DEVICEHUB_DEVICE_AUTH", "plugin",
			"how the broker learns device logins: plugin (devicehub feeds its own Mosquitto plugin, ingest/devauth) or none (the broker reads them itself, e.g. EMQX from PostgreSQL)",
			enum(&c.DeviceAuth, "plugin", "none")},
		{"login-wait", "DEVICEHUB_LOGIN_WAIT", "5s",
			"how long a device write (deploy, undeploy, rotation, update, bulk) waits for the broker to hold its login change before it answers 503 broker_timeout (the change is stored and applied once the broker answers)",
			duration(&c.LoginWait, true)},
		{"login-check-interval", "DEVICEHUB_LOGIN_CHECK_INTERVAL", "30s",
			"how often the leader compares the count and digest of this installation's device logins in each broker's plugin with what it synced (syncing them again at once on a difference) and refreshes the usernames reserved for the broker's other logins",
			duration(&c.LoginCheckInterval, true)},
		{"mqtt-client-id", "DEVICEHUB_MQTT_CLIENT_ID", "", "ingest client id prefix, stable per instance; empty: devicehub-ingest-<hostname>", str(&c.MQTTClientID)},
		{"mqtt-share-group", "DEVICEHUB_MQTT_SHARE_GROUP", ingest.NoShareGroup,
			"shared-subscription group that several ingest instances join to split the traffic; \"none\" (one instance) subscribes plainly with one connection, which Mosquitto keeps across its restarts",
			str(&c.MQTTShareGroup)},
		{"ingest-connections", "DEVICEHUB_INGEST_CONNECTIONS", "0", "subscriber connections sharing the uplink subscription; 0 is ingest's default, one per two cores",
			integer(&c.IngestConnections, 0, math.MaxInt, "an integer, 0 (the default) or more")},
		{"ingest-writers", "DEVICEHUB_INGEST_WRITERS", "0", "concurrent ClickHouse insert streams; 0 is ingest's default, 1",
			integer(&c.IngestWriters, 0, math.MaxInt, "an integer, 0 (the default) or more")},
		{"ingest-batch-rows", "DEVICEHUB_INGEST_BATCH_ROWS", strconv.Itoa(wo.MaxRows), "ClickHouse insert at this many buffered rows",
			integer(&c.BatchRows, 1, tsdb.MaxBatchRows, fmt.Sprintf("an integer from 1 to %d (one ClickHouse INSERT stays one part)", tsdb.MaxBatchRows))},
		{"ingest-batch-bytes", "DEVICEHUB_INGEST_BATCH_BYTES", "32MiB",
			"ClickHouse insert as soon as the buffered rows take this much memory, payloads and unacknowledged QoS 1 messages included; raise it with -ingest-batch-rows",
			size(&c.BatchBytes, 1, tsdb.MaxBatchBytes, "a size from 1 byte to 1GiB like 32MiB (KiB, MiB, GiB suffixes)")},
		{"ingest-flush-interval", "DEVICEHUB_INGEST_FLUSH_INTERVAL", wo.FlushInterval.String(), "ClickHouse insert at least this often",
			duration(&c.FlushInterval, true)},
		{"retention-months", "DEVICEHUB_RETENTION_MONTHS", "0", "drop monthly partitions of messages and property values older than this many months; 0 keeps everything",
			integer(&c.RetentionMonths, 0, math.MaxInt, "an integer, 0 (keep everything) or more")},
		{"audit-retention", "DEVICEHUB_AUDIT_RETENTION", "2160h0m0s", "how long the audit trail (writes and logins) is kept, e.g. 2160h for 90 days; older entries are deleted hourly; 0 keeps everything",
			duration(&c.AuditRetention, false)},
		{"alarms", "DEVICEHUB_ALARMS", "true", "evaluate alarm rules on an instance with the ingest role (one such instance at a time evaluates; the others stand by)",
			boolean(&c.Alarms)},
		{"alarm-retention", "DEVICEHUB_ALARM_RETENTION", "2160h0m0s", "how long cleared alarms and their transitions are kept, e.g. 2160h for 90 days; older ones are deleted hourly; 0 keeps everything",
			duration(&c.AlarmRetention, false)},
		{"notify", "DEVICEHUB_NOTIFY", "true", "deliver alarm notifications from this instance (every instance that does shares the outbox; one at a time schedules escalations and reminders)",
			boolean(&c.Notify)},
		{"notify-workers", "DEVICEHUB_NOTIFY_WORKERS", "4", "notifications this instance sends at once (each holds a PostgreSQL connection while sending)",
			integer(&c.NotifyWorkers, 1, 256, "an integer from 1 to 256")},
		{"notify-max-attempts", "DEVICEHUB_NOTIFY_MAX_ATTEMPTS", "10", "delivery attempts of a notification (retries with exponential backoff from 1s up to 10m) before it becomes a dead letter",
			integer(&c.NotifyMaxAttempts, 1, 1000, "an integer from 1 to 1000")},
		{"memory-limit", "DEVICEHUB_MEMORY_LIMIT", "160MiB", "soft memory limit of the Go runtime (0: none); GOMEMLIMIT, when set, wins",
			size(&c.MemoryLimit, 0, math.MaxInt64, "a size like 160MiB (KiB, MiB, GiB suffixes; 0: none)")},
		{"cors-origins", "DEVICEHUB_CORS_ORIGINS", "", "comma-separated browser origins allowed to call the API (CORS), e.g. https://console.example.com; empty: none, no CORS headers",
			origins(&c.CORSOrigins)},
		{"metrics-allow", "DEVICEHUB_METRICS_ALLOW", api.DefaultMetricsAllow,
			"comma-separated IP addresses and CIDR prefixes whose clients may read GET /metrics without a token (the TCP peer's address); none: no address",
			addressList(&c.MetricsAllow)},
		{"metrics-token", "DEVICEHUB_METRICS_TOKEN", "", "a bearer token that also lets a client read GET /metrics (Authorization: Bearer <token>), from any address; empty: none",
			str(&c.MetricsToken)},
		{"pprof-addr", "DEVICEHUB_PPROF_ADDR", "", "serve net/http/pprof on this address, e.g. 127.0.0.1:6060; empty: off", str(&c.PprofAddr)},
		{"roles", "DEVICEHUB_ROLES", "api,ingest", "comma-separated roles of this instance: api, ingest", roles(c)},
		{"live-streams-per-user", "DEVICEHUB_LIVE_STREAMS_PER_USER", strconv.Itoa(api.DefaultUserLimits().LiveStreams),
			"live streams (GET /api/live) one user, by all its logins and keys, may hold open on an instance at once; more are refused with 429",
			integer(&c.LiveStreamsPerUser, 1, math.MaxInt, "an integer, 1 or more")},
		{"exports-per-user", "DEVICEHUB_EXPORTS_PER_USER", strconv.Itoa(api.DefaultUserLimits().Exports),
			"exports (POST /api/dashboard/_export) one user, by all its logins and keys, may run on an instance at once (an instance runs 4); more are refused with 429",
			integer(&c.ExportsPerUser, 1, math.MaxInt, "an integer, 1 or more")},
	}
}

func str(p *string) parser {
	return parser{kind: "string", want: "text",
		parse: func(s string) error { *p = s; return nil },
		get:   func() string { return *p }}
}

// duration reads a time.Duration; positive rejects zero and less.
func duration(p *time.Duration, positive bool) parser {
	want := "a duration like 5s or 1m"
	if positive {
		want = "a positive duration like 5s or 1m"
	}
	return parser{kind: "duration", want: want,
		parse: func(s string) error {
			d, err := time.ParseDuration(s)
			if err == nil && positive && d <= 0 {
				err = errors.New("not positive")
			}
			if err == nil {
				*p = d
			}
			return err
		},
		get: func() string { return p.String() }}
}

// integer reads a decimal int from lo to hi.
func integer(p *int, lo, hi int, want string) parser {
	return parser{kind: "int", want: want,
		parse: func(s string) error {
			n, err := strconv.Atoi(s)
			if err == nil && (n < lo || n > hi) {
				err = errors.New("out of range")
			}
			if err == nil {
				*p = n
			}
			return err
		},
		get: func() string { return strconv.Itoa(*p) }}
}

// size reads a byte count (see parseBytes) from lo to hi.
func size(p *int64, lo, hi int64, want string) parser {
	return parser{kind: "size", want: want,
		parse: func(s string) error {
			n, err := parseBytes(s)
			if err == nil && (n < lo || n > hi) {
				err = errors.New("out of range")
			}
			if err == nil {
				*p = n
			}
			return err
		},
		get: func() string { return strconv.FormatInt(*p, 10) }}
}

// enum reads one of allowed.
func enum(p *string, allowed ...string) parser {
	want := strings.Join(allowed[:len(allowed)-1], ", ") + " or " + allowed[len(allowed)-1]
	return parser{kind: "enum", want: want,
		parse: func(s string) error {
			for _, a := range allowed {
				if s == a {
					*p = s
					return nil
				}
			}
			return errors.New("not allowed")
		},
		get: func() string { return *p }}
}

// boolean reads true or false (and the other forms of strconv.ParseBool:
// 1, 0, t, f, TRUE, False...); as a flag it may be given alone (-access-log).
func boolean(p *bool) parser {
	return parser{kind: "bool", want: "true or false",
		parse: func(s string) error {
			b, err := strconv.ParseBool(s)
			if err == nil {
				*p = b
			}
			return err
		},
		get: func() string { return strconv.FormatBool(*p) }}
}

// origins reads a comma-separated list of CORS origins as
// api.ParseCORSOrigins does, normalised.
func origins(p *[]string) parser {
	return parser{kind: "origins", want: "comma-separated origins scheme://host[:port] like https://console.example.com, or * alone",
		parse: func(s string) error {
			o, err := api.ParseCORSOrigins(s)
			if err == nil {
				*p = o
			}
			return err
		},
		get: func() string { return strings.Join(*p, ",") }}
}

// addressList reads a comma-separated list of IP addresses and CIDR
// prefixes as api.ParseAddressList does, normalised; none is none.
func addressList(p *[]netip.Prefix) parser {
	return parser{kind: "addrs", want: "comma-separated IP addresses or CIDR prefixes like 10.0.0.0/8,::1, or none",
		parse: func(s string) error {
			a, err := api.ParseAddressList(s)
			if err == nil {
				*p = a
			}
			return err
		},
		get: func() string {
			if len(*p) == 0 {
				return "none"
			}
			out := make([]string, len(*p))
			for i, a := range *p {
				out[i] = a.String()
			}
			return strings.Join(out, ",")
		}}
}

// brokerList reads one broker URL or a comma-separated pool of them
// (mqttconn.Brokers), kept as written.
func brokerList(p *string) parser {
	return parser{kind: "brokers", want: "a broker URL like tcp://127.0.0.1:1884, or several comma-separated",
		parse: func(s string) error {
			if _, err := mqttconn.Brokers(s); err != nil {
				return err
			}
			*p = s
			return nil
		},
		get: func() string { return *p }}
}

// level reads a log level as slog.Level does (debug, info, warn, error,
// any case, with an optional offset like warn+2).
func level(p *string) parser {
	return parser{kind: "level", want: "debug, info, warn or error",
		parse: func(s string) error {
			var l slog.Level
			if err := l.UnmarshalText([]byte(s)); err != nil {
				return err
			}
			*p = s
			return nil
		},
		get: func() string { return *p }}
}

// roles reads a comma-separated list of api and ingest into c.Roles, with
// the text in c.RolesText.
func roles(c *config) parser {
	return parser{kind: "roles", want: "api, ingest or both, comma-separated",
		parse: func(s string) error {
			m := map[string]bool{}
			for _, r := range strings.Split(s, ",") {
				switch r = strings.TrimSpace(r); r {
				case "api", "ingest":
					m[r] = true
				case "":
				default:
					return fmt.Errorf("unknown role %q", r)
				}
			}
			if len(m) == 0 {
				return errors.New("no role")
			}
			c.Roles, c.RolesText = m, s
			return nil
		},
		get: func() string { return c.RolesText }}
}

// errVersion is what loadConfig returns for -version.
var errVersion = errors.New("version requested")

// settingValue is a setting as a flag.Value; a malformed flag value is kept
// in *bad so that loadConfig reports it in its own words.
type settingValue struct {
	s   *setting
	bad *error
}

func (v settingValue) String() string {
	if v.s == nil {
		return ""
	}
	return v.s.get()
}

// IsBoolFlag lets a bool setting be given as a flag alone (-access-log).
func (v settingValue) IsBoolFlag() bool { return v.s != nil && v.s.kind == "bool" }

func (v settingValue) Set(text string) error {
	if err := v.s.parse(text); err != nil {
		*v.bad = malformed("-"+v.s.name, text, v.s.want)
		return *v.bad
	}
	return nil
}

func malformed(source, text, want string) error {
	return fmt.Errorf("%s=%q: want %s", source, text, want)
}

// loadConfig reads each setting's default, then its DEVICEHUB_* variable
// through getenv (an empty one counts as unset), then its flag in args. A
// malformed variable or flag is an error naming it and the expected form.
// It returns flag.ErrHelp for -h or -help and errVersion for -version,
// whatever the variables hold.
func loadConfig(args []string, getenv func(string) string) (config, error) {
	var c config
	fs := flag.NewFlagSet("devicehub", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	var envErr, badFlag error
	table := settings(&c)
	for i := range table {
		s := &table[i]
		if err := s.parse(s.def); err != nil {
			panic(fmt.Sprintf("devicehub: default of -%s: %v", s.name, err))
		}
		if v := getenv(s.env); v != "" {
			if err := s.parse(v); err != nil && envErr == nil {
				envErr = malformed(s.env, v, s.want)
			}
		}
		fs.Var(settingValue{s, &badFlag}, s.name, s.help)
	}
	version := fs.Bool("version", false, "print the version and exit")
	err := fs.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		return config{}, err
	case err == nil && *version:
		return config{}, errVersion
	case envErr != nil:
		return config{}, envErr
	case badFlag != nil:
		return config{}, badFlag
	case err != nil:
		return config{}, err
	case fs.NArg() > 0:
		return config{}, fmt.Errorf("unexpected argument %q (settings are flags like -http-addr=:8848)", fs.Arg(0))
	}
	return c, nil
}

// writeUsage lists every setting with its variable and default.
func writeUsage(w io.Writer) {
	fmt.Fprint(w, "Usage: devicehub [-flag=value ...]\n\n"+
		"Each setting is read from its DEVICEHUB_* variable; the flag of the same name overrides it.\n\n")
	for _, s := range settings(new(config)) {
		def := s.def
		if def == "" {
			def = "empty"
		}
		fmt.Fprintf(w, "  -%s %s\n        %s (default %s)\n        %s\n", s.name, s.kind, s.env, def, s.help)
	}
	fmt.Fprint(w, "  -version\n        print the version and exit\n  -h, -help\n        print this help and exit\n")
}
