package tsdb

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"devicehub/bench/testkit"
	"devicehub/schema"
)

// The cluster rewrite of the embedded DDL, without a server.
func TestClusterStatements(t *testing.T) {
	db := &DB{tzName: "Asia/Shanghai"}
	single, err := db.statements()
	if err != nil {
		t.Fatal(err)
	}
	out, err := clusterStatements(single, "dh", "db1")
	if err != nil {
		t.Fatalf("the embedded DDL has no cluster form: %v", err)
	}
	var creates, views, inserts, converts int
	for _, s := range out {
		if s.convert != "" {
			// convert.go writes its own ON CLUSTER statements.
			converts++
			if s.convert != "device_property device_property_v6" {
				t.Errorf("convert: %+v", s)
			}
			continue
		}
		if strings.HasPrefix(s.sql, "INSERT INTO ") {
			// The rollups', the quarter-hours' and the daily values' backfills, through the
			// Distributed tables.
			inserts++
			if strings.Contains(s.sql, "_local") || s.cond == "" {
				t.Errorf("insert: %+v", s)
			}
			continue
		}
		if !strings.Contains(s.sql, " ON CLUSTER `dh`") {
			t.Errorf("not ON CLUSTER: %s", s.sql)
		}
		// Every statement runs only when the node's catalog says it is due:
		// a start with the schema in place queues nothing.
		if s.cond == "" {
			t.Errorf("no condition: %s", s.sql)
		}
		switch {
		case strings.Contains(s.sql, "ENGINE = Replicated"):
			creates++
			if !strings.Contains(s.sql, "('/clickhouse/tables/{shard}/db1/") || !strings.Contains(s.sql, "_local', '{replica}'") {
				t.Errorf("replicated table path: %s", s.sql)
			}
		case strings.Contains(s.sql, "MATERIALIZED VIEW"):
			views++
			daily := strings.Contains(s.sql, "TO `db1`.`device_message_daily_local`") && strings.Contains(s.sql, "FROM `db1`.`device_message_local`") &&
				strings.Contains(s.sql, "'Asia/Shanghai'")
			hourly := strings.Contains(s.sql, "TO `db1`.`device_property_hourly_local`") && strings.Contains(s.sql, "FROM `db1`.`device_property_local`")
			quarter := strings.Contains(s.sql, "TO `db1`.`device_message_quarter_local`") && strings.Contains(s.sql, "FROM `db1`.`device_message_local`")
			product := (strings.Contains(s.sql, "TO `db1`.`device_property_product_hourly_local`") || strings.Contains(s.sql, "TO `db1`.`device_property_daily_local`")) &&
				strings.Contains(s.sql, "FROM `db1`.`device_property_local`")
			// The views of the layout of 00006 read ts; the old ones,
			// time, and only while the old layout is in place.
			if old := strings.Contains(s.sql, "(time"); old == strings.Contains(s.sql, "_mv6`") && strings.Contains(s.sql, "device_property_local") {
				t.Errorf("view of the wrong layout: %s", s.sql)
			}
			if strings.Contains(s.sql, "(time") && !strings.Contains(s.cond, "name = 'time'") && strings.Contains(s.sql, "device_property_local") {
				t.Errorf("old view without the layout's condition: %+v", s)
			}
			if !daily && !hourly && !quarter && !product {
				t.Errorf("view: %s", s.sql)
			}
		case strings.HasPrefix(s.sql, "TRUNCATE"):
			if s.sql != "TRUNCATE TABLE `db1`.`device_property_hourly_local` ON CLUSTER `dh`" &&
				s.sql != "TRUNCATE TABLE `db1`.`device_message_quarter_local` ON CLUSTER `dh`" &&
				s.sql != "TRUNCATE TABLE `db1`.`device_property_product_hourly_local` ON CLUSTER `dh`" &&
				s.sql != "TRUNCATE TABLE `db1`.`device_property_daily_local` ON CLUSTER `dh`" {
				t.Errorf("truncate: %s", s.sql)
			}
		}
	}
	// 10 tables and the conversion's 2 (device_property_v6 and its
	// record); 5 views and their 3 successors on the new layout.
	if creates != 12 || views != 8 || inserts != 4 || converts != 1 {
		t.Fatalf("%d replicated tables, %d views, %d inserts, %d conversions; want 12, 8, 4, 1", creates, views, inserts, converts)
	}
	want := map[string]string{
		"device_message":                        "cityHash64(device_id)",
		"device_property":                       "cityHash64(device_id)",
		"device_message_daily":                  "rand()",
		"device_property_hourly":                "cityHash64(device_id)",
		"device_property_hourly_filled":         "rand()",
		"device_message_quarter":                "rand()",
		"device_message_quarter_filled":         "rand()",
		"device_property_product_hourly":        "rand()",
		"device_property_daily":                 "rand()",
		"device_property_product_hourly_filled": "rand()",
	}
	for table, key := range want {
		d := "CREATE TABLE IF NOT EXISTS `db1`.`" + table + "` ON CLUSTER `dh` AS `db1`.`" + table + "_local` ENGINE = Distributed('dh', 'db1', '" + table + "_local', " + key + ")"
		found := false
		for _, s := range out {
			found = found || s.sql == d
		}
		if !found {
			t.Errorf("missing %s", d)
		}
	}

	f := func(src, wantErr string, want ...ddl) {
		t.Helper()
		got, err := clusterStatements(splitDDL(src, "UTC"), "c", "d")
		if wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), wantErr) {
				t.Fatalf("%q: error %v, want %q", src, err, wantErr)
			}
			return
		}
		if err != nil {
			t.Fatalf("%q: %v", src, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%q:\n got %q\nwant %q", src, got, want)
		}
	}
	missing := func(n string) string {
		return "SELECT toUInt64(count() = 0) FROM system.tables WHERE database = currentDatabase() AND name = '" + n + "'"
	}
	f("CREATE TABLE IF NOT EXISTS t (a String, f Enum8('x)' = 1)) ENGINE = SummingMergeTree((a, b)) ORDER BY a;", "",
		ddl{sql: "CREATE TABLE IF NOT EXISTS `d`.`t_local` ON CLUSTER `c` (a String, f Enum8('x)' = 1)) ENGINE = ReplicatedSummingMergeTree('/clickhouse/tables/{shard}/d/t_local', '{replica}', (a, b)) ORDER BY a",
			cond: missing("t_local")},
		ddl{sql: "CREATE TABLE IF NOT EXISTS `d`.`t` ON CLUSTER `c` AS `d`.`t_local` ENGINE = Distributed('c', 'd', 't_local', rand())", cond: missing("t")})
	f("SELECT 1;", "no cluster form")
	f("CREATE TABLE IF NOT EXISTS t (a String) ENGINE = MergeTree() ORDER BY a;\nALTER TABLE t ADD COLUMN b String;", "needs a \"--@if\" condition")
	f("ALTER TABLE nope DROP COLUMN x;", "not a table created before it")
	f("TRUNCATE TABLE nope;", "not a table created before it")
	f("--@if SELECT 1\nINSERT INTO nope (a) SELECT 1;", "not a table created before it")
	f("CREATE TABLE IF NOT EXISTS t (a String) ENGINE = MergeTree() ORDER BY a;\nINSERT INTO t (a) SELECT 'x';", "needs a \"--@if\" condition")
	f("CREATE TABLE IF NOT EXISTS t (a String) ENGINE = MergeTree() ORDER BY a;\n--@if SELECT 1\nTRUNCATE TABLE t;\n--@if SELECT 2\nINSERT INTO t (a) SELECT a FROM t;", "",
		ddl{sql: "CREATE TABLE IF NOT EXISTS `d`.`t_local` ON CLUSTER `c` (a String) ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/d/t_local', '{replica}') ORDER BY a",
			cond: missing("t_local")},
		ddl{sql: "CREATE TABLE IF NOT EXISTS `d`.`t` ON CLUSTER `c` AS `d`.`t_local` ENGINE = Distributed('c', 'd', 't_local', rand())", cond: missing("t")},
		ddl{sql: "TRUNCATE TABLE `d`.`t_local` ON CLUSTER `c`", cond: "SELECT 1"},
		ddl{sql: "INSERT INTO t (a) SELECT a FROM t", cond: "SELECT 2"})
	f("CREATE TABLE IF NOT EXISTS t (a String) ENGINE = MergeTree() ORDER BY a;\n"+
		"CREATE MATERIALIZED VIEW IF NOT EXISTS v TO nope AS SELECT a FROM t;", "not a table created before it")
	f("CREATE TABLE IF NOT EXISTS t (a String, device_id String) ENGINE = MergeTree() ORDER BY device_id;\nDROP TABLE IF EXISTS t;", "",
		ddl{sql: "CREATE TABLE IF NOT EXISTS `d`.`t_local` ON CLUSTER `c` (a String, device_id String) ENGINE = ReplicatedMergeTree('/clickhouse/tables/{shard}/d/t_local', '{replica}') ORDER BY device_id",
			cond: missing("t_local")},
		ddl{sql: "CREATE TABLE IF NOT EXISTS `d`.`t` ON CLUSTER `c` AS `d`.`t_local` ENGINE = Distributed('c', 'd', 't_local', cityHash64(device_id))", cond: missing("t")},
		ddl{sql: "DROP TABLE IF EXISTS `d`.`t` ON CLUSTER `c`", cond: exists("t")},
		ddl{sql: "DROP TABLE IF EXISTS `d`.`t_local` ON CLUSTER `c`", cond: exists("t_local")})
}

