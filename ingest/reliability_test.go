package ingest

import (
	"context"
	"strconv"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"devicehub/bench/testkit"
	"devicehub/meta/metatest"
	"devicehub/tsdb/tsdbtest"
)

// TestRetainedUplinkStoredOnce: a report a device publishes with the
// retain flag is stored once; the broker's replays of it to every later
// subscription (a restart of devicehub) are dropped and counted.
func TestRetainedUplinkStoredOnce(t *testing.T) {
	e, p, d := newEnvOneDevice(t)
	topic := "/" + p + "/" + d + "/properties/report"
	dev := newPublisher(t, nil)
	t.Cleanup(func() { // an empty retained message clears it on the shared broker
		if tok := dev.Publish(topic, 1, true, ""); !tok.WaitTimeout(5*time.Second) || tok.Error() != nil {
			t.Errorf("clearing the retained report: %v", tok.Error())
		}
	})

	// A plain subscription, the default: Mosquitto sends no retained
	// message to a shared one.
	opt := func() Options {
		o := testOptions(p)
		o.ShareGroup = NoShareGroup
		return o
	}
	first := e.startIngester(opt())
	if tok := dev.Publish(topic, 1, true, `{"messageId":"kept","properties":{"v":1}}`); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("publish: %v", tok.Error())
	}
	testkit.Eventually(t, 10*time.Second, "the live report stored", func() bool {
		return e.count("SELECT count() FROM device_message WHERE device_id = ?", d) == 1
	})

	ctx := ctxT(t, 10*time.Second)
	if err := first.Close(ctx); err != nil {
		t.Fatal(err)
	}
	// Two more starts, each a new subscription that the broker replays
	// the retained report to.
	for range 2 {
		in := e.startIngester(opt())
		testkit.Eventually(t, 10*time.Second, "the replay dropped", func() bool { return in.Stats().Dropped[DropRetained] == 1 })
		if err := in.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n := e.count("SELECT count() FROM device_message WHERE device_id = ?", d); n != 1 {
		t.Fatalf("the retained report is stored %d times", n)
	}
}

// TestBadTimestampsCounted: a report whose timestamp is 0, negative, in
// year 3000 or not a number is stored at its arrival time and counted in
// devicehub_ingest_bad_timestamps_total; a null one is no timestamp, and a
// good one is kept; neither is counted.
func TestBadTimestampsCounted(t *testing.T) {
	e, p, d := newEnvOneDevice(t)
	in := e.startIngester(testOptions(p))
	dev := newPublisher(t, nil)
	topic := "/" + p + "/" + d + "/properties/report"
	good := time.Now().Add(-time.Hour).UnixMilli()
	before := time.Now().Add(-time.Second)
	for _, ts := range []string{"0", "-1000", "32503680000000", `"abc"`, "null", strconv.FormatInt(good, 10)} {
		dev.MustPublish(t, topic, 1, `{"timestamp":`+ts+`,"properties":{"v":1}}`)
	}
	testkit.Eventually(t, 10*time.Second, "six reports stored", func() bool {
		return e.count("SELECT count() FROM device_message WHERE device_id = ?", d) == 6
	})

	if n := in.Stats().BadTimestamps; n != 4 {
		t.Fatalf("bad timestamps counted: %v, want 4", n)
	}
	if n := e.count("SELECT count() FROM device_message WHERE device_id = ? AND time >= ?", d, before); n != 5 {
		t.Fatalf("%d reports stored at their arrival time, want 5", n)
	}
	if n := e.count("SELECT count() FROM device_message WHERE device_id = ? AND ts = ?", d, good); n != 1 {
		t.Fatalf("the good timestamp was not kept (%d rows)", n)
	}
}

