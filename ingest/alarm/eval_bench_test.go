package alarm

import (
	"runtime"
	"strconv"
	"testing"
	"time"

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