// --- against the local cluster (.ci/cluster test) ----------------------------

// testCluster is the cluster .ci/cluster runs (testkit.Cluster).
type testCluster struct{ testkit.Cluster }

// needCluster skips the test unless the cluster runs (testkit.NeedCluster).
func needCluster(t *testing.T) testCluster { return testCluster{testkit.NeedCluster(t)} }

func (c testCluster) options(name string, loc *time.Location, nodes ...string) Options {
	opt := testOptions(name, loc)
	opt.Addr, opt.Cluster = c.Addrs(nodes...), c.Name
	return opt
}

// open opens a cluster database of this run through nodes (registered
// for dropping, ON CLUSTER).
func (c testCluster) open(t *testing.T, name string, loc *time.Location, nodes ...string) *DB {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	db, err := Open(ctx, c.options(name, loc, nodes...))
	if err != nil {
		t.Fatalf("open on cluster %s through %v: %v", c.Name, nodes, err)
	}
	sharedMu.Lock()
	toDrop = append(toDrop, db)
	sharedMu.Unlock()
	return db
}

// onNode runs a scalar query on one node, outside devicehub's database.
func (c testCluster) scalar(t *testing.T, node, query string, args ...any) uint64 {
	t.Helper()
	conn, err := connect(Options{Addr: c.Nodes[node], Username: "default", DialTimeout: 5 * time.Second,
		QueryTimeout: 30 * time.Second, MaxOpenConns: 1}, "default")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var n uint64
	if err := conn.QueryRow(ctxT(t), query, args...).Scan(&n); err != nil {
		t.Fatalf("%s on %s: %v", query, node, err)
	}
	return n
}

