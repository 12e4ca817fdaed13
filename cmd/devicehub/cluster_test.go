package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"devicehub/bench/testkit"
	"devicehub/ingest/mqtttest"
	"devicehub/meta/metatest"
	"devicehub/tsdb"
	"devicehub/tsdb/tsdbtest"
)

// TestCluster runs the real binary as two instances, a and b, on the
// local ClickHouse cluster (.ci/cluster: 2 shards x 2 replicas) and a
// third, single, on the one-server ClickHouse, all three on one
// PostgreSQL database and one broker. a and b split the uplinks (a share
// group); single subscribes plainly and so stores every message too: the
// single-server run of the same messages. It checks:
//   - ClickHouse node ch11 (a's first node, shard 1's first replica)
//     SIGKILLed during ingest: dashboard queries through a and b keep
//     answering, and every message the broker acknowledged to the device
//     is stored exactly once in the Distributed table;
//   - dashboard counts and property history through a and through b equal
//     single's;
//   - read-property commands on either instance answer, their replies
//     landing on either instance's ingest;
//   - a device deployed through b is stored by both within the cache
//     bound (2 s), one undeployed through a no longer is.
//
// It runs with DEVICEHUB_TEST_CLUSTER=1 (`make test-cluster`, which
// starts the cluster), and is skipped otherwise.
func TestCluster(t *testing.T) {
	cl := needCluster(t)
	broker := mqtttest.StartBroker(t)
	bin := testkit.Devicehub(t)
	suffix := randHex()
	pg := metatest.NewDatabase(t)
	clusterDB, singleDB := "devicehub_cluster_test_"+suffix, "devicehub_single_test_"+suffix
	base := append(os.Environ(),
		"DEVICEHUB_POSTGRES_DSN="+pg,
		"DEVICEHUB_MQTT_URL="+broker.URL(),
		"DEVICEHUB_ADMIN_PASSWORD=admin123",
		"DEVICEHUB_LOG_LEVEL=warn",
		"DEVICEHUB_COMMAND_TIMEOUT=5s",
	)
	group := "cluster-test-" + suffix
	envA := append(append([]string(nil), base...), "DEVICEHUB_CLICKHOUSE_CLUSTER="+cl.Name, "DEVICEHUB_CLICKHOUSE_DB="+clusterDB,
		"DEVICEHUB_CLICKHOUSE_ADDR="+cl.Addrs("ch11", "ch21"), "DEVICEHUB_MQTT_SHARE_GROUP="+group, "DEVICEHUB_MQTT_CLIENT_ID=a-"+suffix)
	envB := append(append([]string(nil), base...), "DEVICEHUB_CLICKHOUSE_CLUSTER="+cl.Name, "DEVICEHUB_CLICKHOUSE_DB="+clusterDB,
		"DEVICEHUB_CLICKHOUSE_ADDR="+cl.Addrs("ch22", "ch12"), "DEVICEHUB_MQTT_SHARE_GROUP="+group, "DEVICEHUB_MQTT_CLIENT_ID=b-"+suffix)
	envS := append(append([]string(nil), base...), "DEVICEHUB_CLICKHOUSE_DB="+singleDB,
		"DEVICEHUB_CLICKHOUSE_ADDR="+envOr("DEVICEHUB_CLICKHOUSE_ADDR", "127.0.0.1:9000"), "DEVICEHUB_MQTT_SHARE_GROUP=none",
		"DEVICEHUB_MQTT_CLIENT_ID=single-"+suffix)

	// a and b start together: both migrate PostgreSQL and create the
	// tables ON CLUSTER at once.
	started := time.Now()
	a, b := launch(t, bin, envA, "a"), launch(t, bin, envB, "b")
	a.waitHealthy(t, 90*time.Second)
	b.waitHealthy(t, 90*time.Second)
	t.Logf("a and b started together in %s", time.Since(started).Round(time.Millisecond))
	single := launch(t, bin, envS, "single")
	single.waitHealthy(t, 60*time.Second)
	t.Cleanup(func() { // before the databases are dropped
		for _, s := range []*instance{a, b, single} {
			s.signal(syscall.SIGTERM)
		}
		for _, s := range []*instance{a, b, single} {
			s.wait(20 * time.Second)
		}
	})
	singleStore := tsdbtest.OpenDB(t, singleDB, nil)
	clusterStore := cl.openDB(t, clusterDB, "ch21", "ch22")

	token := login(t, a.base)
	product := "cp" + suffix
	a.call(t, token, "POST", "/api/device/product", map[string]any{"id": product, "name": "Cluster", "classifiedId": "test",
		"modelFrom": "custom", "accessId": "mqtt", "deviceType": "device"})
	a.call(t, token, "PATCH", "/api/device-product", map[string]any{"id": product, "name": "Cluster", "classifiedId": "test",
		"accessId": "mqtt", "deviceType": map[string]any{"value": "device"}, "metadata": testModel})
	a.call(t, token, "POST", "/api/device-product/"+product+"/deploy", nil)
	var devices []string
	for i := range 24 {
		d := fmt.Sprintf("cd%d-%s", i, suffix)
		devices = append(devices, d)
		a.call(t, token, "POST", "/api/device/instance", map[string]any{"id": d, "name": d, "productId": product})
		a.call(t, token, "POST", "/api/device/instance/"+d+"/deploy", nil)
	}
	gw := mqtttest.Gateway(t, broker.URL())

	// --- ingest through a and b, ch11 killed meanwhile ---------------------
	pub := startReports(t, broker.URL(), gw, product, devices)
	until := func(n int64) {
		t.Helper()
		testkit.Eventually(t, 60*time.Second, fmt.Sprintf("%d reports published", n), func() bool { return pub.published() >= n })
	}
	until(3000)
	killed := time.Now()
	cl.Script(t, "kill", "ch11")
	restarted := false
	t.Cleanup(func() {
		if !restarted {
			cl.Script(t, "start", "clickhouse")
		}
	})
	// Queries keep answering through both instances.
	from, to := time.Now().Add(-2*time.Hour).UnixMilli(), time.Now().Add(time.Hour).UnixMilli()
	queries := dashboardQueries(product, devices[:6], from, to)
	var answered, failed int
	for time.Since(killed) < 8*time.Second {
		for _, s := range []*instance{a, b} {
			if _, err := s.dashboard(token, queries); err != nil {
				failed++
				t.Logf("%s, %s after the kill: %v", s.name, time.Since(killed).Round(time.Millisecond), err)
			} else {
				answered++
			}
		}
		time.Sleep(200 * time.Millisecond) // pacing of the requests; their answers are what is counted
	}
	t.Logf("with ch11 down: %d dashboard requests answered, %d failed", answered, failed)
	if failed > 2 {
		t.Errorf("with ch11 down %d dashboard requests failed (%d answered); want at most 2 (a request on a connection cut by the kill)", failed, answered)
	}
	until(pub.published() + 2000) // more traffic while ch11 is down
	acked := pub.stop(t)
	cl.Script(t, "start", "clickhouse")
	restarted = true
	t.Logf("ch11 down for %s; %d reports acknowledged by the broker", time.Since(killed).Round(time.Millisecond), len(acked))

	// Every acknowledged report stored exactly once, on the cluster and on
	// the single server.
	for _, st := range []struct {
		name string
		db   *tsdb.DB
	}{{"cluster", clusterStore}, {"single server", singleStore}} {
		got, missing := tsdbtest.AwaitStored(st.db, "up", acked, 90*time.Second)
		if len(missing) > 0 {
			t.Fatalf("%s: %d acknowledged reports not stored: %s\na:\n%s\nb:\n%s", st.name, len(missing), mqtttest.IDRanges(missing), a.logTail(), b.logTail())
		}
		var dupIDs []string
		for id, n := range got {
			if n > 1 && strings.HasPrefix(id, "m") {
				dupIDs = append(dupIDs, id)
			}
		}
		if len(dupIDs) > 0 {
			t.Fatalf("%s: %d reports stored more than once: %s", st.name, len(dupIDs), mqtttest.IDRanges(dupIDs))
		}
	}
	storedA, storedB := metric(t, a, "devicehub_ingest_stored_total"), metric(t, b, "devicehub_ingest_stored_total")
	t.Logf("stored by a %v, by b %v; failed inserts (retried) a %v, b %v", storedA, storedB,
		metric(t, a, "devicehub_ingest_flush_errors_total"), metric(t, b, "devicehub_ingest_flush_errors_total"))
	if storedA == 0 || storedB == 0 {
		t.Errorf("the share group did not split the traffic: a stored %v, b %v", storedA, storedB)
	}
	// Both replicas of each shard hold the same rows (ch11 caught up),
	// in the raw tables and in every view's table (each replicates on its
	// own): whichever replica a query reads, it sees them all.
	for _, shard := range [][2]string{{"ch11", "ch12"}, {"ch21", "ch22"}} {
		for table, rows := range map[string]string{
			"device_message_local": "count()", "device_property_local": "count()",
			"device_message_daily_local": "sum(messages)", "device_message_quarter_local": "sum(messages)",
			"device_property_hourly_local": "countMerge(n)", "device_property_product_hourly_local": "countMerge(n)",
			"device_property_daily_local": "sum(n)",
		} {
			q := "SELECT toUInt64(" + rows + ") FROM `" + clusterDB + "`." + table
			testkit.Eventually(t, 90*time.Second, shard[0]+" and "+shard[1]+" in step", func() bool {
				n := cl.scalar(t, shard[0], q)
				return n > 0 && n == cl.scalar(t, shard[1], q)
			})

		}
	}

	// The message-count rollups against the raw table on the cluster. A
	// replica killed after an insert's raw part was committed and before
	// its views were written leaves that block out of the views for good:
	// the retry is recognised as a duplicate of the committed part, and
	// ClickHouse then writes no view (tsdb/cluster.go, "A replica killed
	// in an insert"). The kill above lands in such an insert now and
	// then; the raw table is exact either way (checked above), the
	// rollups are then short by what that insert held, and the dashboard
	// must answer exactly what they hold: short by that much, never more.
	short := rollupShortfall(t, cl, clusterDB)

	// --- the dashboard: a and b answer as the single server does ------------
	queries = dashboardQueries(product, devices, from, to)
	want, err := single.dashboard(token, queries)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []*instance{a, b} {
		// Rows stored through the other instance show within the result
		// cache's TTL (1 s; REFERENCE.md, Dashboard): the replicas just
		// caught up, so an answer may be that old. The bound is wider
		// than that: four ClickHouse servers, ZooKeeper and two devicehubs
		// share two cores here, and a CI run once saw an hourly count
		// still 96 short after 5 s (the answers must still be exact).
		var diff string
		if !testkit.Within(15*time.Second, func() bool {
			got, err := s.dashboard(token, queries)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(want) {
				t.Fatalf("%s: %d dashboard items, single server %d", s.name, len(got), len(want))
			}
			diff = compareDashboards(s.name, got, want, short)
			return diff == ""
		}) {
			t.Fatal(diff)
		}
	}
	t.Logf("%d dashboard items alike on a, b and the single server", len(want))

	// --- commands: either instance, replies to either ingest ----------------
	dev := devices[0]
	responder := startResponder(t, broker.URL(), gw, product, dev)
	testkit.Eventually(t, 10*time.Second, "the device online on every instance", func() bool {
		for _, s := range []*instance{a, b, single} {
			if code, _ := s.readProperty(token, dev, "temperature"); code != http.StatusOK {
				return false
			}
		}
		return true
	})

	recvA, recvB := metric(t, a, "devicehub_ingest_received_total"), metric(t, b, "devicehub_ingest_received_total")
	for i := range 20 {
		s := []*instance{a, b}[i%2]
		code, v := s.readProperty(token, dev, "temperature")
		if code != http.StatusOK || v != float64(responder.value) {
			t.Fatalf("read %d on %s: status %d, value %v; want 200, %d\n%s", i, s.name, code, v, responder.value, s.logTail())
		}
	}
	// The replies, the only uplinks meanwhile, went to both ingests
	// (the share group), so replies to a's reads were taken by b's and
	// the other way round; each is stored once.
	replies := func() uint64 {
		var n uint64
		if err := clusterStore.Conn().QueryRow(context.Background(), "SELECT count() FROM device_message WHERE device_id = ? AND topic LIKE '%/properties/read/reply'", dev).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	testkit.Eventually(t, 10*time.Second, "the replies stored", func() bool { return replies() >= uint64(responder.sent()) })
	ra, rb := metric(t, a, "devicehub_ingest_received_total")-recvA, metric(t, b, "devicehub_ingest_received_total")-recvB
	t.Logf("20 reads answered on a and b; their replies taken by a's ingest %v, b's %v; %d replies sent, %d stored",
		ra, rb, responder.sent(), replies())
	if ra == 0 || rb == 0 {
		t.Errorf("the replies all went to one ingest (a %v, b %v): nothing showed a reply taken by the other instance", ra, rb)
	}
	if n := replies(); n != uint64(responder.sent()) {
		t.Errorf("%d replies stored, %d sent", n, responder.sent())
	}

	// --- deploy and undeploy through one instance, seen by the other --------
	late := "late-" + suffix
	b.call(t, token, "POST", "/api/device/instance", map[string]any{"id": late, "name": late, "productId": product})
	lateCount := func() uint64 {
		n, err := tsdbtest.StoredCounts(context.Background(), clusterStore, "up")
		if err != nil {
			t.Fatal(err)
		}
		var c uint64
		for id, k := range n {
			if strings.HasPrefix(id, "late-") {
				c += k
			}
		}
		return c
	}
	// Every report of the late device is either stored (lateCount) or
	// dropped as not active (the two instances' counters): a burst is
	// waited for until all of it is accounted for, so that no assertion
	// rests on a sleep.
	const notActive = `devicehub_ingest_dropped_total{reason="not_active"}`
	burst := func(prefix string, n int) (sent time.Time, stored, droppedA, droppedB int) {
		t.Helper()
		s0, a0, b0 := lateCount(), metric(t, a, notActive), metric(t, b, notActive)
		sent = time.Now()
		publishBurst(t, broker.URL(), gw, product, late, prefix, n)
		testkit.Eventually(t, 20*time.Second, fmt.Sprintf("the %d reports %s* stored or dropped", n, prefix), func() bool {
			stored, droppedA, droppedB = int(lateCount()-s0), int(metric(t, a, notActive)-a0), int(metric(t, b, notActive)-b0)
			return stored+droppedA+droppedB >= n
		})
		return sent, stored, droppedA, droppedB
	}
	// The ingest caches device statuses 2 s (REFERENCE.md, Scaling out):
	// after a change, a burst sent later than that (and some slack) must
	// see the new status on both instances.
	const bound = 2500 * time.Millisecond
	// settle sends bursts until one is wholly stored (want true) or
	// wholly dropped, failing if a burst sent after the bound is not.
	settle := func(what string, changed time.Time, want bool) {
		t.Helper()
		for k := 0; ; k++ {
			sent, stored, da, db := burst(fmt.Sprintf("late-%s-%d-", what, k), 20)
			if want && stored == 20 || !want && stored == 0 {
				t.Logf("%s: a burst sent %s after the change wholly %s", what, sent.Sub(changed).Round(time.Millisecond), map[bool]string{true: "stored", false: "dropped"}[want])
				return
			}
			if sent.Sub(changed) > bound {
				t.Fatalf("%s: a burst sent %s after the change: %d stored, dropped by a %d, by b %d", what, sent.Sub(changed).Round(time.Millisecond), stored, da, db)
			}
		}
	}

	_, stored, da, db := burst("late-before-", 40)
	if stored != 0 || da == 0 || db == 0 {
		// Both instances must have seen it not active (and cached that)
		// for the deploy below to test their caches.
		t.Fatalf("a device not deployed: %d reports stored, dropped by a %d, by b %d; want none stored, both dropping", stored, da, db)
	}
	b.call(t, token, "POST", "/api/device/instance/"+late+"/deploy", nil)
	settle("deployed", time.Now(), true)
	a.call(t, token, "POST", "/api/device/instance/"+late+"/undeploy", nil)
	settle("undeployed", time.Now(), false)
}

// --- the cluster of .ci/cluster -------------------------------------------------

// testCluster is the cluster .ci/cluster runs (testkit.Cluster).
type testCluster struct{ testkit.Cluster }

// needCluster skips the test unless the cluster runs (testkit.NeedCluster).
func needCluster(t *testing.T) testCluster { return testCluster{testkit.NeedCluster(t)} }

// openDB opens the cluster database name (which the instances create)
// and drops it ON CLUSTER when the test ends.
func (c testCluster) openDB(t *testing.T, name string, nodes ...string) *tsdb.DB {
	t.Helper()
	opt := tsdb.DefaultOptions()
	opt.Addr, opt.Database, opt.Cluster = c.Addrs(nodes...), name, c.Name
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	db, err := tsdb.Open(ctx, opt)
	if err != nil {
		t.Fatalf("open the cluster database: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		if err := db.DropDatabase(ctx); err != nil {
			t.Logf("drop %s: %v", name, err)
		}
		db.Close()
	})
	return db
}

