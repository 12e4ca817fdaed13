package tsdb

import (
	"fmt"
	"regexp"
	"strings"
)

// Cluster mode (Options.Cluster names a cluster of the servers'
// remote_servers). The embedded DDL is written for one server; in cluster
// mode each statement is rewritten, so the schema files stay one source:
//
//   - CREATE TABLE t (...) ENGINE = XMergeTree(...) becomes t_local, a
//     ReplicatedXMergeTree('/clickhouse/tables/{shard}/<db>/t_local',
//     '{replica}') created ON CLUSTER, and t, a Distributed table over
//     t_local, also ON CLUSTER. Every query and insert names t, as in
//     single-server mode, and reaches every shard through it. Rows are
//     sharded by cityHash64(device_id) when the table has a device_id
//     column (all of one device's rows on one shard: its history is read
//     there whole), by rand() otherwise (per-day counts, summed over all
//     shards by every query anyway).
//   - CREATE MATERIALIZED VIEW v TO t AS SELECT ... FROM s becomes v ON
//     CLUSTER, from s_local into t_local: each replica that takes an
//     insert counts it into its shard's replicated table, which copies the
//     counts to the other replica (a replica never counts what it fetched).
//   - ALTER TABLE t ... becomes ALTER TABLE t_local ON CLUSTER ..., then
//     the Distributed t is dropped and created again if its columns no
//     longer match t_local's (ClickHouse 18.16 refuses an ALTER ON
//     CLUSTER of a table that is not replicated on a replicated cluster).
//   - DROP TABLE IF EXISTS t drops t and t_local ON CLUSTER.
//   - TRUNCATE TABLE t becomes TRUNCATE TABLE t_local ON CLUSTER.
//   - INSERT INTO t (...) SELECT ... stays as it is: it reads and writes
//     the Distributed tables, so every shard's rows are read and each
//     written row lands on its device's shard. It carries a condition,
//     as an ALTER does.
//
// A replica killed in an insert. A replica writes an insert's block into
// the raw table's part, commits it (in ZooKeeper, with the block's hash),
// and only then writes the block's views into their tables, one after the
// other. Killed (SIGKILL, power loss) between the two, it leaves the raw
// part committed and some views unwritten; the sender (devicehub's
// Writer, or a Distributed table sending its queue) gets an error and
// sends the block again, the replicated raw table recognises it as a
// duplicate of the committed part and keeps one copy, and ClickHouse
// writes no view for a duplicate block (by design: the views of a block
// are written once, with its first insert). So the raw tables stay exact,
// every acknowledged row once, and the rollups (the message counts and
// the property aggregates read from views) lack that one block for good.
// ClickHouse 18.16 offers no way round it; a release that has
// deduplicate_blocks_in_dependent_materialized_views with
// insert_deduplication_token would let a retry write the views it missed.
// An operator who kills a replica during ingest can see the shortfall by
// comparing count() of device_message with sum(messages) of
// device_message_quarter; TestCluster (cmd/devicehub) kills one and
// checks that the rollups lack at most such a block and that the
// dashboard answers exactly what they hold.
//
// The version record: single-server mode keeps none; every statement is
// idempotent or carries a "--@if" condition read from the catalog. Cluster
// mode does the same with the connected node's catalog as the record: a
// statement runs ON CLUSTER only when its object is missing there (or its
// condition, rewritten for t_local, says so). ON CLUSTER statements are
// queued in ZooKeeper and every node runs them in queue order, also one
// that was down and comes back, so what one node has, all have or will
// have. So a start whose schema is in place sends no ON CLUSTER statement
// and starts while a node is down; instances starting together may queue
// the same statement twice, which the IF NOT EXISTS forms and the
// conditions (checked again after a failure) make harmless.

// localSuffix names the replicated table behind a Distributed one.
const localSuffix = "_local"

