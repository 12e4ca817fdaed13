package main

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"devicehub/bench/testkit"
	"devicehub/ingest/mqttconn"
	"devicehub/ingest/mqtttest"
	"devicehub/tsdb/tsdbtest"
)

const alarmTestModel = `{"properties":[{"id":"temp","name":"Temperature","valueType":{"type":"float"}}],"events":[],"functions":[],"tags":[]}`

// metricValue reads one sample of the server's /metrics ("" labels: the
// unlabelled one), 0 if absent.
func (s *server) metricValue(t *testing.T, sample string) float64 {
	t.Helper()
	resp, err := http.Get(s.base + "/metrics")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, sample+" "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	return 0
}

type alarmRecord struct {
	ID       string `json:"id"`
	DeviceID string `json:"deviceId"`
	State    string `json:"state"`
	Count    int    `json:"count"`
}

func (s *server) alarmRecords(t *testing.T, token string) ([]alarmRecord, error) {
	t.Helper()
	var page struct {
		Total int           `json:"total"`
		Data  []alarmRecord `json:"data"`
	}
	r, err := s.api(token).Request("POST", "/api/alarm/record/_query", map[string]any{"pageSize": 1000})
	if err != nil {
		return nil, err
	}
	if err := r.Decode(&page); err != nil {
		return nil, err
	}
	return page.Data, nil
}

// restartBroker restarts broker (SIGTERM, then a start on its kept
// state) and returns a new publisher in place of pub. Not pub
// reconnected: paho's resume sends a reconnected client's publishes in
// flight again, which the broker delivers twice (the device's own
// duplicate, which a report without a messageId cannot be told from), and
// it races with the client's writer on them.
func restartBroker(t *testing.T, broker *mqtttest.Broker, pub mqtt.Client, clientID string) mqtt.Client {
	t.Helper()
	pub.Disconnect(250)
	broker.Stop(syscall.SIGTERM)
	broker.Start()
	return gateway(t, broker.URL(), clientID)
}

// roundTemp is the temperature the devices report in round: above the
// rules' 30 (counted), but in every fourth round.
func roundTemp(round int) (v float64, counted bool) {
	if round%4 == 3 {
		return 10, false
	}
	return 31, true
}

// probeRaised publishes a crossing report of product's device "probe"
// until the server holds its alarm, the only one: the rule is evaluated
// from then on.
func (s *server) probeRaised(t *testing.T, pub mqtt.Client, product, token string) {
	t.Helper()
	n := 0
	testkit.Eventually(t, 30*time.Second, "the probe's alarm", func() bool {
		n++
		_ = mqttconn.WaitToken(pub.Publish("/"+product+"/probe/properties/report", 1, false,
			fmt.Sprintf(`{"messageId":"p%d","properties":{"temp":99}}`, n)), 5*time.Second)
		recs, _ := s.alarmRecords(t, token)
		return len(recs) == 1
	})
}

// exactAlarms waits up to a minute until the server holds an alarm for
// each of devices counting above reports (the probe's aside), then fails
// the test for a device with none, two, or another count or state.
func (s *server) exactAlarms(t *testing.T, token string, devices, above int, after string) []alarmRecord {
	t.Helper()
	var recs []alarmRecord
	ok := testkit.Within(60*time.Second, func() bool {
		var err error
		recs, err = s.alarmRecords(t, token)
		if err != nil || len(recs) < devices+1 {
			return false
		}
		for _, r := range recs {
			if r.DeviceID != "probe" && r.Count < above {
				return false
			}
		}
		return true
	})
	counts := map[string]int{}
	for _, r := range recs {
		if r.DeviceID == "probe" {
			continue
		}
		counts[r.DeviceID]++
		if r.Count != above || r.State != "active" {
			t.Errorf("%s: count %d (%s), want %d", r.DeviceID, r.Count, r.State, above)
		}
	}
	t.Logf("%d devices' alarms, each counting %d reports above the threshold, after %s", len(counts), above, after)
	if !ok || len(counts) != devices {
		t.Errorf("%d devices with alarms, want %d (settled: %v)", len(counts), devices, ok)
	}
	for d, n := range counts {
		if n != 1 {
			t.Errorf("%s has %d alarms", d, n)
		}
	}
	return recs
}

