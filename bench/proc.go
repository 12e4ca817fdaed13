package bench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"path/filepath"
	"runtime/metrics"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// clockTicks is USER_HZ, the unit of utime and stime in /proc/<pid>/stat:
// sysconf(_SC_CLK_TCK), which is 100 on every Linux architecture Go runs on
// (the kernel's ABI fixes it, whatever CONFIG_HZ is).
const clockTicks = 100

// procCPUTime is the CPU time (user plus system, every thread) that pid
// has used so far; pid 0 means this process. ok is false when the process
// is gone or unreadable.
func procCPUTime(pid int) (time.Duration, bool) {
	b, err := os.ReadFile(procPath(pid, "stat"))
	if err != nil {
		return 0, false
	}
	ticks, err := parseStatCPU(b)
	if err != nil {
		return 0, false
	}
	return time.Duration(ticks) * time.Second / clockTicks, true
}

// parseStatCPU returns utime+stime in clock ticks from the text of
// /proc/<pid>/stat. The command name (field 2) is in parentheses and may
// hold spaces and parentheses, so fields are counted from the last ')'.
func parseStatCPU(b []byte) (int64, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errors.New("bench: /proc stat: no command")
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return 0, errors.New("bench: /proc stat: short")
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("bench: /proc stat: %w", err)
	}
	return ut + st, nil
}

// machineBusy is the CPU time every core of the machine has spent not
// idle so far (/proc/stat, first line: all but idle and iowait; guest time
// is already counted in user).
func machineBusy() (time.Duration, bool) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, false
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 5 || f[0] != "cpu" {
		return 0, false
	}
	var busy int64
	for i, v := range f[1:] {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, false
		}
		switch i {
		case 3, 4, 8, 9: // idle, iowait, guest, guest_nice
		default:
			busy += n
		}
	}
	return time.Duration(busy) * time.Second / clockTicks, true
}

// MachineRest is a wait for the machine to come to rest (waitRest).
type MachineRest struct {
	WaitedSeconds float64 `json:"waitedSeconds"`
	Cores         float64 `json:"cores"` // busy over the last second of the wait
	Rested        bool    `json:"rested"`
}

// waitRest waits until the machine's cores were busy less than restCores
// over a second (the previous phase's background work done), at most
// restWait; it says how long it waited and how busy the machine was.
func waitRest(ctx context.Context) MachineRest {
	start := time.Now()
	prev, ok := machineBusy()
	if !ok {
		return MachineRest{}
	}
	prevAt := start
	t := time.NewTicker(time.Second)
	defer t.Stop()
	var r MachineRest
	for {
		select {
		case <-ctx.Done():
			return r
		case <-t.C:
		}
		busy, _ := machineBusy()
		now := time.Now()
		r.Cores = (busy - prev).Seconds() / now.Sub(prevAt).Seconds()
		prev, prevAt = busy, now
		r.WaitedSeconds = now.Sub(start).Seconds()
		if r.Cores < restCores || now.Sub(start) >= restWait {
			r.Rested = r.Cores < restCores
			return r
		}
	}
}

// A machine at rest: less than restCores busy over a second (the alarms
// bench's machine measured 0.05-0.2 between its bursts, the services
// idle). One that does not come to rest is waited for restWait, and the
// wait says so (MachineRest.Rested).
const (
	restCores = 0.25
	restWait  = 30 * time.Second
)

func procPath(pid int, file string) string {
	if pid == 0 {
		return "/proc/self/" + file
	}
	return "/proc/" + strconv.Itoa(pid) + "/" + file
}

// processRSS is this process's resident set size in bytes (VmRSS).
func processRSS() int64 { return pidRSS(0) }

// pidRSS is pid's resident set size in bytes (VmRSS), 0 if unknown; pid 0
// means this process.
func pidRSS(pid int) int64 {
	b, err := os.ReadFile(procPath(pid, "status"))
	if err != nil {
		return 0
	}
	return parseVmRSS(b)
}

func parseVmRSS(b []byte) int64 {
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// rssSampler samples this process's VmRSS every 250 ms; stop returns the peak.
func rssSampler() (stop func() int64) { return pidRSSSampler(0) }

// pidRSSSampler samples pid's VmRSS (pid 0: this process) at once and then
// every 250 ms; stop returns the peak and may be called more than once.
func pidRSSSampler(pid int) (stop func() int64) {
	var peak atomic.Int64
	quit := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			if r := pidRSS(pid); r > peak.Load() {
				peak.Store(r)
			}
			select {
			case <-t.C:
			case <-quit:
				return
			}
		}
	}()
	return sync.OnceValue(func() int64 {
		close(quit)
		wg.Wait()
		// One last sample, so a phase shorter than the tick still counts.
		if r := pidRSS(pid); r > peak.Load() {
			peak.Store(r)
		}
		return peak.Load()
	})
}

