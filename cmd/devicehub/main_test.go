package main

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"devicehub/bench/testkit"
	"devicehub/ingest/mqttconn"
	"devicehub/ingest/mqtttest"
	"devicehub/meta/metatest"
	"devicehub/tsdb/tsdbtest"
)

// TestSigtermDrains runs the real binary, SIGTERMs it while a device
// publishes at QoS 1 and starts it again with the same MQTT client id:
// the first instance exits 0 within its shutdown timeout, and every
// message the broker acknowledged to the device ends up in ClickHouse
// (what the first instance had not taken stays in its broker sessions and
// is delivered to the second).
//
// The binary joins the default share group ($share/devicehub/...), which
// DEVICEHUB_* cannot change: on the shared broker any other devicehub
// running on the machine would take (and, not knowing the device, drop)
// part of the traffic. So the test runs its own Mosquitto.
func TestMain(m *testing.M) { testkit.Main(m) }

func TestSigtermDrains(t *testing.T) {
	t.Parallel()
	broker := mqtttest.StartBroker(t)
	bin := testkit.Devicehub(t)
	const shutdownTimeout = 10 * time.Second
	env, chDB, suffix := testEnv(t, broker.URL(), "sigterm")
	env = append(env, "DEVICEHUB_SHUTDOWN_TIMEOUT="+shutdownTimeout.String(), "DEVICEHUB_LOG_LEVEL=info")

	first := startServer(t, bin, env, "first")
	product, device := "sp"+suffix, "sd"+suffix
	token := login(t, first.base)
	first.deployDevice(t, token, product, device)

	db := tsdbtest.OpenDB(t, chDB, nil) // the server created it
	stored := func() (map[string]uint64, error) {
		return tsdbtest.StoredCounts(context.Background(), db, "up")
	}

	// The device publishes QoS 1 reports without waiting for each PUBACK.
	pubOpts := mqtt.NewClientOptions().AddBroker(broker.URL()).SetClientID("dev-" + suffix)
	mqtttest.Gateway(t, broker.URL())(pubOpts)
	pub := mqtt.NewClient(pubOpts.
		SetCleanSession(true).SetAutoReconnect(false).SetWriteTimeout(5 * time.Second))
	if tok := pub.Connect(); !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("device connect: %v", tok.Error())
	}
	t.Cleanup(func() { pub.Disconnect(0) })
	topic := "/" + product + "/" + device + "/properties/report"
	dev := mqtttest.StartPublisher(t, pub, func(int) string { return topic })

	testkit.Eventually(t, 30*time.Second, "some traffic stored by the first instance", func() bool {
		got, err := stored()
		return err == nil && len(got) > 300
	})

	atSignal := dev.Published()
	signalled := time.Now()
	first.signal(syscall.SIGTERM)
	code, ok := first.wait(shutdownTimeout + 5*time.Second)
	exitedIn := time.Since(signalled)
	atExit := dev.Published()
	if !ok {
		t.Fatalf("the first instance did not exit within %s of SIGTERM\n%s", shutdownTimeout+5*time.Second, first.logTail())
	}
	if code != 0 {
		t.Fatalf("the first instance exited %d after SIGTERM\n%s", code, first.logTail())
	}
	time.Sleep(300 * time.Millisecond) // pacing: publish into the offline sessions too
	dev.Stop()

	all := dev.Sent()
	ackedAt, failed, pending := mqtttest.WaitAcks(all, 20*time.Second)
	acked := make([]string, len(ackedAt))
	for k, i := range ackedAt {
		acked[k] = all[i].ID
	}
	before, err := stored()
	if err != nil {
		t.Fatal(err)
	}

	second := startServer(t, bin, env, "second")
	got, missing := tsdbtest.AwaitStored(db, "up", acked, 30*time.Second)
	rows, dups, dupIDs := tsdbtest.Duplicates(got)
	t.Logf("SIGTERM after %d published; exited 0 in %s, after %d published; published %d, acknowledged by the broker %d (failed %d, no answer %d)",
		atSignal, exitedIn.Round(time.Millisecond), atExit, len(all), len(acked), failed, pending)
	t.Logf("stored by the first instance %d distinct; after the second start %d distinct in %d rows: %d duplicates (%s)",
		len(before), len(got), rows, dups, mqtttest.IDRanges(dupIDs))
	if len(missing) > 0 {
		t.Fatalf("%d acknowledged messages not stored: %s\n%s", len(missing), mqtttest.IDRanges(missing), second.logTail())
	}

	second.signal(syscall.SIGTERM)
	if code, ok := second.wait(shutdownTimeout + 5*time.Second); !ok || code != 0 {
		t.Fatalf("the second instance: exited %v, code %d\n%s", ok, code, second.logTail())
	}
}