// lastDDLTask is the newest ON CLUSTER task queued in ZooKeeper.
func (c testCluster) lastDDLTask(t *testing.T) string {
	t.Helper()
	conn, err := connect(Options{Addr: c.Nodes["ch11"], Username: "default", DialTimeout: 5 * time.Second,
		QueryTimeout: 30 * time.Second, MaxOpenConns: 1}, "default")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var last string
	if err := conn.QueryRow(ctxT(t), "SELECT max(name) FROM system.zookeeper WHERE path = '/clickhouse/task_queue/ddl'").Scan(&last); err != nil {
		t.Fatal(err)
	}
	return last
}

// clusterData is messages and property values of 24 devices of 2
// products over seven months, some of them on day, month and UTC-day edges.
func clusterData(t *testing.T) ([]Message, []PropertyValue) {
	r := rand.New(rand.NewPCG(3, 4))
	lo, hi := sh(t, "2023-11-01 00:00:00").Unix(), sh(t, "2024-06-01 00:00:00").Unix()
	var ms []Message
	var ps []PropertyValue
	for i := range 6000 {
		tm := time.Unix(lo+r.Int64N(hi-lo), r.Int64N(1000)*1e6)
		if i < len(countTimes) {
			tm = sh(t, countTimes[i])
		}
		product, device := fmt.Sprint("cp", i%2), fmt.Sprint("cd", i%24)
		dir := "up"
		if i%7 == 0 {
			dir = "down"
		}
		ms = append(ms, Message{Time: tm, ProductID: product, DeviceID: device, Direction: dir, MessageID: fmt.Sprint("m", i),
			MessageType: "REPORT_PROPERTY", Topic: "/" + product + "/" + device + "/properties/report", Payload: []byte(`{"x":1}`)})
		for k := range 1 + i%3 {
			ps = append(ps, PropertyValue{Time: tm, ProductID: product, DeviceID: device, Property: fmt.Sprint("p", k),
				ValueType: "number", Num: float64(i)})
		}
		if i%5 == 0 {
			ps = append(ps, PropertyValue{Time: tm, ProductID: product, DeviceID: device, Property: "mode", ValueType: "string", Str: fmt.Sprint("s", i)})
		}
	}
	return ms, ps
}