// TestAlarmsSIGKILL: two devicehub processes share ingest and the alarm
// evaluation; 100 devices cross a threshold in rounds while the
// evaluating process is SIGKILLed and then the broker restarts. Every
// device ends with exactly one alarm whose count is its number of reports
// above the threshold: none lost, none doubled. The alarm transitions,
// and an acknowledgement by hand, reach /api/live on the other instance.
func TestAlarmsSIGKILL(t *testing.T) {
	t.Parallel()
	broker := mqtttest.StartBroker(t)
	bin := testkit.Devicehub(t)
	env, chDB, suffix := testEnv(t, broker.URL(), "alarms")
	group := "alarms-test-" + suffix
	envA := append(append([]string(nil), env...), "DEVICEHUB_MQTT_SHARE_GROUP="+group, "DEVICEHUB_MQTT_CLIENT_ID=a-"+suffix, "DEVICEHUB_LOG_LEVEL=warn")
	envB := append(append([]string(nil), env...), "DEVICEHUB_MQTT_SHARE_GROUP="+group, "DEVICEHUB_MQTT_CLIENT_ID=b-"+suffix, "DEVICEHUB_LOG_LEVEL=warn")
	a := startServer(t, bin, envA, "a")
	tsdbtest.OpenDB(t, chDB, nil)
	b := startServer(t, bin, envB, "b")
	t.Cleanup(func() {
		for _, s := range []*server{a, b} {
			s.signal(syscall.SIGTERM)
			s.wait(15 * time.Second)
		}
	})
	token := login(t, a.base)
	product := "meter" + suffix[:6]
	a.call(t, token, "POST", "/api/device/product", map[string]any{"id": product, "name": "Meter", "classifiedId": "test",
		"modelFrom": "custom", "accessId": "mqtt", "deviceType": "device", "metadata": alarmTestModel})
	for _, id := range []string{"dev000", "probe"} {
		a.call(t, token, "POST", "/api/device/instance", map[string]any{"id": id, "name": id, "productId": product})
	}
	a.call(t, token, "POST", "/api/alarm/config", map[string]any{"id": "hot-" + suffix, "name": "Hot", "productId": product, "severity": "major",
		"enabled": true, "trigger": map[string]any{"type": "property", "all": []any{map[string]any{"property": "temp", "op": "gt", "value": 30}}},
		"clear": map[string]any{"type": "manual"}})
	// The owner: whichever process took the alarm lock; it subscribes
	// within a rules poll of the rule's creation.
	var owner, other *server
	testkit.Eventually(t, 30*time.Second, "an alarm owner", func() bool {
		switch {
		case a.metricValue(t, "devicehub_alarm_owner") == 1:
			owner, other = a, b
		case b.metricValue(t, "devicehub_alarm_owner") == 1:
			owner, other = b, a
		}
		return owner != nil
	})
	// A live stream on the other instance follows the probe and dev000.
	events := make(chan string, 64)
	req, _ := http.NewRequest("GET", other.base+"/api/live?deviceId=probe&deviceId=dev000&token="+token, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("live: %d %s", resp.StatusCode, b)
	}
	defer resp.Body.Close()
	go func() {
		sc := bufio.NewScanner(resp.Body)
		var ev string
		for sc.Scan() {
			l := sc.Text()
			if v, ok := strings.CutPrefix(l, "event: "); ok {
				ev = v
			}
			if v, ok := strings.CutPrefix(l, "data: "); ok && ev == "alarm" {
				events <- v
			}
		}
	}()

	pub := gateway(t, broker.URL(), "gw-"+suffix)
	// The rule is evaluated once its subscription is in place: a probe
	// device's crossing raises its alarm.
	owner.probeRaised(t, pub, product, token)
	// The owner's raise reaches /api/live on the other instance. Live
	// events are a view, announced after the commit: the raise of an
	// alarm the owner commits just before its SIGKILL below may never be
	// announced (the records are the truth, checked below), so the raise
	// is checked here, with the owner alive.
	select {
	case e := <-events:
		var ev struct {
			DeviceID, Kind, Severity string
		}
		if json.Unmarshal([]byte(e), &ev) != nil || ev.DeviceID != "probe" || ev.Kind != "raised" || ev.Severity != "major" {
			t.Errorf("live alarm event %s", e)
		}
	case <-time.After(10 * time.Second):
		t.Error("no alarm event on /api/live")
	}

	const devices, rounds = 100, 10
	start := time.Now().Add(-time.Hour)
	above := 0
	for round := range rounds {
		v, counted := roundTemp(round)
		if counted {
			above++
		}
		var toks []mqtt.Token
		for d := range devices {
			toks = append(toks, pub.Publish(fmt.Sprintf("/%s/dev%03d/properties/report", product, d), 1, false,
				fmt.Sprintf(`{"messageId":"m%d","timestamp":%d,"properties":{"temp":%v}}`, round, start.Add(time.Duration(round)*time.Second).UnixMilli(), v)))
		}
		for _, tok := range toks {
			if err := mqttconn.WaitToken(tok, 30*time.Second); err != nil {
				t.Fatal(err)
			}
		}
		switch round {
		case 3: // SIGKILL the evaluating process mid-stream
			_ = syscall.Kill(-owner.cmd.Process.Pid, syscall.SIGKILL)
			<-owner.exited
			testkit.Eventually(t, 30*time.Second, "the other instance to take over", func() bool {
				return other.metricValue(t, "devicehub_alarm_owner") == 1
			})
		case 6: // the broker restarts
			pub = restartBroker(t, broker, pub, "gw-"+suffix)
		}
	}
	recs := other.exactAlarms(t, token, devices, above, "a SIGKILL of the evaluating process and a broker restart")
	// Prometheus: evaluations counted, the active alarms by severity.
	if other.metricValue(t, "devicehub_alarm_evaluations_total") < devices {
		t.Errorf("evaluations: %v", other.metricValue(t, "devicehub_alarm_evaluations_total"))
	}
	testkit.Eventually(t, 10*time.Second, "the active alarms gauge", func() bool {
		return other.metricValue(t, `devicehub_alarms_active{severity="major"}`) == devices+1
	})
	if other.metricValue(t, "devicehub_alarm_evaluation_lag_seconds_count") == 0 {
		t.Error("no evaluation lag observed")
	}
	// A hand's acknowledgement is announced too (api's AlarmHandled, over
	// the PostgreSQL relay), by the instance that took it. dev000's raise
	// comes before it, unless its announcement died with the owner.
	for _, r := range recs {
		if r.DeviceID == "dev000" {
			other.call(t, token, "POST", "/api/alarm/record/"+r.ID+"/_ack", map[string]any{"comment": "seen"})
		}
	}
	raises := 0
	for acked := false; !acked; {
		select {
		case e := <-events:
			var ev struct {
				DeviceID, Kind, Value string
			}
			switch {
			case json.Unmarshal([]byte(e), &ev) != nil || ev.DeviceID != "dev000":
				t.Errorf("live alarm event after the ack: %s", e)
			case ev.Kind == "raised" && raises == 0:
				raises++
			case ev.Kind == "acknowledged" && ev.Value == "seen":
				acked = true
			default:
				t.Errorf("live alarm event after the ack: %s", e)
			}
		case <-time.After(10 * time.Second):
			t.Error("no acknowledged event on /api/live")
			acked = true
		}
	}
	// The instance that announced the ack handed it to its own hub at
	// once (else it never arrives: its listener skips the same event
	// coming back over PostgreSQL, eventRelay); a second one, if the
	// listener did not skip it, would arrive within milliseconds.
	select {
	case e := <-events:
		t.Errorf("live alarm event after the ack, announced twice? %s", e)
	case <-time.After(time.Second):
	}
	if t.Failed() {
		b, _ := os.ReadFile(other.logf)
		t.Logf("survivor's log:\n%s", b)
	}
}

