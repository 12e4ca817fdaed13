package forward

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"devicehub/bench/testkit"
	"devicehub/ingest/mqttconn"
	"devicehub/ingest/mqtttest"
)

// sinkLogin is a login the private broker b lets publish on
// /fwdsink/...: the gateway's.
func sinkLogin(t testing.TB, b *mqtttest.Broker) (username, password string) {
	t.Helper()
	o := mqtt.NewClientOptions()
	mqtttest.Gateway(t, b.URL())(o)
	return o.Username, o.Password
}

// spooled fills a spool in a directory of its own with n synced messages
// of devices d0..d<devs-1>, messageId "<dev>-<i>", as the intake does.
func spooled(t testing.TB, n, devs int) *spool {
	t.Helper()
	sp, err := openSpool(t.TempDir(), 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sp.close)
	at := time.Now()
	for i := range n {
		d := fmt.Sprintf("d%d", i%devs)
		msg := fmt.Sprintf(`"productId":"p","deviceId":"%s","type":"property","messageId":"%s-%d","time":%d,"received":%d,"properties":{"temp":%d}}`,
			d, d, i/devs, at.UnixMilli(), at.UnixMilli(), i)
		if err := sp.append([]byte(msg), at); err != nil {
			t.Fatal(err)
		}
	}
	if err := sp.sync(); err != nil {
		t.Fatal(err)
	}
	return sp
}

// sinkLines subscribes to a sink broker's /fwdsink/+/event/+ for the
// test and returns what arrived so far, in order.
func sinkLines(t *testing.T, br *mqtttest.Broker, user, pass string) func() []got {
	t.Helper()
	sub, err := mqtttest.Dial(br.URL(), testkit.RandID("sub"), user, pass, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Disconnect(0) })
	handle, received := lineCollector(t)
	if tok := sub.Subscribe("/fwdsink/+/event/+", 1, handle); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe: %v", tok.Error())
	}
	return received
}

// lineCollector is a message handler keeping each forwarded line, and
// what it kept so far, in order.
func lineCollector(t *testing.T) (mqtt.MessageHandler, func() []got) {
	var mu sync.Mutex
	var lines []got
	return func(_ mqtt.Client, m mqtt.Message) {
			var l got
			if err := json.Unmarshal(m.Payload(), &l); err != nil {
				t.Errorf("payload %q", m.Payload())
			}
			mu.Lock()
			lines = append(lines, l)
			mu.Unlock()
		}, func() []got {
			mu.Lock()
			defer mu.Unlock()
			return append([]got(nil), lines...)
		}
}

// everyMessage waits until the n messages of spooled(n, devs) arrived
// and returns every line, checked in order per device (inOrder), and the
// number of repeats.
func everyMessage(t *testing.T, received func() []got, n, devs int) ([]got, int) {
	t.Helper()
	testkit.Eventually(t, 60*time.Second, "every message", func() bool {
		seen := map[string]bool{}
		for _, l := range received() {
			seen[l.MessageID] = true
		}
		return len(seen) == n
	})
	var ids []string
	for i := range devs {
		ids = append(ids, fmt.Sprintf("d%d", i))
	}
	all := received()
	return all, inOrder(t, all, ids, n/devs)
}

// sinkRule is an MQTT rule to broker (a URL) with the test sink's
// topic and login; window 0 is the default batchSize.
func sinkRule(t testing.TB, id, broker, user, pass string, window int) Rule {
	t.Helper()
	r := Rule{ID: id, Kind: KindMQTT, Secret: pass,
		MQTT: &MQTTSink{Broker: broker, Topic: "/fwdsink/{deviceId}/event/{type}", Username: user, BatchSize: window}}
	if err := r.MQTT.normalize(); err != nil {
		t.Fatal(err)
	}
	return r
}

// sending runs f's sender of r over sp until stop, which waits for it.
func sending(f *Forwarder, r Rule, sp *spool) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); f.send(ctx, r, sp) }()
	return func() { cancel(); <-done }
}

// bareForwarder runs senders without a database or an intake.
func bareForwarder() *Forwarder {
	o := Options{BackoffMin: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond, Retry: 50 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}.withDefaults()
	return &Forwarder{opt: o, log: o.Logger, crashed: make(chan struct{}, 1)}
}

// BenchmarkMQTTSink is the MQTT sender's rate: b.N messages spooled and
// synced beforehand, published to a private Mosquitto on this machine
// (the rule's default batchSize, 500), timed until the cursor is past
// them all; rtt=... puts a link of that round trip between the sender
// and the broker (delayLink). Run it with a fixed count:
// -bench MQTTSink -benchtime 50000x.
func BenchmarkMQTTSink(b *testing.B) {
	for _, rtt := range []time.Duration{0, 10 * time.Millisecond, 40 * time.Millisecond} {
		b.Run("rtt="+rtt.String(), func(b *testing.B) {
			br := mqtttest.StartBroker(b)
			user, pass := sinkLogin(b, br)
			url := br.URL()
			if rtt > 0 {
				url = delayLink(b, strings.TrimPrefix(url, "tcp://"), rtt/2)
			}
			sp := spooled(b, b.N, 10)
			r := sinkRule(b, "bench", url, user, pass, 0)
			f := bareForwarder()
			b.ResetTimer()
			start := time.Now()
			stop := sending(f, r, sp)
			for sp.position() < uint64(b.N) {
				time.Sleep(time.Millisecond)
			}
			el := time.Since(start)
			b.StopTimer()
			stop()
			b.ReportMetric(float64(b.N)/el.Seconds(), "msg/s")
		})
	}
}