// namedProc is a process whose CPU time a phase accounts for, or a group
// of processes listed anew at each snapshot (Members set; PID unused).
type namedProc struct {
	Name string
	PID  int // 0: this process
	// Members, if set, lists the group's processes at a snapshot. A member
	// that appears during the span counts from its start; one that is gone
	// at the end is left out with its CPU time.
	Members func() []int
}

// ProcCPU is the CPU one process used during a phase.
type ProcCPU struct {
	Name    string  `json:"name"`
	PID     int     `json:"pid"`               // 0: the sum, the machine or a group
	Members int     `json:"members,omitempty"` // processes of a group counted
	Seconds float64 `json:"cpuSeconds"`
	Cores   float64 `json:"cores"` // Seconds over the phase's wall time
	// MicrosPerMsg is Seconds per message (or request: CPUBreakdown.Unit)
	// of the phase, in µs.
	MicrosPerMsg float64 `json:"cpuMicrosPerMsg"`
}

// Label is the name, with the number of processes of a group.
func (p ProcCPU) Label() string {
	if p.Members > 0 {
		return fmt.Sprintf("%s [%d]", p.Name, p.Members)
	}
	return p.Name
}

// CPUBreakdown is where the CPU went during one phase: each process that
// could be read at its start and end, their sum, and the whole machine's
// busy time (the difference is everything else running meanwhile).
type CPUBreakdown struct {
	Phase       string  `json:"phase"`
	WallSeconds float64 `json:"wallSeconds"`
	Messages    int64   `json:"messages"`
	// Unit is what Messages count: "" or "msg" (MQTT messages), "req"
	// (HTTP requests).
	Unit         string    `json:"unit,omitempty"`
	Procs        []ProcCPU `json:"procs"`
	Total        ProcCPU   `json:"total"`             // sum of Procs
	Machine      *ProcCPU  `json:"machine,omitempty"` // every process on every core
	MachineCores int       `json:"machineCores"`
	// SchedWait is how long this process's goroutines, once runnable,
	// waited for a CPU (runtime/metrics /sched/latencies:seconds): where
	// the machine's cores are the bound, a request's latency is mostly
	// this, paid at each of its goroutines' wake-ups.
	SchedWait *SchedWait `json:"schedWait,omitempty"`
}

// SchedWait summarises goroutine scheduling latencies over a span (the
// runtime samples a share of the wake-ups; Count is how many).
type SchedWait struct {
	Count uint64  `json:"count"`
	P50Ms float64 `json:"p50Ms"` // upper bounds of the runtime's histogram buckets
	P99Ms float64 `json:"p99Ms"`
}

func (c CPUBreakdown) String() string {
	if c.WallSeconds == 0 {
		return c.Phase + ": no CPU figures"
	}
	unit := c.Unit
	if unit == "" {
		unit = "msg"
	}
	w := 28
	for _, p := range c.Procs {
		w = max(w, len(p.Label()))
	}
	var b strings.Builder
	fmt.Fprintf(&b, "CPU, %s (%.1f s wall, %d %ss):", c.Phase, c.WallSeconds, c.Messages, unit)
	row := func(p ProcCPU) {
		fmt.Fprintf(&b, "\n    %-*s %6.2f CPU-s %5.2f cores %7.2f µs/%s", w, p.Label(), p.Seconds, p.Cores, p.MicrosPerMsg, unit)
	}
	for _, p := range c.Procs {
		row(p)
	}
	row(c.Total)
	if c.Machine != nil {
		row(*c.Machine)
	}
	if w := c.SchedWait; w != nil {
		fmt.Fprintf(&b, "\n    this process's goroutines waited for a CPU: p50 %.2f ms, p99 %.2f ms (%d wake-ups sampled by the runtime)", w.P50Ms, w.P99Ms, w.Count)
	}
	return b.String()
}

