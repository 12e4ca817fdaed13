package ingest

import (
	"context"
	"fmt"
	"hash/maphash"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"devicehub/bench/testkit"
	"devicehub/ingest/mqtttest"
	"devicehub/ingest/wire"
)

// TestBirthNotBehindReports: births and wills have a session, workers and
// a writer of their own, so births reach PostgreSQL while the reports
// published ahead of them cannot be stored. ClickHouse (a private one) is
// killed; one device's reports fill the reports' writer and its worker's
// queue, and the data session's callback waits; a birth of every other
// device, published after those reports, still makes its device online,
// those of the reports' shard included. In the data session they waited
// behind the reports until ClickHouse came back; with a worker and writer
// shared with the reports, a worker wrote one birth's state and waited
// for room in the full writer, and the births behind it with it.
func TestBirthNotBehindReports(t *testing.T) {
	const devices = 16
	e, ch, p := privateEnv(t, "devicehub_presence", devices)
	db := e.ch
	iopt := testOptions(p)
	iopt.ShareGroup = NoShareGroup // the default: one plain subscription per session
	iopt.Workers, iopt.Queue = 4, 16
	iopt.Writer.MaxRows = 10 // a writer full after a few reports
	iopt.Writer.RetryMin = 50 * time.Millisecond
	iopt.Writer.RetryMax = 500 * time.Millisecond
	in := e.startIngester(iopt)
	dev := func(i int) string { return fmt.Sprintf("%s-d%d", p, i) }
	worker := func(id string) uint64 { return maphash.String(in.seed, id) % uint64(len(in.queues)) }

	pub := newPublisher(t, nil)
	pub.MustPublish(t, "/"+p+"/"+dev(0)+"/properties/report", 1, `{"messageId":"r-first","properties":{"t":1}}`)
	testkit.Eventually(t, 30*time.Second, "a report stored", func() bool { return in.Stats().Stored >= 1 })
	ch.kill()

	const reports = 200
	for i := range reports {
		pub.MustPublish(t, "/"+p+"/"+dev(0)+"/properties/report", 1, fmt.Sprintf(`{"messageId":"r%d","properties":{"t":%d}}`, i, i))
	}
	full := in.queues[worker(dev(0))]
	testkit.Eventually(t, 30*time.Second, "the reports' worker queue full", func() bool { return len(full) == cap(full) })

	var born []string
	for i := 1; i < devices; i++ {
		born = append(born, dev(i))
		pub.MustPublish(t, "/"+p+"/"+dev(i)+"/online", 1, fmt.Sprintf(`{"messageId":"b%d"}`, i))
	}
	online := func() uint64 {
		var n uint64
		if err := e.store.DB().QueryRow(`SELECT count(*) FROM devices WHERE id = ANY($1) AND state = 'online'`, "{"+strings.Join(born, ",")+"}").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	testkit.Eventually(t, 20*time.Second, "births in PostgreSQL while ClickHouse is down", func() bool {
		return online() == uint64(len(born))
	})
	if s := in.Stats(); s.Stored != 1 {
		t.Fatalf("stored %d while ClickHouse was down, want 1 (the first report)", s.Stored)
	}

	ch.start()
	want := uint64(1 + reports + len(born))
	testkit.Eventually(t, 90*time.Second, "every message stored once ClickHouse is back", func() bool {
		var got uint64
		err := db.Conn().QueryRow(context.Background(), "SELECT uniqExact(message_id) FROM device_message").Scan(&got)
		return err == nil && got == want
	})
}

// TestBirthAheadOfQueuedReports: a shard's births and wills have a worker
// of their own. With ClickHouse (a private one) down and one shard, its
// reports' worker holds 3,000 reports in its queue when a birth comes; the
// birth is written to PostgreSQL before ClickHouse is back. Taken by the
// reports' worker, it waited for the reports' writer at least.
func TestBirthAheadOfQueuedReports(t *testing.T) {
	e, ch, p := privateEnv(t, "devicehub_presence_first", 2)
	d0, d1 := p+"-d0", p+"-d1"
	iopt := testOptions(p)
	iopt.ShareGroup = NoShareGroup
	iopt.Workers = 1         // one shard: the birth's and the reports'
	iopt.Writer.MaxRows = 10 // a writer full after a few reports, and small inserts after
	iopt.Writer.RetryMin = 50 * time.Millisecond
	iopt.Writer.RetryMax = 200 * time.Millisecond
	in := e.startIngester(iopt)

	pub := newPublisher(t, nil)
	pub.MustPublish(t, "/"+p+"/"+d0+"/properties/report", 1, `{"messageId":"r-first","properties":{"t":1}}`)
	testkit.Eventually(t, 30*time.Second, "a report stored", func() bool { return in.Stats().Stored >= 1 })
	ch.kill()
	const reports = 3000
	for i := range reports {
		pub.MustPublish(t, "/"+p+"/"+d0+"/properties/report", 1, fmt.Sprintf(`{"messageId":"r%d","properties":{"t":%d}}`, i, i))
	}
	testkit.Eventually(t, 30*time.Second, "the reports queued", func() bool {
		return in.depth.Load() >= reports-100 && in.Stats().Received == reports+1
	})
	pub.MustPublish(t, "/"+p+"/"+d1+"/online", 1, `{"messageId":"b1"}`)
	testkit.Eventually(t, 20*time.Second, "the birth in PostgreSQL while ClickHouse is down", func() bool {
		var s string
		if err := e.store.DB().QueryRow(`SELECT state FROM devices WHERE id = $1`, d1).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s == "online"
	})
	if s := in.Stats(); s.Stored != 1 {
		t.Fatalf("stored %d while ClickHouse was down, want 1 (the first report)", s.Stored)
	}
	ch.start()
	testkit.Eventually(t, 90*time.Second, "every message stored", func() bool {
		return e.count("SELECT uniqExact(message_id) FROM device_message") == reports+2
	})
}

// TestHandoffFromCombinedSession: a data session kept from a run before
// the presence session existed holds the birth and will filters and a
// backlog. The first start with a presence session hands births and wills
// over while a device flips between online and offline as fast as it can:
// every birth and will is stored exactly once, and the device's state is
// its last one. In "presence session removed" the data session has no
// such filters any more, so the births the presence session holds ahead
// of its split marker are its own and must be stored.
func TestHandoffFromCombinedSession(t *testing.T) {
	t.Run("combined session kept", func(t *testing.T) { handoffFromCombined(t, true) })
	t.Run("presence session removed", func(t *testing.T) { handoffFromCombined(t, false) })
}

func handoffFromCombined(t *testing.T, combined bool) {
	e, p, d := newEnvOneDevice(t)
	iopt := testOptions(p)
	iopt.ShareGroup = NoShareGroup
	iopt.Logger = nil // Info: the handoff says what it did
	if combined {
		// The session an earlier run left: every uplink filter, plain.
		c := mqtt.NewClient(mqtttest.ServiceOptions(iopt.BrokerURL, iopt.ClientID+"-0").SetCleanSession(false))
		if tok := c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
			t.Fatalf("connect: %v", tok.Error())
		}
		fs := map[string]byte{}
		for _, f := range wire.UplinkFilters(p) {
			fs[f] = 1
		}
		if tok := c.SubscribeMultiple(fs, nil); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
			t.Fatalf("subscribe: %v", tok.Error())
		}
		c.Disconnect(0)
	} else {
		in := e.startIngester(iopt) // data and presence sessions, handed over
		if err := in.Close(ctxT(t, 30*time.Second)); err != nil {
			t.Fatal(err)
		}
		c := mqtt.NewClient(mqtttest.ServiceOptions(iopt.BrokerURL, iopt.ClientID+presenceSuffix).SetCleanSession(true))
		if tok := c.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
			t.Fatalf("remove the presence session: %v", tok.Error())
		}
		c.Disconnect(0)
	}

	// A device flips while the sessions are away (the data session's
	// backlog, when it holds births and wills), while ingest starts and
	// hands over, and after.
	pub := newPublisher(t, nil)
	var n atomic.Int64
	// In "combined session kept" the handoff waits, between the presence
	// session's subscription and its split marker, until 50 more flips
	// went out: the broker sends those to both sessions, so the test
	// always splits copies, however slow the machine. The flips go on
	// until that window has passed.
	var window atomic.Bool
	window.Store(!combined)
	if combined {
		iopt.handoffSubscribed = func() {
			defer window.Store(true)
			from := n.Load()
			for end := time.Now().Add(20 * time.Second); n.Load() < from+50 && time.Now().Before(end); {
				time.Sleep(time.Millisecond)
			}
		}
	}
	flip := func(until time.Time, pastWindow bool) {
		for hard := until.Add(time.Minute); time.Now().Before(until) || (pastWindow && !window.Load() && time.Now().Before(hard)); {
			k := n.Load()
			level := wire.LevelOnline
			if k%2 == 1 {
				level = wire.LevelOffline
			}
			pub.MustPublish(t, wire.DeviceTopic(p, d, level), 1, fmt.Sprintf(`{"messageId":"m%d"}`, k))
			n.Add(1)
		}
	}
	if combined {
		flip(time.Now().Add(300*time.Millisecond), false)
	}
	flipping := make(chan struct{})
	go func() {
		defer close(flipping)
		flip(time.Now().Add(3*time.Second), true)
	}()
	time.Sleep(200 * time.Millisecond)
	in := e.startIngester(iopt)
	started := n.Load() // published before New returned: maybe before the presence session subscribed
	<-flipping
	total := n.Load()
	last := "online" // message total-1: births at even numbers
	if (total-1)%2 == 1 {
		last = "offline"
	}

	stored := func(from int64) uint64 {
		return e.count("SELECT uniqExact(message_id) FROM device_message WHERE device_id = ? AND toInt64(substring(message_id, 2)) >= ?", d, from)
	}
	if combined {
		testkit.Eventually(t, 60*time.Second, "every birth and will stored", func() bool { return stored(0) == uint64(total) })
	} else {
		// Nobody held the births and wills until the presence session
		// subscribed: those published after New returned, and every one
		// ingest received, must be stored.
		testkit.Eventually(t, 60*time.Second, "every birth and will received stored", func() bool {
			s := in.Stats()
			return stored(started) == uint64(total-started) && stored(0) == s.Received && s.Received == s.Stored
		})
	}
	testkit.Eventually(t, 10*time.Second, "the device's last state in PostgreSQL", func() bool {
		var s string
		if err := e.store.DB().QueryRow(`SELECT state FROM devices WHERE id = $1`, d).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s == last
	})
	time.Sleep(500 * time.Millisecond) // a late copy would be stored by now
	rows := e.count("SELECT count() FROM device_message WHERE device_id = ?", d)
	s := in.Stats()
	t.Logf("%d births and wills (%d before New returned), %d received, %d rows; copies dropped: %d",
		total, started, s.Received, rows, s.Dropped[DropHandedOver])
	if rows != stored(0) {
		t.Fatalf("%d rows for %d messages: stored twice", rows, stored(0))
	}
	switch dropped := s.Dropped[DropHandedOver]; {
	case combined && dropped == 0:
		t.Fatal("no copy dropped, though 50 births and wills went to both sessions")
	case !combined && dropped > 0:
		t.Fatalf("%d births and wills dropped as copies, but the data session had none", dropped)
	}
}
