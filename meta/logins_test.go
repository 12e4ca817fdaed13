package meta_test

import (
	"context"
	"errors"
	"net/url"
	"reflect"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"devicehub/bench/testkit"
	"devicehub/meta"
	"devicehub/meta/metatest"
)

// Device logins, their change feed, the advisory lock and the
// installation id (logins.go) against a real PostgreSQL database.

// storesBehindProxy opens two stores on one fresh database: direct, and
// behind a metatest.Proxy the test can take down. It returns the direct
// DSN too.
func storesBehindProxy(t *testing.T) (direct, behind *meta.Store, px *metatest.Proxy, dsn string) {
	t.Helper()
	dsn = metatest.NewDatabase(t)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	px = metatest.NewProxy(t, u.Host)
	u.Host = px.Addr()
	opts := meta.DefaultOptions()
	opts.QueryTimeout = 2 * time.Second
	direct = openTestStore(t, dsn, opts)
	behind = openTestStore(t, u.String(), opts)
	return direct, behind, px, dsn
}

// sortedLogins sorts l by id, versions left out (TestLoginVersions has them).
func sortedLogins(l []meta.DeviceLogin) []meta.DeviceLogin {
	sort.Slice(l, func(i, j int) bool { return l[i].ID < l[j].ID })
	for i := range l {
		l[i].Version = 0
	}
	return l
}

// TestLoginVersions: every write that changes what the broker must hold
// for a device gives it a new, higher login_version and says so
// (DeviceDetail.Login); writes that change nothing of it say nothing.
func TestLoginVersions(t *testing.T) {
	t.Parallel()
	s := metatest.NewStore(t)
	ctx := context.Background()
	createTestProduct(t, s, "p", true)
	createTestDevice(t, s, "d", "p")
	version := func() int64 {
		t.Helper()
		l, err := s.DeviceLogins(ctx, []string{"d"})
		if err != nil || len(l) != 1 {
			t.Fatalf("login %v %v", l, err)
		}
		return l[0].Version
	}
	bob := meta.User{ID: "u2", Username: "bob"}
	last := version()
	step := func(what string, changes bool, write func() (meta.DeviceDetail, error)) {
		t.Helper()
		d, err := write()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		now := version()
		switch {
		case changes && (now <= last || d.Login != meta.LoginChange{ID: "d", Version: now}):
			t.Fatalf("%s: version %d -> %d, Login %+v: want a new version, announced", what, last, now, d.Login)
		case !changes && (now != last || d.Login != meta.LoginChange{}):
			t.Fatalf("%s: version %d -> %d, Login %+v: want none", what, last, now, d.Login)
		}
		last = now
	}
	step("deploy", true, func() (meta.DeviceDetail, error) { return s.DeployDevice(ctx, "d", bob) })
	step("deploy again", false, func() (meta.DeviceDetail, error) { return s.DeployDevice(ctx, "d", bob) })
	name := "renamed"
	step("rename", false, func() (meta.DeviceDetail, error) {
		return s.UpdateDevice(ctx, "d", meta.DevicePatch{Name: &name}, bob)
	})
	step("rotate", true, func() (meta.DeviceDetail, error) { return s.RotateDeviceSecret(ctx, "d", bob) })
	sid := "d-login-2"
	step("new secureId", true, func() (meta.DeviceDetail, error) {
		return s.UpdateDevice(ctx, "d", meta.DevicePatch{Configuration: &meta.DeviceConfigInput{SecureID: &sid}}, bob)
	})
	step("undeploy", true, func() (meta.DeviceDetail, error) { return s.UndeployDevice(ctx, "d", bob) })
	step("undeploy again", false, func() (meta.DeviceDetail, error) { return s.UndeployDevice(ctx, "d", bob) })
	if _, err := s.UndeployDevice(ctx, "missing", bob); !errors.Is(err, meta.ErrNotFound) {
		t.Fatalf("undeploy of a missing device: %v", err)
	}
	if _, err := s.RotateDeviceSecret(ctx, "missing", bob); !errors.Is(err, meta.ErrNotFound) {
		t.Fatalf("rotation of a missing device: %v", err)
	}
}

