package dynsec

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/prometheus/client_golang/prometheus"

	"devicehub/meta"
)

// Source is what the syncer reads of meta.
type Source interface {
	// DeviceLogins returns the logins of the devices of ids that exist.
	DeviceLogins(ctx context.Context, ids []string) ([]meta.DeviceLogin, error)
	// InstallationID names the database's deployment (see scope).
	InstallationID(ctx context.Context) (string, error)
	// DeployedDeviceLogins returns the login of every deployed device.
	DeployedDeviceLogins(ctx context.Context) ([]meta.DeviceLogin, error)
	// WatchDevices calls changed with the ids of devices whose login may
	// have changed, and with none when anything may have (on start, once
	// listening, and after a reconnection); it returns when ctx ends.
	WatchDevices(ctx context.Context, changed func(ids ...string)) error
	// Lock blocks until this process holds the lock key among all that
	// share the database; lost is closed if it is lost.
	Lock(ctx context.Context, key int64) (lost <-chan struct{}, release func(), err error)
}

// lockKey elects the one instance that writes the plugin's rules: two
// writers could apply one device's changes in opposite orders.
const lockKey = 0x64796e736563 // "dynsec"

// Options configure a Syncer.
type Options struct {
	// BrokerURL of the broker whose plugin is kept. Default
	// "tcp://127.0.0.1:1884".
	BrokerURL string
	// Username and Password are devicehub's service login; it needs the
	// plugin's admin rights (`mosquitto_ctrl dynsec init` gives them).
	Username, Password string
	// ClientID of the control connection. Default
	// "devicehub-dynsec-<random>".
	ClientID string
	// Retry is how long a failed change waits before it is tried again.
	// Default 2s.
	Retry time.Duration
	// Timeout bounds one exchange with the plugin. Default 30s (a change
	// rewrites the plugin's whole file: about 1 s at 100k devices).
	Timeout time.Duration
	// Batch is how many commands go in one control message. Default 200.
	Batch int
	// Logger; default slog.Default().
	Logger *slog.Logger
	// Registerer for the devicehub_dynsec_* metrics; nil registers none.
	Registerer prometheus.Registerer
}

// Syncer keeps the plugin's device logins and rights equal to meta's
// deployed devices, and devicehub's service login's rights complete.
type Syncer struct {
	opt Options
	src Source
	log *slog.Logger

	mu      sync.Mutex
	dirty   map[string]struct{} // devices to apply
	full    bool                // everything to compare
	wake    chan struct{}
	started chan struct{} // closed after the first full sync as leader

	have map[string]brokerDevice // what the plugin holds, as leader
	sc   scope                   // this deployment's part of the plugin

	commands *prometheus.CounterVec
	fulls    prometheus.Counter
}

// New returns a Syncer of src's devices; Run runs it.
func New(src Source, opt Options) *Syncer {
	if opt.BrokerURL == "" {
		opt.BrokerURL = "tcp://127.0.0.1:1884"
	}
	if opt.ClientID == "" {
		opt.ClientID = "devicehub-dynsec-" + strings.ToLower(rand.Text()[:8])
	}
	if opt.Retry <= 0 {
		opt.Retry = 2 * time.Second
	}
	if opt.Timeout <= 0 {
		opt.Timeout = 30 * time.Second
	}
	if opt.Batch <= 0 {
		opt.Batch = 200
	}
	if opt.Logger == nil {
		opt.Logger = slog.Default()
	}
	s := &Syncer{opt: opt, src: src, log: opt.Logger.With("component", "dynsec"),
		dirty: map[string]struct{}{}, wake: make(chan struct{}, 1), started: make(chan struct{}),
		commands: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "devicehub_dynsec_commands_total",
			Help: "Commands sent to the broker's dynamic-security plugin, by result (ok, error)."}, []string{"result"}),
		fulls: prometheus.NewCounter(prometheus.CounterOpts{Name: "devicehub_dynsec_full_syncs_total",
			Help: "Comparisons of every device login with what the broker holds."}),
	}
	if opt.Registerer != nil {
		opt.Registerer.MustRegister(s.commands, s.fulls)
	}
	return s
}

// Started is closed once this instance has led a full sync (an instance
// that never becomes the leader never closes it).
func (s *Syncer) Started() <-chan struct{} { return s.started }

