package ingest

import (
	"context"
	"fmt"
	"os"
	"syscall"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"devicehub/bench/testkit"
	"devicehub/ingest/mqttconn"
	"devicehub/ingest/mqtttest"
	"devicehub/tsdb/tsdbtest"
)

// Fault tests: the broker goes away under the ingester. They run a private Mosquitto (the settings of
// .ci/mosquitto.conf, on a free port and a temporary data directory) so
// that it can be stopped without touching the shared one.

// storedCounts returns, per message id, how many rows device_message holds.
func (e *env) storedCounts() (map[string]uint64, error) {
	return tsdbtest.StoredCounts(context.Background(), e.ch, "")
}

// TestFaultBrokerRestartDuringIngest stops Mosquitto (SIGTERM: it saves its
// sessions) while a device publishes at QoS 1 and starts it again on the
// same port: the ingester reconnects and resubscribes on its own within a
// second, and every message the broker acknowledged is stored at least
// once.
func TestFaultBrokerRestartDuringIngest(t *testing.T) {
	// The default: one plain persistent subscription, which the broker
	// keeps and queues for, so nothing acknowledged may be lost at all.
	t.Run("default", func(t *testing.T) { brokerRestartDuringIngest(t, "", true) })
	// A share group (several instances): Mosquitto 2.0 does not restore
	// it after a restart, so loss inside the restart window is logged as
	// the broker's limitation (REFERENCE.md "Broker settings").
	t.Run("shared", func(t *testing.T) { brokerRestartDuringIngest(t, "devicehub", false) })
}

