package link

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"devicehub/bench/testkit"
)

// The request/reply table's own logic, on a Client without a broker so
// that every interleaving is certain; the same paths run on the real
// broker in commands_test.go.

// fakeClient is a Client whose publishes do what publish says (nil: they
// succeed and nothing answers). deliver hands a payload to the reply
// subscription, as the client's delivery goroutine would; goOffline and
// lose run the presence hooks.
type fakeClient struct {
	publish func(ctx context.Context, topic string, payload []byte) error

	mu      sync.Mutex
	offline map[string]bool
	reply   Handler
	change  func(deviceID string, online bool)
	lost    func()
}

func (f *fakeClient) IsOnline(id string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return !f.offline[id]
}

func (f *fakeClient) Subscribe(_ string, _ byte, h Handler) error {
	f.mu.Lock()
	f.reply = h
	f.mu.Unlock()
	return nil
}

func (f *fakeClient) OnPresenceChange(h func(string, bool)) { f.change = h }
func (f *fakeClient) OnConnectionLost(h func())             { f.lost = h }

func (f *fakeClient) Publish(ctx context.Context, topic string, _ byte, payload []byte) error {
	if f.publish == nil {
		return nil
	}
	return f.publish(ctx, topic, payload)
}

// deliver hands payload to the reply handler as the reply to the downlink
// published on topic (on that device's reply topic).
func (f *fakeClient) deliver(topic, payload string) {
	f.mu.Lock()
	h := f.reply
	f.mu.Unlock()
	h(topic+"/reply", []byte(payload))
}

func (f *fakeClient) goOffline(id string) {
	f.mu.Lock()
	if f.offline == nil {
		f.offline = map[string]bool{}
	}
	f.offline[id] = true
	f.mu.Unlock()
	f.change(id, false)
}

// answer is a reply to the downlink payload with properties.
func answer(t *testing.T, payload []byte, properties string) string {
	var dl struct{ MessageID string }
	if err := json.Unmarshal(payload, &dl); err != nil || dl.MessageID == "" {
		t.Errorf("downlink %s: %v", payload, err)
	}
	return fmt.Sprintf(`{"messageId":%q,"success":true,"properties":%s}`, dl.MessageID, properties)
}