func TestDeviceLogins(t *testing.T) {
	t.Parallel()
	s := metatest.NewStore(t)
	ctx := context.Background()
	createTestProduct(t, s, "p", true)
	idle := createTestDevice(t, s, "idle", "p")
	dep := createTestDevice(t, s, "dep", "p")
	deployTestDevice(t, s, "dep")
	on := createTestDevice(t, s, "on", "p")
	deployTestDevice(t, s, "on")
	if _, err := s.ApplyStateChanges(ctx, []meta.StateChange{{DeviceID: "on", Online: true, At: time.Now()}}); err != nil {
		t.Fatal(err)
	}
	// Deployed, but without a key (only SQL written by hand makes one):
	// no login, so it counts as not deployed.
	createTestDevice(t, s, "nokey", "p")
	deployTestDevice(t, s, "nokey")
	if _, err := s.DB().Exec(`UPDATE devices SET secure_key = '' WHERE id = 'nokey'`); err != nil {
		t.Fatal(err)
	}

	login := func(d meta.DeviceDetail, key string, deployed bool) meta.DeviceLogin {
		return meta.DeviceLogin{ID: d.ID, ProductID: "p", SecureID: d.Configuration.SecureID, SecureKey: key, Deployed: deployed}
	}
	got, err := s.DeviceLogins(ctx, []string{"idle", "dep", "on", "nokey", "missing"})
	if err != nil {
		t.Fatal(err)
	}
	want := []meta.DeviceLogin{
		login(dep, dep.Configuration.SecureKey, true),
		login(idle, idle.Configuration.SecureKey, false),
		{ID: "nokey", ProductID: "p", SecureID: "nokey", Deployed: false},
		login(on, on.Configuration.SecureKey, true),
	}
	if got := sortedLogins(got); !reflect.DeepEqual(got, want) {
		t.Fatalf("logins\n got %+v\nwant %+v", got, want)
	}
	if got, err := s.DeviceLogins(ctx, nil); err != nil || len(got) != 0 {
		t.Fatalf("no ids: %v %v", got, err)
	}

	var all []meta.DeviceLogin
	if err := s.EachDeployedDeviceLogin(ctx, func(d meta.DeviceLogin) error { all = append(all, d); return nil }); err != nil {
		t.Fatal(err)
	}
	if got := sortedLogins(all); !reflect.DeepEqual(got, []meta.DeviceLogin{want[0], want[3]}) {
		t.Fatalf("deployed logins %+v, want dep and on", got)
	}
}

func TestRotateDeviceSecret(t *testing.T) {
	t.Parallel()
	s := metatest.NewStore(t)
	ctx := context.Background()
	createTestProduct(t, s, "p", true)
	old := createTestDevice(t, s, "d", "p")
	deployTestDevice(t, s, "d")
	createTestDevice(t, s, "other", "p")
	otherBefore, _ := s.DeviceLogins(ctx, []string{"other"})

	bob := meta.User{ID: "u2", Username: "bob"}
	d, err := s.RotateDeviceSecret(ctx, "d", bob)
	if err != nil {
		t.Fatal(err)
	}
	key := d.Configuration.SecureKey
	if !hex32.MatchString(key) || key == old.Configuration.SecureKey {
		t.Fatalf("new key %q (old %q), want a fresh 32-hex key", key, old.Configuration.SecureKey)
	}
	if d.ID != "d" || d.State != meta.StateOffline || d.ModifierID != "u2" || d.ModifierName != "bob" ||
		d.Configuration.SecureID != old.Configuration.SecureID {
		t.Fatalf("detail after rotation %+v", d)
	}
	// The broker's view holds the new key and not the old; the detail masks it.
	l, err := s.DeviceLogins(ctx, []string{"d"})
	if err != nil || len(l) != 1 || l[0].SecureKey != key || !l[0].Deployed {
		t.Fatalf("login after rotation %+v %v, want key %q", l, err, key)
	}
	if got := deviceDetail(t, s, "d").Configuration.SecureKey; got != meta.MaskSecret(key) {
		t.Fatalf("detail shows %q", got)
	}
	// Only that device changed.
	if otherAfter, _ := s.DeviceLogins(ctx, []string{"other"}); !reflect.DeepEqual(otherAfter, otherBefore) {
		t.Fatalf("other device's login %+v, was %+v", otherAfter, otherBefore)
	}
	// Each rotation gives another key.
	if d2, err := s.RotateDeviceSecret(ctx, "d", bob); err != nil || d2.Configuration.SecureKey == key {
		t.Fatalf("second rotation: %q %v", d2.Configuration.SecureKey, err)
	}

	if _, err := s.RotateDeviceSecret(ctx, "missing", bob); !errors.Is(err, meta.ErrNotFound) {
		t.Fatalf("rotate unknown: %v", err)
	}
}