// Run syncs until ctx ends: it waits to lead, then follows changes.
func (s *Syncer) Run(ctx context.Context) {
	for ctx.Err() == nil {
		lost, release, err := s.src.Lock(ctx, lockKey)
		if err != nil {
			if ctx.Err() == nil {
				s.log.Warn("dynsec: waiting for the sync lock", "err", err)
				sleep(ctx, s.opt.Retry)
			}
			continue
		}
		s.lead(ctx, lost)
		release()
	}
}

// changed marks devices to apply; none marks everything.
func (s *Syncer) changed(ids ...string) {
	s.mu.Lock()
	if len(ids) == 0 {
		s.full = true
	}
	for _, id := range ids {
		s.dirty[id] = struct{}{}
	}
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// lead syncs while this instance holds the lock.
func (s *Syncer) lead(ctx context.Context, lost <-chan struct{}) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-lost:
			s.log.Warn("dynsec: sync lock lost; waiting to lead again")
			cancel()
		case <-ctx.Done():
		}
	}()
	var inst string
	for {
		var err error
		if inst, err = s.src.InstallationID(ctx); err == nil {
			break
		}
		if ctx.Err() != nil {
			return
		}
		s.log.Warn("dynsec: reading the installation id failed; retrying", "err", err)
		sleep(ctx, s.opt.Retry)
	}
	s.mu.Lock()
	s.have, s.full, s.sc = nil, true, newScope(inst)
	s.mu.Unlock()
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		if err := s.src.WatchDevices(ctx, s.changed); err != nil && ctx.Err() == nil {
			s.log.Error("dynsec: watching devices stopped", "err", err)
			cancel()
		}
	}()
	defer func() { <-watchDone }()

	var cl *Client
	for cl == nil {
		opts := mqtt.NewClientOptions().AddBroker(s.opt.BrokerURL).SetClientID(s.opt.ClientID).
			SetUsername(s.opt.Username).SetPassword(s.opt.Password).SetConnectTimeout(10 * time.Second)
		var err error
		if cl, err = Dial(ctx, opts, func() { s.changed() }); err != nil {
			if ctx.Err() != nil {
				return
			}
			s.log.Warn("dynsec: broker not reachable; retrying", "err", err)
			sleep(ctx, s.opt.Retry)
		}
	}
	defer cl.Close()

	retry := time.NewTimer(time.Hour)
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.wake:
		case <-retry.C:
		}
		s.mu.Lock()
		full, ids := s.full, s.dirty
		s.full, s.dirty = false, map[string]struct{}{}
		s.mu.Unlock()
		var err error
		if full {
			err = s.syncAll(ctx, cl)
		} else if len(ids) > 0 {
			err = s.apply(ctx, cl, ids)
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			s.log.Warn("dynsec: sync failed; retrying", "err", err, "retry", s.opt.Retry)
			s.mu.Lock()
			s.full = s.full || full || s.have == nil
			for id := range ids {
				s.dirty[id] = struct{}{}
			}
			s.mu.Unlock()
			retry.Reset(s.opt.Retry)
		}
	}
}

