package alarm

import (
	"fmt"
	"runtime"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	dto "github.com/prometheus/client_model/go"

	"devicehub/ingest/mqttconn"
	"devicehub/ingest/mqtttest"
)

// benchRules are ten rules on the test model's temp (as bench/alarms.go's
// ten: every kind of condition, a duration, a repetition, hysteresis, a
// ladder, a no-data timer); only the first is met by the crossing
// reports.
var benchRules = []string{
	`{"id":"hot","trigger":{"type":"property","all":[{"property":"temp","op":"gt","value":80}]},"clear":{"type":"trigger"}}`,
	`{"id":"hot-long","trigger":{"type":"property","all":[{"property":"temp","op":"gt","value":95}]},"duration":"30s"}`,
	`{"id":"cold","trigger":{"type":"property","all":[{"property":"temp","op":"lt","value":-10}]}}`,
	`{"id":"wet","trigger":{"type":"property","all":[{"property":"limit","op":"gt","value":150}]},"ladder":[{"severity":"critical","all":[{"property":"limit","op":"gt","value":180}]}]}`,
	`{"id":"band","trigger":{"type":"property","all":[{"property":"limit","op":"between","value":[-100,-50]}]}}`,
	`{"id":"jump","trigger":{"type":"property","all":[{"property":"limit","of":"rate","op":"gt","value":1000}]}}`,
	`{"id":"bursts","trigger":{"type":"property","all":[{"property":"temp","op":"gt","value":1000}]},"repeat":{"count":3,"within":"1m"}}`,
	`{"id":"extreme","trigger":{"type":"property","any":[{"property":"temp","op":"gt","value":200},{"property":"limit","op":"gt","value":400}]}}`,
	`{"id":"hyst","trigger":{"type":"property","all":[{"property":"temp","op":"gt","value":100}]},"clear":{"type":"condition","all":[{"property":"temp","op":"lt","value":90}]}}`,
	`{"id":"silent","trigger":{"type":"nodata","for":"1h"}}`,
}

// evaluatorAcked is how many messages the runner acknowledged (its lag
// histogram's count).
func evaluatorAcked(r *Runner) uint64 {
	var m dto.Metric
	if err := r.m.lag.Write(&m); err != nil {
		panic(err)
	}
	return m.GetHistogram().GetSampleCount()
}

