package link

import (
	"context"
	"errors"
	"syscall"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"devicehub/bench/sim"
	"devicehub/bench/testkit"
	"devicehub/ingest/mqttconn"
	"devicehub/ingest/mqtttest"
	"devicehub/schema"
)

// Fault tests: the broker goes away under pending commands. They run a
// private Mosquitto (the settings of .ci/mosquitto.conf, on a free port
// and a temporary data directory) so that it can be stopped without
// touching the shared one.

// startFleet starts simulated devices of product on the broker at url.
func startFleet(t *testing.T, url, product string, ids []string, opts sim.Options) *sim.Fleet {
	t.Helper()
	m, err := schema.ParseThingModelString(cmdModel)
	if err != nil {
		t.Fatal(err)
	}
	opts.BrokerURL, opts.ProductID, opts.DeviceIDs, opts.Model = url, product, ids, m
	opts.ValueFunc = func(dev, prop string, vt *schema.ValueType) (any, bool) {
		if vt.Type == "float" {
			return 21.5, true
		}
		return dev + ":" + prop, true
	}
	f := mqtttest.StartFleet(t, opts)
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
		testkit.Eventually(t, 5*time.Second, id+" online", func() bool { return presence.IsOnline(id) })
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
	testkit.Eventually(t, 5*time.Second, "the reads to be pending", func() bool { return cmds.Pending() == reads })

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
	testkit.Eventually(t, 5*time.Second, "presence to notice the loss", func() bool { return !presence.Connected() })
	// Pacing, not an assertion: the commands below are asked once the
	// client is in its reconnect backoff rather than still noticing the loss.
	time.Sleep(200 * time.Millisecond)
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
	testkit.Eventually(t, 20*time.Second, "presence reconnected", presence.Connected)
	reconnectedIn := time.Since(restartedAt)

	// The presence subscriptions are renewed asynchronously after the
	// reconnect: a probe's birth message shows when they are active.
	probeOpts := mqtt.NewClientOptions().AddBroker(broker.URL()).SetClientID(randID("probe-"))
	mqtttest.Gateway(t, broker.URL())(probeOpts)
	probe := mqtt.NewClient(probeOpts)
	if err := mqttconn.WaitToken(probe.Connect(), 5*time.Second); err != nil {
		t.Fatalf("probe connect: %v", err)
	}
	defer probe.Disconnect(0)
	testkit.Eventually(t, 15*time.Second,

		"presence resubscribed", func() bool {
			if presence.IsOnline("probe") {
				return true
			}
			_ = mqttconn.WaitToken(probe.Publish("/"+product+"/probe/online", 1, false, "{}"), time.Second)
			return false // the next poll sees whether it was taken
		})

	// The silent devices died with the broker; the reseeded view forgets them.
	testkit.Eventually(t, 5*time.Second, "s1 offline after the reseed", func() bool { return !presence.IsOnline("s1") })

	// The device reconnects; a read succeeds.
	startFleet(t, broker.URL(), product, []string{"n1"}, sim.Options{})
	testkit.Eventually(t, 5*time.Second, "n1 online again", func() bool { return presence.IsOnline("n1") })
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