// syncAll compares every device login and role the plugin holds with the
// deployed devices and mends every difference.
func (s *Syncer) syncAll(ctx context.Context, cl *Client) error {
	s.fulls.Inc()
	start := time.Now()
	devices, err := s.src.DeployedDeviceLogins(ctx)
	if err != nil {
		return err
	}
	clients, err := listAll[pluginClient](ctx, s, cl, "listClients", "clients")
	if err != nil {
		return err
	}
	roles, err := listAll[pluginRole](ctx, s, cl, "listRoles", "roles")
	if err != nil {
		return err
	}
	wantByID := make(map[string]meta.DeviceLogin, len(devices))
	for _, d := range devices {
		wantByID[d.ID] = d
	}
	have := make(map[string]brokerDevice, len(devices))
	taken := make(map[string]bool, len(clients)) // usernames of clients that stay
	var cmds []Command
	var self *pluginClient
	for i, c := range clients {
		if c.Username == s.opt.Username {
			self = &clients[i]
		}
		if c.TextName != s.sc.text {
			taken[c.Username] = true
			continue
		}
		d, ok := wantByID[c.ClientID]
		if !ok || d.SecureID != c.Username || len(c.Roles) != 1 || c.Roles[0].Name != s.sc.role(d.ID) {
			cmds = append(cmds, Command{"command": "deleteClient", "username": c.Username})
			continue
		}
		taken[c.Username] = true
		have[d.ID] = brokerDevice{username: c.Username, fingerprint: c.TextDescription, productID: d.ProductID}
	}
	roleACLs := make(map[string][]ACL, len(roles))
	for _, r := range roles {
		roleACLs[r.Name] = r.ACLs
	}
	// Roles after the clients that used them are gone; then what is
	// missing or different.
	for _, r := range roles {
		if id, ok := strings.CutPrefix(r.Name, s.sc.rolePrefix); ok {
			if _, wanted := wantByID[id]; !wanted {
				cmds = append(cmds, Command{"command": "deleteRole", "rolename": r.Name})
			}
		}
	}
	acls, ok := roleACLs[ServiceRole]
	cmds = append(cmds, serviceCommands(s.opt.Username, ok, acls, self != nil && self.hasRole(ServiceRole))...)
	for _, d := range devices {
		acls, roleOK := roleACLs[s.sc.role(d.ID)]
		switch {
		case !roleOK:
			cmds = append(cmds, s.sc.createDevice(d)[0])
		case !sameACLs(acls, DeviceACLs(d.ProductID, d.ID)):
			cmds = append(cmds, Command{"command": "modifyRole", "rolename": s.sc.role(d.ID), "acls": DeviceACLs(d.ProductID, d.ID)})
		}
		h, ok := have[d.ID]
		switch {
		case ok:
			cmds = append(cmds, s.sc.updateDevice(h, d)...)
		case taken[d.SecureID]:
			s.log.Error("dynsec: a device's secureId is the username of another broker login; the device cannot connect",
				"device", d.ID, "secureId", d.SecureID)
		default:
			cmds = append(cmds, s.sc.createDevice(d)[1])
		}
	}
	failed, err := s.send(ctx, cl, cmds)
	if err != nil {
		return err
	}
	s.mu.Lock()
	for _, d := range devices {
		have[d.ID] = want(d)
	}
	s.have = have
	s.mu.Unlock()
	s.log.Info("dynsec: device logins synced", "devices", len(devices), "commands", len(cmds),
		"failed", failed, "took", time.Since(start).Round(time.Millisecond))
	select {
	case <-s.started:
	default:
		close(s.started)
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d commands failed", failed, len(cmds))
	}
	return nil
}

// apply mends the plugin for the devices of ids, from what it holds
// (s.have) to what meta says now.
func (s *Syncer) apply(ctx context.Context, cl *Client, ids map[string]struct{}) error {
	list := make([]string, 0, len(ids))
	for id := range ids {
		list = append(list, id)
	}
	logins, err := s.src.DeviceLogins(ctx, list)
	if err != nil {
		return err
	}
	now := make(map[string]meta.DeviceLogin, len(logins))
	for _, d := range logins {
		if d.Deployed {
			now[d.ID] = d
		}
	}
	var cmds []Command
	s.mu.Lock()
	for _, id := range list {
		h, had := s.have[id]
		d, deployed := now[id]
		switch {
		case had && !deployed:
			cmds = append(cmds, s.sc.deleteDevice(id, h.username)...)
		case !had && deployed:
			cmds = append(cmds, s.sc.createDevice(d)...)
		case had && deployed:
			cmds = append(cmds, s.sc.updateDevice(h, d)...)
		}
	}
	s.mu.Unlock()
	failed, err := s.send(ctx, cl, cmds)
	if err != nil {
		return err
	}
	if failed > 0 {
		// What the plugin holds is no longer known for sure: the retry
		// compares everything (a partly applied change, retried from
		// s.have, would repeat the commands that did succeed and fail).
		s.mu.Lock()
		s.full = true
		s.mu.Unlock()
		return fmt.Errorf("%d of %d commands failed", failed, len(cmds))
	}
	s.mu.Lock()
	for _, id := range list {
		if d, ok := now[id]; ok {
			s.have[id] = want(d)
		} else {
			delete(s.have, id)
		}
	}
	s.mu.Unlock()
	return nil
}

// send sends cmds in batches and counts the commands the plugin refused
// (logged); the error is about the exchange.
func (s *Syncer) send(ctx context.Context, cl *Client, cmds []Command) (failed int, err error) {
	for len(cmds) > 0 {
		n := min(len(cmds), s.opt.Batch)
		batch := cmds[:n]
		cmds = cmds[n:]
		cctx, cancel := context.WithTimeout(ctx, s.opt.Timeout)
		rs, err := cl.Do(cctx, batch...)
		cancel()
		if err != nil {
			return failed, err
		}
		for i, r := range rs {
			if err := r.Err(); err != nil {
				failed++
				s.commands.WithLabelValues("error").Inc()
				s.log.Error("dynsec: command refused", "err", err, "username", batch[i]["username"], "role", batch[i]["rolename"])
				continue
			}
			s.commands.WithLabelValues("ok").Inc()
		}
	}
	return failed, nil
}