// insertAll stores ms and ps in batches of 700 messages, so that the
// per-day tables hold parts to sum.
func insertAll(t *testing.T, db *DB, ms []Message, ps []PropertyValue) {
	t.Helper()
	ctx := ctxT(t)
	for i := 0; i < len(ms); i += 700 {
		if err := db.Insert(ctx, ms[i:min(i+700, len(ms))], nil); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < len(ps); i += 1500 {
		if err := db.Insert(ctx, nil, ps[i:min(i+1500, len(ps))]); err != nil {
			t.Fatal(err)
		}
	}
}

// dashboardAnswers is what the dashboard reads from db for the data of
// clusterData: counts of every interval, per product and in all, and
// each device's history.
func dashboardAnswers(t *testing.T, db *DB) map[string]any {
	t.Helper()
	ctx := ctxT(t)
	out := map[string]any{}
	from, to := sh(t, "2023-10-01 00:00:00"), sh(t, "2024-06-30 23:59:59")
	for _, product := range []string{"", "cp0", "cp1"} {
		for _, q := range []CountQuery{
			{Interval: Hour, From: sh(t, "2024-02-27 00:00:00"), To: sh(t, "2024-03-02 12:00:00")},
			{Interval: Day, From: from, To: to},
			{Interval: Week, From: from, To: to},
			{Interval: Month, From: from, To: to},
			{Interval: Year, From: from, To: to},
			{Interval: Day, From: from, To: to, Limit: 7},
		} {
			q.ProductID = product
			got, err := db.MessageCounts(ctx, q)
			if err != nil {
				t.Fatal(err)
			}
			var counts []string
			for _, b := range got {
				counts = append(counts, fmt.Sprintf("%s=%d", b.Start.Format(time.RFC3339), b.Count))
			}
			out[fmt.Sprintf("counts %s %s limit %d", product, q.Interval, q.Limit)] = counts
		}
	}
	for i := range 24 {
		product, device := fmt.Sprint("cp", i%2), fmt.Sprint("cd", i)
		for _, q := range []struct {
			props []string
			n     int
		}{{nil, 1}, {nil, 3}, {[]string{"p0", "mode"}, 5}, {[]string{"p2"}, 1}} {
			got, err := db.PropertyHistory(ctx, product, device, q.props, q.n)
			if err != nil {
				t.Fatal(err)
			}
			var vs []string
			for _, v := range got {
				vs = append(vs, fmt.Sprintf("%s %s %s %v %q", v.Time.Format(time.RFC3339Nano), v.Property, v.ValueType, v.Num, v.Str))
			}
			out[fmt.Sprintf("history %s %v %d", device, q.props, q.n)] = vs
		}
	}
	ids, err := db.MessageIDCounts(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	out["message ids"] = ids
	return out
}

func compareAnswers(t *testing.T, what string, got, want map[string]any) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d answers, want %d", what, len(got), len(want))
	}
	bad := 0
	for k, w := range want {
		if g := got[k]; !reflect.DeepEqual(g, w) {
			if bad++; bad <= 5 {
				t.Errorf("%s: %s:\n got %v\nwant %v", what, k, g, w)
			}
		}
	}
	if bad > 0 {
		t.Fatalf("%s: %d of %d answers differ", what, bad, len(want))
	}
}

