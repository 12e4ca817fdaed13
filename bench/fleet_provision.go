package bench

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"devicehub/ingest/devauth"
	"devicehub/ingest/dynsec"
	"devicehub/ingest/mqttconn"
)

// fleetEnv is what phases 1-5 share: the private broker with devicehub's
// plugin, the devicehub child (roles api, -device-auth plugin) on a
// PostgreSQL database of its own, and the devices provisioned in phase 1.
type fleetEnv struct {
	p      FleetParams
	broker *fleetBroker
	// pool: every broker devicehub connects to (fleet-connect's broker
	// pool), broker first; nil: broker alone.
	pool  []*fleetBroker
	tmp   string
	bin   string
	db    *pgDatabase
	child *childAPI // the running child: the run's goroutine only; others read current
	// current is child for the samplers' goroutines, nil between
	// children; childPID its pid, 0 between children.
	current       atomic.Pointer[childAPI]
	childPID      atomic.Int64
	adminPassword string
	backends      func() []int
	chPID         int
	product       string
	seed          string       // of the devices' keys (fleetKey)
	logins        []fleetLogin // phase 1's devices, as provisioned
}

// procs are the processes a phase with the plugin accounts for.
func (e *fleetEnv) procs(extra ...fleetProc) []fleetProc {
	ps := []fleetProc{
		{name: "bench (clients, devices)", pid: os.Getpid},
		{name: "devicehub (child)", pid: func() int { return int(e.childPID.Load()) }},
		{name: "mosquitto (devicehub plugin)", group: e.brokerPIDs},
	}
	if e.backends != nil {
		ps = append(ps, fleetProc{name: "postgres (backends of the run's db)", group: e.backends})
	}
	if e.chPID > 0 {
		ch := e.chPID
		ps = append(ps, fleetProc{name: "clickhouse-server", pid: func() int { return ch }})
	}
	return append(ps, extra...)
}

// brokers are the brokers devicehub connects to.
func (e *fleetEnv) brokers() []*fleetBroker {
	if len(e.pool) > 0 {
		return e.pool
	}
	return []*fleetBroker{e.broker}
}

// brokerURL is devicehub's -mqtt-url: every broker, comma-separated.
func (e *fleetEnv) brokerURL() string {
	var urls []string
	for _, b := range e.brokers() {
		urls = append(urls, b.url())
	}
	return strings.Join(urls, ",")
}

// brokerPIDs are the pids of the running brokers.
func (e *fleetEnv) brokerPIDs() []int {
	var out []int
	for _, b := range e.brokers() {
		if p := b.pid(); p > 0 {
			out = append(out, p)
		}
	}
	return out
}

// startChild starts the devicehub child on the run's database and the
// private broker, keeping the device logins (-device-auth plugin).
func (e *fleetEnv) startChild(ctx context.Context) error {
	svc := serviceLogin()
	args := append([]string{"-mqtt-username=" + svc.Username, "-mqtt-password=" + svc.Password}, e.p.ServerArgs...)
	c, err := startChildAPI(ctx, childAPIConfig{Binary: e.bin, LogDir: e.tmp, DB: e.db, ClickHouseAddr: e.p.ClickHouseAddr,
		BrokerURL: e.brokerURL(), Roles: "api", Args: args, Conns: max(e.p.Clients, e.p.Workers) + 2,
		DeviceLogins: true, AdminPassword: e.adminPassword})
	if err != nil {
		return err
	}
	e.setChild(c)
	return nil
}

// setChild records the running child (nil: none).
func (e *fleetEnv) setChild(c *childAPI) {
	e.child = c
	e.current.Store(c)
	if c == nil {
		e.childPID.Store(0)
	} else {
		e.childPID.Store(int64(c.pid()))
	}
}

func (e *fleetEnv) stopChild() error {
	if e.child == nil {
		return nil
	}
	err := e.child.stop()
	e.setChild(nil)
	return err
}

