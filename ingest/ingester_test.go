package ingest

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"devicehub/bench/testkit"
	"devicehub/ingest/link"
	"devicehub/ingest/mqttconn"
	"devicehub/ingest/mqtttest"
	"devicehub/ingest/wire"
	"devicehub/tsdb"
)

type propRow struct {
	Property, ValueType string
	Num                 float64
	Str                 string
}

func TestReportsFromManyDevicesStored(t *testing.T) {
	e := newEnv(t)
	p := randID("p")
	e.product(p)
	const devices, perDevice = 5, 20
	e.devices(p, devices)
	opt := testOptions(p)
	opt.Connections = 2 // the share group split over connections, whatever the cores
	in := e.startIngester(opt)

	// Each device reports 2..14 properties of mixed types; message k of a
	// device carries the timestamp t0+k.
	t0 := time.Now().UnixMilli()
	wantProps := 0
	var wg sync.WaitGroup
	for i := range devices {
		nprops := 2 + i*3
		wantProps += nprops * perDevice
		dev := newPublisher(t, nil)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range perDevice {
				var b strings.Builder
				fmt.Fprintf(&b, `{"messageId":"%s-d%d-m%d","timestamp":%d,"properties":{`, p, i, k, t0+int64(k))
				for j := range nprops {
					if j > 0 {
						b.WriteByte(',')
					}
					switch j % 3 {
					case 0:
						fmt.Fprintf(&b, `"num%d":%d.5`, j, k)
					case 1:
						fmt.Fprintf(&b, `"txt%d":"v%d"`, j, k)
					case 2:
						fmt.Fprintf(&b, `"flag%d":%v`, j, k%2 == 0)
					}
				}
				b.WriteString("}}")
				if tok := dev.Publish(fmt.Sprintf("/%s/%s-d%d/properties/report", p, p, i), 1, false, b.String()); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
					t.Errorf("publish: %v", tok.Error())
					return
				}
			}
		}()
	}
	wg.Wait()
	testkit.Eventually(t, 30*time.Second, "every message and property stored", func() bool {
		return e.count("SELECT count() FROM device_message WHERE product_id = ?", p) >= devices*perDevice &&
			e.count("SELECT count() FROM device_property WHERE product_id = ?", p) >= uint64(wantProps)
	})

	if n := e.count("SELECT count() FROM device_message WHERE product_id = ? AND message_type = 'REPORT_PROPERTY' AND direction = 'up'", p); n != devices*perDevice {
		t.Fatalf("%d report messages, want %d", n, devices*perDevice)
	}
	if n := e.count("SELECT count() FROM device_property WHERE product_id = ?", p); n != uint64(wantProps) {
		t.Fatalf("%d property rows, want %d", n, wantProps)
	}
	// One message in detail: device 1 (5 properties), message 3.
	rows, err := e.ch.Conn().Query(context.Background(),
		"SELECT property, toString(value_type), num_value, str_value FROM device_property WHERE device_id = ? AND ts = ? ORDER BY property",
		p+"-d1", t0+3)
	if err != nil {
		t.Fatal(err)
	}
	var got []propRow
	for rows.Next() {
		var r propRow
		if err := rows.Scan(&r.Property, &r.ValueType, &r.Num, &r.Str); err != nil {
			t.Fatal(err)
		}
		got = append(got, r)
	}
	rows.Close()
	want := []propRow{
		{"flag2", "bool", 0, "false"},
		{"num0", "number", 3.5, ""},
		{"num3", "number", 3.5, ""},
		{"txt1", "string", 0, "v3"},
		{"txt4", "string", 0, "v3"},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("properties of one message\n got %v\nwant %v", got, want)
	}
	var payload, topic string
	if err := e.ch.Conn().QueryRow(context.Background(), "SELECT payload, topic FROM device_message WHERE message_id = ?", p+"-d1-m3").Scan(&payload, &topic); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(payload, `"txt1":"v3"`) || topic != fmt.Sprintf("/%s/%s-d1/properties/report", p, p) {
		t.Fatalf("stored payload %q topic %q", payload, topic)
	}
	testkit.Eventually(t, 10*time.Second, "acks", func() bool { return in.Stats().Acked == devices*perDevice })
	if s := in.Stats(); s.Stored != devices*perDevice || len(nonZero(s.Dropped)) != 0 {
		t.Fatalf("stats %+v", s)
	}
}

func nonZero(m map[string]uint64) map[string]uint64 {
	out := map[string]uint64{}
	for k, v := range m {
		if v != 0 {
			out[k] = v
		}
	}
	return out
}