// The same rows give the same dashboard answers on the cluster, through
// a node of either shard, as on one server; each shard holds whole
// devices, and both replicas of a shard hold the same rows.
func TestClusterMatchesSingleServer(t *testing.T) {
	c := needCluster(t)
	ms, ps := clusterData(t)
	single := openDB(t, "csingle", shanghai)
	insertAll(t, single, ms, ps)
	want := dashboardAnswers(t, single)

	name := fmt.Sprint("cmatch", rand.IntN(1e6))
	a := c.open(t, name, shanghai, "ch11", "ch21")
	insertAll(t, a, ms, ps)
	b := c.open(t, name, shanghai, "ch22", "ch12")
	compareAnswers(t, "through ch11", dashboardAnswers(t, a), want)
	compareAnswers(t, "through ch22", dashboardAnswers(t, b), want)

	// Where the rows are: each device on one shard, each shard's rows on
	// both of its replicas, the shards together holding each row once.
	dbName := a.Database()
	for _, table := range []string{"device_message_local", "device_property_local"} {
		var total uint64
		for _, shard := range [][2]string{{"ch11", "ch12"}, {"ch21", "ch22"}} {
			q := "SELECT count() FROM `" + dbName + "`.`" + table + "`"
			testkit.Eventually(t, 30*time.Second, "replicas of "+shard[0]+" in step", func() bool {
				return c.scalar(t, shard[0], q) == c.scalar(t, shard[1], q)
			})

			n := c.scalar(t, shard[0], q)
			if n == 0 {
				t.Errorf("%s holds no rows of %s: not sharded", shard[0], table)
			}
			total += n
		}
		wantRows := uint64(len(ms))
		if table == "device_property_local" {
			wantRows = uint64(len(ps))
		}
		if total != wantRows {
			t.Errorf("%s: shards hold %d rows together, want %d", table, total, wantRows)
		}
		devices := "SELECT uniqExact(device_id) FROM `" + dbName + "`.`" + table + "`"
		if n1, n2 := c.scalar(t, "ch11", devices), c.scalar(t, "ch21", devices); n1+n2 != 24 {
			t.Errorf("%s: devices per shard %d + %d, want 24 in all (each on one shard)", table, n1, n2)
		}
	}
}