// runFleetPlugin runs phases 1-5 and cleans up after them.
func runFleetPlugin(ctx context.Context, p FleetParams, res *FleetResult) error {
	broker, err := startFleetBroker(ctx, brokerPlugin, nil)
	if err != nil {
		return err
	}
	defer broker.stop()
	e := &fleetEnv{p: p, broker: broker, adminPassword: "bench-" + randHex(8), seed: randHex(8), chPID: clickhousePID(p.ClickHouseAddr)}
	tmp, bin, db, cleanup, err := p.prepare(ctx, "fleet")
	if err != nil {
		return err
	}
	defer cleanup()
	e.tmp, e.bin, e.db = tmp, bin, db
	backends, closeBackends := db.backends()
	defer closeBackends()
	e.backends = backends
	p.Logf("fleet: private broker with devicehub's plugin on %s; starting devicehub (roles api, -device-auth plugin)", broker.url())
	if err := e.startChild(ctx); err != nil {
		return err
	}
	defer e.stopChild()

	p.Logf("fleet: phase 1, provisioning %d devices through the bulk API, %d per call, %d calls at a time", p.Devices, p.Batch, p.Clients)
	if res.Provision, err = e.provision(ctx); err != nil {
		return err
	}
	p.Logf("fleet: %s", res.Provision)
	if p.Logins > p.Devices {
		p.Logf("fleet: phase 2, filling to %d logins in PostgreSQL, then timing the full sync of a restarted devicehub", p.Logins)
		if res.Fill, err = e.fill(ctx); err != nil {
			return err
		}
		p.Logf("fleet: %s", res.Fill)
	}
	if p.Churn > 0 {
		p.Logf("fleet: phases 3-4, PUBACK of a connected device, %s quiet then %s with %d deploy/undeploy/rotate calls a second; each deployed device connects at once",
			p.Baseline, p.Churn, p.ChurnRate)
		if res.Churn, err = e.churn(ctx); err != nil {
			return err
		}
		p.Logf("fleet: %s", res.Churn)
	}
	if p.IngestDevices > 0 {
		p.Logf("fleet: phase 5, %d devices publishing QoS 1 on their own logins: devicehub's plugin vs dynamic security, %d rounds of %s each",
			min(p.IngestDevices, len(e.logins)), p.IngestRounds, p.IngestDuration)
		if res.Ingest, err = e.ingest(ctx); err != nil {
			return err
		}
		p.Logf("fleet: %s", res.Ingest)
	}
	if err := e.stopChild(); err != nil {
		return fmt.Errorf("bench: devicehub child: %w", err)
	}
	return nil
}

// FleetProvision is phase 1: devices created and deployed through the
// bulk API, each call answering once the broker holds its logins.
type FleetProvision struct {
	Devices int `json:"devices"`
	Calls   int `json:"calls"`
	Clients int `json:"clients"`
	// Seconds from the first call to the last answer; Rate is devices
	// over it, end to end.
	Seconds float64        `json:"seconds"`
	Rate    float64        `json:"devicesPerSecond"`
	Call    LatencySummary `json:"call"`
	// AtOnce: a device of each call logging in the moment its call
	// returned (once, no retry); Sample: devices spread over the fleet
	// after the last call.
	AtOnce   LoginCheck `json:"atOnce"`
	Sample   LoginCheck `json:"sample"`
	RSSBytes int64      `json:"brokerRssBytes"` // after the last call
	Phase    FleetPhase `json:"phase"`
}

func (f FleetProvision) String() string {
	return fmt.Sprintf("provisioned %d devices in %d calls (%d at a time) in %.1fs: %.0f devices/s; call %s\n    login at once after each call: %s\n    sample: %s\n    broker RSS %d MiB\n    %s",
		f.Devices, f.Calls, f.Clients, f.Seconds, f.Rate, f.Call, f.AtOnce, f.Sample, f.RSSBytes>>20, f.Phase)
}

