package alarm

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"devicehub/bench/testkit"
	"devicehub/ingest/mqtttest"
)

// fedTestMsg is a message as ingest hands it to the feed.
type fedTestMsg struct {
	topic   string
	payload []byte
}

func (m *fedTestMsg) Duplicate() bool   { return false }
func (m *fedTestMsg) Qos() byte         { return 1 }
func (m *fedTestMsg) Retained() bool    { return false }
func (m *fedTestMsg) Topic() string     { return m.topic }
func (m *fedTestMsg) MessageID() uint16 { return 1 }
func (m *fedTestMsg) Payload() []byte   { return m.payload }
func (m *fedTestMsg) Ack()              { panic("the feed acknowledges through done") }

// TestFeed: Take waits while the feed holds its bound and gives up when
// stop closes; a turn is given what it was not given, in order; a new
// turn is given again what the last one did not commit, as redeliveries;
// acknowledgements call done once, in any order.
func TestFeed(t *testing.T) {
	f := NewFeed(3)
	var done [4]atomic.Int32
	take := func(i int, stop <-chan struct{}) bool {
		return f.Take(&fedTestMsg{topic: fmt.Sprint(i)}, 0, time.Now(), func() { done[i].Add(1) }, stop)
	}
	for i := range 3 {
		if !take(i, nil) {
			t.Fatal("take refused")
		}
	}
	stop := make(chan struct{})
	close(stop)
	if take(3, stop) {
		t.Fatal("a full feed took a fourth message")
	}
	f.restart()
	if f.caughtUp() {
		t.Fatal("caught up before reading")
	}
	never := make(chan struct{})
	var got []*fedMsg
	for range 3 {
		m, ok := f.next(never)
		if !ok {
			t.Fatal("no message")
		}
		got = append(got, m.Msg.(*fedMsg))
	}
	if !f.caughtUp() || got[0].Topic() != "0" || got[2].Topic() != "2" || got[0].Duplicate() {
		t.Fatalf("first turn: caught up %v, %s..%s, dup %v", f.caughtUp(), got[0].Topic(), got[2].Topic(), got[0].Duplicate())
	}
	got[1].Ack() // out of order: 0 and 2 stay held
	got[1].Ack()
	if done[1].Load() != 1 || f.Held() != 2 {
		t.Fatalf("done %d, held %d", done[1].Load(), f.Held())
	}
	// A fourth fits now, while the turn waits for it.
	waiting := make(chan *fedMsg)
	go func() {
		m, _ := f.next(never)
		waiting <- m.Msg.(*fedMsg)
	}()
	if !take(3, nil) {
		t.Fatal("take refused")
	}
	if m := <-waiting; m.Topic() != "3" || m.Duplicate() {
		t.Fatalf("next: %s dup %v", m.Topic(), m.Duplicate())
	}
	// The next turn reads 0, 2 and 3 again, redeliveries now.
	f.restart()
	var again []string
	for range 3 {
		m, _ := f.next(never)
		if !m.Msg.Duplicate() {
			t.Errorf("%s not a redelivery", m.Msg.Topic())
		}
		again = append(again, m.Msg.Topic())
		m.Msg.Ack()
	}
	if fmt.Sprint(again) != "[0 2 3]" || f.Held() != 0 || len(f.log) != 0 {
		t.Fatalf("again %v, held %d, log %d", again, f.Held(), len(f.log))
	}
	for i := range done {
		if done[i].Load() != 1 {
			t.Errorf("message %d done %d times", i, done[i].Load())
		}
	}
}

// TestRunnerFeedExact: the evaluator reads a feed (ingest's session)
// instead of a session of its own. Its turn ends twice between a commit
// and its acknowledgements, and once with a batch in memory (a new turn,
// as after a lost lock, on the same feed); half the devices send no
// messageId. Each device ends with one alarm counting exactly its reports
// above the threshold, and every message's done is called once. Without
// the feed marking what an ended turn read as redeliveries, the devices
// without a messageId count the crashed batches twice.
func TestRunnerFeedExact(t *testing.T) {
	b := mqtttest.StartBroker(t)
	g := newRig(t, b.URL(), `{"trigger":{"type":"property","all":[{"property":"temp","op":"gt","value":30}]},"clear":{"type":"manual"}}`)
	feed := NewFeed(0)
	var crashNext atomic.Bool
	start := func() (*Runner, func()) {
		return g.runner(func(r *Runner) {
			r.opt.Feed = feed
			r.afterWrite = func(*batch) error {
				if crashNext.CompareAndSwap(true, false) {
					return errors.New("test crash between a write and its acks")
				}
				return nil
			}
		})
	}
	r, stop := start()
	testkit.Eventually(t, 20*time.Second, "the owner", r.Ready)
	const devices, rounds = 50, 12
	var mu sync.Mutex
	dones := map[string]int{}
	base := time.Now().Add(-time.Hour)
	above := 0
	for round := range rounds {
		v := 31.0
		if round%3 == 2 {
			v = 20
		} else {
			above++
		}
		if round == 3 || round == 7 {
			crashNext.Store(true)
		}
		for d := range devices {
			ts := base.Add(time.Duration(round) * time.Second).UnixMilli()
			payload := fmt.Sprintf(`{"messageId":"m%d","timestamp":%d,"properties":{"temp":%v}}`, round, ts, v)
			if d%2 == 1 {
				payload = fmt.Sprintf(`{"timestamp":%d,"properties":{"temp":%v}}`, ts, v)
			}
			key := fmt.Sprintf("%d/%d", round, d)
			m := &fedTestMsg{topic: fmt.Sprintf("/%s/dev%03d/properties/report", g.product, d), payload: []byte(payload)}
			if !feed.Take(m, 0, time.Now(), func() { mu.Lock(); dones[key]++; mu.Unlock() }, nil) {
				t.Fatal("take refused")
			}
		}
		if round == 3 || round == 7 {
			testkit.Eventually(t, 20*time.Second, "the crash", func() bool { return !crashNext.Load() })
		}
		if round == 5 { // the turn ends with what it read in memory; a new one reads the feed
			stop()
			r, stop = start()
		}
	}
	recs, ok := g.settledRecords(devices, int64(above), 30*time.Second, func() bool { return feed.Held() == 0 })
	if !ok || len(recs) != devices {
		t.Errorf("%d alarms for %d devices (settled: %v, held %d)", len(recs), devices, ok, feed.Held())
	}
	for _, r := range recs {
		if r.Count != int64(above) || r.State != StateActive {
			t.Errorf("%s: count %d state %s, want %d active", r.DeviceID, r.Count, r.State, above)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(dones) != devices*rounds {
		t.Errorf("%d messages done, want %d", len(dones), devices*rounds)
	}
	for k, n := range dones {
		if n != 1 {
			t.Errorf("message %s done %d times", k, n)
		}
	}
	_ = r
}
