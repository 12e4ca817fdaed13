package bench

import (
	"context"
	"database/sql"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"devicehub/schema/backoff"
)

// FleetSecond is one second of fleet-connect's timeline.
type FleetSecond struct {
	T         int    `json:"t"` // seconds since the devices began connecting
	Phase     string `json:"phase"`
	Connected int64  `json:"connected"` // device connections up
	// Acked: reports the broker acknowledged this second; Stored: messages
	// devicehub stored this second (its devicehub_ingest_stored_total).
	Acked  int64 `json:"acked"`
	Stored int64 `json:"stored"`
	// Unacked: messages devicehub has received and not yet acknowledged
	// to the broker (its received minus acked counters).
	Unacked int64 `json:"unacked"`
	// End to end, publish to visible in ClickHouse, of the probe devices'
	// reports first seen this second (resolution: the 250 ms poll).
	P50Ms float64 `json:"p50Ms"`
	P99Ms float64 `json:"p99Ms"`
	// Devices online in PostgreSQL and in devicehub's presence view
	// (devicehub_devices_online; -1 while devicehub is down).
	PGOnline int64 `json:"pgOnline"`
	Presence int64 `json:"presence"`
	// PGCommits: transactions committed on the run's database this
	// second (devicehub's queries and writes, the bench's few polls).
	PGCommits int64 `json:"pgCommits"`
	// CPU (% of one core over the second) and RSS (MiB) per process; the
	// brokers of a pool and the generator with its children summed.
	CPU map[string]float64 `json:"cpu"`
	RSS map[string]int64   `json:"rssMiB"`
}

// fleetWatch samples the run every second and polls ClickHouse for the
// probe devices' reports every 250 ms.
type fleetWatch struct {
	e     *fleetEnv
	f     *genPool
	pg    *sql.DB
	ch    driver.Conn
	start time.Time

	mu       sync.Mutex
	phase    string
	secs     []FleetSecond
	latency  map[int]*Histogram // by second of observation
	phaseLat map[string]*Histogram
	last     FleetSecond // the latest sample
	unacked  int64       // from the latest scrape

	stop chan struct{}
	wg   sync.WaitGroup
}

func newFleetWatch(e *fleetEnv, f *genPool) (*fleetWatch, error) {
	pg, err := e.db.open(2)
	if err != nil {
		return nil, err
	}
	ch, err := clickhouse.Open(&clickhouse.Options{Addr: []string{e.p.ClickHouseAddr}, Auth: clickhouse.Auth{Database: e.db.name},
		DialTimeout: 10 * time.Second, ReadTimeout: 5 * time.Minute})
	if err != nil {
		pg.Close()
		return nil, err
	}
	return &fleetWatch{e: e, f: f, pg: pg, ch: ch, latency: map[int]*Histogram{}, phaseLat: map[string]*Histogram{}, stop: make(chan struct{})}, nil
}

func (w *fleetWatch) setPhase(p string) {
	w.mu.Lock()
	w.phase = p
	w.mu.Unlock()
}

// phaseLatency is the end-to-end latency of the probes seen during phase.
func (w *fleetWatch) phaseLatency(p string) LatencySummary {
	w.mu.Lock()
	defer w.mu.Unlock()
	if h := w.phaseLat[p]; h != nil {
		return h.Summary()
	}
	return LatencySummary{}
}

func (w *fleetWatch) latest() FleetSecond {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.last
}

// caughtUp reports whether the latest second says the backlog is stored:
// reports stored in it, their end-to-end p99 under 2 s.
func (w *fleetWatch) caughtUp() bool {
	l := w.latest()
	return l.P99Ms > 0 && l.P99Ms < 2000 && l.Stored > 0
}

func (w *fleetWatch) run() {
	w.start = time.Now()
	w.wg.Add(2)
	go w.sampler()
	go w.prober()
}

func (w *fleetWatch) close() {
	close(w.stop)
	w.wg.Wait()
	w.pg.Close()
	w.ch.Close()
}

func (w *fleetWatch) timeline() []FleetSecond {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]FleetSecond(nil), w.secs...)
}

// pgOnline counts the run's devices online in PostgreSQL, and those online
// since at least since (the zero time: all online ones).
func (w *fleetWatch) pgOnline(ctx context.Context, since time.Time) (online, fresh int64, err error) {
	if since.IsZero() {
		since = time.Unix(0, 0)
	}
	err = w.pg.QueryRowContext(ctx, `SELECT count(*) FILTER (WHERE state = 'online'), count(*) FILTER (WHERE state = 'online' AND online_time >= $2)
		FROM devices WHERE product_id = $1`, w.e.product, since).Scan(&online, &fresh)
	return online, fresh, err
}