func TestInstallationID(t *testing.T) {
	t.Parallel()
	dsn := metatest.NewDatabase(t)
	ctx := context.Background()
	s1 := openTestStore(t, dsn, meta.DefaultOptions())
	id, err := s1.InstallationID(ctx)
	if err != nil || len(id) != 12 {
		t.Fatalf("installation id %q %v", id, err)
	}
	if again, err := s1.InstallationID(ctx); err != nil || again != id {
		t.Fatalf("second call %q %v, want %q", again, err, id)
	}
	// Reopening (and migrating again) keeps it.
	s1.Close()
	s2 := openTestStore(t, dsn, meta.DefaultOptions())
	if again, err := s2.InstallationID(ctx); err != nil || again != id {
		t.Fatalf("after reopening %q %v, want %q", again, err, id)
	}
	// Another database has another id.
	other, err := metatest.NewStore(t).InstallationID(ctx)
	if err != nil || other == id {
		t.Fatalf("other database's id %q %v, same as %q", other, err, id)
	}
}

// watchEvents runs WatchDevices on s until the test ends and returns its
// calls: nil for a call without ids. It waits for the first call (the
// store is listening then).
func watchEvents(t *testing.T, s *meta.Store) <-chan []string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	events := make(chan []string, 100)
	done := make(chan error, 1)
	go func() {
		done <- s.WatchDevices(ctx, func(ids ...string) { events <- ids })
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("WatchDevices: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("WatchDevices did not return after its context ended")
		}
	})
	if ids := nextEvent(t, events); ids != nil {
		t.Fatalf("first call %v, want one without ids", ids)
	}
	return events
}

// nextEvent waits for the next call of a watch.
func nextEvent(t *testing.T, events <-chan []string) []string {
	t.Helper()
	select {
	case ids := <-events:
		return ids
	case <-time.After(15 * time.Second):
		t.Fatal("no WatchDevices call within 15 s")
		return nil
	}
}