var clusterNameRE = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.\-]*$`)

// clustered reports whether the database is spread over a cluster.
func (db *DB) clustered() bool { return db.opt.Cluster != "" }

// onCluster is the " ON CLUSTER `c`" of every DDL statement in cluster
// mode, "" otherwise.
func (db *DB) onCluster() string {
	if !db.clustered() {
		return ""
	}
	return " ON CLUSTER `" + db.opt.Cluster + "`"
}

// storageTable is the table holding the rows (parts, partitions) of the
// table queries name: t itself on one server, t_local in cluster mode.
func (db *DB) storageTable(t string) string {
	if !db.clustered() {
		return t
	}
	return t + localSuffix
}

// partsTable is where the active parts of storageTable tables are listed:
// system.parts, or one replica's of each shard in cluster mode.
func (db *DB) partsTable() string {
	if !db.clustered() {
		return "system.parts"
	}
	return "cluster(" + quoteString(db.opt.Cluster) + ", system, parts)"
}

// alterTarget is what an ALTER of storage table t (as partsTable lists
// it) names: t, or in cluster mode t ON CLUSTER (each shard's leader
// replica runs it; replication brings it to the others).
func (db *DB) alterTarget(t string) string {
	if !db.clustered() {
		return t
	}
	return "`" + db.opt.Database + "`.`" + t + "`" + db.onCluster()
}

var (
	createTableRE = regexp.MustCompile(`(?is)^CREATE\s+TABLE\s+IF\s+NOT\s+EXISTS\s+([A-Za-z_][A-Za-z0-9_]*)\s*\((.*)\)\s*ENGINE\s*=\s*([A-Za-z]*MergeTree)\s*\(`)
	createMVRE    = regexp.MustCompile(`(?is)^CREATE\s+MATERIALIZED\s+VIEW\s+IF\s+NOT\s+EXISTS\s+([A-Za-z_][A-Za-z0-9_]*)\s+TO\s+([A-Za-z_][A-Za-z0-9_]*)\s+AS\s+(.*)$`)
	alterTableRE  = regexp.MustCompile(`(?is)^ALTER\s+TABLE\s+([A-Za-z_][A-Za-z0-9_]*)\s+(.*)$`)
	truncateRE    = regexp.MustCompile(`(?is)^TRUNCATE\s+TABLE\s+([A-Za-z_][A-Za-z0-9_]*)\s*$`)
	insertRE      = regexp.MustCompile(`(?is)^INSERT\s+INTO\s+([A-Za-z_][A-Za-z0-9_]*)\s*\(`)
	dropTableRE   = regexp.MustCompile(`(?is)^DROP\s+TABLE\s+IF\s+EXISTS\s+([A-Za-z_][A-Za-z0-9_]*)\s*$`)
	fromTableRE   = regexp.MustCompile(`(?i)\b(FROM|JOIN)(\s+)([A-Za-z_][A-Za-z0-9_]*)\b`)
	deviceColRE   = regexp.MustCompile(`(?:^|,)\s*device_id\s`) // a column definition
)

// clusterStatements rewrites the single-server statements for cluster
// mode (see the top of this file). A statement of another form is an
// error: cluster mode would not know how to spread it.
func clusterStatements(stmts []ddl, cluster, database string) ([]ddl, error) {
	q := func(name string) string { return "`" + database + "`.`" + name + "`" }
	on := " ON CLUSTER `" + cluster + "`"
	missing := func(name string) string {
		return "SELECT toUInt64(count() = 0) FROM system.tables WHERE database = currentDatabase() AND name = " + quoteString(name)
	}
	distributed := func(t, key string) ddl {
		return ddl{
			sql: "CREATE TABLE IF NOT EXISTS " + q(t) + on + " AS " + q(t+localSuffix) +
				" ENGINE = Distributed(" + quoteString(cluster) + ", " + quoteString(database) + ", " +
				quoteString(t+localSuffix) + ", " + key + ")",
			cond: missing(t),
		}
	}
	tables := map[string]string{} // table -> sharding key
	var out []ddl
	for _, s := range stmts {
		sql := s.sql
		if s.convert != "" {
			out = append(out, s) // convert.go knows both modes
			continue
		}
		switch {
		case createTableRE.MatchString(sql):
			m := createTableRE.FindStringSubmatchIndex(sql)
			name, cols, engine := sql[m[2]:m[3]], sql[m[4]:m[5]], sql[m[6]:m[7]]
			open := m[1] - 1 // the engine's "("
			closing := matchParen(sql, open)
			if closing < 0 {
				return nil, fmt.Errorf("tsdb: cluster DDL: unbalanced engine arguments in %q", firstLine(sql))
			}
			args := strings.TrimSpace(sql[open+1 : closing])
			local := name + localSuffix
			zkPath := "/clickhouse/tables/{shard}/" + database + "/" + local
			repl := "Replicated" + engine + "(" + quoteString(zkPath) + ", '{replica}'"
			if args != "" {
				repl += ", " + args
			}
			repl += ")"
			key := "rand()"
			if deviceColRE.MatchString(cols) {
				key = "cityHash64(device_id)"
			}
			tables[name] = key
			out = append(out,
				ddl{sql: "CREATE TABLE IF NOT EXISTS " + q(local) + on + " (" + cols + ") ENGINE = " + repl + sql[closing+1:],
					cond: andCond(s.cond, missing(local))},
				distributedIf(s.cond, distributed(name, key)))
		case createMVRE.MatchString(sql):
			m := createMVRE.FindStringSubmatch(sql)
			name, to, sel := m[1], m[2], m[3]
			if _, ok := tables[to]; !ok {
				return nil, fmt.Errorf("tsdb: cluster DDL: view %s writes to %s, not a table created before it", name, to)
			}
			sel = fromTableRE.ReplaceAllStringFunc(sel, func(f string) string {
				p := fromTableRE.FindStringSubmatch(f)
				if _, ok := tables[p[3]]; !ok {
					return f
				}
				return p[1] + p[2] + q(p[3]+localSuffix)
			})
			out = append(out, ddl{
				sql:  "CREATE MATERIALIZED VIEW IF NOT EXISTS " + q(name) + on + " TO " + q(to+localSuffix) + " AS " + sel,
				cond: andCond(s.cond, missing(name)),
			})
		case alterTableRE.MatchString(sql):
			m := alterTableRE.FindStringSubmatch(sql)
			name, rest := m[1], m[2]
			key, ok := tables[name]
			if !ok {
				return nil, fmt.Errorf("tsdb: cluster DDL: ALTER of %s, not a table created before it", name)
			}
			if s.cond == "" {
				// Run at every start, it would queue an ON CLUSTER
				// statement each time and wait for every node.
				return nil, fmt.Errorf("tsdb: cluster DDL: %q needs a %q condition", firstLine(sql), strings.TrimSpace(condPrefix))
			}
			local := name + localSuffix
			out = append(out,
				ddl{sql: "ALTER TABLE " + q(local) + on + " " + rest, cond: renameInCond(s.cond, name, local)},
				ddl{sql: "DROP TABLE IF EXISTS " + q(name) + on, cond: columnsDiffer(name, local)},
				distributed(name, key))
		case truncateRE.MatchString(sql):
			name := truncateRE.FindStringSubmatch(sql)[1]
			if _, ok := tables[name]; !ok {
				return nil, fmt.Errorf("tsdb: cluster DDL: TRUNCATE of %s, not a table created before it", name)
			}
			out = append(out, ddl{sql: "TRUNCATE TABLE " + q(name+localSuffix) + on, cond: s.cond})
		case insertRE.MatchString(sql):
			name := insertRE.FindStringSubmatch(sql)[1]
			if _, ok := tables[name]; !ok {
				return nil, fmt.Errorf("tsdb: cluster DDL: INSERT into %s, not a table created before it", name)
			}
			if s.cond == "" {
				return nil, fmt.Errorf("tsdb: cluster DDL: %q needs a %q condition", firstLine(sql), strings.TrimSpace(condPrefix))
			}
			out = append(out, s)
		case dropTableRE.MatchString(sql):
			name := dropTableRE.FindStringSubmatch(sql)[1]
			if _, ok := tables[name]; ok {
				delete(tables, name)
				out = append(out,
					ddl{sql: "DROP TABLE IF EXISTS " + q(name) + on, cond: andCond(s.cond, exists(name))},
					ddl{sql: "DROP TABLE IF EXISTS " + q(name+localSuffix) + on, cond: andCond(s.cond, exists(name+localSuffix))})
				continue
			}
			// A view: no replicated table behind it.
			out = append(out, ddl{sql: "DROP TABLE IF EXISTS " + q(name) + on, cond: andCond(s.cond, exists(name))})
		default:
			return nil, fmt.Errorf("tsdb: cluster DDL: no cluster form for %q", firstLine(sql))
		}
	}
	return out, nil
}

// distributedIf is d, run only when cond (of the replicated table's
// statement) also holds: a table created only while an old layout is in
// place gets its Distributed table only then too.
func distributedIf(cond string, d ddl) ddl {
	d.cond = andCond(cond, d.cond)
	return d
}

// matchParen returns the index of the ")" closing the "(" at open, or -1;
// string literals may hold parentheses.
func matchParen(s string, open int) int {
	depth, inStr := 0, false
	for i := open; i < len(s); i++ {
		switch c := s[i]; {
		case inStr && c == '\\':
			i++
		case c == '\'':
			inStr = !inStr
		case inStr:
		case c == '(':
			depth++
		case c == ')':
			depth--
			if depth == 0 {
				return i
			}
		}
	}
	return -1
}

// andCond is a condition counting more than 0 when both do; either may be
// empty (no condition).
func andCond(a, b string) string {
	switch {
	case a == "":
		return b
	case b == "":
		return a
	}
	return "SELECT toUInt64(((" + a + ")) > 0 AND ((" + b + ")) > 0)"
}

func exists(name string) string {
	return "SELECT count() FROM system.tables WHERE database = currentDatabase() AND name = " + quoteString(name)
}

// renameInCond points a condition written for the single-server table at
// its replicated table: the quoted name 't' becomes 't_local'.
func renameInCond(cond, from, to string) string {
	return strings.ReplaceAll(cond, quoteString(from), quoteString(to))
}

// columnsDiffer counts 1 when the Distributed table's columns are not
// those of its replicated table (or it is missing).
func columnsDiffer(dist, local string) string {
	cols := func(t string) string {
		return "(SELECT arrayStringConcat(arraySort(groupArray(concat(name, ' ', type))), ',') FROM system.columns" +
			" WHERE database = currentDatabase() AND table = " + quoteString(t) + ")"
	}
	return "SELECT toUInt64(" + cols(dist) + " != " + cols(local) + ")"
}