// pgCommits is the run's database's committed transactions so far.
func (w *fleetWatch) pgCommits(ctx context.Context) (int64, error) {
	var n int64
	err := w.pg.QueryRowContext(ctx, `SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()`).Scan(&n)
	return n, err
}

// presence is the child's presence view count and stored counter (-1,
// -1 while it does not answer).
func (w *fleetWatch) childMetrics(ctx context.Context) (presence, stored float64) {
	c := w.e.current.Load()
	if c == nil {
		return -1, -1
	}
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	m, err := c.proc.scrapeMetrics(cctx)
	if err != nil {
		return -1, -1
	}
	w.mu.Lock()
	w.unacked = int64(m["devicehub_ingest_received_total"] - m["devicehub_ingest_acked_total"])
	w.mu.Unlock()
	return m["devicehub_devices_online"], m["devicehub_ingest_stored_total"]
}

func (w *fleetWatch) sampler() {
	defer w.wg.Done()
	type proc struct {
		name string
		pids func() []int
	}
	procs := []proc{
		{"generator", func() []int { return append([]int{os.Getpid()}, w.f.pids()...) }},
		{"devicehub", func() []int {
			if p := int(w.e.childPID.Load()); p > 0 {
				return []int{p}
			}
			return nil
		}},
		{"mosquitto", w.e.brokerPIDs},
		{"clickhouse", func() []int {
			if w.e.chPID > 0 {
				return []int{w.e.chPID}
			}
			return nil
		}},
		{"postgres", func() []int {
			if w.e.backends != nil {
				return w.e.backends()
			}
			return nil
		}},
	}
	prevCPU := map[string]time.Duration{}
	cpuNow := func(p proc) time.Duration {
		var sum time.Duration
		for _, pid := range p.pids() {
			if d, ok := procCPUTime(pid); ok {
				sum += d
			}
		}
		return sum
	}
	for _, p := range procs {
		prevCPU[p.name] = cpuNow(p)
	}
	var prevAcked, prevCommits int64
	var prevStored float64 = -1
	prevT := time.Now()
	backoff.Every(w.stop, time.Second, func(time.Time) bool {
		now := time.Now()
		el := now.Sub(prevT).Seconds()
		prevT = now
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		s := FleetSecond{T: int(now.Sub(w.start) / time.Second), Connected: w.f.connected.Load(), CPU: map[string]float64{}, RSS: map[string]int64{}}
		acked := w.f.acked.Load()
		s.Acked, prevAcked = acked-prevAcked, acked
		presence, stored := w.childMetrics(ctx)
		s.Presence = int64(presence)
		switch {
		case stored < 0:
		case prevStored < 0 || stored < prevStored: // a new child counts from 0
			s.Stored = int64(stored)
		default:
			s.Stored = int64(stored - prevStored)
		}
		if stored >= 0 {
			prevStored = stored
		} else {
			prevStored = 0
		}
		if c, err := w.pgCommits(ctx); err == nil {
			if prevCommits > 0 {
				s.PGCommits = c - prevCommits
			}
			prevCommits = c
		}
		if on, _, err := w.pgOnline(ctx, time.Time{}); err == nil {
			s.PGOnline = on
		} else {
			s.PGOnline = -1
		}
		cancel()
		for _, p := range procs {
			c := cpuNow(p)
			if c >= prevCPU[p.name] {
				s.CPU[p.name] = float64(c-prevCPU[p.name]) / float64(time.Second) / el * 100
			}
			prevCPU[p.name] = c
			var rss int64
			for _, pid := range p.pids() {
				if p.name == "postgres" {
					rss = max(rss, pidRSS(pid)) // the largest backend (shared buffers would count once per backend)
				} else {
					rss += pidRSS(pid) // the brokers of a pool, the generator and its children
				}
			}
			s.RSS[p.name] = rss >> 20
		}
		w.mu.Lock()
		s.Unacked = w.unacked
		s.Phase = w.phase
		if h := w.latency[s.T-1]; h != nil {
			s.P50Ms, s.P99Ms = ms(h.Quantile(0.5)), ms(h.Quantile(0.99))
			delete(w.latency, s.T-1)
		}
		w.secs = append(w.secs, s)
		w.last = s
		w.mu.Unlock()
		w.e.p.Logf("fleet-connect %4ds %-22s connected %6d  acked %5d/s stored %5d/s unacked %6d  e2e p50 %5.0fms p99 %5.0fms  pg online %6d presence %6d commits %5d/s  cpu dh %3.0f%% mq %3.0f%% ch %3.0f%% pg %3.0f%% gen %3.0f%%  rss dh %d mq %d gen %d MiB",
			s.T, s.Phase, s.Connected, s.Acked, s.Stored, s.Unacked, s.P50Ms, s.P99Ms, s.PGOnline, s.Presence, s.PGCommits,
			s.CPU["devicehub"], s.CPU["mosquitto"], s.CPU["clickhouse"], s.CPU["postgres"], s.CPU["generator"],
			s.RSS["devicehub"], s.RSS["mosquitto"], s.RSS["generator"])
		return true
	})
}

