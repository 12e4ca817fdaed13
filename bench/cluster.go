package bench

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"

	"devicehub/tsdb"
)

// Scale-out runs (REFERENCE.md "Scaling out", BENCHMARKS.md): the ingest and
// dashboard scenarios take a ClickHouse cluster name (ClickHouseCluster,
// cmd/bench -clickhouse-cluster). Then ClickHouseAddr is a node of it, or
// a comma-separated list of nodes tried in order (tsdb.Options.Addr); the
// devicehub child, the ceiling's writers and the dashboard's store spread
// their tables over the cluster, and the CPU of every clickhouse-server
// of the cluster on this machine, and of ZooKeeper, is reported.

// clickhouseProcs are the ClickHouse server processes of a run: the one
// at addr, or with a cluster every node of it that listens on this
// machine (named by its port), and ZooKeeper.
func clickhouseProcs(ctx context.Context, addr, cluster string) []namedProc {
	if cluster == "" {
		if pid := clickhousePID(addr); pid > 0 {
			return []namedProc{{Name: "clickhouse-server", PID: pid}}
		}
		return nil
	}
	var out []namedProc
	for _, port := range clusterPorts(ctx, addr, cluster) {
		if pid := listenerPID(port); pid > 0 {
			out = append(out, namedProc{Name: "clickhouse-server :" + strconv.Itoa(port), PID: pid})
		}
	}
	if pid := findProcess("java", "QuorumPeerMain"); pid > 0 {
		out = append(out, namedProc{Name: "zookeeper", PID: pid})
	}
	return out
}

// clusterPorts lists the native ports of the cluster's nodes, as the
// first reachable node of addr knows them.
func clusterPorts(ctx context.Context, addr, cluster string) []int {
	var addrs []string
	for _, a := range strings.Split(addr, ",") {
		if a = strings.TrimSpace(a); a != "" {
			addrs = append(addrs, a)
		}
	}
	conn, err := clickhouse.Open(&clickhouse.Options{Addr: addrs, DialTimeout: 5 * time.Second})
	if err != nil {
		return nil
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	rows, err := conn.Query(ctx, "SELECT port FROM system.clusters WHERE cluster = ? ORDER BY shard_num, replica_num", cluster)
	if err != nil {
		return nil
	}
	defer rows.Close()
	var out []int
	for rows.Next() {
		var p uint16
		if rows.Scan(&p) == nil {
			out = append(out, int(p))
		}
	}
	return out
}

// storageTable is what TRUNCATE and OPTIMIZE name for a table of db: the
// table on one server; on a cluster, its replicated table on every node.
func storageTable(db *tsdb.DB, table string) string {
	if db.Cluster() == "" {
		return table
	}
	return fmt.Sprintf("`%s`.`%s_local` ON CLUSTER `%s`", db.Database(), table, db.Cluster())
}