func TestDropsCountedNeverStored(t *testing.T) {
	e := newEnv(t)
	p, other := randID("p"), randID("q")
	e.product(p)
	e.product(other)
	good, idle, foreign := p+"-good", p+"-idle", other+"-dev"
	e.device(good, p, "offline")
	e.device(idle, p, "notActive")
	e.device(foreign, other, "offline")
	in := e.startIngester(testOptions(p, other))
	dev := newPublisher(t, nil)

	report := `{"properties":{"t":1}}`
	dev.MustPublish(t, "/"+p+"/"+p+"-nobody/properties/report", 1, report)         // unknown device
	dev.MustPublish(t, "/"+p+"/"+foreign+"/properties/report", 1, report)          // product mismatch
	dev.MustPublish(t, "/"+p+"/"+idle+"/properties/report", 1, report)             // notActive
	dev.MustPublish(t, "/"+p+"/"+good+"/properties/report", 1, `{"properties":[}`) // malformed
	dev.MustPublish(t, "/"+p+"/"+good+"/event/e", 1, `{"data":`+strings.Repeat(" ", wire.MaxPayload)+`1}`)
	dev.MustPublish(t, "/"+p+"/"+good+"/properties/report", 1, report) // the one stored

	want := map[string]uint64{DropUnknownDevice: 1, DropProductMismatch: 1, DropNotActive: 1, DropMalformed: 1, DropOversize: 1}
	testkit.Eventually(t, 20*time.Second, "drops counted and the good message stored", func() bool {
		return fmt.Sprint(nonZero(in.Stats().Dropped)) == fmt.Sprint(want) && in.Stats().Stored == 1
	})

	if n := e.count("SELECT count() FROM device_message"); n != 1 {
		t.Fatalf("%d messages stored, want only the good one", n)
	}
	if n := e.count("SELECT count() FROM device_message WHERE device_id = ?", good); n != 1 {
		t.Fatalf("good message not stored")
	}
	if n := e.count("SELECT count() FROM device_property"); n != 1 {
		t.Fatalf("%d property rows, want 1", n)
	}
	testkit.Eventually(t, 5*time.Second, "every message acked", func() bool { return in.Stats().Acked == 6 })

	// The device cache is negative too, but expires: a device created after
	// a dropped message is accepted within the TTL.
	late := p + "-late"
	dev.MustPublish(t, "/"+p+"/"+late+"/properties/report", 1, report)
	testkit.Eventually(t, 10*time.Second, "late device dropped once", func() bool { return in.Stats().Dropped[DropUnknownDevice] == 2 })
	e.device(late, p, "offline")
	testkit.Eventually(t, 10*time.Second, "a message of a newly created device stored (the negative cache entry expired)", func() bool {
		if e.count("SELECT count() FROM device_message WHERE device_id = ?", late) > 0 {
			return true
		}
		dev.MustPublish(t, "/"+p+"/"+late+"/properties/report", 1, report)
		return false
	})
}

func TestPresenceBirthAndLastWill(t *testing.T) {
	e, p, d := newEnvOneDevice(t)
	seeded := p + "-seeded"
	e.device(seeded, p, "online")
	in := e.startIngester(testOptions(p))
	pres, err := link.NewPresence(ctxT(t, 20*time.Second), link.PresenceOptions{BrokerURL: brokerURL(), ProductIDs: []string{p}}, e.store)
	if err != nil {
		t.Fatal(err)
	}
	defer pres.Close()
	if !pres.IsOnline(seeded) || pres.IsOnline(d) {
		t.Fatalf("seeded view: %s online=%v, %s online=%v", seeded, pres.IsOnline(seeded), d, pres.IsOnline(d))
	}

	state := func() (s string, on, off bool) {
		var onT, offT *time.Time
		if err := e.store.DB().QueryRow(`SELECT state, online_time, offline_time FROM devices WHERE id = $1`, d).Scan(&s, &onT, &offT); err != nil {
			t.Fatal(err)
		}
		return s, onT != nil, offT != nil
	}
	dev := newPublisher(t, func(o *mqtt.ClientOptions) {
		o.SetWill("/"+p+"/"+d+"/offline", `{"reason":"will"}`, 1, false)
	})
	dev.MustPublish(t, "/"+p+"/"+d+"/online", 1, "")
	testkit.Eventually(t, 10*time.Second, "online in PostgreSQL and in Presence", func() bool {
		s, on, _ := state()
		return s == "online" && on && pres.IsOnline(d)
	})

	dev.Cut() // no DISCONNECT: the broker publishes the will
	testkit.Eventually(t, 15*time.Second, "offline through the last will", func() bool {
		s, _, off := state()
		return s == "offline" && off && !pres.IsOnline(d)
	})

	testkit.Eventually(t, 10*time.Second, "ONLINE and OFFLINE messages stored", func() bool {
		return e.count("SELECT count() FROM device_message WHERE device_id = ? AND message_type IN ('ONLINE','OFFLINE')", d) == 2
	})

	if s := in.Stats(); s.StateChanges != 2 {
		t.Fatalf("stats %+v", s)
	}
}