func newFakeCommands(t *testing.T, f *fakeClient, opt CommandOptions) *Commands {
	t.Helper()
	c, err := NewCommands(f, nil, opt)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// sameShard returns n device ids whose waiters share one shard.
func sameShard(n int) []string {
	var ids []string
	for i := 0; len(ids) < n; i++ {
		id := fmt.Sprintf("dev%d", i)
		if shardOf(id) == shardOf("dev0") {
			ids = append(ids, id)
		}
	}
	return ids
}

// read runs a property read in a goroutine and returns its outcome.
func read(c *Commands, deviceID string, timeout time.Duration) <-chan error {
	done := make(chan error, 1)
	go func() {
		_, err := c.ReadProperties(context.Background(), Target{DeviceID: deviceID, ProductID: "p"}, nil, timeout)
		done <- err
	}()
	return done
}

func wantOutcome(t *testing.T, done <-chan error, want error) {
	t.Helper()
	select {
	case err := <-done:
		if !errors.Is(err, want) {
			t.Fatalf("read ended with %v, want %v", err, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("read still waits, want %v", want)
	}
}

// A connection loss while the request is still publishing ends it with
// client_offline at once, not at its timeout.
func TestConnectionLostDuringPublish(t *testing.T) {
	publishing := make(chan struct{}, 1)
	f := &fakeClient{publish: func(ctx context.Context, _ string, _ []byte) error {
		publishing <- struct{}{}
		<-ctx.Done() // a QoS 1 publish waiting for a reconnection
		return ctx.Err()
	}}
	cmds := newFakeCommands(t, f, DefaultCommandOptions())
	done := read(cmds, "d", time.Hour)
	<-publishing
	f.lost()
	wantOutcome(t, done, ErrOffline)
	if n := cmds.Pending(); n != 0 {
		t.Fatalf("%d waiters left", n)
	}
}

// No lock is held across a publish: while one read's publish is stuck, a
// read of a device in the same shard is published, answered and
// returned.
func TestPublishHoldsNoLock(t *testing.T) {
	ids := sameShard(2)
	stuck, fast := ids[0], ids[1]
	publishing := make(chan struct{}, 1)
	var f *fakeClient
	f = &fakeClient{publish: func(ctx context.Context, topic string, payload []byte) error {
		if strings.Contains(topic, "/"+stuck+"/") {
			publishing <- struct{}{}
			<-ctx.Done()
			return ctx.Err()
		}
		go f.deliver(topic, answer(t, payload, `{"temp":1}`))
		return nil
	}}
	cmds := newFakeCommands(t, f, DefaultCommandOptions())
	stuckDone := read(cmds, stuck, time.Hour)
	<-publishing
	wantOutcome(t, read(cmds, fast, time.Hour), nil)
	f.goOffline(stuck)
	wantOutcome(t, stuckDone, ErrOffline)
}

// A device going offline fails its own waiters at once and no other's,
// though they share its shard.
func TestOfflineFailsOnlyItsWaiters(t *testing.T) {
	ids := sameShard(2)
	cmds := newFakeCommands(t, &fakeClient{}, DefaultCommandOptions())
	f := cmds.client.(*fakeClient)
	a1, a2, b := read(cmds, ids[0], time.Hour), read(cmds, ids[0], time.Hour), read(cmds, ids[1], time.Hour)
	testkit.Eventually(t, 5*time.Second, "three reads pending", func() bool { return cmds.Pending() == 3 })
	f.goOffline(ids[0])
	wantOutcome(t, a1, ErrOffline)
	wantOutcome(t, a2, ErrOffline)
	if n := cmds.Pending(); n != 1 {
		t.Fatalf("%d waiters pending after %s went offline, want %s's one", n, ids[0], ids[1])
	}
	select {
	case err := <-b:
		t.Fatalf("the other device's read ended with %v", err)
	default:
	}
	f.goOffline(ids[1])
	wantOutcome(t, b, ErrOffline)
}

// MaxPending bounds the table: one more read is refused with ErrTooBusy
// and counted as busy, and a slot freed is usable again.
func TestTooBusy(t *testing.T) {
	opt := DefaultCommandOptions()
	opt.MaxPending = 2
	reg := prometheus.NewRegistry()
	opt.Registerer = reg
	cmds := newFakeCommands(t, &fakeClient{}, opt)
	f := cmds.client.(*fakeClient)
	first, second := read(cmds, "a", time.Hour), read(cmds, "b", time.Hour)
	testkit.Eventually(t, 5*time.Second, "two reads pending", func() bool { return cmds.Pending() == 2 })
	wantOutcome(t, read(cmds, "c", time.Hour), ErrTooBusy)
	if got := metricValue(t, reg, "devicehub_commands_total", "kind", "read", "outcome", "busy"); got != 1 {
		t.Fatalf("busy reads counted %v, want 1", got)
	}
	f.goOffline("a")
	wantOutcome(t, first, ErrOffline)
	third := read(cmds, "c", time.Hour)
	testkit.Eventually(t, 5*time.Second, "the third read pending in the freed slot", func() bool { return cmds.Pending() == 2 })
	f.lost()
	wantOutcome(t, second, ErrOffline)
	wantOutcome(t, third, ErrOffline)
}

// The deadline is the request's: a silent device's read ends at exactly
// its timeout, and a reply that comes before it wins (synctest's clock).
func TestReadDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const timeout = 10 * time.Second
		var replyAfter time.Duration // 0: silent
		var f *fakeClient
		f = &fakeClient{publish: func(_ context.Context, topic string, payload []byte) error {
			if replyAfter > 0 {
				time.AfterFunc(replyAfter, func() { f.deliver(topic, answer(t, payload, `{"temp":2}`)) })
			}
			return nil
		}}
		cmds := newFakeCommands(t, f, DefaultCommandOptions())
		target := Target{DeviceID: "d", ProductID: "p"}

		start := time.Now()
		if _, err := cmds.ReadProperties(context.Background(), target, nil, timeout); !errors.Is(err, ErrTimeout) {
			t.Fatalf("silent device: %v", err)
		}
		if d := time.Since(start); d != timeout {
			t.Fatalf("silent read ended after %v, want %v", d, timeout)
		}

		replyAfter = timeout - time.Millisecond
		start = time.Now()
		got, err := cmds.ReadProperties(context.Background(), target, nil, timeout)
		if err != nil || got["temp"] != float64(2) {
			t.Fatalf("reply a millisecond before the deadline: %v, %v", got, err)
		}
		if d := time.Since(start); d != replyAfter {
			t.Fatalf("answered read took %v, want %v", d, replyAfter)
		}

		// The default timeout applies when none is given.
		replyAfter = 0
		start = time.Now()
		if _, err := cmds.ReadProperties(context.Background(), target, nil, 0); !errors.Is(err, ErrTimeout) {
			t.Fatalf("default timeout: %v", err)
		}
		if d := time.Since(start); d != DefaultCommandOptions().Timeout {
			t.Fatalf("read with the default timeout ended after %v", d)
		}
		if n := cmds.Pending(); n != 0 {
			t.Fatalf("%d waiters left", n)
		}
	})
}