// TestStartWithBacklog: an ingester starts while the broker holds 100,000
// messages for its session (after an outage), with a connect timeout far
// shorter than the backlog takes: it starts, and stores all of them.
func TestStartWithBacklog(t *testing.T) {
	const n = 100_000
	e, p, d := newEnvOneDevice(t)
	opt := testOptions(p)
	opt.ShareGroup = NoShareGroup
	// A start-up step that waited behind the backlog (storing 100k takes
	// well over 10 s here) would time out; 2 s leaves a loaded machine
	// room to answer CONNECT and SUBSCRIBE themselves.
	opt.ConnectTimeout = 2 * time.Second
	first := e.startIngester(opt)
	if err := first.Close(ctxT(t, 10*time.Second)); err != nil { // the session stays
		t.Fatal(err)
	}
	dev := newPublisher(t, nil)
	topic := "/" + p + "/" + d + "/properties/report"
	var last mqtt.Token
	for i := range n {
		last = dev.Publish(topic, 1, false, `{"messageId":"b`+strconv.Itoa(i)+`","properties":{"v":1}}`)
	}
	if !last.WaitTimeout(60*time.Second) || last.Error() != nil {
		t.Fatalf("publish: %v", last.Error())
	}
	start := time.Now()
	in := e.startIngester(opt)
	t.Logf("started in %s with the backlog", time.Since(start).Round(time.Millisecond))
	// Readiness waits for the backlog: not drained while it is being
	// stored, drained once all of it is.
	if in.BacklogDrained() {
		t.Fatalf("backlog drained at start, with %d of %d stored", in.Stats().Stored, n)
	}
	testkit.Eventually(t, 120*time.Second, "the backlog drained", in.BacklogDrained)
	if s := in.Stats(); s.Stored < n {
		t.Fatalf("backlog said drained with %d of %d stored", s.Stored, n)
	}
	t.Logf("backlog drained %s after the start", time.Since(start).Round(time.Millisecond))
	if got := e.count("SELECT uniqExact(message_id) FROM device_message WHERE device_id = ?", d); got != n {
		t.Fatalf("%d distinct messages stored, want %d", got, n)
	}
	if s := in.Stats(); s.Received != n || s.Acked != n {
		t.Fatalf("received %d, acked %d: the marker is counted as a device message", s.Received, s.Acked)
	}
}

// TestBacklogDrainedWithoutBacklog: a new session, a shared subscription
// and a QoS 0 one are drained as soon as they are subscribed.
func TestBacklogDrainedWithoutBacklog(t *testing.T) {
	for _, tc := range []struct {
		name  string
		share string
		qos   byte
	}{
		{"new kept session", NoShareGroup, 1},
		{"shared subscription", "g-" + randID("s"), 1},
		{"QoS 0", NoShareGroup, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, p, _ := newEnvOneDevice(t)
			opt := testOptions(p)
			opt.ShareGroup, opt.QoS = tc.share, tc.qos
			in := e.startIngester(opt)
			testkit.Eventually(t, 5*time.Second, "drained", in.BacklogDrained)
		})
	}
}

// awayEnv is an env whose PostgreSQL can be taken away (pg), with a
// product p of two offline devices, known and other, and the options of
// an ingester on one plain subscription.
type awayEnv struct {
	env          *env
	pg           *metatest.Proxy
	p            string
	known, other string
	opt          Options
}

func newAwayEnv(t *testing.T, other string) awayEnv {
	store, pg := metatest.NewStoreBehindProxy(t)
	a := awayEnv{env: &env{t: t, store: store, ch: tsdbtest.NewDB(t, time.UTC)}, pg: pg, p: randID("p")}
	a.env.product(a.p)
	a.known, a.other = a.p+"-known", a.p+"-"+other
	a.env.device(a.known, a.p, "offline")
	a.env.device(a.other, a.p, "offline")
	a.opt = testOptions(a.p)
	a.opt.ShareGroup = NoShareGroup
	return a
}

// TestPostgresAwayDelaysOnlyItsDevice: while PostgreSQL is unreachable, a
// report of a device not looked up yet and the birth messages (whose state
// write waits) are delayed, not the other devices' reports: those are
// stored and acknowledged meanwhile. When PostgreSQL is back everything is
// stored and acknowledged.
func TestPostgresAwayDelaysOnlyItsDevice(t *testing.T) {
	a := newAwayEnv(t, "unknown")
	e, pg, p, known, unknown, opt := a.env, a.pg, a.p, a.known, a.other, a.opt
	in := e.startIngester(opt)
	dev := newPublisher(t, nil)
	report := func(d, id string) {
		dev.MustPublish(t, "/"+p+"/"+d+"/properties/report", 1, `{"messageId":"`+id+`","properties":{"v":1}}`)
	}
	report(known, "k0") // looked up and cached
	testkit.Eventually(t, 10*time.Second, "the first report acknowledged", func() bool { return in.Stats().Acked == 1 })

	pg.Down()
	report(unknown, "u0")
	dev.MustPublish(t, "/"+p+"/"+known+"/online", 1, "{}")
	const n = 50
	for i := range n {
		report(known, "k"+strconv.Itoa(i+1))
	}
	testkit.Eventually(t, 10*time.Second, "the known device's reports acknowledged while PostgreSQL is away", func() bool {
		return in.Stats().Acked >= 1+n
	})

	if got := e.count("SELECT count() FROM device_message WHERE device_id = ? AND message_type = 'REPORT_PROPERTY'", known); got != 1+n {
		t.Fatalf("%d of the known device's reports stored", got)
	}
	if in.Stats().Acked != 1+n {
		t.Fatalf("acknowledged %d, want %d: the unknown device's report or the birth was acknowledged without PostgreSQL", in.Stats().Acked, 1+n)
	}

	pg.Up()
	testkit.Eventually(t, 20*time.Second, "everything acknowledged once PostgreSQL is back", func() bool {
		return in.Stats().Acked == 3+n
	})

	if got := e.count("SELECT count() FROM device_message WHERE device_id = ?", unknown); got != 1 {
		t.Fatalf("the unknown device's report stored %d times", got)
	}
	testkit.Eventually(t, 10*time.Second, "the birth written", func() bool {
		var state string
		_ = e.store.DB().Get(&state, `SELECT state FROM devices WHERE id = $1`, known)
		return state == "online"
	})

}

