package testkit

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Cluster is the ClickHouse cluster .ci/cluster runs (2 shards x 2
// replicas): its name and each node's native address by node name (ch11,
// ch12, ch21, ch22).
type Cluster struct {
	Name  string
	Nodes map[string]string
}

// NeedCluster skips the test unless DEVICEHUB_TEST_CLUSTER=1 (set by
// `make test-cluster`) and reads the cluster from the variables
// `.ci/cluster env` prints; it fails the test if they are missing.
func NeedCluster(t testing.TB) Cluster {
	t.Helper()
	if os.Getenv("DEVICEHUB_TEST_CLUSTER") != "1" {
		t.Skip("cluster tests run with DEVICEHUB_TEST_CLUSTER=1 (make test-cluster)")
	}
	c := Cluster{Name: os.Getenv("DEVICEHUB_CLUSTER_NAME"), Nodes: map[string]string{}}
	for _, kv := range strings.Split(os.Getenv("DEVICEHUB_CLUSTER_NODES"), ",") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			c.Nodes[k] = v
		}
	}
	if c.Name == "" || len(c.Nodes) != 4 {
		t.Fatal("DEVICEHUB_CLUSTER_NAME and DEVICEHUB_CLUSTER_NODES (4 nodes) not set: run through `.ci/cluster test`")
	}
	return c
}

// Addrs is the comma-separated address list of the named nodes, in order.
func (c Cluster) Addrs(nodes ...string) string {
	out := make([]string, 0, len(nodes))
	for _, n := range nodes {
		out = append(out, c.Nodes[n])
	}
	return strings.Join(out, ",")
}

// Script runs .ci/cluster with args (kill a node, start it again),
// failing t with its output if it fails.
func (c Cluster) Script(t testing.TB, args ...string) {
	t.Helper()
	script := filepath.Join(RepoRoot(t), ".ci", "cluster")
	out, err := exec.Command("bash", append([]string{script}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf(".ci/cluster %v: %v\n%s", args, err, out)
	}
}