// Every downlink's ids are fresh; the messageId's first byte names the
// shard of its device, where the reply is looked up.
func TestRequestIDs(t *testing.T) {
	hex24 := regexp.MustCompile(`^[0-9a-f]{24}$`)
	trace := regexp.MustCompile(`^00-[0-9a-f]{32}-[0-9a-f]{16}-01$`)
	seen := map[string]bool{}
	for i := range 1000 {
		dev := fmt.Sprintf("device-%d", i)
		ids := newIDs(shardOf(dev))
		if !hex24.MatchString(ids.messageID) || !hex24.MatchString(ids.uid) || !trace.MatchString(ids.traceparent) {
			t.Fatalf("ids %+v", ids)
		}
		if got := shardOfID(ids.messageID); got != int(shardOf(dev)) {
			t.Fatalf("messageId %s names shard %d, its device's is %d", ids.messageID, got, shardOf(dev))
		}
		for _, id := range []string{ids.messageID, ids.uid, ids.traceparent} {
			if seen[id] {
				t.Fatalf("id %s drawn twice", id)
			}
			seen[id] = true
		}
	}
	for _, id := range []string{"", "x", "zz0000", "FF00"} { // not ours: some shard, no panic
		if s := shardOfID(id); s < 0 || s >= shardCount {
			t.Fatalf("shardOfID(%q) = %d", id, s)
		}
	}
}

// The headers are written as a map of them would be (keys sorted), so the
// downlink's bytes do not depend on the struct that holds them.
func TestDownlinkHeadersAsMap(t *testing.T) {
	f := func(tg Target) {
		t.Helper()
		ids := newIDs(0)
		got, err := json.Marshal(headers(tg, ids))
		if err != nil {
			t.Fatal(err)
		}
		want, _ := json.Marshal(map[string]string{
			"deviceName": tg.DeviceName, "productName": tg.ProductName, "productId": tg.ProductID,
			"_uid": ids.uid, "creatorId": tg.CreatorID, "traceparent": ids.traceparent,
		})
		if string(got) != string(want) {
			t.Fatalf("headers\n%s\nwant\n%s", got, want)
		}
	}
	f(Target{DeviceID: "d", DeviceName: "Device d", ProductID: "p", ProductName: "P", CreatorID: "admin"})
	f(Target{DeviceName: `<b>"q"</b> & \ ` + "\u2028\x01é", ProductName: "温度"})
	f(Target{})
}

// Each outcome is counted under its kind.
func TestOutcomeOf(t *testing.T) {
	f := func(kind int, err error, want string) {
		t.Helper()
		if got := outcomeNames[outcomeOf(kind, err)]; got != want {
			t.Fatalf("%s %v: outcome %s, want %s", kindNames[kind], err, got, want)
		}
	}
	f(kindRead, nil, "answered")
	f(kindInvoke, nil, "sent")
	f(kindRead, &DeviceError{Code: "x"}, "failed")
	f(kindRead, ErrTimeout, "timeout")
	f(kindInvoke, ErrTimeout, "timeout")
	f(kindRead, ErrOffline, "offline")
	f(kindInvoke, fmt.Errorf("wrapped: %w", ErrOffline), "offline")
	f(kindRead, ErrTooBusy, "busy")
	f(kindRead, errors.New("link: publish: connection lost"), "error")
	f(kindInvoke, context.Canceled, "error")
}

// metricValue is the value of the counter, gauge or histogram count name
// whose labels are the given name, value pairs (-1: no such series).
func metricValue(t *testing.T, g prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			if len(have) != len(labels)/2 {
				continue
			}
			for i := 0; i < len(labels); i += 2 {
				if have[labels[i]] != labels[i+1] {
					continue series
				}
			}
			switch {
			case m.Counter != nil:
				return m.GetCounter().GetValue()
			case m.Gauge != nil:
				return m.GetGauge().GetValue()
			case m.Histogram != nil:
				return float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return -1
}