// delayLink is a TCP relay to addr that holds every chunk oneWay before
// passing it on, both ways (a long link's latency, not its bandwidth);
// it returns the tcp:// URL to dial.
func delayLink(t testing.TB, addr string, oneWay time.Duration) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	pipe := func(dst, src net.Conn) {
		type chunk struct {
			b  []byte
			at time.Time
		}
		q := make(chan chunk, 4096)
		go func() {
			defer dst.Close()
			for c := range q {
				time.Sleep(time.Until(c.at.Add(oneWay)))
				if _, err := dst.Write(c.b); err != nil {
					return
				}
			}
		}()
		defer close(q)
		for {
			buf := make([]byte, 32<<10)
			n, err := src.Read(buf)
			if n > 0 {
				q <- chunk{buf[:n], time.Now()}
			}
			if err != nil {
				return
			}
		}
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", addr)
			if err != nil {
				c.Close()
				continue
			}
			go pipe(up, c)
			go pipe(c, up)
		}
	}()
	return "tcp://" + ln.Addr().String()
}

// An MQTT rule's sink broker stopped mid-stream, with a window of
// publishes in flight, and started again: every message arrives, first
// arrivals in order per device, a repeat only with its first arrival's
// seq, and the cursor ends past them all. The broker is stopped with
// SIGTERM so that it keeps (in its persistence file, for the subscriber's
// session) every message it acknowledged: what is missing then is what
// the sender skipped. Counting a publish that failed with the connection
// as acknowledged (the cursor past an unacknowledged message) loses
// messages here (seen failing).
func TestMQTTSinkBrokerRestart(t *testing.T) {
	br := mqtttest.StartBroker(t)
	user, pass := sinkLogin(t, br)
	handle, received := lineCollector(t)
	o := mqtt.NewClientOptions().AddBroker(br.URL()).SetClientID("fwd-restart-sub").SetUsername(user).SetPassword(pass).
		SetCleanSession(false).SetAutoReconnect(true).SetMaxReconnectInterval(100 * time.Millisecond).
		SetConnectRetry(true).SetConnectRetryInterval(100 * time.Millisecond).SetOrderMatters(true)
	o.SetOnConnectHandler(func(c mqtt.Client) {
		c.Subscribe("/fwdsink/+/event/+", 1, nil) // the kept session holds it too
	})
	o.SetDefaultPublishHandler(handle)
	sub := mqtt.NewClient(o)
	if err := mqttconn.WaitToken(sub.Connect(), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	defer sub.Disconnect(0)
	testkit.Eventually(t, 10*time.Second, "subscribed", func() bool {
		tok := sub.Subscribe("/fwdsink/+/event/+", 1, nil)
		return tok.WaitTimeout(time.Second) && tok.Error() == nil
	})

	const n, devs = 20000, 10
	sp := spooled(t, n, devs)
	r := sinkRule(t, "restart", br.URL(), user, pass, 500)
	defer sending(bareForwarder(), r, sp)()

	testkit.Eventually(t, 30*time.Second, "a quarter received", func() bool { return len(received()) >= n/4 })
	br.Stop(syscall.SIGTERM)
	stoppedAt := sp.position()
	time.Sleep(300 * time.Millisecond)
	br.Start()
	all, dups := everyMessage(t, received, n, devs)
	testkit.Eventually(t, 10*time.Second, "the cursor past every message", func() bool { return sp.position() == n })
	first := map[string]uint64{}
	for _, l := range all {
		if s, ok := first[l.MessageID]; ok && s != l.Seq {
			t.Fatalf("%s again with seq %d, first with %d", l.MessageID, l.Seq, s)
		}
		first[l.MessageID] = l.Seq
	}
	st := sp.stats(time.Now())
	t.Logf("%d messages, %d lines, %d repeats (same seq); cursor %d at the stop; %d failures; sent %d", n, len(all), dups, stoppedAt, st.Failed, st.Sent)
	if st.Failed == 0 || stoppedAt >= n {
		t.Fatalf("the stop was not mid-stream: cursor %d, %d failures", stoppedAt, st.Failed)
	}
	if st.Sent != n {
		t.Fatalf("sent %d of %d", st.Sent, n)
	}
}

// A cursor that cannot be saved (here cursor.tmp is a directory; a full
// disk does the same) deletes no segment: the reopened spool reads on
// from the saved cursor. Deleting the segments the unsaved cursor had
// passed first left a spool whose saved cursor's next message was in no
// segment, which no sender could read again (seen failing).
func TestSpoolCursorNotSaved(t *testing.T) {
	dir := t.TempDir()
	sp, err := openSpool(dir, 1<<20) // segments of 128 KiB
	if err != nil {
		t.Fatal(err)
	}
	msg := []byte(fmt.Sprintf(`"deviceId":"d","pad":"%0500d"}`, 0))
	for range 1000 { // about four segments
		if err := sp.append(msg, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	if err := sp.sync(); err != nil {
		t.Fatal(err)
	}
	recs, err := sp.read(10)
	if err != nil || len(recs) != 10 {
		t.Fatalf("read %d: %v", len(recs), err)
	}
	if err := sp.ack(10, 10); err != nil {
		t.Fatal(err)
	}
	if len(sp.segs) < 3 {
		t.Fatalf("%d segments", len(sp.segs))
	}
	if err := os.Mkdir(filepath.Join(dir, "cursor.tmp"), 0o750); err != nil {
		t.Fatal(err)
	}
	sp.advance(11, 900)
	if err := sp.save(); err == nil {
		t.Fatal("the cursor saved")
	}
	sp.close()
	if err := os.Remove(filepath.Join(dir, "cursor.tmp")); err != nil {
		t.Fatal(err)
	}
	sp, err = openSpool(dir, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer sp.close()
	recs, err = sp.read(5)
	if err != nil || len(recs) != 5 || recs[0].seq != 11 {
		t.Fatalf("after reopening: %d records, the first %v: %v", len(recs), recs[:min(1, len(recs))], err)
	}
}

// An MQTT sender crashed between the PUBACKs and the cursor's save (the
// spool reopened from disk, a new connection): every message arrives,
// first arrivals in order per device, the repeats only with their seq
// and at most one and a half windows.
func TestMQTTSinkCrash(t *testing.T) {
	br := mqtttest.StartBroker(t)
	user, pass := sinkLogin(t, br)
	received := sinkLines(t, br, user, pass)
	const n, devs, window = 6000, 4, 200
	sp := spooled(t, n, devs)
	r := sinkRule(t, "crash", br.URL(), user, pass, window)
	f := bareForwarder()
	var saves, unsavedAtCrash atomic.Int64
	f.beforeAck = func(_ string, k int) error {
		if saves.Add(1) == 5 {
			unsavedAtCrash.Store(int64(k))
			return errCrash
		}
		return nil
	}
	run := func(sp *spool) { t.Cleanup(sending(f, r, sp)) }
	run(sp)
	select {
	case <-f.crashed:
	case <-time.After(30 * time.Second):
		t.Fatal("no crash")
	}
	sp.close()
	sp2, err := openSpool(sp.dir, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	defer sp2.close()
	run(sp2)
	all, dups := everyMessage(t, received, n, devs)
	sameSeq, newSeq := repeats(all)
	t.Logf("%d lines, %d repeats (%d with their seq); %d acknowledged and not saved at the crash", len(all), dups, sameSeq, unsavedAtCrash.Load())
	if newSeq != 0 || dups > window*3/2 || dups < int(unsavedAtCrash.Load()) {
		t.Fatalf("%d repeats, %d with a new seq, for a window of %d and %d unsaved", dups, newSeq, window, unsavedAtCrash.Load())
	}
}

// An MQTT rule's sender stopped mid-stream (a stop, a changed rule, a
// lost lock) with a window of publishes in flight over a slow link, and
// the next owner reopening its spool: every message arrives once. The
// stop waits for the PUBACKs in flight and saves the cursor past them, as
// a webhook's waits for its batch. Returning at once (the cursor saved
// only every half window) has the next owner publish again up to one and
// a half windows (seen failing).
func TestForwardMQTTHandover(t *testing.T) {
	br := mqtttest.StartBroker(t)
	user, pass := sinkLogin(t, br)
	received := sinkLines(t, br, user, pass)
	const n, devs, window = 6000, 4, 200
	sp := spooled(t, n, devs)
	// 25 ms each way: a window's PUBACKs are always outstanding.
	link := delayLink(t, strings.TrimPrefix(br.URL(), "tcp://"), 25*time.Millisecond)
	r := sinkRule(t, "handover", link, user, pass, window)
	f := bareForwarder()
	stop := sending(f, r, sp)
	testkit.Eventually(t, 30*time.Second, "a quarter received", func() bool { return len(received()) >= n/4 })
	stop()
	stoppedAt := sp.position()
	sp.close()
	if stoppedAt >= n {
		t.Fatalf("the stop was not mid-stream: cursor %d", stoppedAt)
	}
	sp2, err := openSpool(sp.dir, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	defer sp2.close()
	defer sending(f, r, sp2)()
	all, dups := everyMessage(t, received, n, devs)
	t.Logf("%d lines; the stop at %d of %d", len(all), stoppedAt, n)
	if dups != 0 {
		t.Fatalf("%d messages published again by the next owner", dups)
	}
}