// TestAlarmsFeedSIGKILL: a devicehub process with a share group (the
// evaluator on its own session) is SIGKILLed mid-stream and replaced by
// one without (the evaluator on ingest's session, alarm.Feed), which
// reads what the killed one's session holds and then ends it; that one
// is SIGKILLed in turn and replaced, and then the broker restarts. Half
// the devices send no messageId (their reports are known by a hash of
// topic and payload). Before each SIGKILL the test holds the evaluator's
// writes (a lock on alarm_owner) while ingest stores a round, so that the
// round is only in the killed process's alarm session (the first) or
// only in ingest's session, unacknowledged (the second). Every device
// ends with exactly one alarm whose count is its number of reports above
// the threshold: none lost, none doubled. It fails when the new process
// does not read the left session (round 3 lost), when ingest acknowledges
// without waiting for the evaluator (round 6 lost), and, most runs, when
// what ingest hands the feed before it passed the left session's markers
// is not read as a possible redelivery (a round counted twice).
func TestAlarmsFeedSIGKILL(t *testing.T) {
	t.Parallel()
	broker := mqtttest.StartBroker(t)
	bin := testkit.Devicehub(t)
	env, chDB, suffix := testEnv(t, broker.URL(), "alarmfeed")
	shared := append(append([]string(nil), env...), "DEVICEHUB_MQTT_SHARE_GROUP=feed-"+suffix, "DEVICEHUB_LOG_LEVEL=warn")
	plain := append(append([]string(nil), env...), "DEVICEHUB_MQTT_SHARE_GROUP=none", "DEVICEHUB_LOG_LEVEL=info")
	srv := startServer(t, bin, shared, "shared")
	ch := tsdbtest.OpenDB(t, chDB, nil)
	pg, err := sql.Open("postgres", envValue(env, "DEVICEHUB_POSTGRES_DSN"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Close() })
	t.Cleanup(func() {
		srv.signal(syscall.SIGTERM)
		srv.wait(15 * time.Second)
		if t.Failed() {
			b, _ := os.ReadFile(srv.logf)
			t.Logf("last process's log:\n%s", b)
		}
	})
	token := login(t, srv.base)
	product := "meter" + suffix[:6]
	srv.call(t, token, "POST", "/api/device/product", map[string]any{"id": product, "name": "Meter", "classifiedId": "test",
		"modelFrom": "custom", "accessId": "mqtt", "deviceType": "device", "metadata": alarmTestModel})
	const devices, rounds = 40, 10
	for d := range devices {
		id := fmt.Sprintf("dev%03d", d)
		srv.call(t, token, "POST", "/api/device/instance", map[string]any{"id": id, "name": id, "productId": product})
	}
	srv.call(t, token, "POST", "/api/device/instance", map[string]any{"id": "probe", "name": "probe", "productId": product})
	// Deployed: ingest stores (and hands the evaluator) only the messages
	// of active devices.
	srv.call(t, token, "POST", "/api/device-product/"+product+"/deploy", nil)
	for d := range devices {
		srv.call(t, token, "POST", fmt.Sprintf("/api/device/instance/dev%03d/deploy", d), nil)
	}
	srv.call(t, token, "POST", "/api/device/instance/probe/deploy", nil)
	srv.call(t, token, "POST", "/api/alarm/config", map[string]any{"id": "hot-" + suffix, "name": "Hot", "productId": product, "severity": "major",
		"enabled": true, "trigger": map[string]any{"type": "property", "all": []any{map[string]any{"property": "temp", "op": "gt", "value": 30}}},
		"clear": map[string]any{"type": "manual"}})
	pub := gateway(t, broker.URL(), "gw-"+suffix)
	srv.probeRaised(t, pub, product, token)
	restart := func(env []string, name string) {
		if srv.cmd.ProcessState == nil {
			_ = syscall.Kill(-srv.cmd.Process.Pid, syscall.SIGKILL)
			<-srv.exited
		}
		srv = startServer(t, bin, env, name)
		testkit.Eventually(t, 30*time.Second, "the new process to evaluate", func() bool {
			return srv.metricValue(t, "devicehub_alarm_owner") == 1
		})
	}
	start := time.Now().Add(-time.Hour)
	above := 0
	for round := range rounds {
		v, counted := roundTemp(round)
		if counted {
			above++
		}
		var hold *sql.Tx
		if round == 6 {
			// The process ended the session the first one left, once it
			// committed what it read of it: ingest's session alone holds
			// what comes next.
			testkit.Eventually(t, 30*time.Second, "the left session to end", func() bool {
				b, _ := os.ReadFile(srv.logf)
				return strings.Contains(string(b), "alarms: the left session is ended")
			})
		}
		if round == 3 || round == 6 {
			// The evaluator's writes wait while ingest stores the round:
			// in round 3 only the killed process's own session keeps it
			// for the next process to evaluate; in round 6 only ingest's
			// session, whose acknowledgements wait for the evaluator.
			if hold, err = pg.Begin(); err != nil {
				t.Fatal(err)
			}
			if _, err := hold.Exec("LOCK TABLE alarm_owner IN EXCLUSIVE MODE"); err != nil {
				t.Fatal(err)
			}
		}
		var toks []mqtt.Token
		for d := range devices {
			ts := start.Add(time.Duration(round) * time.Second).UnixMilli()
			payload := fmt.Sprintf(`{"messageId":"m%d","timestamp":%d,"properties":{"temp":%v}}`, round, ts, v)
			if d%2 == 1 {
				payload = fmt.Sprintf(`{"timestamp":%d,"properties":{"temp":%v}}`, ts, v)
			}
			toks = append(toks, pub.Publish(fmt.Sprintf("/%s/dev%03d/properties/report", product, d), 1, false, payload))
		}
		for _, tok := range toks {
			if err := mqttconn.WaitToken(tok, 30*time.Second); err != nil {
				t.Fatal(err)
			}
		}
		if hold != nil {
			testkit.Eventually(t, 30*time.Second, "ingest to store the round", func() bool {
				var n uint64
				err := ch.Conn().QueryRow(context.Background(), "SELECT uniqExact(device_id, ts) FROM device_message WHERE device_id LIKE 'dev%'").Scan(&n)
				return err == nil && n >= uint64((round+1)*devices)
			})
			// Stored: an ingest that did not wait for the evaluator would
			// acknowledge the round within milliseconds.
			time.Sleep(500 * time.Millisecond)
			if round == 6 { // the round waits in ingest's feed for the evaluator's commit
				if n := srv.metricValue(t, "devicehub_alarm_feed_held"); n < devices {
					t.Fatalf("devicehub_alarm_feed_held %v while the evaluator's writes wait, want at least %d", n, devices)
				}
			}
			_ = syscall.Kill(-srv.cmd.Process.Pid, syscall.SIGKILL)
			<-srv.exited
			if err := hold.Rollback(); err != nil {
				t.Fatal(err)
			}
		}
		switch round {
		case 3: // from the evaluator's own session to ingest's
			restart(plain, "plain")
		case 6:
			restart(plain, "plain2")
		case 8:
			pub = restartBroker(t, broker, pub, "gw-"+suffix)
		}
	}
	srv.exactAlarms(t, token, devices, above, "two SIGKILLs (the second process on ingest's session) and a broker restart")
}
