package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"devicehub/bench/testkit"
	"devicehub/ingest/mqttconn"
	"devicehub/ingest/mqtttest"
	"devicehub/tsdb/tsdbtest"
)

// TestForwardSigkill forwards reports published through MQTT to a real
// HTTP receiver, SIGKILLs devicehub mid-stream and starts it again on the
// same spool directory: every report arrives, first arrivals in order per
// device, and a repeat only of a message devicehub had not finished with:
// its line's (ruleId, seq) seen before (a batch sent and not recorded:
// at most a batch), or a new seq (a message spooled, the process killed
// before its acknowledgement reached the broker, which delivered it
// again flagged DUP: at most the restarted server's
// devicehub_forward_redelivered_total).
func TestForwardSigkill(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	type line struct {
		RuleID    string `json:"ruleId"`
		Seq       uint64 `json:"seq"`
		DeviceID  string `json:"deviceId"`
		MessageID string `json:"messageId"`
	}
	var lines []line
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		time.Sleep(5 * time.Millisecond) // a receiver that takes its time
		sc := bufio.NewScanner(bytes.NewReader(b))
		mu.Lock()
		defer mu.Unlock()
		for sc.Scan() {
			var l line
			if err := json.Unmarshal(sc.Bytes(), &l); err == nil {
				lines = append(lines, l)
			}
		}
	}))
	defer rcv.Close()
	received := func() []line { mu.Lock(); defer mu.Unlock(); return append([]line(nil), lines...) }

	broker := mqtttest.StartBroker(t)
	env, chDB, _ := testEnv(t, broker.URL(), "forward")
	env = append(env, "DEVICEHUB_FORWARD_DIR="+t.TempDir())
	bin := testkit.Devicehub(t)
	first := startServer(t, bin, env, "forward-1")
	tsdbtest.OpenDB(t, chDB, nil)
	token := login(t, first.base)
	first.deployDevice(t, token, "fp", "fd0")
	first.call(t, token, "POST", "/api/notify/forward", map[string]any{"id": "out", "name": "Out", "productId": "fp",
		"webhook": map[string]any{"url": rcv.URL, "batchSize": 50, "batchMs": 10}})

	pub := gateway(t, broker.URL(), testkit.RandID("fwd-gw-"))
	// The forwarder subscribes within a second of the rule.
	testkit.Eventually(t, 20*time.Second, "the forwarder's status", func() bool {
		var r struct {
			Status *struct{ Owner string } `json:"status"`
		}
		first.do(t, token, "GET", "/api/notify/forward/out", nil, &r)
		return r.Status != nil
	})
	devs := []string{"fd0", "fd1", "fd2", "fd3"}
	const per = 1000
	var second *server
	for i := range per {
		for _, d := range devs {
			tok := pub.Publish("/fp/"+d+"/properties/report", 1, false, fmt.Sprintf(`{"messageId":"%s-%d","properties":{"temp":%d}}`, d, i, i))
			if err := mqttconn.WaitToken(tok, 20*time.Second); err != nil {
				t.Fatal(err)
			}
		}
		if i == per/3 {
			testkit.Eventually(t, 20*time.Second, "deliveries under way", func() bool { return len(received()) > 0 })
			first.signal(syscall.SIGKILL)
			first.wait(10 * time.Second)
			t.Logf("killed after %d reports, %d lines received", (i+1)*len(devs), len(received()))
		}
		if i == per/2 { // some reports wait in the broker meanwhile
			second = startServer(t, bin, env, "forward-2")
			t.Cleanup(func() { second.signal(syscall.SIGTERM); second.wait(15 * time.Second) })
		}
	}
	testkit.Eventually(t, 60*time.Second, "every report", func() bool {
		seen := map[string]bool{}
		for _, l := range received() {
			seen[l.MessageID] = true
		}
		return len(seen) == per*len(devs)
	})
	next := map[string]int{}
	seen, seqs := map[string]bool{}, map[uint64]bool{}
	sameSeq, redelivered := 0, 0
	for _, l := range received() {
		if seen[l.MessageID] {
			if seqs[l.Seq] {
				sameSeq++ // a batch sent again: the cursor was not saved
			} else {
				redelivered++ // spooled, not acknowledged to the broker
			}
			continue
		}
		seen[l.MessageID], seqs[l.Seq] = true, true
		if want := fmt.Sprintf("%s-%d", l.DeviceID, next[l.DeviceID]); l.MessageID != want || !strings.HasPrefix(l.MessageID, l.DeviceID) {
			t.Fatalf("device %s: %s arrived where %s was due", l.DeviceID, l.MessageID, want)
		}
		next[l.DeviceID]++
	}
	dup := second.metricValue(t, "devicehub_forward_redelivered_total")
	t.Logf("%d reports, %d lines: %d repeats of a batch (same seq), %d of redelivered messages (new seq; the broker redelivered %.0f)",
		per*len(devs), len(received()), sameSeq, redelivered, dup)
	// A batch is at most 50 lines; the broker redelivers at most what one
	// flush (20 ms) had taken plus the forwarder's queue.
	if sameSeq > 50 {
		t.Fatalf("%d repeats with the same seq: more than a batch", sameSeq)
	}
	if float64(redelivered) > dup {
		t.Fatalf("%d repeats with a new seq, %.0f messages redelivered by the broker", redelivered, dup)
	}
}
