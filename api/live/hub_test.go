package live

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"devicehub/tsdb"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"))
}

func newHub(t *testing.T, opt Options) *Hub {
	t.Helper()
	h, err := New(context.Background(), opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h
}

func subscribe(t *testing.T, h *Hub, devices, props []string) *Subscription {
	t.Helper()
	s, err := h.Subscribe(devices, props)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

var t0 = time.UnixMilli(1764000000000)

func num(device, prop string, v float64) tsdb.PropertyValue {
	return tsdb.PropertyValue{Time: t0, ProductID: "p1", DeviceID: device, Property: prop, ValueType: "number", Num: v}
}

// events takes what s holds, as "<event> <data>" lines.
func events(s *Subscription) (lines []string, skipped uint64) {
	frames, skipped := s.Take(nil)
	for _, f := range frames {
		name, data, ok := strings.Cut(strings.TrimSuffix(string(f), "\n\n"), "\ndata: ")
		if !ok || !strings.HasPrefix(name, "event: ") {
			panic(fmt.Sprintf("not an event frame: %q", f))
		}
		lines = append(lines, strings.TrimPrefix(name, "event: ")+" "+data)
	}
	return lines, skipped
}

func TestPropertyData(t *testing.T) {
	f := func(v tsdb.PropertyValue, want string) {
		t.Helper()
		v.Time, v.ProductID, v.DeviceID, v.Property = t0, "p1", "d1", "x"
		for _, stored := range []bool{false, true} {
			got, ok := propertyData(&v, stored)
			if !ok {
				t.Fatalf("%+v: not encoded", v)
			}
			w := `{"deviceId":"d1","productId":"p1","property":"x","value":` + want + `,"timestamp":1764000000000,"stored":` + fmt.Sprint(stored) + `}`
			if string(got) != w {
				t.Fatalf("%+v:\n got %s\nwant %s", v, got, w)
			}
		}
	}
	f(tsdb.PropertyValue{ValueType: "number", Num: 21.5}, `21.5`)
	f(tsdb.PropertyValue{ValueType: "number", Num: -3}, `-3`)
	f(tsdb.PropertyValue{ValueType: "bool", Num: 1, Str: "true"}, `true`)
	f(tsdb.PropertyValue{ValueType: "bool", Str: "false"}, `false`)
	f(tsdb.PropertyValue{ValueType: "string", Str: "eco \"mode\"\n"}, `"eco \"mode\"\n"`)
	f(tsdb.PropertyValue{ValueType: "json", Str: `{"a": [1, 2]}`}, `{"a":[1,2]}`)
	f(tsdb.PropertyValue{ValueType: "json", Str: `{"a":`}, `"{\"a\":"`) // not JSON: sent as text
}

func TestFanOut(t *testing.T) {
	h := newHub(t, Options{})
	all := subscribe(t, h, []string{"d1", "d2"}, nil)
	temp := subscribe(t, h, []string{"d1"}, []string{"temp"})
	other := subscribe(t, h, []string{"d3"}, nil)

	h.Decoded([]tsdb.PropertyValue{num("d1", "temp", 1), num("d1", "hum", 2), num("d2", "temp", 3), num("d9", "temp", 4)})
	h.PresenceChanged("d1", true)
	h.PresenceChanged("d2", false)
	h.PresenceChanged("d9", true)

	prop := func(d, p string, v int) string {
		return fmt.Sprintf(`property {"deviceId":"%s","productId":"p1","property":"%s","value":%d,"timestamp":1764000000000,"stored":false}`, d, p, v)
	}
	for _, c := range []struct {
		name string
		s    *Subscription
		want []string // without state events' timestamps
	}{
		{"d1+d2, all properties", all, []string{prop("d1", "temp", 1), prop("d1", "hum", 2), prop("d2", "temp", 3),
			`state {"deviceId":"d1","state":"online"`, `state {"deviceId":"d2","state":"offline"`}},
		{"d1, temp only (state changes whatever the filter)", temp, []string{prop("d1", "temp", 1), `state {"deviceId":"d1","state":"online"`}},
		{"d3, silent", other, nil},
	} {
		got, skipped := events(c.s)
		if skipped != 0 || len(got) != len(c.want) {
			t.Fatalf("%s: got %d events (skipped %d), want %d:\n%s", c.name, len(got), skipped, len(c.want), strings.Join(got, "\n"))
		}
		for i := range got {
			if !strings.HasPrefix(got[i], c.want[i]) {
				t.Errorf("%s: event %d:\n got %s\nwant %s...", c.name, i, got[i], c.want[i])
			}
		}
	}
}

// TestQueueBounds: a subscriber that never takes holds at most Queue
// events and about QueueBytes bytes, the newest; the rest are counted.
func TestQueueBounds(t *testing.T) {
	f := func(queue, queueBytes int, sizes []int, wantKept []int, wantSkipped uint64) {
		t.Helper()
		h := newHub(t, Options{Queue: queue, QueueBytes: queueBytes})
		s := subscribe(t, h, []string{"d"}, nil)
		for i, n := range sizes {
			s.offer([]byte(fmt.Sprintf("%d:%s", i, strings.Repeat("x", n-len(fmt.Sprint(i))-1))))
		}
		frames, skipped := s.Take(nil)
		var kept []int
		for _, fr := range frames {
			var i int
			fmt.Sscanf(string(fr), "%d:", &i)
			kept = append(kept, i)
		}
		if fmt.Sprint(kept) != fmt.Sprint(wantKept) || skipped != wantSkipped {
			t.Fatalf("queue %d/%dB, sizes %v: kept %v skipped %d; want %v, %d", queue, queueBytes, sizes, kept, skipped, wantKept, wantSkipped)
		}
		if n, b := s.Queued(); n != 0 || b != 0 {
			t.Fatalf("after Take: %d events, %d bytes queued", n, b)
		}
	}
	f(4, 1000, []int{10, 10, 10}, []int{0, 1, 2}, 0)                             // fits
	f(4, 1000, []int{10, 10, 10, 10, 10, 10, 10}, []int{3, 4, 5, 6}, 3)          // event bound
	f(100, 25, []int{10, 10, 10, 10}, []int{2, 3}, 2)                            // byte bound
	f(100, 25, []int{10, 30}, []int{1}, 1)                                       // larger than the bound: alone
	f(100, 25, []int{30, 10}, []int{1}, 1)                                       // and pushed out by the next
	f(3, 1000, []int{10, 10, 10, 10, 10, 10, 10, 10, 10, 10}, []int{7, 8, 9}, 7) // wraps around
}

// TestStalledSubscriber: values for a subscriber that never reads go on
// being accepted at once; its queue stays at the bound, the rest is
// counted, and another subscriber of the same device gets everything.
func TestStalledSubscriber(t *testing.T) {
	reg := prometheus.NewRegistry()
	h := newHub(t, Options{Queue: 64, Registerer: reg})
	stalled := subscribe(t, h, []string{"d"}, nil)
	reader := subscribe(t, h, []string{"d"}, nil)
	const n = 100000
	got := 0
	start := time.Now()
	for i := range n {
		h.Stored([]tsdb.PropertyValue{num("d", "v", float64(i))})
		if i%32 == 31 {
			frames, skipped := reader.Take(nil)
			got += len(frames)
			if skipped != 0 {
				t.Fatalf("the reading subscriber skipped %d", skipped)
			}
		}
		if q, _ := stalled.Queued(); q > 64 {
			t.Fatalf("stalled queue at %d events, bound 64", q)
		}
	}
	elapsed := time.Since(start)
	frames, _ := reader.Take(nil)
	got += len(frames)
	frames, skipped := stalled.Take(nil)
	if got != n || len(frames) != 64 || skipped != n-64 {
		t.Fatalf("reader got %d of %d; stalled kept %d, skipped %d (want 64, %d)", got, n, len(frames), skipped, n-64)
	}
	if v := counter(t, reg, "devicehub_live_skipped_total"); v != n-64 {
		t.Fatalf("devicehub_live_skipped_total %v, want %d", v, n-64)
	}
	t.Logf("%d values to one reading and one stalled subscriber in %s (%.2f µs each)", n, elapsed, float64(elapsed.Microseconds())/n)
}

// counter is the value of a counter in reg.
func counter(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

func TestSubscribeLimitsAndClose(t *testing.T) {
	h, err := New(context.Background(), Options{MaxSubscribers: 2})
	if err != nil {
		t.Fatal(err)
	}
	a := subscribe(t, h, []string{"d1"}, nil)
	b := subscribe(t, h, []string{"d1", "d2"}, nil)
	if _, err := h.Subscribe([]string{"d3"}, nil); !errors.Is(err, ErrTooMany) {
		t.Fatalf("third subscription: %v, want ErrTooMany", err)
	}
	for _, c := range []struct {
		device string
		want   bool
	}{{"d1", true}, {"d2", true}, {"d3", false}} {
		if h.Watching(c.device) != c.want {
			t.Fatalf("Watching(%s) = %v", c.device, !c.want)
		}
	}
	b.Close()
	b.Close() // again: nothing
	if h.Watching("d2") || !h.Watching("d1") || h.Subscribers() != 1 {
		t.Fatalf("after closing b: Watching d2 %v, d1 %v, %d subscribers", h.Watching("d2"), h.Watching("d1"), h.Subscribers())
	}
	if _, err := h.Subscribe([]string{"d3"}, nil); err != nil {
		t.Fatalf("a slot is free again: %v", err)
	}
	h.Close()
	select {
	case <-a.Done():
	default:
		t.Fatal("Close left a subscription open")
	}
	if _, err := h.Subscribe([]string{"d1"}, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("after Close: %v, want ErrClosed", err)
	}
	if h.Watching("d1") {
		t.Fatal("a closed hub watches d1")
	}
}

func TestSkippedFrame(t *testing.T) {
	got := string(SkippedFrame(42))
	if got != "event: skipped\ndata: {\"count\":42}\n\n" {
		t.Fatalf("%q", got)
	}
	var e SkippedEvent
	if err := json.Unmarshal([]byte(strings.TrimSuffix(strings.TrimPrefix(got, "event: skipped\ndata: "), "\n\n")), &e); err != nil || e.Count != 42 {
		t.Fatalf("%v %+v", err, e)
	}
}

func BenchmarkStored(b *testing.B) {
	h, _ := New(context.Background(), Options{})
	defer h.Close()
	subs := make([]*Subscription, 10)
	for i := range subs {
		subs[i], _ = h.Subscribe([]string{"d1"}, nil)
	}
	vals := []tsdb.PropertyValue{num("d1", "temp", 21.5), num("d2", "temp", 1)}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		h.Stored(vals)
		if i%512 == 0 {
			for _, s := range subs {
				s.Take(nil)
			}
		}
	}
}
