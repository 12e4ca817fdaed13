package ingest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"devicehub/bench/sim"
	"devicehub/ingest/mqtttest"
	"devicehub/schema"
	"devicehub/tsdb/tsdbtest"
)

// Fault tests: the broker goes away under the ingester and under pending
// commands. They run a private Mosquitto (the settings of
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
	// the broker's limitation (README "Broker settings").
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
	if err := waitToken(pub.Connect(), 10*time.Second); err != nil {
		t.Fatalf("publisher connect: %v", err)
	}
	t.Cleanup(func() { pub.Disconnect(0) })

	dev := mqtttest.StartPublisher(t, pub, func(i int) string {
		return fmt.Sprintf("/%s/%s-d%d/properties/report", p, p, i%devices)
	})

	eventually(t, 20*time.Second, "some traffic stored", func() bool { return in.Stats().Stored > 300 })
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
	if err := waitToken(probe.Connect(), 5*time.Second); err != nil {
		t.Fatalf("probe connect: %v", err)
	}
	defer probe.Disconnect(0)
	eventually(t, 20*time.Second, "the ingester subscribed again after the restart", func() bool {
		if in.Stats().Dropped[DropUnknownDevice] > 0 {
			return true
		}
		_ = waitToken(probe.Publish("/"+p+"/"+p+"-probe/properties/report", 1, false, `{"messageId":"probe","properties":{}}`), time.Second)
		time.Sleep(50 * time.Millisecond)
		return in.Stats().Dropped[DropUnknownDevice] > 0
	})
	resubscribedIn := time.Since(restartedAt)
	if resubscribedIn > time.Second {
		t.Errorf("the ingester took %s to subscribe again after the broker was back", resubscribedIn.Round(time.Millisecond))
	}
	windowEnd := dev.Published()
	eventually(t, 30*time.Second, "500 more messages published", func() bool { return dev.Published() >= windowEnd+500 })
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
			// then count them as lost.
			if grace := time.Now().Add(3 * time.Second); grace.Before(waitDeadline) {
				waitDeadline = grace
			}
		}
		time.Sleep(100 * time.Millisecond)
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