// bulkDevice is one device of a bulk create call.
type bulkDevice struct {
	ID            string `json:"id"`
	Name          string `json:"name"`
	ProductID     string `json:"productId"`
	Configuration struct {
		SecureID  string `json:"secureId"`
		SecureKey string `json:"secureKey"`
	} `json:"configuration"`
}

// createProduct creates and deploys a product through the API.
func (e *fleetEnv) createProduct(ctx context.Context, id string) error {
	if err := e.child.call(ctx, "POST", "/api/device/product", map[string]string{"id": id, "name": "Fleet " + id,
		"classifiedId": "bench", "modelFrom": "custom", "accessId": "mqtt", "deviceType": "device"}, nil); err != nil {
		return err
	}
	return e.child.call(ctx, "POST", "/api/device-product/"+id+"/deploy", nil, nil)
}

func (e *fleetEnv) provision(ctx context.Context) (*FleetProvision, error) {
	p := e.p
	e.product = "fleet" + randHex(3)
	if err := e.createProduct(ctx, e.product); err != nil {
		return nil, err
	}
	e.logins = fleetLogins(e.product, "d", p.Devices, e.seed)
	calls := (len(e.logins) + p.Batch - 1) / p.Batch
	res := &FleetProvision{Devices: len(e.logins), Calls: calls, Clients: p.Clients}
	meter := startFleetPhase("provisioning", e.procs())
	var (
		hist   Histogram
		atOnce loginChecker
	)
	start := time.Now()
	firstErr := forEach(ctx, calls, p.Clients, func(ctx context.Context, k int) error {
		batch := e.logins[k*p.Batch : min((k+1)*p.Batch, len(e.logins))]
		t0 := time.Now()
		if err := e.bulkCreate(ctx, batch); err != nil {
			return err
		}
		hist.Record(time.Since(t0))
		// The call has returned: the broker holds its logins.
		l := batch[len(batch)-1]
		atOnce.record(tryLogin(ctx, e.broker.addr(), l, 10*time.Second))
		return nil
	})
	elapsed := time.Since(start)
	if firstErr != nil {
		if errors.Is(firstErr, errFleetUnavailable) {
			return nil, firstErr
		}
		return nil, fmt.Errorf("%w\ndevicehub's log:\n%s\nbroker's log:\n%s", firstErr, e.child.proc.logTail(), e.broker.logTail())
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	res.Seconds, res.Call, res.AtOnce = elapsed.Seconds(), hist.Summary(), atOnce.result()
	res.Rate = float64(len(e.logins)) / elapsed.Seconds()
	res.Sample = checkLogins(ctx, e.broker.addr(), spread(e.logins, p.Verify), 8)
	res.RSSBytes = pidRSS(e.broker.pid())
	res.Phase = meter.end(int64(len(e.logins)), "device")
	return res, nil
}

// bulkCreate creates and deploys batch in one call of the bulk API and
// checks its answer lists every device with its login.
func (e *fleetEnv) bulkCreate(ctx context.Context, batch []fleetLogin) error {
	devs := make([]bulkDevice, len(batch))
	for i, l := range batch {
		devs[i] = bulkDevice{ID: l.ID, Name: l.ID, ProductID: e.product}
		devs[i].Configuration.SecureID, devs[i].Configuration.SecureKey = l.SecureID, l.Key
	}
	body, err := json.Marshal(devs)
	if err != nil {
		return err
	}
	const path = "/api/device/instance/batch/_create?deploy=true"
	status, raw, err := e.child.http.do(ctx, "POST", e.child.base+path, []string{"Content-Type", "application/json", "X-Access-Token", e.child.token}, body)
	if err != nil {
		return err
	}
	switch {
	case status == http.StatusNotFound && strings.Contains(string(raw), "no such endpoint"):
		return fmt.Errorf("%w: POST %s: HTTP 404 (no bulk API in this tree)", errFleetUnavailable, path)
	case status != http.StatusOK:
		return fmt.Errorf("bench: POST %s: HTTP %d: %.300s", path, status, raw)
	}
	var env struct {
		Result struct {
			Total    int  `json:"total"`
			Deployed bool `json:"deployed"`
			Devices  []struct {
				ID        string `json:"id"`
				SecureID  string `json:"secureId"`
				SecureKey string `json:"secureKey"`
			} `json:"devices"`
		} `json:"result"`
	}
	if err := json.Unmarshal(raw, &env); err != nil {
		return fmt.Errorf("bench: POST %s: %w: %.300s", path, err, raw)
	}
	if got := env.Result.Devices; len(got) != len(batch) || env.Result.Total != len(batch) || !env.Result.Deployed {
		return fmt.Errorf("bench: POST %s: %d devices (total %d, deployed %v) in the answer, %d sent",
			path, len(got), env.Result.Total, env.Result.Deployed, len(batch))
	}
	for i, r := range env.Result.Devices {
		if r.ID != batch[i].ID || r.SecureID != batch[i].SecureID || r.SecureKey != batch[i].Key {
			return fmt.Errorf("bench: POST %s: answer %d is %s/%s, sent %s/%s", path, i, r.ID, r.SecureID, batch[i].ID, batch[i].SecureID)
		}
	}
	return nil
}

// FleetFill is phase 2: the fleet filled to Logins in PostgreSQL, then the
// full sync of a restarted devicehub.
type FleetFill struct {
	Logins   int `json:"logins"`   // deployed devices after the fill
	Inserted int `json:"inserted"` // by the fill
	// InsertSeconds: the inserts (server-side INSERT ... SELECT of
	// 100,000 rows a statement) and VACUUM ANALYZE.
	InsertSeconds float64 `json:"insertSeconds"`
	// From the restarted child's exec: HealthySeconds to /healthz,
	// HeldSeconds until the plugin holds every login (its getStats),
	// SyncSeconds until devicehub says its full sync is done (its
	// devicehub_devauth_logins gauge; HeldSeconds if it has none).
	HealthySeconds float64 `json:"healthySeconds"`
	HeldSeconds    float64 `json:"heldSeconds"`
	SyncSeconds    float64 `json:"syncSeconds"`
	// What the plugin said after the sync (getStats): its logins, and
	// their memory.
	PluginDevices     int64 `json:"pluginDevices"`
	PluginMemoryBytes int64 `json:"pluginMemoryBytes"`
	// Broker RSS with phase 1's devices and with every login.
	RSSBeforeBytes int64 `json:"brokerRssBeforeBytes"`
	RSSBytes       int64 `json:"brokerRssBytes"`
	// Sample: filled and provisioned devices logging in after the sync.
	Sample LoginCheck `json:"sample"`
	// ControlChange: one setDevice or deleteDevice (of a device of the
	// bench's own, removed at once) on the plugin's control topic, publish
	// to response, at full size.
	ControlChange LatencySummary `json:"controlChange"`
	FillPhase     FleetPhase     `json:"fillPhase"`
	SyncPhase     FleetPhase     `json:"syncPhase"`
}

func (f FleetFill) String() string {
	return fmt.Sprintf("filled %d devices in %.1fs; restarted devicehub: healthy %.1fs, plugin holds all %d logins %.1fs, full sync done %.1fs after exec (%.0f logins/s)\n    broker RSS %d MiB with %d logins (the plugin's logins %d MiB), %d MiB before the fill\n    sample: %s\n    one control change at full size: %s\n    %s\n    %s",
		f.Inserted, f.InsertSeconds, f.HealthySeconds, f.PluginDevices, f.HeldSeconds, f.SyncSeconds, float64(f.Logins)/f.SyncSeconds,
		f.RSSBytes>>20, f.Logins, f.PluginMemoryBytes>>20, f.RSSBeforeBytes>>20, f.Sample, f.ControlChange, f.FillPhase, f.SyncPhase)
}

// fillChunk is how many devices one INSERT adds.
const fillChunk = 100000

func (e *fleetEnv) fill(ctx context.Context) (*FleetFill, error) {
	p := e.p
	res := &FleetFill{Logins: p.Logins, Inserted: p.Logins - len(e.logins), RSSBeforeBytes: pidRSS(e.broker.pid())}
	if err := e.stopChild(); err != nil {
		return nil, fmt.Errorf("bench: devicehub child: %w", err)
	}
	meter := startFleetPhase("fill: PostgreSQL inserts", e.procs())
	db, err := e.db.open(0)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	fillProduct := "fleetfill" + randHex(3)
	if _, err := db.ExecContext(ctx, `INSERT INTO products (id, name, device_type, state) VALUES ($1, $1, 'device', 1)`, fillProduct); err != nil {
		return nil, fmt.Errorf("bench: fill product: %w", err)
	}
	// The per-row NOTIFY of new deployed devices is turned off inside each
	// insert's transaction (nobody listens: the child is stopped, and its
	// next start syncs everything); the other triggers (product counts,
	// list changes) run as for any insert.
	var notify []string
	rows, err := db.QueryContext(ctx, `SELECT t.tgname FROM pg_trigger t JOIN pg_proc f ON f.oid = t.tgfoid
		WHERE t.tgrelid = 'devices'::regclass AND f.proname = 'devicehub_device_notify' AND t.tgenabled <> 'D'`)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			rows.Close()
			return nil, err
		}
		notify = append(notify, `"`+n+`"`)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	start := time.Now()
	for from := 0; from < res.Inserted; from += fillChunk {
		to := min(from+fillChunk, res.Inserted) - 1
		if err := fillInsert(ctx, db, notify, fillProduct, e.seed, from, to); err != nil {
			return nil, err
		}
		p.Logf("fleet: filled %d of %d", to+1, res.Inserted)
	}
	if _, err := db.ExecContext(ctx, `VACUUM (ANALYZE) devices`); err != nil {
		return nil, fmt.Errorf("bench: vacuum: %w", err)
	}
	res.InsertSeconds = time.Since(start).Seconds()
	res.FillPhase = meter.end(int64(res.Inserted), "device")

	meter = startFleetPhase("full sync of a restarted devicehub", e.procs())
	t0 := time.Now()
	if err := e.startChild(ctx); err != nil {
		return nil, err
	}
	res.HealthySeconds = time.Since(t0).Seconds()
	ctl, err := dynsec.DialTopic(ctx, mqttconn.Config{Broker: e.broker.url(), ClientID: "bench-devauth-" + randHex(4), Login: serviceLogin()}, devauth.ControlTopic, nil)
	if err != nil {
		return nil, err
	}
	defer ctl.Close()
	deadline := t0.Add(p.SyncTimeout)
	for res.HeldSeconds == 0 || res.SyncSeconds == 0 {
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("bench: the full sync did not finish within %s: plugin holds %d of %d logins\n%s",
				p.SyncTimeout, res.PluginDevices, p.Logins, e.child.proc.logTail())
		}
		if err := sleepCtx(ctx, 100*time.Millisecond); err != nil {
			return nil, err
		}
		now := time.Since(t0).Seconds()
		if res.HeldSeconds == 0 {
			st, err := getPluginStats(ctx, ctl)
			if err != nil {
				p.Logf("fleet: getStats: %v", err)
				continue
			}
			res.PluginDevices, res.PluginMemoryBytes = *st.Devices, st.MemoryBytes
			if res.PluginDevices >= int64(p.Logins) {
				res.HeldSeconds = now
			}
		}
		if res.HeldSeconds > 0 && res.SyncSeconds == 0 {
			m, err := e.child.proc.scrapeMetrics(ctx)
			if err != nil {
				return nil, err
			}
			held, ok := m["devicehub_devauth_logins"]
			if !ok || held >= float64(p.Logins) {
				res.SyncSeconds = max(now, res.HeldSeconds)
			}
		}
	}
	res.RSSBytes = pidRSS(e.broker.pid())
	fillLogins := make([]fleetLogin, 0, p.Verify)
	for i := range p.Verify {
		id := fleetID(fillProduct, "f", i*res.Inserted/p.Verify)
		fillLogins = append(fillLogins, fleetLogin{ID: id, SecureID: id, Key: fleetKey(e.seed, id)})
	}
	res.Sample = checkLogins(ctx, e.broker.addr(), append(fillLogins, spread(e.logins, p.Verify)...), 8)
	if res.ControlChange, err = controlChanges(ctx, ctl, fillProduct, 20); err != nil {
		return nil, err
	}
	res.SyncPhase = meter.end(int64(p.Logins), "login")
	return res, nil
}

