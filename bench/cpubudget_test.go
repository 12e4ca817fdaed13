package bench

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestCPUBudgetThrottles: a busy process added to a budget of a tenth of
// a core is throttled by the kernel (cpu.stat's nr_throttled, in v1 and
// v2 alike), and the cgroup is gone after close.
func TestCPUBudgetThrottles(t *testing.T) {
	b, err := newCPUBudget(0.1)
	if err != nil {
		t.Skipf("no cgroup to make here: %v", err)
	}
	defer b.close()
	busy := exec.Command("sh", "-c", "while :; do :; done")
	if err := busy.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = busy.Process.Kill(); _ = busy.Wait() }()
	if err := b.add(busy.Process.Pid); err != nil {
		t.Fatal(err)
	}
	procs, _ := os.ReadFile(filepath.Join(b.dir, "cgroup.procs"))
	if !strings.Contains(string(procs), strconv.Itoa(busy.Process.Pid)) {
		t.Fatalf("cgroup.procs %q has not the busy process %d", procs, busy.Process.Pid)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if throttled(t, b.dir) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a busy process in a budget of 0.1 cores was never throttled")
		}
		time.Sleep(50 * time.Millisecond)
	}
	_ = busy.Process.Kill()
	_ = busy.Wait()
	b.close()
	if _, err := os.Stat(b.dir); !os.IsNotExist(err) {
		t.Fatalf("the cgroup %s is left after close: %v", b.dir, err)
	}
}

func throttled(t *testing.T, dir string) int {
	s, err := os.ReadFile(filepath.Join(dir, "cpu.stat"))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(s), "\n") {
		if v, ok := strings.CutPrefix(l, "nr_throttled "); ok {
			n, _ := strconv.Atoi(v)
			return n
		}
	}
	return 0
}