// schedLatencies is this process's goroutine scheduling latency
// histogram so far.
func schedLatencies() *metrics.Float64Histogram {
	s := []metrics.Sample{{Name: "/sched/latencies:seconds"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindFloat64Histogram {
		return nil
	}
	return s[0].Value.Float64Histogram()
}

// schedWaitBetween summarises the latencies added between two histograms
// of schedLatencies.
func schedWaitBetween(from, to *metrics.Float64Histogram) *SchedWait {
	if from == nil || to == nil || len(from.Counts) != len(to.Counts) {
		return nil
	}
	counts := make([]uint64, len(to.Counts))
	var n uint64
	for i := range counts {
		counts[i] = to.Counts[i] - from.Counts[i]
		n += counts[i]
	}
	if n == 0 {
		return nil
	}
	q := func(f float64) float64 {
		var acc uint64
		for i, c := range counts {
			acc += c
			if float64(acc) >= f*float64(n) {
				upper := to.Buckets[i+1]
				if math.IsInf(upper, 1) { // the last bucket's
					upper = to.Buckets[i]
				}
				return upper * 1e3
			}
		}
		return 0
	}
	return &SchedWait{Count: n, P50Ms: q(0.5), P99Ms: q(0.99)}
}

// cpuSnapshot is the CPU time of a set of processes at one instant.
type cpuSnapshot struct {
	at      time.Time
	used    map[int]time.Duration
	groups  map[int]map[int]time.Duration // index in procs -> member pid -> CPU time
	machine time.Duration
	hasMach bool
	sched   *metrics.Float64Histogram // this process's goroutine scheduling latencies so far
}

func takeCPUSnapshot(procs []namedProc) cpuSnapshot {
	s := cpuSnapshot{at: time.Now(), used: make(map[int]time.Duration, len(procs))}
	for i, p := range procs {
		if p.Members != nil {
			m := map[int]time.Duration{}
			for _, pid := range p.Members() {
				if d, ok := procCPUTime(pid); ok && pid > 0 {
					m[pid] = d
				}
			}
			if s.groups == nil {
				s.groups = map[int]map[int]time.Duration{}
			}
			s.groups[i] = m
			continue
		}
		if d, ok := procCPUTime(p.PID); ok {
			s.used[p.PID] = d
		}
	}
	s.machine, s.hasMach = machineBusy()
	s.sched = schedLatencies()
	return s
}

// cpuSpan measures the CPU of procs from its start to a chosen snapshot.
type cpuSpan struct {
	phase string
	procs []namedProc
	start cpuSnapshot
}

func startCPUSpan(phase string, procs []namedProc) *cpuSpan {
	return &cpuSpan{phase: phase, procs: procs, start: takeCPUSnapshot(procs)}
}

func (s *cpuSpan) snapshot() cpuSnapshot { return takeCPUSnapshot(s.procs) }

// breakdown is the CPU used between the span's start and end, per
// message of msgs. A process missing at either end is left out.
func (s *cpuSpan) breakdown(end cpuSnapshot, msgs int64) CPUBreakdown {
	wall := end.at.Sub(s.start.at).Seconds()
	c := CPUBreakdown{Phase: s.phase, WallSeconds: wall, Messages: msgs, MachineCores: numCPU()}
	mk := func(name string, pid int, d time.Duration) ProcCPU {
		p := ProcCPU{Name: name, PID: pid, Seconds: d.Seconds()}
		if wall > 0 {
			p.Cores = p.Seconds / wall
		}
		if msgs > 0 {
			p.MicrosPerMsg = p.Seconds * 1e6 / float64(msgs)
		}
		return p
	}
	var sum time.Duration
	for i, p := range s.procs {
		if p.Members != nil {
			// Members at the end; one not there at the start began meanwhile.
			var d time.Duration
			n := 0
			for pid, b := range end.groups[i] {
				d += b - s.start.groups[i][pid]
				n++
			}
			if n > 0 {
				pc := mk(p.Name, 0, d)
				pc.Members = n
				c.Procs = append(c.Procs, pc)
				sum += d
			}
			continue
		}
		a, ok1 := s.start.used[p.PID]
		b, ok2 := end.used[p.PID]
		if !ok1 || !ok2 {
			continue
		}
		pid := p.PID
		if pid == 0 {
			pid = os.Getpid()
		}
		c.Procs = append(c.Procs, mk(p.Name, pid, b-a))
		sum += b - a
	}
	c.Total = mk("sum", 0, sum)
	c.SchedWait = schedWaitBetween(s.start.sched, end.sched)
	if s.start.hasMach && end.hasMach {
		m := mk("machine (all processes)", 0, end.machine-s.start.machine)
		c.Machine = &m
	}
	return c
}

// numCPU counts the cpuN lines of /proc/stat (the machine, not this
// process's affinity).
func numCPU() int {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	n := 0
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if l := sc.Text(); strings.HasPrefix(l, "cpu") && len(l) > 3 && l[3] >= '0' && l[3] <= '9' {
			n++
		}
	}
	return n
}

// listenerPID finds the process listening on TCP port (any local
// address) through /proc/net/tcp{,6} and the processes' socket
// descriptors; 0 when none is found (reading other users' descriptors
// needs root).
func listenerPID(port int) int {
	inodes := map[string]bool{}
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		if b, err := os.ReadFile(f); err == nil {
			for _, ino := range parseListenInodes(b, port) {
				inodes["socket:["+ino+"]"] = true
			}
		}
	}
	if len(inodes) == 0 {
		return 0
	}
	for _, pid := range allPIDs() {
		dir := "/proc/" + strconv.Itoa(pid) + "/fd"
		ents, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, e := range ents {
			if l, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil && inodes[l] {
				return pid
			}
		}
	}
	return 0
}