// fillInsert adds devices from..to (inclusive) of product, deployed, each
// with its login (secureId its id, key md5(seed || id), as fleetKey), in
// one transaction with the login NOTIFY triggers off.
func fillInsert(ctx context.Context, db *sql.DB, notify []string, product, seed string, from, to int) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	for _, t := range notify {
		if _, err := tx.ExecContext(ctx, `ALTER TABLE devices DISABLE TRIGGER `+t); err != nil {
			return fmt.Errorf("bench: fill: %w", err)
		}
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO devices (id, name, product_id, state, secure_id, secure_key)
		SELECT i, i, $1, 'offline', i, md5($2 || i) FROM (SELECT $1 || '-f' || g AS i FROM generate_series($3::int, $4::int) g) s`,
		product, seed, from, to); err != nil {
		return fmt.Errorf("bench: fill: %w", err)
	}
	for _, t := range notify {
		if _, err := tx.ExecContext(ctx, `ALTER TABLE devices ENABLE TRIGGER `+t); err != nil {
			return fmt.Errorf("bench: fill: %w", err)
		}
	}
	return tx.Commit()
}

// pluginStats is what devicehub's plugin says of itself (getStats).
type pluginStats struct {
	Devices     *int64 `json:"devices"`
	MemoryBytes int64  `json:"memoryBytes"` // its logins' own memory
}

// getPluginStats asks devicehub's plugin how many device logins it holds.
func getPluginStats(ctx context.Context, ctl *dynsec.Client) (pluginStats, error) {
	var stats pluginStats
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	rs, err := ctl.Do(cctx, dynsec.Command{"command": "getStats"})
	if err != nil {
		return stats, err
	}
	if err := rs[0].Err(); err != nil {
		return stats, err
	}
	if err := json.Unmarshal(rs[0].Data, &stats); err != nil || stats.Devices == nil {
		return stats, fmt.Errorf("bench: getStats: no device count in %.200s", rs[0].Data)
	}
	return stats, nil
}

// controlChanges times n setDevice and n deleteDevice commands, one per
// control message, of devices of the bench's own (ids no device of the
// database has, so the syncer never writes them; each is deleted right
// after it is set).
func controlChanges(ctx context.Context, ctl *dynsec.Client, product string, n int) (LatencySummary, error) {
	var h Histogram
	for i := range n {
		id := product + "-ctl" + randHex(4)
		for _, c := range []dynsec.Command{
			{"command": "setDevice", "id": id, "product": product, "username": id, "key": fleetKey("ctl", id)},
			{"command": "deleteDevice", "id": id},
		} {
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			t0 := time.Now()
			rs, err := ctl.Do(cctx, c)
			cancel()
			if err != nil {
				return h.Summary(), fmt.Errorf("bench: plugin %s: %w", c["command"], err)
			}
			if err := rs[0].Err(); err != nil {
				return h.Summary(), fmt.Errorf("bench: plugin change %d: %w", i, err)
			}
			h.Record(time.Since(t0))
		}
	}
	return h.Summary(), nil
}