// Instances starting together on a new database all open it; reopening
// queues no ON CLUSTER statement; a version 1 database loses
// device_property.message_id on every node, its rows kept.
func TestClusterOpenTogetherAndUpgrade(t *testing.T) {
	c := needCluster(t)
	ctx := ctxT(t)
	name := fmt.Sprint("copen", rand.IntN(1e6))
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	for _, nodes := range [][]string{{"ch11"}, {"ch12"}, {"ch22"}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			db, err := Open(ctx, c.options(name, time.UTC, nodes...))
			if err == nil {
				db.Close()
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("open a new database with others: %v", err)
		}
	}
	db := c.open(t, name, time.UTC, "ch21")
	for node := range c.Nodes {
		// device_message, device_property, device_message_daily,
		// device_property_hourly and its fill mark device_property_hourly_filled,
		// device_message_quarter and its fill mark device_message_quarter_filled,
		// device_property_product_hourly, device_property_daily and their
		// fill mark device_property_product_hourly_filled.
		if n := c.scalar(t, node, "SELECT count() FROM system.tables WHERE database = ? AND engine LIKE 'Replicated%'", db.Database()); n != 10 {
			t.Errorf("%s has %d replicated tables, want 10", node, n)
		}
		if n := c.scalar(t, node, "SELECT count() FROM system.tables WHERE database = ? AND engine = 'Distributed'", db.Database()); n != 10 {
			t.Errorf("%s has %d distributed tables, want 10", node, n)
		}
	}
	before := c.lastDDLTask(t)
	again := c.open(t, name, time.UTC, "ch12")
	if after := c.lastDDLTask(t); after != before {
		t.Errorf("reopening queued ON CLUSTER statements (last task %s, was %s)", after, before)
	}
	_ = again

	// Version 1 had device_property.message_id (on the replicated and the
	// distributed table): a database of its own, as version 1 made it.
	name = fmt.Sprint("cv1", rand.IntN(1e6))
	v1 := c.options(name, time.UTC, "ch11")
	v1.SchemaVersion = 1
	db, err := Open(ctx, v1)
	if err != nil {
		t.Fatal(err)
	}
	sharedMu.Lock()
	toDrop = append(toDrop, db)
	sharedMu.Unlock()
	tm := time.Date(2024, 5, 1, 8, 0, 0, 250e6, time.UTC)
	q := func(s string) string { return strings.ReplaceAll(s, "DB", "`"+db.Database()+"`") }
	for _, s := range []string{
		"INSERT INTO DB.device_property (time, ts, product_id, device_id, property, value_type, num_value, str_value, message_id)" +
			" SELECT toDateTime(1714550400), toInt64(1714550400250), 'p', 'd', 'temp', 'number', 21.5, '', 'm1'",
	} {
		if err := db.Conn().Exec(ctx, q(s)); err != nil {
			t.Fatalf("%s: %v", q(s), err)
		}
	}
	errs = make(chan error, 3)
	for _, nodes := range [][]string{{"ch11"}, {"ch21"}, {"ch22"}} {
		go func() {
			opt := c.options(name, time.UTC, nodes...)
			opt.SchemaVersion = 5
			db, err := Open(ctx, opt)
			if err == nil {
				db.Close()
			}
			errs <- err
		}()
	}
	for range 3 {
		if err := <-errs; err != nil {
			t.Fatalf("open a version 1 database with others: %v", err)
		}
	}
	for node := range c.Nodes {
		if n := c.scalar(t, node, "SELECT count() FROM system.columns WHERE database = ? AND name = 'message_id' AND table LIKE 'device_property%'", db.Database()); n != 0 {
			t.Errorf("%s: device_property still has message_id in %d tables", node, n)
		}
	}
	db = c.open(t, name, time.UTC, "ch21") // version 6: converted
	for node := range c.Nodes {
		if n := c.scalar(t, node, "SELECT count() FROM system.columns WHERE database = ? AND name = 'time' AND table LIKE 'device_property%'", db.Database()); n != 0 {
			t.Errorf("%s: device_property still has time in %d tables", node, n)
		}
	}
	got, err := db.PropertyHistory(ctx, "p", "d", []string{"temp"}, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Num != 21.5 || !got[0].Time.Equal(tm) {
		t.Fatalf("history after the upgrade: %+v", got)
	}
}

// An insert sent again after a failure that left part of it stored (one
// shard took its rows, another did not) is stored once: each shard drops
// a block identical to one it has. The writer's retries rely on it.
func TestClusterRetriedInsertStoredOnce(t *testing.T) {
	c := needCluster(t)
	db := c.open(t, fmt.Sprint("cretry", rand.IntN(1e6)), shanghai, "ch11")
	ms, ps := clusterData(t)
	ms, ps = ms[:1000], ps[:2000]
	ctx := ctxT(t)
	for range 3 {
		if err := db.Insert(ctx, ms, ps); err != nil {
			t.Fatal(err)
		}
	}
	ids, err := db.MessageIDCounts(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	for id, n := range ids {
		if n != 1 {
			t.Fatalf("message %s stored %d times", id, n)
		}
	}
	var props, daily uint64
	if err := db.Conn().QueryRow(ctx, "SELECT count() FROM device_property").Scan(&props); err != nil {
		t.Fatal(err)
	}
	if err := db.Conn().QueryRow(ctx, "SELECT sum(messages) FROM device_message_daily").Scan(&daily); err != nil {
		t.Fatal(err)
	}
	if len(ids) != len(ms) || props != uint64(len(ps)) || daily != uint64(len(ms)) {
		t.Fatalf("after 3 identical inserts: %d messages, %d values, daily %d; want %d, %d, %d",
			len(ids), props, daily, len(ms), len(ps), len(ms))
	}
}

func TestClusterDropPartitionsBefore(t *testing.T) {
	c := needCluster(t)
	db := c.open(t, fmt.Sprint("cret", rand.IntN(1e6)), shanghai, "ch21")
	ctx := ctxT(t)
	var ms []Message
	var ps []PropertyValue
	for _, s := range []string{"2023-12-31 23:59:59", "2024-01-15 00:00:00", "2024-02-29 23:00:00", "2024-03-01 00:00:00"} {
		for d := range 8 { // devices on both shards
			dev := fmt.Sprint("d", d)
			ms = append(ms, Message{Time: sh(t, s), ProductID: "p", DeviceID: dev, Direction: "up"})
			ps = append(ps, PropertyValue{Time: sh(t, s), ProductID: "p", DeviceID: dev, Property: "x", ValueType: "bool", Num: 1})
		}
	}
	if err := db.Insert(ctx, ms, ps); err != nil {
		t.Fatal(err)
	}
	n, err := db.DropPartitionsBefore(ctx, sh(t, "2024-02-10 00:00:00"))
	if err != nil {
		t.Fatal(err)
	}
	if n != 8 {
		t.Errorf("dropped %d partitions, want 8 (2 months x 4 tables)", n)
	}
	count := func(q string) uint64 {
		var c uint64
		if err := db.Conn().QueryRow(ctx, q).Scan(&c); err != nil {
			t.Fatal(err)
		}
		return c
	}
	testkit.Eventually(t, 30*time.Second, "the drop on every replica", func() bool {
		return count("SELECT count() FROM device_message") == 16 && count("SELECT count() FROM device_property") == 16 &&
			count("SELECT sum(messages) FROM device_message_daily") == 16 && count("SELECT sum(messages) FROM device_message_quarter") == 16
	})

	for node := range c.Nodes {
		if n := c.scalar(t, node, "SELECT count() FROM system.parts WHERE database = ? AND active AND partition_id IN ('202312', '202401')", db.Database()); n != 0 {
			t.Errorf("%s keeps %d parts of dropped months", node, n)
		}
	}
	if n, err := db.DropPartitionsBefore(ctx, sh(t, "2024-02-10 00:00:00")); err != nil || n != 0 {
		t.Fatalf("second drop: %d, %v", n, err)
	}
}

// Reopening with another zone rebuilds the per-day view on every node and
// recounts the days of every shard.
func TestClusterZoneRebuild(t *testing.T) {
	c := needCluster(t)
	ctx := ctxT(t)
	name := fmt.Sprint("czone", rand.IntN(1e6))
	utc := c.open(t, name, time.UTC, "ch11")
	var ms []Message
	for d := range 8 {
		ms = append(ms,
			Message{Time: time.Date(2024, 2, 29, 16, 30, 0, 0, time.UTC), ProductID: "p", DeviceID: fmt.Sprint("d", d), Direction: "up"},
			Message{Time: time.Date(2024, 2, 29, 15, 30, 0, 0, time.UTC), ProductID: "p", DeviceID: fmt.Sprint("d", d), Direction: "up"})
	}
	if err := utc.Insert(ctx, ms, nil); err != nil {
		t.Fatal(err)
	}
	day := func(db *DB, y int, m time.Month, d int) uint64 { t.Helper(); return dayCount(t, ctx, db, y, m, d) }
	if a, b := day(utc, 2024, 2, 29), day(utc, 2024, 3, 1); a != 16 || b != 0 {
		t.Fatalf("UTC days: Feb 29 %d, Mar 1 %d; want 16, 0", a, b)
	}
	shdb := c.open(t, name, shanghai, "ch22")
	if a, b := day(shdb, 2024, 2, 29), day(shdb, 2024, 3, 1); a != 8 || b != 8 {
		t.Fatalf("Shanghai days after rebuild: Feb 29 %d, Mar 1 %d; want 8, 8", a, b)
	}
	for node := range c.Nodes {
		if n := c.scalar(t, node, "SELECT count() FROM system.tables WHERE database = ? AND name = ? AND create_table_query LIKE '%Asia/Shanghai%'",
			shdb.Database(), dailyMV); n != 1 {
			t.Errorf("%s: the per-day view is not Shanghai's", node)
		}
	}
	// New rows, inserted through any node, are counted in the new zone
	// (shown through another handle within its ResultTTL).
	if err := utc.Insert(ctx, ms[:2], nil); err != nil {
		t.Fatal(err)
	}
	var a, b uint64
	testkit.Eventually(t, 10*time.Second, "the insert counted", func() bool {
		a, b = day(shdb, 2024, 2, 29), day(shdb, 2024, 3, 1)
		return a == 9 && b == 9
	})

}

// With a replica down, an instance starts (nothing to create, so no ON
// CLUSTER statement waits for it), stores and answers; the replica
// catches up when it is back.
func TestClusterStartWithReplicaDown(t *testing.T) {
	c := needCluster(t)
	ctx := ctxT(t)
	name := fmt.Sprint("cdown", rand.IntN(1e6))
	first := c.open(t, name, shanghai, "ch11")
	ms, ps := clusterData(t)
	insertAll(t, first, ms[:3000], nil)

	c.Script(t, "kill", "ch12")
	t.Cleanup(func() { c.Script(t, "start", "clickhouse") })
	start := time.Now()
	db := c.open(t, name, shanghai, "ch12", "ch11") // ch12 first: falls back
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("open with ch12 down took %s", d)
	}
	t.Logf("open with ch12 down: %s", time.Since(start))
	insertAll(t, db, ms[3000:], ps)
	t.Logf("open and insert with ch12 down: %s", time.Since(start))
	ids, err := db.MessageIDCounts(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != len(ms) {
		t.Fatalf("with ch12 down: %d messages stored, want %d", len(ids), len(ms))
	}
	c.Script(t, "start", "clickhouse")
	t.Logf("ch12 back after %s", time.Since(start))
	q := "SELECT count() FROM `" + db.Database() + "`.device_message_local"
	testkit.Eventually(t, 60*time.Second, "ch12 to catch up", func() bool {
		return c.scalar(t, "ch12", q) == c.scalar(t, "ch11", q)
	})

	t.Logf("ch12 caught up after %s", time.Since(start))
}

func TestClusterBadName(t *testing.T) {
	if _, err := Open(ctxT(t), Options{Cluster: "a b"}); !errors.Is(err, schema.ErrIllegalArgument) {
		t.Fatalf("bad cluster name: %v", err)
	}
}