// parseListenInodes returns the inodes of the sockets listening on port
// in the text of /proc/net/tcp or tcp6.
func parseListenInodes(b []byte, port int) []string {
	var out []string
	for i, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if i == 0 || len(f) < 10 || f[3] != "0A" { // 0A: TCP_LISTEN
			continue
		}
		_, hexPort, ok := strings.Cut(f[1], ":")
		if !ok {
			continue
		}
		if p, err := strconv.ParseUint(hexPort, 16, 16); err == nil && int(p) == port && f[9] != "0" {
			out = append(out, f[9])
		}
	}
	return out
}

func allPIDs() []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var pids []int
	for _, e := range ents {
		if pid, err := strconv.Atoi(e.Name()); err == nil && pid > 0 {
			pids = append(pids, pid)
		}
	}
	sort.Ints(pids)
	return pids
}

// findProcess returns the first process whose comm (the kernel's name,
// 15 characters at most) is comm and whose command line contains hint,
// else the first with that comm; 0 if none.
func findProcess(comm, hint string) int {
	first := 0
	for _, pid := range allPIDs() {
		c, err := os.ReadFile(procPath(pid, "comm"))
		if err != nil || strings.TrimSpace(string(c)) != comm {
			continue
		}
		if hint == "" {
			return pid
		}
		if cl, err := os.ReadFile(procPath(pid, "cmdline")); err == nil && bytes.Contains(cl, []byte(hint)) {
			return pid
		}
		if first == 0 {
			first = pid
		}
	}
	return first
}

// pidFromFile reads a pid file; 0 if it is missing or its process is gone.
func pidFromFile(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0
	}
	if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err != nil {
		return 0
	}
	return pid
}

// addrPort is the port of a host:port address or URL (tcp://h:p), 0 if none.
func addrPort(addr string) int {
	if _, rest, ok := strings.Cut(addr, "://"); ok {
		addr = rest
	}
	addr, _, _ = strings.Cut(addr, "/")
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(p)
	return n
}

// brokerPID is the MQTT broker serving brokerURL: the process listening
// on its port, else the project's Mosquitto (.data/mosquitto), else any
// mosquitto; 0 if none.
func brokerPID(brokerURL string) int {
	if pid := listenerPID(addrPort(brokerURL)); pid > 0 {
		return pid
	}
	for _, f := range []string{".data/mosquitto/mosquitto.pid", "../.data/mosquitto/mosquitto.pid"} {
		if pid := pidFromFile(f); pid > 0 {
			return pid
		}
	}
	return findProcess("mosquitto", ".data/mosquitto")
}

// clickhousePID is the ClickHouse server at addr: the process listening
// on its port, else .data/clickhouse/clickhouse.pid, else a
// clickhouse-server process; 0 if none.
func clickhousePID(addr string) int {
	if pid := listenerPID(addrPort(addr)); pid > 0 {
		return pid
	}
	for _, f := range []string{".data/clickhouse/clickhouse.pid", "../.data/clickhouse/clickhouse.pid"} {
		if pid := pidFromFile(f); pid > 0 {
			return pid
		}
	}
	if pid := findProcess("clickhouse-serv", ".data/clickhouse"); pid > 0 {
		return pid
	}
	return findProcess("clickhouse", "server")
}