// TestParkedMessageAcknowledged: a report parked while PostgreSQL is away
// is acknowledged to the broker once stored, and not before, whatever
// comes after it on its session. The cases:
//   - stored, then ingest restarts: the broker does not deliver it again
//     (its PUBACK went out);
//   - 65,600 later reports stored and acknowledged while it is parked,
//     then ingest stops before PostgreSQL is back: Mosquitto numbered one
//     of them with the parked report's packet id (its counter wraps after
//     65,535), and that one's PUBACK must not take the parked report off
//     the broker: the next ingester gets it and stores it;
//   - the same, stored before the restart: every acknowledgement held
//     for the shared packet id went out, nothing comes again.
func TestParkedMessageAcknowledged(t *testing.T) {
	cases := []struct {
		name    string
		later   int  // the known device's reports published while the other's is parked
		upFirst bool // PostgreSQL back, and the parked report stored, before ingest stops
	}{
		{"stored, then restarted", 0, true},
		{"packet id reused, stopped while parked", 65_600, false},
		{"packet id reused, stored, then restarted", 65_600, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a := newAwayEnv(t, "parked")
			e, pg, p, known, parked, opt := a.env, a.pg, a.p, a.known, a.other, a.opt
			opt.Connections = 1
			opt.DeviceCacheTTL = 10 * time.Minute // the known device stays looked up while PostgreSQL is away
			in := e.startIngester(opt)
			dev := newPublisher(t, nil)
			topic := func(d string) string { return "/" + p + "/" + d + "/properties/report" }
			dev.MustPublish(t, topic(known), 1, `{"messageId":"k","properties":{"v":1}}`)
			testkit.Eventually(t, 10*time.Second, "the known device looked up", func() bool { return in.Stats().Acked == 1 })

			pg.Down()
			dev.MustPublish(t, topic(parked), 1, `{"messageId":"u","properties":{"v":1}}`)
			testkit.Eventually(t, 10*time.Second, "the report parked", func() bool { return in.parked() == 1 })
			toks := make([]mqtt.Token, c.later)
			for i := range toks {
				toks[i] = dev.Publish(topic(known), 1, false, `{"messageId":"k`+strconv.Itoa(i)+`","properties":{"v":1}}`)
			}
			for _, tok := range toks {
				if !tok.WaitTimeout(time.Minute) || tok.Error() != nil {
					t.Fatalf("publish: %v", tok.Error())
				}
			}
			testkit.Eventually(t, time.Minute, "the known device's reports stored", func() bool {
				return in.Stats().Stored >= uint64(1+c.later)
			})
			if c.upFirst {
				pg.Up()
				testkit.Eventually(t, 20*time.Second, "the parked report stored", func() bool {
					return in.Stats().Stored == uint64(2+c.later) && in.parked() == 0
				})
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := in.Close(ctx); err != nil && c.upFirst {
				t.Fatalf("close: %v", err)
			}
			if !c.upFirst {
				pg.Up()
			}

			next := e.startIngester(opt) // the same session
			dev.MustPublish(t, topic(known), 1, `{"messageId":"fence","properties":{"v":1}}`)
			testkit.Eventually(t, 20*time.Second, "the fence stored", func() bool {
				return e.count("SELECT count() FROM device_message WHERE device_id = ? AND message_id = 'fence'", known) == 1
			})
			testkit.Eventually(t, 20*time.Second, "the parked report stored", func() bool {
				return e.count("SELECT count() FROM device_message WHERE device_id = ?", parked) >= 1
			})
			if got := e.count("SELECT count() FROM device_message WHERE device_id = ?", parked); got != 1 {
				t.Fatalf("the parked report stored %d times", got)
			}
			if got := next.Stats().Received; c.upFirst && got != 1 {
				t.Fatalf("the next ingester received %d messages, want only the fence: an acknowledgement did not go out", got)
			}
		})
	}
}