// probeLookback bounds the end-to-end latencies the prober sees (prober).
const probeLookback = 10 * time.Minute

// prober polls ClickHouse for the probe devices' recent reports and
// times each from its publish (the report's own timestamp, which the
// generator sets as it publishes; the children share this machine's
// clock) to its first sighting.
func (w *fleetWatch) prober() {
	defer w.wg.Done()
	var ids []string
	for i := 0; i < len(w.f.logins); i += w.f.probeEvery {
		ids = append(ids, "'"+w.f.logins[i].ID+"'")
	}
	q := `SELECT device_id, message_id, ts FROM device_message WHERE product_id = '` + w.e.product + `' AND device_id IN (` + strings.Join(ids, ",") +
		`) AND message_type = 'REPORT_PROPERTY' AND time >= now() - ` + strconv.Itoa(int(probeLookback/time.Second))
	counted := map[string]time.Time{} // device/message id -> first sighting, for twice the window
	backoff.Every(w.stop, 250*time.Millisecond, func(time.Time) bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		rows, err := w.ch.Query(ctx, q)
		if err != nil {
			cancel()
			return true
		}
		now := time.Now()
		for k, at := range counted {
			if now.Sub(at) > 2*probeLookback {
				delete(counted, k)
			}
		}
		var seen []time.Duration
		for rows.Next() {
			var dev, mid string
			var ts int64
			if rows.Scan(&dev, &mid, &ts) != nil {
				continue
			}
			k := dev + "/" + mid
			if _, ok := counted[k]; ok {
				continue
			}
			counted[k] = now
			if sent := time.UnixMilli(ts); now.Sub(sent) < probeLookback {
				seen = append(seen, max(now.Sub(sent), 0))
			}
		}
		rows.Close()
		cancel()
		if len(seen) == 0 {
			return true
		}
		w.mu.Lock()
		sec := int(now.Sub(w.start) / time.Second)
		h := w.latency[sec]
		if h == nil {
			h = &Histogram{}
			w.latency[sec] = h
		}
		ph := w.phaseLat[w.phase]
		if ph == nil {
			ph = &Histogram{}
			w.phaseLat[w.phase] = ph
		}
		w.mu.Unlock()
		for _, d := range seen {
			h.Record(d)
			ph.Record(d)
		}
		return true
	})
}

// storedReport is what ClickHouse holds of one device at the end.
type storedCounts struct {
	reports, births, wills map[string]int // message id -> rows
}

// storedByDevice reads every stored report, birth and will of the run's
// product, device by device.
func (w *fleetWatch) storedByDevice(ctx context.Context) (map[string]*storedCounts, error) {
	rows, err := w.ch.Query(ctx, `SELECT device_id, message_type, message_id, count() FROM device_message
		WHERE product_id = ? GROUP BY device_id, message_type, message_id`, w.e.product)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]*storedCounts{}
	for rows.Next() {
		var dev, typ, mid string
		var n uint64
		if err := rows.Scan(&dev, &typ, &mid, &n); err != nil {
			return nil, err
		}
		s := out[dev]
		if s == nil {
			s = &storedCounts{reports: map[string]int{}, births: map[string]int{}, wills: map[string]int{}}
			out[dev] = s
		}
		switch typ {
		case "REPORT_PROPERTY":
			s.reports[mid] += int(n)
		case "ONLINE":
			s.births[mid] += int(n)
		case "OFFLINE":
			s.wills[mid] += int(n)
		}
	}
	return out, rows.Err()
}

// storedTotal counts the run's stored reports.
func (w *fleetWatch) storedTotal(ctx context.Context) (int64, error) {
	var n uint64
	err := w.ch.QueryRow(ctx, `SELECT count() FROM device_message WHERE product_id = ? AND message_type = 'REPORT_PROPERTY'`, w.e.product).Scan(&n)
	return int64(n), err
}
