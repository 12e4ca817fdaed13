package bench

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
)

// cpuBudget holds processes to a fixed share of the machine's cores: a
// cgroup of their own whose CFS quota is cores x its period (cgroup v2's
// cpu.max, or v1's cpu.cfs_quota_us where the cpu controller is mounted
// on its own). fleet-connect puts its generator children in one so that
// the devices' side of a storm has the same CPU in the ceilings and with
// devicehub attached: on two cores shared by everything, the generator
// otherwise takes what devicehub, the brokers and the databases leave,
// and a ratio to the ceiling measures the sharing, not devicehub.
type cpuBudget struct {
	dir string // the cgroup's directory
}

var cpuBudgets atomic.Int64

// cgroupCPURoot is where a cgroup with a cpu quota can be made: the
// unified hierarchy when it has the cpu controller, else v1's cpu mount.
func cgroupCPURoot() (root string, v2 bool, err error) {
	if b, err := os.ReadFile("/sys/fs/cgroup/cgroup.controllers"); err == nil && strings.Contains(" "+string(b)+" ", " cpu ") {
		return "/sys/fs/cgroup", true, nil
	}
	if _, err := os.Stat("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"); err == nil {
		return "/sys/fs/cgroup/cpu", false, nil
	}
	return "", false, errors.New("bench: no cgroup cpu controller at /sys/fs/cgroup (v2) or /sys/fs/cgroup/cpu (v1)")
}

// newCPUBudget makes a cgroup capped at cores (> 0) for the processes
// later added to it.
func newCPUBudget(cores float64) (*cpuBudget, error) {
	root, v2, err := cgroupCPURoot()
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(root, fmt.Sprintf("devicehub-bench-%d-%d", os.Getpid(), cpuBudgets.Add(1)))
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, fmt.Errorf("bench: cpu budget: %w (needs root and a writable cgroup hierarchy)", err)
	}
	const period = 100000 // µs
	quota := strconv.Itoa(int(cores * period))
	if v2 {
		err = os.WriteFile(filepath.Join(dir, "cpu.max"), []byte(quota+" "+strconv.Itoa(period)), 0)
	} else if err = os.WriteFile(filepath.Join(dir, "cpu.cfs_period_us"), []byte(strconv.Itoa(period)), 0); err == nil {
		err = os.WriteFile(filepath.Join(dir, "cpu.cfs_quota_us"), []byte(quota), 0)
	}
	if err != nil {
		_ = os.Remove(dir)
		return nil, fmt.Errorf("bench: cpu budget of %.2f cores: %w", cores, err)
	}
	return &cpuBudget{dir: dir}, nil
}

// add moves process pid, all its threads, into the budget.
func (b *cpuBudget) add(pid int) error {
	if err := os.WriteFile(filepath.Join(b.dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
		return fmt.Errorf("bench: cpu budget: add process %d: %w", pid, err)
	}
	return nil
}

// close removes the cgroup; its processes must have exited.
func (b *cpuBudget) close() {
	if b != nil {
		_ = os.Remove(b.dir)
	}
}