// pluginClient and pluginRole are the plugin's verbose listings.
type pluginClient struct {
	Username        string `json:"username"`
	ClientID        string `json:"clientid"`
	TextName        string `json:"textname"`
	TextDescription string `json:"textdescription"`
	Roles           []struct {
		Name string `json:"rolename"`
	} `json:"roles"`
}

func (c *pluginClient) hasRole(name string) bool {
	for _, r := range c.Roles {
		if r.Name == name {
			return true
		}
	}
	return false
}

type pluginRole struct {
	Name string `json:"rolename"`
	ACLs []ACL  `json:"acls"`
}

// listPage is how many clients or roles one listing asks for.
const listPage = 1000

// listAll pages through a verbose listing (listClients, listRoles).
func listAll[T any](ctx context.Context, s *Syncer, cl *Client, command, field string) ([]T, error) {
	var out []T
	for offset := 0; ; offset += listPage {
		cctx, cancel := context.WithTimeout(ctx, s.opt.Timeout)
		rs, err := cl.Do(cctx, Command{"command": command, "verbose": true, "count": listPage, "offset": offset})
		cancel()
		if err != nil {
			return nil, err
		}
		if err := rs[0].Err(); err != nil {
			return nil, err
		}
		var raw map[string]json.RawMessage
		var total int
		var items []T
		if err := json.Unmarshal(rs[0].Data, &raw); err != nil {
			return nil, fmt.Errorf("dynsec %s: %w", command, err)
		}
		if err := json.Unmarshal(raw["totalCount"], &total); err != nil {
			return nil, fmt.Errorf("dynsec %s: totalCount: %w", command, err)
		}
		if err := json.Unmarshal(raw[field], &items); err != nil {
			return nil, fmt.Errorf("dynsec %s: %s: %w", command, field, err)
		}
		out = append(out, items...)
		if len(items) < listPage || offset+len(items) >= total {
			return out, nil
		}
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// serviceCommands give the service login its rights, from what the plugin
// has: whether ServiceRole exists (with acls) and the login holds it. A
// change of either makes the plugin drop the login's connections, which
// reconnect: it happens once per broker, on devicehub's first start.
func serviceCommands(username string, exists bool, acls []ACL, held bool) []Command {
	var cmds []Command
	if !exists {
		cmds = append(cmds, Command{"command": "createRole", "rolename": ServiceRole, "textname": "devicehub", "acls": ServiceACLs()})
	} else if !sameACLs(acls, ServiceACLs()) {
		cmds = append(cmds, Command{"command": "modifyRole", "rolename": ServiceRole, "acls": ServiceACLs()})
	}
	if !held {
		cmds = append(cmds, Command{"command": "addClientRole", "username": username, "rolename": ServiceRole, "priority": 1})
	}
	return cmds
}

// EnsureService gives the service login username (the one cl is
// connected with) its rights, as a devicehub leader does on start: for
// tools and tests that use a broker before any devicehub has run.
func EnsureService(ctx context.Context, cl *Client, username string) error {
	rs, err := cl.Do(ctx, Command{"command": "getRole", "rolename": ServiceRole},
		Command{"command": "getClient", "username": username})
	if err != nil {
		return err
	}
	var role struct {
		Role pluginRole `json:"role"`
	}
	var client struct {
		Client pluginClient `json:"client"`
	}
	exists := rs[0].Err() == nil && json.Unmarshal(rs[0].Data, &role) == nil
	if err := rs[1].Err(); err != nil {
		return err
	}
	if err := json.Unmarshal(rs[1].Data, &client); err != nil {
		return fmt.Errorf("dynsec getClient: %w", err)
	}
	cmds := serviceCommands(username, exists, role.Role.ACLs, client.Client.hasRole(ServiceRole))
	for _, c := range cmds {
		rs, err := cl.Do(ctx, c)
		if errors.Is(err, ErrConnectionLost) && c["command"] == "addClientRole" {
			// The plugin drops the login's connections, this one
			// included, once it has granted the role: before it answers.
			return nil
		}
		if err != nil {
			return err
		}
		if err := rs[0].Err(); err != nil {
			return err
		}
	}
	return nil
}