// testEnv is the environment of a binary under test: a PostgreSQL
// database of its own, already migrated with the admin (a copy of
// metatest's template: the server's migrations find nothing to do),
// ClickHouse database chDB (the server creates it; tsdbtest.OpenDB drops
// it), the broker at brokerURL and admin password admin123. Names end in
// suffix, random.
func testEnv(t *testing.T, brokerURL, name string) (env []string, chDB, suffix string) {
	t.Helper()
	return testEnvOn(t, metatest.NewMigratedDatabase(t), brokerURL, name)
}

// firstStartEnv is testEnv on an empty PostgreSQL database: the server
// migrates it and creates the admin, as on a new user's first start.
func firstStartEnv(t *testing.T, brokerURL, name string) (env []string, chDB, suffix string) {
	t.Helper()
	return testEnvOn(t, metatest.NewDatabase(t), brokerURL, name)
}

// testEnvOn is testEnv on the PostgreSQL database at dsn. The server's
// pool is 8 connections, as metatest's stores: binaries run in parallel,
// and PostgreSQL's max_connections (100 by default) is shared by them all.
func testEnvOn(t *testing.T, dsn, brokerURL, name string) (env []string, chDB, suffix string) {
	t.Helper()
	suffix = randHex()
	chDB = "devicehub_" + name + "_test_" + suffix
	env = append(os.Environ(),
		"DEVICEHUB_POSTGRES_DSN="+dsn,
		"DEVICEHUB_POSTGRES_MAX_CONNS=8",
		"DEVICEHUB_CLICKHOUSE_DB="+chDB,
		"DEVICEHUB_MQTT_URL="+brokerURL,
		"DEVICEHUB_MQTT_CLIENT_ID="+name+"-test-"+suffix,
		"DEVICEHUB_ADMIN_PASSWORD=admin123",
	)
	return env, chDB, suffix
}

func randHex() string { return testkit.RandID("") }

// server is one run of the binary.
type server struct {
	cmd    *exec.Cmd
	base   string
	logf   string
	exited chan struct{}
	err    error // of Wait, once exited is closed
}

// ownServer is the binary on a broker of its own, a PostgreSQL database
// of its own and a ClickHouse one dropped when the test ends, with the
// administrator logged in.
type ownServer struct {
	*server
	broker *mqtttest.Broker
	suffix string // of its names (testEnv)
	token  string // the administrator's
}

// startOwn starts the binary with testEnv's environment and extra; the
// test's cleanup stops it (SIGTERM) before its database is dropped.
func startOwn(t *testing.T, name string, extra ...string) *ownServer {
	t.Helper()
	broker := mqtttest.StartBroker(t)
	env, chDB, suffix := testEnv(t, broker.URL(), name)
	srv := startServer(t, testkit.Devicehub(t), append(env, extra...), name)
	tsdbtest.OpenDB(t, chDB, nil) // drops the server's database at the end
	t.Cleanup(func() {            // runs first: the server stops before the drop
		srv.signal(syscall.SIGTERM)
		srv.wait(15 * time.Second)
	})
	return &ownServer{server: srv, broker: broker, suffix: suffix, token: login(t, srv.base)}
}

// productWithDevice creates product (named name, of thing model
// metadata) and its device dev (named devName), both deployed when
// deploy: where the browser tests start.
func (own *ownServer) productWithDevice(t *testing.T, product, name, metadata, dev, devName string, deploy bool) {
	t.Helper()
	own.call(t, own.token, "POST", "/api/device/product", map[string]any{"id": product, "name": name, "classifiedId": "test",
		"modelFrom": "custom", "accessId": "mqtt", "deviceType": "device", "metadata": metadata})
	if deploy {
		own.call(t, own.token, "POST", "/api/device-product/"+product+"/deploy", nil)
	}
	own.call(t, own.token, "POST", "/api/device/instance", map[string]any{"id": dev, "name": devName, "productId": product})
	if deploy {
		own.call(t, own.token, "POST", "/api/device/instance/"+dev+"/deploy", nil)
	}
}

// hotRule creates an enabled alarm rule id of product: major when temp
// is above 80, cleared by hand.
func (own *ownServer) hotRule(t *testing.T, id, name, product string) {
	t.Helper()
	own.call(t, own.token, "POST", "/api/alarm/config", map[string]any{"id": id, "name": name, "productId": product,
		"severity": "major", "enabled": true, "clear": map[string]any{"type": "manual"},
		"trigger": map[string]any{"type": "property", "all": []any{map[string]any{"property": "temp", "op": "gt", "value": 80}}}})
}