func (c testCluster) scalar(t *testing.T, node, query string) uint64 {
	t.Helper()
	out, err := exec.Command("clickhouse-client", "--host", strings.Split(c.Nodes[node], ":")[0],
		"--port", strings.Split(c.Nodes[node], ":")[1], "-q", query).Output()
	if err != nil {
		return 0 // not up yet
	}
	n, _ := strconv.ParseUint(strings.TrimSpace(string(out)), 10, 64)
	return n
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// --- instances ----------------------------------------------------------------

// instance is a named run of the binary.
type instance struct {
	*server
	name string
}

// launch starts the binary without waiting for it (see waitHealthy), so
// that instances start together.
func launch(t *testing.T, bin string, env []string, name string) *instance {
	t.Helper()
	return &instance{launchServer(t, bin, env, name), name}
}

func (s *instance) waitHealthy(t *testing.T, d time.Duration) {
	t.Helper()
	s.await(t, s.name, "/readyz", d)
}

// request sends a JSON request and returns the status and the
// envelope's result; an answer other than 200 is an error too.
func (s *instance) request(token, method, path string, body any) (int, json.RawMessage, error) {
	r, err := s.api(token).Request(method, path, body)
	if err != nil {
		return 0, nil, err
	}
	if r.HTTPStatus != http.StatusOK {
		return r.HTTPStatus, r.Result, &testkit.StatusError{Method: method, Path: path, Response: r}
	}
	return r.HTTPStatus, r.Result, nil
}

// dashboard runs endpoint 14 and returns its items.
func (s *instance) dashboard(token string, queries []map[string]any) ([]any, error) {
	_, res, err := s.request(token, "POST", "/api/dashboard/_multi", queries)
	if err != nil {
		return nil, err
	}
	var items []any
	if err := json.Unmarshal(res, &items); err != nil {
		return nil, err
	}
	return items, nil
}

// readProperty runs endpoint 10 and returns the status and the value.
func (s *instance) readProperty(token, device, property string) (int, any) {
	code, res, err := s.request(token, "GET", "/api/device/standard/"+device+"/property/"+property, nil)
	if err != nil {
		return code, nil
	}
	var m map[string]any
	_ = json.Unmarshal(res, &m)
	return code, m[property]
}

// metric reads an unlabelled counter from /metrics.
func metric(t *testing.T, s *instance, name string) float64 {
	t.Helper()
	resp, err := http.Get(s.base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	t.Fatalf("%s has no metric %s", s.name, name)
	return 0
}

// rollupShortfall returns, per message-count rollup table, how many
// messages of the cluster database's raw table it lacks; a rollup holding
// more than the raw table, or lacking more than a tenth of it (more than
// the inserts in flight at one replica's kill), fails the test.
func rollupShortfall(t *testing.T, cl testCluster, db string) map[string]uint64 {
	t.Helper()
	q := func(sql string) uint64 {
		var n uint64
		testkit.Eventually(t, 30*time.Second, sql, func() bool {
			n = cl.scalar(t, "ch21", sql)
			return n > 0
		})
		return n
	}
	raw := q("SELECT count() FROM `" + db + "`.device_message")
	short := map[string]uint64{}
	for _, table := range []string{"device_message_quarter", "device_message_daily"} {
		n := q("SELECT sum(messages) FROM `" + db + "`." + table)
		switch {
		case n > raw:
			t.Fatalf("%s counts %d messages, device_message holds %d", table, n, raw)
		case raw-n > raw/10:
			t.Fatalf("%s counts %d messages, device_message holds %d: more lost than one replica's inserts in flight", table, n, raw)
		case n < raw:
			t.Logf("%s lacks %d of device_message's %d messages: an insert cut by the kill between its raw part and its views", table, raw-n, raw)
		}
		short[table] = raw - n
	}
	return short
}

// compareDashboards returns "" when got (a cluster instance's answer)
// equals want (the single server's), or says where they differ. A
// message-count item (group count-<interval>-<product>) may be lower than
// want's where the rollup it is read from is short (rollupShortfall): the
// 15m and 1h counts are read from device_message_quarter, days and longer
// from device_message_daily; then its values must sum to exactly want's
// less that shortfall.
func compareDashboards(name string, got, want []any, short map[string]uint64) string {
	type sums struct{ got, want float64 }
	groups := map[string]*sums{}
	table := func(group string) string {
		if strings.HasPrefix(group, "count-1h-") {
			return "device_message_quarter"
		}
		return "device_message_daily"
	}
	field := func(item any, key string) any {
		m, _ := item.(map[string]any)
		return m[key]
	}
	value := func(item any) float64 {
		v, _ := field(field(item, "data"), "value").(float64)
		return v
	}
	for i := range want {
		group, _ := field(want[i], "group").(string)
		if strings.HasPrefix(group, "count-") && short[table(group)] > 0 && field(got[i], "group") == group {
			g, w := value(got[i]), value(want[i])
			if g > w {
				return fmt.Sprintf("%s: dashboard item %d counts more than the single server:\n got %v\nwant %v", name, i, got[i], want[i])
			}
			if groups[group] == nil {
				groups[group] = &sums{}
			}
			groups[group].got += g
			groups[group].want += w
			continue
		}
		if !reflect.DeepEqual(got[i], want[i]) {
			return fmt.Sprintf("%s: dashboard item %d:\n got %v\nwant %v", name, i, got[i], want[i])
		}
	}
	for group, s := range groups {
		if s.want-s.got != float64(short[table(group)]) {
			return fmt.Sprintf("%s: %s counts %v, the single server %v; %s lacks %d", name, group, s.got, s.want, table(group), short[table(group)])
		}
	}
	return ""
}

// dashboardQueries are message counts (hours and days, the product and
// all) between from and to, and the history of each device.
func dashboardQueries(product string, devices []string, from, to int64) []map[string]any {
	var qs []map[string]any
	for _, p := range []string{product, ""} {
		for _, iv := range []string{"1h", "1d", "1M"} {
			params := map[string]any{"time": iv, "format": "yyyy-MM-dd HH", "limit": 100, "from": from, "to": to}
			if p != "" {
				params["productId"] = p
			}
			qs = append(qs, map[string]any{"dashboard": "device", "object": "message", "measurement": "quantity",
				"dimension": "agg", "group": "count-" + iv + "-" + p, "params": params})
		}
	}
	for _, d := range devices {
		qs = append(qs, map[string]any{"dashboard": "device", "object": product, "measurement": "properties",
			"dimension": "history", "group": "history-" + d,
			"params": map[string]any{"deviceId": d, "history": 20, "properties": []string{"temperature", "mode", "i"}}})
	}
	return qs
}

// --- the devices ----------------------------------------------------------------

// reports publishes QoS 1 reports of devices through a gateway login,
// report i (messageId "m<i>") from devices[i % len], with its timestamp
// in the payload so that every instance stores the same time.
type reports struct {
	mu    sync.Mutex
	sent  []mqtttest.Sent
	n     int64
	quit  chan struct{}
	done  chan struct{}
	pubCl mqtt.Client
}

func startReports(t *testing.T, url string, gw func(*mqtt.ClientOptions), product string, devices []string) *reports {
	t.Helper()
	o := mqtt.NewClientOptions().AddBroker(url).SetClientID("gw-pub-" + randHex()).SetCleanSession(true).SetAutoReconnect(false)
	gw(o)
	c := mqtt.NewClient(o)
	if tok := c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("publisher connect: %v", tok.Error())
	}
	r := &reports{quit: make(chan struct{}), done: make(chan struct{}), pubCl: c}
	go func() {
		defer close(r.done)
		for i := 0; ; i++ {
			select {
			case <-r.quit:
				return
			default:
			}
			d := devices[i%len(devices)]
			id := "m" + strconv.Itoa(i)
			payload := fmt.Sprintf(`{"messageId":%q,"timestamp":%d,"properties":{"temperature":%.1f,"mode":"mode-%d","i":%d}}`,
				id, time.Now().UnixMilli(), 20+float64(i%100)/10, i%7, i)
			tok := c.Publish("/"+product+"/"+d+"/properties/report", 1, false, payload)
			r.mu.Lock()
			r.sent = append(r.sent, mqtttest.Sent{ID: id, Tok: tok})
			r.n++
			r.mu.Unlock()
			time.Sleep(time.Millisecond) // pacing: a steady stream of reports
		}
	}()
	t.Cleanup(func() { r.halt(); c.Disconnect(0) })
	return r
}

func (r *reports) published() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n
}