// BenchmarkRunner: the runner on a private broker, one product with the
// ten benchRules, 2,000 devices reporting without message ids (as
// bench/alarms.go's). A paced phase (1,000 reports/s for 10 s, one device
// in 50 crossing the threshold on every other report) measures a
// crossing report's publish to its raised transition handed to
// OnTransitions (the live feed's announcement; the relay over
// PostgreSQL's NOTIFY to /api/live comes after); then bursts of one
// report per device (10 rounds, all in flight) measure the runner's
// throughput (published to acknowledged) and this process's CPU time and
// allocations per report over the bursts (the runner's, and the
// publishing client's: the same in every run). Run with -benchtime=1x:
// it states what it measures as metrics.
func BenchmarkRunner(b *testing.B) {
	const devices, rate, paced, rounds = 2000, 1000, 10 * time.Second, 10
	for b.Loop() {
		br := mqtttest.StartBroker(b)
		g := newRig(b, br.URL(), benchRules...)
		var mu sync.Mutex
		published := map[string]time.Time{}
		var lat []time.Duration
		var waits, writes []time.Duration // arrival -> written; a batch's transaction
		var changes int                   // transitions users are told of (not repeats)
		began := map[uint64]time.Time{}
		r, stop := g.runner(func(r *Runner) {
			r.opt.FlushInterval = 50 * time.Millisecond // the default
			r.beforeWrite = func(b *batch) error {
				now := time.Now()
				mu.Lock()
				defer mu.Unlock()
				began[b.seq] = now
				for _, m := range b.msgs {
					waits = append(waits, now.Sub(m.At))
				}
				return nil
			}
			r.afterWrite = func(b *batch) error {
				now := time.Now()
				mu.Lock()
				defer mu.Unlock()
				writes = append(writes, now.Sub(began[b.seq]))
				return nil
			}
			r.opt.OnTransitions = func(trs []Transition) {
				now := time.Now()
				mu.Lock()
				defer mu.Unlock()
				for _, t := range trs {
					if t.Kind != KindRepeated {
						changes++
					}
					if t.Kind == KindRaised && t.RuleID == g.product+"-hot" {
						if at, ok := published[t.DeviceID]; ok {
							lat = append(lat, now.Sub(at))
						}
					}
				}
			}
		})
		g.waitOwner(r)
		report := func(d, round int) mqtt.Token {
			dev := fmt.Sprintf("d%05d", d)
			temp := 20 + float64(d%10)
			if d%50 == 0 && (round+d/50)%2 == 0 {
				temp = 85
				mu.Lock()
				published[dev] = time.Now()
				mu.Unlock()
			}
			return g.pub.Publish("/"+g.product+"/"+dev+"/properties/report", 1, false,
				fmt.Sprintf(`{"properties":{"temp":%g,"limit":%d}}`, temp, 40+round%7))
		}
		// paced
		start := time.Now()
		n := 0
		var last mqtt.Token
		for time.Since(start) < paced {
			due := start.Add(time.Duration(n) * time.Second / rate)
			time.Sleep(time.Until(due))
			last = report(n%devices, n/devices)
			n++
		}
		if err := mqttconn.WaitToken(last, 30*time.Second); err != nil {
			b.Fatal(err)
		}
		for evaluatorAcked(r) < uint64(n) {
			time.Sleep(5 * time.Millisecond)
		}
		mu.Lock()
		if len(lat) == 0 {
			b.Fatal("no alarm raised")
		}
		q := func(d []time.Duration, f float64) float64 {
			slices.Sort(d)
			return float64(d[int(f*float64(len(d)-1))]) / 1e6
		}
		b.ReportMetric(q(lat, 0.5), "raise-p50-ms")
		b.ReportMetric(q(lat, 0.99), "raise-p99-ms")
		b.ReportMetric(q(lat, 1), "raise-max-ms")
		b.ReportMetric(float64(len(lat)), "raised")
		b.ReportMetric(q(waits, 0.5), "wait-p50-ms")
		b.ReportMetric(q(waits, 0.99), "wait-p99-ms")
		b.ReportMetric(q(writes, 0.5), "write-p50-ms")
		b.ReportMetric(q(writes, 0.99), "write-p99-ms")
		b.ReportMetric(float64(len(writes)), "paced-batches")
		b.ReportMetric(float64(r.store.statements.Load())/float64(r.Batches()), "paced-stmts/batch")
		mu.Unlock()
		// bursts
		mu.Lock()
		writes, changes = nil, 0
		mu.Unlock()
		batches0, stmts0 := r.Batches(), r.store.statements.Load()
		base := evaluatorAcked(r)
		var mem0, mem1 runtime.MemStats
		var ru0, ru1 syscall.Rusage
		runtime.ReadMemStats(&mem0)
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru0); err != nil {
			b.Fatal(err)
		}
		start = time.Now()
		var toks []mqtt.Token
		for round := range rounds {
			for d := range devices {
				toks = append(toks, report(d, 100+round))
			}
		}
		for _, tok := range toks {
			if err := mqttconn.WaitToken(tok, time.Minute); err != nil {
				b.Fatal(err)
			}
		}
		for evaluatorAcked(r) < base+devices*rounds {
			time.Sleep(5 * time.Millisecond)
		}
		b.ReportMetric(float64(devices*rounds)/time.Since(start).Seconds(), "burst-reports/s")
		runtime.ReadMemStats(&mem1)
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru1); err != nil {
			b.Fatal(err)
		}
		cpu := time.Duration(syscall.TimevalToNsec(ru1.Utime) - syscall.TimevalToNsec(ru0.Utime) + syscall.TimevalToNsec(ru1.Stime) - syscall.TimevalToNsec(ru0.Stime))
		b.ReportMetric(float64(cpu.Microseconds())/float64(devices*rounds), "burst-cpu-us/report")
		b.ReportMetric(float64(mem1.TotalAlloc-mem0.TotalAlloc)/float64(devices*rounds), "burst-alloc-B/report")
		b.ReportMetric(float64(mem1.Mallocs-mem0.Mallocs)/float64(devices*rounds), "burst-allocs/report")
		mu.Lock()
		nb := float64(r.Batches() - batches0)
		b.ReportMetric(float64(r.store.statements.Load()-stmts0)/nb, "burst-stmts/batch")
		b.ReportMetric(float64(changes)/nb, "burst-changes/batch")
		b.ReportMetric(q(writes, 0.5), "burst-write-p50-ms")
		b.ReportMetric(q(writes, 0.99), "burst-write-p99-ms")
		b.ReportMetric(nb, "burst-batches")
		mu.Unlock()
		b.ReportMetric(float64(r.Batches()), "batches")
		stop()
	}
}