// startFleet starts simulated devices of product on the broker at url.
func startFleet(t *testing.T, url, product string, ids []string, opts sim.Options) *sim.Fleet {
	t.Helper()
	m, err := schema.ParseThingModelString(cmdModel)
	if err != nil {
		t.Fatal(err)
	}
	opts.BrokerURL, opts.ProductID, opts.DeviceIDs, opts.Model = url, product, ids, m
	gw := mqtttest.Gateway(t, url)
	opts.Login = func(_ string, o *mqtt.ClientOptions) { gw(o) }
	opts.ValueFunc = func(dev, prop string, vt *schema.ValueType) (any, bool) {
		if vt.Type == "float" {
			return 21.5, true
		}
		return dev + ":" + prop, true
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	f, err := sim.Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	return f
}

// TestFaultBrokerRestartDuringReads kills Mosquitto while property reads
// wait for silent devices: every read fails at once (client_offline or
// time_out), long before its timeout; reads asked while the broker is down
// end within their timeout; after the restart the platform's client is
// connected again and a read of a reconnected device succeeds.
func TestFaultBrokerRestartDuringReads(t *testing.T) {
	broker := mqtttest.StartBroker(t)
	product := randID("fp")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	popt := DefaultPresenceOptions()
	popt.BrokerURL = broker.URL()
	popt.ClientID = randID("fault-presence-")
	popt.ProductIDs = []string{product}
	popt.ConnectTimeout = 3 * time.Second
	presence, err := NewPresence(ctx, popt, staticLister(nil))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(presence.Close)
	const cmdTimeout = 3 * time.Second // default: the invoke's bound
	copt := DefaultCommandOptions()    // the downlink QoS the server uses
	copt.Timeout = cmdTimeout
	cmds, err := NewCommands(presence, nil, copt)
	if err != nil {
		t.Fatal(err)
	}
	target := func(id string) Target {
		return Target{DeviceID: id, DeviceName: id, ProductID: product, ProductName: "P", CreatorID: "admin"}
	}

	silent := []string{"s1", "s2", "s3", "s4", "s5"}
	startFleet(t, broker.URL(), product, silent, sim.Options{Silent: true})
	startFleet(t, broker.URL(), product, []string{"n1"}, sim.Options{})
	for _, id := range append(silent, "n1") {
		waitFor(t, 5*time.Second, func() bool { return presence.IsOnline(id) }, id+" online")
	}
	if _, err := cmds.ReadProperties(context.Background(), target("n1"), []string{"temp"}, 5*time.Second); err != nil {
		t.Fatalf("read before the outage: %v", err)
	}

	// Reads pending on silent devices, with a long timeout.
	const readTimeout = 30 * time.Second
	type outcome struct {
		err error
		d   time.Duration
	}
	const reads = 2 * 5
	results := make(chan outcome, reads)
	for i := range reads {
		go func() {
			start := time.Now()
			_, err := cmds.ReadProperties(context.Background(), target(silent[i%len(silent)]), nil, readTimeout)
			results <- outcome{err, time.Since(start)}
		}()
	}
	waitFor(t, 5*time.Second, func() bool { return cmds.Pending() == reads }, "the reads to be pending")

	broker.Stop(syscall.SIGKILL)
	killedAt := time.Now()
	var offline, timedOut int
	var slowest time.Duration
	for range reads {
		select {
		case r := <-results:
			switch {
			case errors.Is(r.err, ErrOffline):
				offline++
			case errors.Is(r.err, ErrTimeout):
				timedOut++
			default:
				t.Errorf("pending read ended with %v, want client_offline or time_out", r.err)
			}
			slowest = max(slowest, r.d)
		case <-time.After(readTimeout / 3):
			t.Fatalf("a pending read still waits %s after the broker died (timeout %s)", time.Since(killedAt), readTimeout)
		}
	}
	failedIn := time.Since(killedAt)
	if cmds.Pending() != 0 {
		t.Fatalf("%d waiters left after the broker died", cmds.Pending())
	}

	// A read or invoke asked while the broker is down (the client waiting
	// to reconnect) ends within its timeout, though the view still shows
	// the device online.
	waitFor(t, 5*time.Second, func() bool { return !presence.Connected() }, "presence to notice the loss")
	time.Sleep(200 * time.Millisecond) // pacing: into the reconnect backoff
	const downTimeout = 2 * time.Second
	downDone := make(chan outcome, 2)
	go func() {
		start := time.Now()
		_, err := cmds.ReadProperties(context.Background(), target("n1"), nil, downTimeout)
		downDone <- outcome{err, time.Since(start)}
	}()
	go func() {
		start := time.Now()
		_, err := cmds.InvokeFunction(context.Background(), target("n1"), "f", nil)
		downDone <- outcome{err, time.Since(start)}
	}()
	var down [2]outcome
	for i := range down {
		select {
		case down[i] = <-downDone:
		case <-time.After(cmdTimeout + 3*time.Second):
			// Let them finish once the broker is back, so no goroutine leaks.
			broker.Start()
			for range len(down) - i {
				<-downDone
			}
			t.Fatalf("a command asked while the broker was down did not end within its timeout")
		}
		if !errors.Is(down[i].err, ErrOffline) && !errors.Is(down[i].err, ErrTimeout) {
			t.Errorf("command while the broker was down: %v, want client_offline or time_out", down[i].err)
		}
	}

	broker.Start()
	restartedAt := time.Now()
	waitFor(t, 20*time.Second, presence.Connected, "presence reconnected")
	reconnectedIn := time.Since(restartedAt)

	// The presence subscriptions are renewed asynchronously after the
	// reconnect: a probe's birth message shows when they are active.
	probeOpts := mqtt.NewClientOptions().AddBroker(broker.URL()).SetClientID(randID("probe-"))
	mqtttest.Gateway(t, broker.URL())(probeOpts)
	probe := mqtt.NewClient(probeOpts)
	if err := waitToken(probe.Connect(), 5*time.Second); err != nil {
		t.Fatalf("probe connect: %v", err)
	}
	defer probe.Disconnect(0)
	waitFor(t, 15*time.Second, func() bool {
		if presence.IsOnline("probe") {
			return true
		}
		_ = waitToken(probe.Publish("/"+product+"/probe/online", 1, false, "{}"), time.Second)
		time.Sleep(100 * time.Millisecond)
		return presence.IsOnline("probe")
	}, "presence resubscribed")
	// The silent devices died with the broker; the reseeded view forgets them.
	waitFor(t, 5*time.Second, func() bool { return !presence.IsOnline("s1") }, "s1 offline after the reseed")

	// The device reconnects; a read succeeds.
	startFleet(t, broker.URL(), product, []string{"n1"}, sim.Options{})
	waitFor(t, 5*time.Second, func() bool { return presence.IsOnline("n1") }, "n1 online again")
	got, err := cmds.ReadProperties(context.Background(), target("n1"), []string{"temp"}, 5*time.Second)
	if err != nil {
		t.Fatalf("read after the restart: %v", err)
	}
	if got["temp"] != 21.5 {
		t.Fatalf("read after the restart: %v", got)
	}
	t.Logf("pending reads %d: %d client_offline, %d time_out, all ended %s after the kill (slowest %s, timeout %s); commands while down: %v after %s, %v after %s (read timeout %s, default %s); presence reconnected %s after the restart",
		reads, offline, timedOut, failedIn.Round(time.Millisecond), slowest.Round(time.Millisecond), readTimeout,
		down[0].err, down[0].d.Round(time.Millisecond), down[1].err, down[1].d.Round(time.Millisecond), downTimeout, cmdTimeout, reconnectedIn.Round(time.Millisecond))
}