func (r *reports) halt() {
	select {
	case <-r.quit:
	default:
		close(r.quit)
	}
	<-r.done
}

// stop stops publishing and returns the ids the broker acknowledged.
func (r *reports) stop(t *testing.T) []string {
	t.Helper()
	r.halt()
	r.mu.Lock()
	sent := append([]mqtttest.Sent(nil), r.sent...)
	r.mu.Unlock()
	ackedAt, failed, pending := mqtttest.WaitAcks(sent, 30*time.Second)
	if failed+pending > 0 {
		t.Logf("of %d reports, %d failed and %d had no answer from the broker", len(sent), failed, pending)
	}
	ids := make([]string, len(ackedAt))
	for k, i := range ackedAt {
		ids[k] = sent[i].ID
	}
	return ids
}

// publishBurst publishes n QoS 1 reports of one device, ids prefix<k>.
func publishBurst(t *testing.T, url string, gw func(*mqtt.ClientOptions), product, device, prefix string, n int) {
	t.Helper()
	o := mqtt.NewClientOptions().AddBroker(url).SetClientID("gw-burst-" + randHex()).SetCleanSession(true).SetAutoReconnect(false)
	gw(o)
	c := mqtt.NewClient(o)
	if tok := c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("burst connect: %v", tok.Error())
	}
	defer c.Disconnect(250)
	for k := range n {
		tok := c.Publish("/"+product+"/"+device+"/properties/report", 1, false,
			fmt.Sprintf(`{"messageId":"%s%d","properties":{"temperature":%d}}`, prefix, k, k))
		if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
			t.Fatalf("burst publish: %v", tok.Error())
		}
	}
}