func TestCloseDrainsAndRedelivers(t *testing.T) {
	e, p, d := newEnvOneDevice(t)
	opt := testOptions(p)
	opt.Writer.FlushInterval = 300 * time.Millisecond // rows are pending when Close comes
	in := e.startIngester(opt)
	dev := newPublisher(t, nil)
	const n = 3000
	toks := make([]mqtt.Token, 0, n)
	for i := range n {
		toks = append(toks, dev.Publish("/"+p+"/"+d+"/properties/report", 1, false, fmt.Sprintf(`{"messageId":"m%d","properties":{"i":%d}}`, i, i)))
	}
	for _, tok := range toks {
		if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
			t.Fatalf("publish: %v", tok.Error())
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := in.Close(ctx); err != nil {
		t.Fatal(err)
	}
	s := in.Stats()
	stored := e.count("SELECT count() FROM device_message WHERE device_id = ?", d)
	t.Logf("at Close: received %d, acked %d, stored %d rows", s.Received, s.Acked, stored)
	if s.Acked != s.Stored || stored != s.Stored {
		t.Fatalf("every acked message must be stored: acked %d, stored counter %d, rows %d", s.Acked, s.Stored, stored)
	}
	// A new ingester with the same client ids gets what was not acked.
	in2 := e.startIngester(opt)
	testkit.Eventually(t, 30*time.Second, "every published message stored after restart", func() bool {
		return e.count("SELECT uniqExact(message_id) FROM device_message WHERE device_id = ?", d) == n
	})

	total := e.count("SELECT count() FROM device_message WHERE device_id = ?", d)
	t.Logf("published %d, stored %d rows (%d duplicates), second ingester received %d", n, total, total-n, in2.Stats().Received)
}

func TestRecordDownlink(t *testing.T) {
	e := newEnv(t)
	p := randID("p")
	in := e.startIngester(testOptions(p))
	err := in.RecordDownlink(context.Background(), tsdb.Message{ProductID: p, DeviceID: "d", MessageType: "READ_PROPERTY",
		MessageID: "down-1", Topic: "/" + p + "/d/properties/read", Payload: []byte(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 10*time.Second, "downlink stored", func() bool {
		return e.count("SELECT count() FROM device_message WHERE message_id = 'down-1' AND direction = 'down'") == 1
	})

}

// TestAcksInBrokerOrder reads a private broker's packet log: the ingester
// acknowledges QoS 1 messages in the order the broker sent them (MQTT
// 3.1.1, 4.6), although two writers store devices interleaved and each
// acknowledges a whole batch at once.
func TestAcksInBrokerOrder(t *testing.T) {
	broker := mqtttest.StartBroker(t, "log_type all")
	e := newEnv(t)
	p := randID("p")
	e.product(p)
	const devices, n = 16, 1500
	e.devices(p, devices)
	opt := testOptions(p)
	opt.BrokerURL = broker.URL()
	opt.Connections, opt.Workers, opt.Writers = 1, 4, 2
	in := e.startIngester(opt)

	pubOpts := mqtt.NewClientOptions().AddBroker(broker.URL()).SetClientID(randID("pub-"))
	mqtttest.Gateway(t, broker.URL())(pubOpts)
	pub := mqtt.NewClient(pubOpts)
	if err := mqttconn.WaitToken(pub.Connect(), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	defer pub.Disconnect(0)
	toks := make([]mqtt.Token, 0, n)
	for i := range n {
		topic := fmt.Sprintf("/%s/%s-d%d/properties/report", p, p, i%devices)
		toks = append(toks, pub.Publish(topic, 1, false, fmt.Sprintf(`{"messageId":"m%d","properties":{"i":%d}}`, i, i)))
	}
	for _, tok := range toks {
		if err := mqttconn.WaitToken(tok, 10*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	client := opt.ClientID + "-0"
	sent := regexp.MustCompile(`Sending PUBLISH to ` + regexp.QuoteMeta(client) + ` \(d0, q1, r0, m(\d+),`)
	acked := regexp.MustCompile(`Received PUBACK from ` + regexp.QuoteMeta(client) + ` \(Mid: (\d+),`)
	mids := func(re *regexp.Regexp, log string) []string {
		var out []string
		for _, m := range re.FindAllStringSubmatch(log, -1) {
			out = append(out, m[1])
		}
		return out
	}
	var log string
	testkit.Eventually(t, 30*time.Second, "every message stored and its PUBACK logged", func() bool {
		log = broker.Log()
		return in.Stats().Stored == n && len(mids(acked, log)) == n
	})

	want, got := mids(sent, log), mids(acked, log)
	if len(want) != n {
		t.Fatalf("broker sent %d publishes to %s, want %d", len(want), client, n)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("PUBACK %d is for message id %s; the broker sent id %s there (ids sent %v..., acked %v...)",
				i, got[i], want[i], want[max(0, i-3):min(n, i+5)], got[max(0, i-3):min(n, i+5)])
		}
	}
}

// A run with fewer connections than the one before takes over the
// sessions that run left in the share group: the share the broker queued
// for them is stored, and they get no new one.
func TestFewerConnectionsRetireSessions(t *testing.T) {
	e, p, d := newEnvOneDevice(t)
	opt := testOptions(p)
	opt.Connections = 3
	t.Cleanup(func() { purgeSessions(t, opt) }) // all three, after the ingesters
	in, err := New(ctxT(t, 30*time.Second), opt, e.ch, e.store, e.store)
	if err != nil {
		t.Fatal(err)
	}
	if err := in.Close(ctxT(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}

	dev := newPublisher(t, nil)
	sent := 0
	publish := func(n int) {
		for range n {
			dev.MustPublish(t, "/"+p+"/"+d+"/properties/report", 1, fmt.Sprintf(`{"messageId":"m%d","properties":{"i":%d}}`, sent, sent))
			sent++
		}
	}
	stored := func() uint64 {
		return e.count("SELECT uniqExact(message_id) FROM device_message WHERE device_id = ?", d)
	}
	// With no ingester running, the broker queues each session's share.
	publish(300)
	one := opt
	one.Connections = 1
	in2 := e.startIngester(one)
	testkit.Eventually(t, 30*time.Second, "the retired sessions' queued share stored", func() bool { return stored() == 300 })
	publish(100)
	testkit.Eventually(t, 30*time.Second, "new messages stored", func() bool { return stored() == 400 })
	if err := in2.Close(ctxT(t, 30*time.Second)); err != nil {
		t.Fatal(err)
	}

	// Down again: now only session 0 is in the share group, so it holds
	// everything and the retired ones nothing.
	publish(100)
	for n := 1; n < opt.Connections; n++ {
		var got atomic.Int64
		c := mqtt.NewClient(mqtttest.ServiceOptions(opt.BrokerURL, fmt.Sprintf("%s-%d", opt.ClientID, n)).
			SetCleanSession(false).SetAutoAckDisabled(true). // whatever arrives stays queued
			SetDefaultPublishHandler(func(mqtt.Client, mqtt.Message) { got.Add(1) }))
		if err := mqttconn.WaitToken(c.Connect(), 10*time.Second); err != nil {
			t.Fatal(err)
		}
		// The broker sends a session what it queued for it right after
		// the CONNACK, before anything published later: a sentinel the
		// session publishes to itself (on a downlink topic, outside the
		// uplink filters) comes back behind whatever was queued.
		sentinel := make(chan struct{}, 1)
		topic := fmt.Sprintf("/%s/sentinel-%d/properties/read", p, n)
		if err := mqttconn.WaitToken(c.Subscribe(topic, 1, func(_ mqtt.Client, m mqtt.Message) { m.Ack(); sentinel <- struct{}{} }), 10*time.Second); err != nil {
			t.Fatal(err)
		}
		if err := mqttconn.WaitToken(c.Publish(topic, 1, false, "sentinel"), 10*time.Second); err != nil {
			t.Fatal(err)
		}
		select {
		case <-sentinel:
		case <-time.After(10 * time.Second):
			if got.Load() == 0 {
				t.Fatalf("retired session %d: its sentinel did not come back", n)
			}
		}
		c.Disconnect(0)
		if g := got.Load(); g != 0 {
			t.Errorf("retired session %d still got %d messages", n, g)
		}
	}
	e.startIngester(one)
	testkit.Eventually(t, 30*time.Second, "session 0's queue stored", func() bool { return stored() == 500 })
}