func brokerRestartDuringIngest(t *testing.T, shareGroup string, mustKeepAll bool) {
	broker := mqtttest.StartBroker(t)
	e := newEnv(t)
	p := randID("p")
	e.product(p)
	const devices = 4
	e.devices(p, devices)
	iopt := testOptions(p)
	iopt.BrokerURL = broker.URL()
	iopt.ConnectTimeout = 3 * time.Second
	if shareGroup != "" {
		iopt.ShareGroup = shareGroup
	}
	in := e.startIngester(iopt)

	// The publisher keeps its session (and paho its unacknowledged
	// publishes) across the restart.
	pubOpts := mqtt.NewClientOptions().AddBroker(broker.URL()).SetClientID(randID("pub-"))
	mqtttest.Gateway(t, broker.URL())(pubOpts)
	pub := mqtt.NewClient(pubOpts.
		SetCleanSession(false).SetAutoReconnect(true).SetMaxReconnectInterval(time.Second).
		SetConnectTimeout(3 * time.Second).SetWriteTimeout(5 * time.Second))
	if err := mqttconn.WaitToken(pub.Connect(), 10*time.Second); err != nil {
		t.Fatalf("publisher connect: %v", err)
	}
	t.Cleanup(func() { pub.Disconnect(0) })

	dev := mqtttest.StartPublisher(t, pub, func(i int) string {
		return fmt.Sprintf("/%s/%s-d%d/properties/report", p, p, i%devices)
	})

	testkit.Eventually(t, 20*time.Second, "some traffic stored", func() bool { return in.Stats().Stored > 300 })
	// What the broker acknowledged before it stopped is in the ingester's
	// sessions, which SIGTERM saves.
	ackedBeforeStop := map[string]bool{}
	for _, m := range dev.Sent() {
		select {
		case <-m.Tok.Done():
			if m.Tok.Error() == nil {
				ackedBeforeStop[m.ID] = true
			}
		default:
		}
	}
	atStop := dev.Published()
	broker.Stop(syscall.SIGTERM)
	time.Sleep(1500 * time.Millisecond) // the outage itself; the device keeps publishing
	atRestart := dev.Published()
	broker.Start()
	restartedAt := time.Now()

	// The ingester resubscribes on its own. A probe message of an unknown
	// device, dropped (and so counted) by the ingester, shows when its
	// shared subscription is back: everything published after that must
	// arrive.
	probeOpts := mqtt.NewClientOptions().AddBroker(broker.URL()).SetClientID(randID("probe-"))
	mqtttest.Gateway(t, broker.URL())(probeOpts)
	probe := mqtt.NewClient(probeOpts)
	if err := mqttconn.WaitToken(probe.Connect(), 5*time.Second); err != nil {
		t.Fatalf("probe connect: %v", err)
	}
	defer probe.Disconnect(0)
	testkit.Eventually(t, 20*time.Second, "the ingester subscribed again after the restart", func() bool {
		if in.Stats().Dropped[DropUnknownDevice] > 0 {
			return true
		}
		_ = mqttconn.WaitToken(probe.Publish("/"+p+"/"+p+"-probe/properties/report", 1, false, `{"messageId":"probe","properties":{}}`), time.Second)
		return false // the next poll sees whether it was taken
	})

	resubscribedIn := time.Since(restartedAt)
	if resubscribedIn > time.Second {
		t.Errorf("the ingester took %s to subscribe again after the broker was back", resubscribedIn.Round(time.Millisecond))
	}
	windowEnd := dev.Published()
	testkit.Eventually(t, 30*time.Second, "500 more messages published", func() bool { return dev.Published() >= windowEnd+500 })
	dev.Stop()

	// Which publishes did the broker acknowledge?
	all := dev.Sent()
	ackedAt, failed, pending := mqtttest.WaitAcks(all, 20*time.Second)
	var acked []string
	var ackedAfter int
	strict := map[string]bool{} // acknowledged before the stop or published after the resubscription
	for _, i := range ackedAt {
		id := all[i].ID
		acked = append(acked, id)
		if ackedBeforeStop[id] || int64(i) >= windowEnd {
			strict[id] = true
		}
		if int64(i) >= windowEnd {
			ackedAfter++
		}
	}
	if ackedAfter == 0 {
		t.Fatal("no message published after the ingester subscribed again was acknowledged")
	}

	var got map[string]uint64
	var missing, lostInWindow []string
	waitDeadline := time.Now().Add(20 * time.Second)
	for {
		var err error
		got, err = e.storedCounts()
		missing, lostInWindow = missing[:0], lostInWindow[:0]
		if err == nil {
			for _, id := range acked {
				switch {
				case got[id] > 0:
				case strict[id]:
					missing = append(missing, id)
				default:
					lostInWindow = append(lostInWindow, id)
				}
			}
		}
		if err == nil && len(missing)+len(lostInWindow) == 0 || time.Now().After(waitDeadline) {
			break
		}
		if err == nil && len(missing) == 0 {
			// Only window messages are absent: give stragglers a moment,
			// then count them as lost (a known broker limitation, logged,
			// unless the test must keep all, when their absence fails it).
			if grace := time.Now().Add(3 * time.Second); grace.Before(waitDeadline) {
				waitDeadline = grace
			}
		}
		time.Sleep(100 * time.Millisecond) // polling
	}
	rows, dups, dupIDs := tsdbtest.Duplicates(got)
	s := in.Stats()
	t.Logf("broker stopped (SIGTERM) after m%d, restarted after m%d, ingester subscribed again %s after the restart, at m%d",
		atStop, atRestart, resubscribedIn.Round(time.Millisecond), windowEnd)
	t.Logf("published %d, acknowledged by the broker %d (failed %d, no answer %d), stored %d distinct in %d rows: %d duplicates (%s); ingester received %d, acked %d",
		len(all), len(acked), failed, pending, len(got), rows, dups, mqtttest.IDRanges(dupIDs), s.Received, s.Acked)
	if len(lostInWindow) > 0 {
		// Mosquitto (2.0.11 here) saves sessions and their queued messages
		// but not shared subscriptions: after its restart, what devices
		// publish before the ingester has subscribed again matches no
		// subscriber and is dropped, though acknowledged to the device.
		msg := fmt.Sprintf("%d acknowledged messages published between the broker restart and the ingester's resubscription were lost (the broker did not restore the shared subscription): %s",
			len(lostInWindow), mqtttest.IDRanges(lostInWindow))
		if mustKeepAll || os.Getenv("DEVICEHUB_TEST_BROKER_KEEPS_SHARED_SUBS") != "" {
			t.Error(msg)
		} else {
			t.Log("KNOWN BROKER LIMITATION: " + msg)
		}
	}
	if len(missing) > 0 {
		t.Fatalf("%d messages acknowledged before the stop or published after the resubscription not stored: %s", len(missing), mqtttest.IDRanges(missing))
	}
}