// responder plays one device: online, and answering every property read
// with temperature = value.
type responder struct {
	value int
	n     atomic.Int64 // replies sent
}

func (r *responder) sent() int64 { return r.n.Load() }

func startResponder(t *testing.T, url string, gw func(*mqtt.ClientOptions), product, device string) *responder {
	t.Helper()
	r := &responder{value: 42}
	prefix := "/" + product + "/" + device + "/"
	o := mqtt.NewClientOptions().AddBroker(url).SetClientID("gw-dev-" + randHex()).SetCleanSession(true).SetAutoReconnect(false)
	gw(o)
	c := mqtt.NewClient(o)
	if tok := c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("responder connect: %v", tok.Error())
	}
	t.Cleanup(func() { c.Disconnect(0) })
	tok := c.Subscribe(prefix+"properties/read", 1, func(c mqtt.Client, m mqtt.Message) {
		var req struct {
			MessageID string `json:"messageId"`
		}
		if json.Unmarshal(m.Payload(), &req) != nil {
			return
		}
		r.n.Add(1)
		c.Publish(prefix+"properties/read/reply", 1, false, fmt.Sprintf(
			`{"messageId":%q,"deviceId":%q,"success":true,"properties":{"temperature":%d}}`, req.MessageID, device, r.value))
	})
	if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("responder subscribe: %v", tok.Error())
	}
	if tok := c.Publish(prefix+"online", 1, false, "{}"); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("responder online: %v", tok.Error())
	}
	return r
}
