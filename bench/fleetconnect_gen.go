package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// The fleet-connect generator runs as child processes, one per broker of
// the pool, each holding that broker's share of the devices: a process
// holds a socket per device, and RLIMIT_NOFILE (20,000 hard on the
// machine of BENCHMARKS.md, raised only with CAP_SYS_RESOURCE) bounds each
// process, not the machine. A child is this same binary re-executed with
// FleetGenEnv set (cmd/bench's main and the bench tests' TestMain call
// MaybeRunFleetGen first); it reads its configuration and then commands
// as JSON lines on stdin, and writes its counters every 200 ms and the
// answer to each command as JSON lines on stdout.

// FleetGenEnv, set in a process's environment, makes MaybeRunFleetGen run
// the process as a fleet-connect generator child.
const FleetGenEnv = "DEVICEHUB_BENCH_FLEET_GEN"

// MaybeRunFleetGen runs this process as a generator child and exits, when
// FleetGenEnv is set; otherwise it returns at once.
func MaybeRunFleetGen() {
	if os.Getenv(FleetGenEnv) != "1" {
		return
	}
	if err := runFleetGen(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "fleet-connect generator:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// genConfig is what one generator child runs: its share of the devices,
// against one broker.
type genConfig struct {
	Addr       string        `json:"addr"`
	Product    string        `json:"product"`
	Logins     []fleetLogin  `json:"logins"`
	Interval   time.Duration `json:"interval"`
	PerAddress int           `json:"perAddress"`
	// SourceBase: the child's first loopback source address is
	// 127.0.0.(2+SourceBase): children use distinct ones (each address
	// has its own ephemeral ports).
	SourceBase int           `json:"sourceBase"`
	BackoffMin time.Duration `json:"backoffMin"`
	BackoffMax time.Duration `json:"backoffMax"`
}

// genStats are a child's counters (connectFleet's).
type genStats struct {
	Connected, Connects, DialFailures, Refused, Lost int64
	Sent, Acked, AckFailed, Skipped, BirthsAcked     int64
}

type genCmd struct {
	Op     string        `json:"op"` // start, connackReset, connack, pause, close, live, dump
	Conc   int           `json:"conc,omitempty"`
	Wait   time.Duration `json:"wait,omitempty"`
	Abrupt bool          `json:"abrupt,omitempty"`
}

// genDev is what the broker acknowledged of one device (dump).
type genDev struct {
	ConnNo uint32   `json:"c"`
	Acked  []uint32 `json:"a,omitempty"`
	Births []uint32 `json:"b,omitempty"`
}

type genReply struct {
	Op      string    `json:"op"`
	Connack *histData `json:"connack,omitempty"`
	Live    int64     `json:"live,omitempty"`
	Devs    []genDev  `json:"devs,omitempty"`
}

type genLine struct {
	Stats *genStats `json:"stats,omitempty"`
	Reply *genReply `json:"reply,omitempty"`
}

// histData is a Histogram's content, to merge the children's.
type histData struct {
	Counts   map[int]int64 `json:"counts"`
	N, Sum   int64
	MaxValue int64
}

func (h *Histogram) export() *histData {
	d := &histData{Counts: map[int]int64{}, N: h.n.Load(), Sum: h.sum.Load(), MaxValue: h.max.Load()}
	for i := range h.counts {
		if c := h.counts[i].Load(); c > 0 {
			d.Counts[i] = c
		}
	}
	return d
}

func (h *Histogram) merge(d *histData) {
	if d == nil {
		return
	}
	for i, c := range d.Counts {
		if i >= 0 && i < histBuckets {
			h.counts[i].Add(c)
		}
	}
	h.n.Add(d.N)
	h.sum.Add(d.Sum)
	if d.MaxValue > h.max.Load() {
		h.max.Store(d.MaxValue)
	}
}

// runFleetGen is a generator child's life: configuration, then commands
// until stdin closes (the parent gone: every connection is closed).
func runFleetGen(in io.Reader, out io.Writer) error {
	dec := json.NewDecoder(bufio.NewReaderSize(in, 1<<20))
	var cfg genConfig
	if err := dec.Decode(&cfg); err != nil {
		return fmt.Errorf("configuration: %w", err)
	}
	f := newConnectFleet(cfg.Addr, cfg.Product, cfg.Logins, cfg.Interval, cfg.PerAddress, cfg.BackoffMin, cfg.BackoffMax)
	f.sources = loopbackSourcesFrom(cfg.SourceBase, len(f.sources))
	f.connack.Store(&Histogram{})
	var mu sync.Mutex
	enc := json.NewEncoder(out)
	write := func(l genLine) {
		mu.Lock()
		defer mu.Unlock()
		_ = enc.Encode(l)
	}
	stop := make(chan struct{})
	go func() {
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-t.C: // the counters, every 200 ms until the parent is gone
				write(genLine{Stats: &genStats{Connected: f.connected.Load(), Connects: f.connects.Load(), DialFailures: f.dialFailures.Load(),
					Refused: f.refused.Load(), Lost: f.lost.Load(), Sent: f.sent.Load(), Acked: f.acked.Load(), AckFailed: f.ackFailed.Load(),
					Skipped: f.skipped.Load(), BirthsAcked: f.birthsAcked.Load()}})
			case <-stop:
				return
			}
		}
	}()
	defer close(stop)
	for {
		var c genCmd
		if err := dec.Decode(&c); err != nil {
			f.closeAll(false)
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		r := &genReply{Op: c.Op}
		switch c.Op {
		case "start":
			f.start(max(c.Conc, 1))
		case "connackReset":
			f.connack.Store(&Histogram{})
		case "connack":
			r.Connack = f.connack.Load().export()
		case "pause":
			f.pauseReports(c.Wait)
		case "close":
			f.closeAll(c.Abrupt)
		case "live":
			r.Live = liveGoMemory()
		case "dump":
			r.Devs = make([]genDev, len(f.devs))
			for i, d := range f.devs {
				d.mu.Lock()
				r.Devs[i] = genDev{ConnNo: d.connNo, Acked: append([]uint32(nil), d.acked...), Births: append([]uint32(nil), d.births...)}
				d.mu.Unlock()
			}
		default:
			return fmt.Errorf("unknown command %q", c.Op)
		}
		write(genLine{Reply: r})
	}
}

// genChild is one generator child, seen from the parent.
type genChild struct {
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	enc     *json.Encoder
	stats   atomic.Pointer[genStats]
	replies chan *genReply
	exited  chan struct{}
	first   int // index of its first device in the pool's logins
	n       int
	stderr  *tailBuffer
}

// genPool is the generator: its children, one per broker, and the sums
// of their counters (each field's Load is the sum of the children's last
// report).
type genPool struct {
	children []*genChild
	logins   []fleetLogin
	sources  int
	budget   *cpuBudget // nil: the children share the cores with everything

	connected, connects, acked, sent, lost, dialFailures, refused, birthsAcked genSum

	// probes: devices whose reports are timed publish -> stored (every
	// probeEvery-th device), from the report's own timestamp.
	probeEvery int
}

// genSum is one counter summed over the children.
type genSum struct {
	p   *genPool
	get func(*genStats) int64
}

func (s genSum) Load() int64 {
	var n int64
	for _, c := range s.p.children {
		if st := c.stats.Load(); st != nil {
			n += s.get(st)
		}
	}
	return n
}

// startGenPool starts one child per broker address, logins split evenly
// among them in order; their source addresses start sourceBase past the
// first (a ceiling's pool uses addresses of its own, whose ports no
// closing connection of another pool still holds).
func startGenPool(ctx context.Context, addrs []string, product string, logins []fleetLogin, p FleetConnectParams, sourceBase int) (*genPool, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	g := &genPool{logins: logins, probeEvery: max(1, len(logins)/max(p.Probes, 1))}
	g.connected = genSum{g, func(s *genStats) int64 { return s.Connected }}
	g.connects = genSum{g, func(s *genStats) int64 { return s.Connects }}
	g.acked = genSum{g, func(s *genStats) int64 { return s.Acked }}
	g.sent = genSum{g, func(s *genStats) int64 { return s.Sent }}
	g.lost = genSum{g, func(s *genStats) int64 { return s.Lost }}
	g.dialFailures = genSum{g, func(s *genStats) int64 { return s.DialFailures }}
	g.refused = genSum{g, func(s *genStats) int64 { return s.Refused }}
	g.birthsAcked = genSum{g, func(s *genStats) int64 { return s.BirthsAcked }}
	if p.GenCPUs > 0 {
		if g.budget, err = newCPUBudget(p.GenCPUs); err != nil {
			return nil, err
		}
	}
	k := len(addrs)
	source := sourceBase
	for i, addr := range addrs {
		first, last := len(logins)*i/k, len(logins)*(i+1)/k
		n := last - first
		cfg := genConfig{Addr: addr, Product: product, Logins: logins[first:last], Interval: p.Interval, PerAddress: p.PerAddress,
			SourceBase: source, BackoffMin: p.BackoffMin, BackoffMax: p.BackoffMax}
		sources := (n + p.PerAddress - 1) / p.PerAddress
		source += sources
		g.sources += sources
		c := &genChild{replies: make(chan *genReply, 1), exited: make(chan struct{}), first: first, n: n, stderr: &tailBuffer{}}
		c.cmd = exec.Command(exe)
		if p.GenNice > 0 { // nice execs exe in its place: the child's pid, its threads all at the lower priority
			c.cmd = exec.Command("nice", "-n", strconv.Itoa(p.GenNice), exe)
		}
		c.cmd.Env = append(os.Environ(), FleetGenEnv+"=1")
		c.cmd.Stderr = c.stderr
		c.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if c.stdin, err = c.cmd.StdinPipe(); err != nil {
			g.close()
			return nil, err
		}
		stdout, err := c.cmd.StdoutPipe()
		if err != nil {
			g.close()
			return nil, err
		}
		if err := c.cmd.Start(); err != nil {
			g.close()
			return nil, fmt.Errorf("bench: start a generator child: %w", err)
		}
		g.children = append(g.children, c)
		go c.read(stdout)
		if g.budget != nil { // before its configuration: it dials nothing until then
			if err := g.budget.add(c.cmd.Process.Pid); err != nil {
				g.close()
				return nil, err
			}
		}
		c.enc = json.NewEncoder(c.stdin)
		if err := c.enc.Encode(cfg); err != nil {
			g.close()
			return nil, fmt.Errorf("bench: configure generator child %d: %w\n%s", i, err, c.stderr)
		}
	}
	return g, nil
}

func (c *genChild) read(stdout io.Reader) {
	defer close(c.exited)
	dec := json.NewDecoder(bufio.NewReaderSize(stdout, 1<<20))
	for {
		var l genLine
		if err := dec.Decode(&l); err != nil {
			_ = c.cmd.Wait()
			return
		}
		if l.Stats != nil {
			c.stats.Store(l.Stats)
		}
		if l.Reply != nil {
			c.replies <- l.Reply
		}
	}
}

// do sends cmd to every child at once and returns their replies in order.
func (g *genPool) do(cmd genCmd) ([]*genReply, error) {
	for _, c := range g.children {
		if err := c.enc.Encode(cmd); err != nil {
			return nil, fmt.Errorf("bench: generator child: %s: %w\n%s", cmd.Op, err, c.stderr)
		}
	}
	out := make([]*genReply, len(g.children))
	for i, c := range g.children {
		select {
		case r := <-c.replies:
			out[i] = r
		case <-c.exited:
			return nil, fmt.Errorf("bench: generator child exited during %s:\n%s", cmd.Op, c.stderr)
		}
	}
	return out, nil
}

// start begins connecting every device, conc dials at a time in all, and
// publishing reports.
func (g *genPool) start(conc int) error {
	_, err := g.do(genCmd{Op: "start", Conc: max(1, conc/len(g.children))})
	return err
}

func (g *genPool) resetConnack() { _, _ = g.do(genCmd{Op: "connackReset"}) }

// connackSummary merges the children's dial-to-CONNACK histograms.
func (g *genPool) connackSummary() LatencySummary {
	rs, err := g.do(genCmd{Op: "connack"})
	if err != nil {
		return LatencySummary{}
	}
	var h Histogram
	for _, r := range rs {
		h.merge(r.Connack)
	}
	return h.Summary()
}

func (g *genPool) pauseReports(wait time.Duration) { _, _ = g.do(genCmd{Op: "pause", Wait: wait}) }

func (g *genPool) closeAll(abrupt bool) { _, _ = g.do(genCmd{Op: "close", Abrupt: abrupt}) }

// live is the children's live heap and goroutine stacks (liveGoMemory).
func (g *genPool) live() int64 {
	rs, err := g.do(genCmd{Op: "live"})
	if err != nil {
		return 0
	}
	var n int64
	for _, r := range rs {
		n += r.Live
	}
	return n
}

// dump is what the broker acknowledged of every device, in logins' order.
func (g *genPool) dump() ([]genDev, error) {
	rs, err := g.do(genCmd{Op: "dump"})
	if err != nil {
		return nil, err
	}
	out := make([]genDev, len(g.logins))
	for i, r := range rs {
		copy(out[g.children[i].first:], r.Devs)
	}
	return out, nil
}

// pids of the running children.
func (g *genPool) pids() []int {
	var out []int
	for _, c := range g.children {
		select {
		case <-c.exited:
		default:
			if c.cmd.Process != nil {
				out = append(out, c.cmd.Process.Pid)
			}
		}
	}
	return out
}

// close ends every child: stdin closed (it disconnects its devices and
// exits), killed after 30 s.
func (g *genPool) close() {
	for _, c := range g.children {
		if c.stdin != nil {
			c.stdin.Close()
		}
	}
	for _, c := range g.children {
		select {
		case <-c.exited:
		case <-time.After(30 * time.Second):
			_ = c.cmd.Process.Kill()
			<-c.exited
		}
	}
	g.budget.close()
}

// tailBuffer keeps the last 4 KiB written to it (a child's stderr).
type tailBuffer struct {
	mu  sync.Mutex
	buf []byte
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if len(b.buf) > 4096 {
		b.buf = append([]byte(nil), b.buf[len(b.buf)-4096:]...)
	}
	return len(p), nil
}

func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}