// TestWatchDevices: each change of who may connect as a device is
// announced with its id, and only those. A change that must not be
// announced is followed by one that must: the next call names the latter
// (announcements come in commit order), which proves the absence without
// waiting for it.
func TestWatchDevices(t *testing.T) {
	t.Parallel()
	s := metatest.NewStore(t)
	ctx := context.Background()
	createTestProduct(t, s, "p", true)
	events := watchEvents(t, s)
	want := func(id string) {
		t.Helper()
		if ids := nextEvent(t, events); !reflect.DeepEqual(ids, []string{id}) {
			t.Fatalf("call %v, want [%s]", ids, id)
		}
	}

	// Created notActive: no login, no announcement; deploy announces.
	createTestDevice(t, s, "a", "p")
	createTestDevice(t, s, "b", "p")
	deployTestDevice(t, s, "a")
	want("a")

	// Presence and a rename do not change the login.
	if _, err := s.ApplyStateChanges(ctx, []meta.StateChange{{DeviceID: "a", Online: true, At: time.Now()}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.UpdateDevice(ctx, "a", meta.DevicePatch{Name: ptr("renamed")}, lcAdmin); err != nil {
		t.Fatal(err)
	}
	if _, err := s.RotateDeviceSecret(ctx, "a", lcAdmin); err != nil {
		t.Fatal(err)
	}
	want("a")

	// A new secureId, even of a notActive device, is announced.
	if _, err := s.UpdateDevice(ctx, "b", meta.DevicePatch{Configuration: &meta.DeviceConfigInput{SecureID: ptr("sid-b")}}, lcAdmin); err != nil {
		t.Fatal(err)
	}
	want("b")
	if _, err := s.UpdateDevice(ctx, "b", meta.DevicePatch{Configuration: &meta.DeviceConfigInput{SecureKey: ptr("key-b-0123456789ab")}}, lcAdmin); err != nil {
		t.Fatal(err)
	}
	want("b")

	// Undeploy announces; deleting a notActive device does not.
	if _, err := s.UndeployDevice(ctx, "a", lcAdmin); err != nil {
		t.Fatal(err)
	}
	want("a")
	if _, err := s.DeleteDevice(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	// Whoever writes the row: SQL by hand is announced too, deletes included.
	if _, err := s.DB().Exec(`UPDATE devices SET state = 'offline' WHERE id = 'b'`); err != nil {
		t.Fatal(err)
	}
	want("b")
	if _, err := s.DB().Exec(`DELETE FROM devices WHERE id = 'b'`); err != nil {
		t.Fatal(err)
	}
	want("b")
	if _, err := s.DB().Exec(`INSERT INTO devices (id, name, product_id, state, secure_id, secure_key)
		VALUES ('c', 'C', 'p', 'offline', 'c', 'k')`); err != nil {
		t.Fatal(err)
	}
	want("c")
}

// TestWatchDevicesReconnects: after its connection is lost and back, the
// watch calls without ids (announcements meanwhile are lost) and goes on.
func TestWatchDevicesReconnects(t *testing.T) {
	t.Parallel()
	direct, behind, px, _ := storesBehindProxy(t)
	createTestProduct(t, direct, "p", true)
	createTestDevice(t, direct, "a", "p")
	events := watchEvents(t, behind)

	px.Down()
	px.Up()
	if ids := nextEvent(t, events); ids != nil {
		t.Fatalf("call after reconnecting %v, want one without ids", ids)
	}
	deployTestDevice(t, direct, "a")
	if ids := nextEvent(t, events); !reflect.DeepEqual(ids, []string{"a"}) {
		t.Fatalf("call after reconnecting %v, want [a]", ids)
	}
}

// TestWatchDevicesStopsWhileUnreachable: a watch whose PostgreSQL cannot
// be reached still returns when its context ends (a shutdown does not wait
// for the database).
func TestWatchDevicesStopsWhileUnreachable(t *testing.T) {
	t.Parallel()
	_, behind, px, _ := storesBehindProxy(t)
	px.Down()
	defer px.Up()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- behind.WatchDevices(ctx, func(...string) {}) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("WatchDevices after its context ended: %v, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("WatchDevices did not return 10s after its context ended while PostgreSQL was unreachable")
	}
}

// advisoryWaiters counts the sessions waiting for an advisory lock in the
// current database.
func advisoryWaiters(t *testing.T, db *sqlx.DB) int {
	t.Helper()
	var n int
	if err := db.Get(&n, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestLock(t *testing.T) {
	t.Parallel()
	s := metatest.NewStore(t)
	ctx := context.Background()
	const key = 4242

	lost1, release1, err := s.Lock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}

	// A second holder waits while the first holds the lock...
	type result struct {
		lost    <-chan struct{}
		release func()
		err     error
	}
	second := make(chan result, 1)
	go func() {
		lost, release, err := s.Lock(ctx, key)
		second <- result{lost, release, err}
	}()
	testkit.Eventually(t, 15*time.Second, "the second Lock to wait", func() bool { return advisoryWaiters(t, s.DB()) == 1 })
	select {
	case r := <-second:
		t.Fatalf("second Lock returned while the first holds the lock: %v", r.err)
	default:
	}

	// ... a third gives up when its context ends, and its wait is dropped ...
	tctx, cancel := context.WithCancel(ctx)
	third := make(chan error, 1)
	go func() {
		_, _, err := s.Lock(tctx, key)
		third <- err
	}()
	testkit.Eventually(t, 15*time.Second, "the third Lock to wait", func() bool { return advisoryWaiters(t, s.DB()) == 2 })
	cancel()
	select {
	case err := <-third:
		if err == nil {
			t.Fatal("Lock with a cancelled context returned the lock")
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Lock did not return after its context ended")
	}
	testkit.Eventually(t, 15*time.Second, "the cancelled wait to end", func() bool { return advisoryWaiters(t, s.DB()) == 1 })

	// ... and the second gets the lock once the first releases it.
	release1()
	var r result
	select {
	case r = <-second:
	case <-time.After(15 * time.Second):
		t.Fatal("second Lock did not get the lock after the first released it")
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	select {
	case <-lost1:
		t.Fatal("lost closed by a release")
	default:
	}

	// Another key is independent.
	_, release3, err := s.Lock(ctx, key+1)
	if err != nil {
		t.Fatal(err)
	}
	release3()
	r.release()
	select {
	case <-r.lost:
		t.Fatal("lost closed by a release")
	default:
	}
	// Released: it can be taken without waiting.
	var free bool
	if err := s.DB().Get(&free, `SELECT pg_try_advisory_lock($1)`, int64(key)); err != nil || !free {
		t.Fatalf("lock free after both releases: %v %v", free, err)
	}
}

// TestLockLost: when the lock's connection dies, lost is closed, and the
// lock is gone with it.
func TestLockLost(t *testing.T) {
	t.Parallel()
	_, behind, px, dsn := storesBehindProxy(t)
	ctx := context.Background()
	const key = 77
	lost, release, err := behind.Lock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	defer release()

	db, err := sqlx.Open("postgres", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1) // one session: try-lock and unlock on the same
	var held bool
	if err := db.Get(&held, `SELECT pg_try_advisory_lock($1)`, int64(key)); err != nil || held {
		t.Fatalf("lock taken by another session while held: %v %v", held, err)
	}

	px.Down()
	select {
	case <-lost:
	case <-time.After(20 * time.Second):
		t.Fatal("lost not closed within 20 s of the connection dying")
	}
	testkit.Eventually(t, 15*time.Second, "the lock to be free", func() bool {
		var ok bool
		if err := db.Get(&ok, `SELECT pg_try_advisory_lock($1)`, int64(key)); err != nil {
			t.Fatal(err)
		}
		return ok
	})

}

// TestLoginsApplied: what one instance announces (NotifyLoginsApplied),
// every watcher hears whole, however many devices (one NOTIFY holds at
// most 7,900 bytes); a malformed announcement is skipped.
func TestLoginsApplied(t *testing.T) {
	t.Parallel()
	s := metatest.NewStore(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	got := map[string]int64{}
	listening := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		var once sync.Once
		done <- s.WatchLoginsApplied(ctx, func(l []meta.LoginChange) {
			mu.Lock()
			defer mu.Unlock()
			for _, c := range l {
				got[c.ID] = c.Version
			}
		}, func() { once.Do(func() { close(listening) }) })
	}()
	<-listening
	var sent []meta.LoginChange
	for i := range 2000 { // about 40 KB of announcements
		sent = append(sent, meta.LoginChange{ID: "device-" + strconv.Itoa(i) + ":x", Version: int64(1e12 + i)})
	}
	if _, err := s.DB().Exec(`SELECT pg_notify('devicehub_login_applied', 'not a version:d-1')`); err != nil {
		t.Fatal(err)
	}
	if err := s.NotifyLoginsApplied(ctx, sent); err != nil {
		t.Fatal(err)
	}
	testkit.Within(5*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return len(got) >= len(sent) })
	mu.Lock()
	defer mu.Unlock()
	if len(got) != len(sent) {
		t.Fatalf("heard %d of %d announced logins", len(got), len(sent))
	}
	for _, c := range sent {
		if got[c.ID] != c.Version {
			t.Fatalf("%s: heard version %d, want %d", c.ID, got[c.ID], c.Version)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
