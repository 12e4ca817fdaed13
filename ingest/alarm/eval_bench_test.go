package alarm

import (
	"fmt"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/lib/pq"

	"devicehub/schema"
)

// BenchmarkNoDataTimers1M: one no-data rule over 1,000,000 devices that
// each reported once: the memory of their state and timers, and the cost
// of a report that moves a deadline. Run with -benchtime=1x.
func BenchmarkNoDataTimers1M(b *testing.B) {
	const devices = 1_000_000
	m := model(b)
	r, err := ParseRule([]byte(`{"id":"quiet","name":"Quiet","productId":"p1","severity":"major","enabled":true,"trigger":{"type":"nodata","for":"10m"}}`))
	if err != nil {
		b.Fatal(err)
	}
	ids := make([]string, devices)
	for i := range ids {
		ids[i] = "dev" + strconv.Itoa(i)
	}
	props := []Prop{{ID: "temp", Value: NumberValue(20)}}
	for b.Loop() {
		runtime.GC()
		var before runtime.MemStats
		runtime.ReadMemStats(&before)
		e := New(nil)
		e.SetRules([]Rule{r}, map[string]*schema.ThingModel{"p1": m})
		start := time.Now()
		for i, id := range ids {
			e.Apply(Message{Kind: MsgReport, ProductID: "p1", DeviceID: id, At: t0.Add(time.Duration(i) * time.Microsecond), Key: "k", KeyUnique: true, Props: props})
		}
		applied := time.Since(start)
		e.Dirty()
		runtime.GC()
		var after runtime.MemStats
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/devices, "heap-bytes/device")
		b.ReportMetric(float64(applied.Nanoseconds())/devices, "ns/report")
		// every deadline due: fire them all
		start = time.Now()
		n := e.Tick(t0.Add(time.Hour))
		b.ReportMetric(float64(time.Since(start).Nanoseconds())/float64(n), "ns/fired")
		if n != devices {
			b.Fatalf("%d fired", n)
		}
		runtime.KeepAlive(e)
	}
}

// benchEvaluator is an evaluator with the ten benchRules on product p1.
func benchEvaluator(tb testing.TB) *Evaluator {
	tb.Helper()
	m := model(tb)
	var rs []Rule
	for _, body := range benchRules {
		r, err := ParseRule([]byte(body))
		if err != nil {
			tb.Fatal(err)
		}
		r.Name, r.ProductID, r.Enabled, r.Severity = r.ID, "p1", true, SeverityMajor
		if err := r.Validate(m); err != nil {
			tb.Fatal(err)
		}
		rs = append(rs, r)
	}
	e := New(nil)
	e.SetRules(rs, map[string]*schema.ThingModel{"p1": m})
	return e
}

// benchReport applies round's report of device d (id) to e, as
// BenchmarkRunner's devices send them (temp and limit, no message id;
// one device in 50 crossing hot's threshold every other round).
func benchReport(e *Evaluator, d int, id string, round int) {
	temp := 20 + float64(d%10)
	if d%50 == 0 && (round+d/50)%2 == 0 {
		temp = 85
	}
	e.Apply(Message{Kind: MsgReport, ProductID: "p1", DeviceID: id,
		At: t0.Add(time.Duration(round)*time.Second + time.Duration(d)*time.Microsecond), Key: "h" + strconv.FormatUint(uint64(round)<<32|uint64(d), 16),
		Props: []Prop{{ID: "temp", Value: NumberValue(temp)}, {ID: "limit", Value: NumberValue(float64(40 + round%7))}}})
}

// benchReports applies round's report of every device.
func benchReports(e *Evaluator, ids []string, round int) {
	for d, id := range ids {
		benchReport(e, d, id, round)
	}
}

// BenchmarkDirty: Dirty over 1,000 devices with the ten benchRules, each
// touched by one report since the previous call (every row changed): an
// op is one call (1,000 rows); ns/row and bytes/row as metrics.
func BenchmarkDirty(b *testing.B) {
	const devices = 1000
	e := benchEvaluator(b)
	ids := benchIDs(devices)
	round := 0
	benchReports(e, ids, round)
	e.Dirty()
	var rows, size int
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		round++
		benchReports(e, ids, round)
		b.StartTimer()
		devs := e.Dirty()
		if len(devs) != devices {
			b.Fatalf("%d rows", len(devs))
		}
		rows += len(devs)
		for _, d := range devs {
			size += len(d.Data)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(rows), "ns/row")
	b.ReportMetric(float64(size)/float64(rows), "bytes/row")
}

// BenchmarkApplyReport: one report of a device (of 1,000) evaluated by
// the ten benchRules, its row taken by Dirty every 1,000 reports (as a
// batch takes them): an op is one report.
func BenchmarkApplyReport(b *testing.B) {
	const devices = 1000
	e := benchEvaluator(b)
	ids := benchIDs(devices)
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		benchReport(e, n%devices, ids[n%devices], n/devices)
		n++
		if n%devices == 0 {
			e.Dirty()
		}
	}
}

// BenchmarkStateArrays: the three array parameters of writeState for
// 1,000 rows of the ten benchRules, as textArray writes them and as
// pq.StringArray did: an op is one batch's parameters.
func BenchmarkStateArrays(b *testing.B) {
	e := benchEvaluator(b)
	ids := benchIDs(1000)
	benchReports(e, ids, 1)
	devs := e.Dirty()
	b.Run("textArray", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			textArray(devs, func(d *DeviceRow) string { return d.DeviceID })
			textArray(devs, func(d *DeviceRow) string { return d.ProductID })
			textArray(devs, func(d *DeviceRow) []byte { return d.Data })
		}
	})
	b.Run("pq.StringArray", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			id, product, data := make([]string, len(devs)), make([]string, len(devs)), make([]string, len(devs))
			for i, d := range devs {
				id[i], product[i], data[i] = d.DeviceID, d.ProductID, string(d.Data)
			}
			for _, a := range []pq.StringArray{id, product, data} {
				if _, err := a.Value(); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
}

// benchIDs are n device ids, d00000 on.
func benchIDs(n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("d%05d", i)
	}
	return ids
}