// gateway connects a client of the broker at url with the gateway's
// login (any device's topics) and clientID, options changed by each of
// with; it is disconnected when the test ends.
func gateway(t *testing.T, url, clientID string, with ...func(*mqtt.ClientOptions)) mqtt.Client {
	t.Helper()
	o := mqtt.NewClientOptions().AddBroker(url).SetClientID(clientID).SetCleanSession(true)
	mqtttest.Gateway(t, url)(o)
	for _, w := range with {
		w(o)
	}
	c := mqtt.NewClient(o)
	if err := mqttconn.WaitToken(c.Connect(), 10*time.Second); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Disconnect(0) })
	return c
}

// startServer starts the binary and waits until it answers /healthz.
func startServer(t *testing.T, bin string, env []string, name string) *server {
	t.Helper()
	s := launchServer(t, bin, env, name)
	s.await(t, name+" instance", "/healthz", 30*time.Second)
	return s
}

// await waits up to d until GET path answers 200, failing the test if the
// process exits first or the time runs out.
func (s *server) await(t *testing.T, name, path string, d time.Duration) {
	t.Helper()
	answered := testkit.Within(d, func() bool {
		select {
		case <-s.exited:
			return true
		default:
		}
		resp, err := http.Get(s.base + path)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	select {
	case <-s.exited:
		t.Fatalf("%s exited at start: %v\n%s", name, s.err, s.logTail())
	default:
	}
	if !answered {
		t.Fatalf("%s: GET %s not 200 within %s\n%s", name, path, d, s.logTail())
	}
}

// launchServer starts the binary on a free port, its output in a log
// file, without waiting for it; the test's cleanup kills it if it still
// runs.
func launchServer(t *testing.T, bin string, env []string, name string) *server {
	t.Helper()
	addr := "127.0.0.1:" + strconv.Itoa(mqtttest.FreePort(t))
	logf := filepath.Join(t.TempDir(), name+".log")
	f, err := os.Create(logf)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cmd := exec.Command(bin)
	cmd.Env = append(append([]string(nil), env...), "DEVICEHUB_HTTP_ADDR="+addr)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &server{cmd: cmd, base: "http://" + addr, logf: logf, exited: make(chan struct{})}
	go func() { s.err = cmd.Wait(); close(s.exited) }()
	t.Cleanup(func() {
		select {
		case <-s.exited:
		default:
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-s.exited
		}
	})
	return s
}

func (s *server) signal(sig syscall.Signal) { _ = s.cmd.Process.Signal(sig) }

// wait waits up to d for the process to exit and returns its exit code.
func (s *server) wait(d time.Duration) (int, bool) {
	select {
	case <-s.exited:
		return s.cmd.ProcessState.ExitCode(), true
	case <-time.After(d):
		return -1, false
	}
}

func (s *server) logTail() string {
	b, _ := os.ReadFile(s.logf)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// login logs the administrator in and returns its token.
func login(t *testing.T, base string) string {
	t.Helper()
	return testkit.Login(t, base, "admin", "admin123").Token
}

// api calls the server's API with token.
func (s *server) api(token string) testkit.API { return testkit.API{Base: s.base, Token: token} }

// deployDevice creates and deploys a product and one device of it
// through the API.
// testModel is the thing model of deployDevice's products.
const testModel = `{"properties":[{"id":"temperature","name":"Temperature","valueType":{"type":"float"}},` +
	`{"id":"temp","name":"Temp","valueType":{"type":"float"}}],"events":[],"functions":[],"tags":[]}`

func (s *server) deployDevice(t *testing.T, token, product, device string) {
	t.Helper()
	s.call(t, token, "POST", "/api/device/product", map[string]any{
		"id": product, "name": "Product " + product, "classifiedId": "test", "modelFrom": "custom",
		"accessId": "mqtt", "deviceType": "device"})
	// The properties the tests read (endpoints 10 and 11 refuse others).
	s.call(t, token, "PATCH", "/api/device-product", map[string]any{"id": product, "name": "Product " + product, "classifiedId": "test",
		"accessId": "mqtt", "deviceType": map[string]any{"value": "device"}, "metadata": testModel})
	s.call(t, token, "POST", "/api/device-product/"+product+"/deploy", nil)
	s.call(t, token, "POST", "/api/device/instance", map[string]any{"id": device, "name": "Device " + device, "productId": product})
	s.call(t, token, "POST", "/api/device/instance/"+device+"/deploy", nil)
}

func (s *server) call(t *testing.T, token, method, path string, body any) {
	t.Helper()
	s.api(token).Call(t, method, path, body, nil)
}

// do sends a JSON request and decodes the envelope's result into out.
func (s *server) do(t *testing.T, token, method, path string, body, out any) {
	t.Helper()
	s.api(token).Call(t, method, path, body, out)
}
