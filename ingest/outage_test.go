package ingest

import (
	"context"
	"devicehub/bench/testkit"
	"devicehub/ingest/mqtttest"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"devicehub/meta/metatest"
	"devicehub/tsdb"
)

// privateClickHouse is a clickhouse-server of one test, on its own ports
// and data directory, so it can be killed without touching the shared one.
type privateClickHouse struct {
	t      *testing.T
	bin    string
	dir    string
	port   int
	cmd    *exec.Cmd
	exited chan struct{}
}

func startPrivateClickHouse(t *testing.T) *privateClickHouse {
	bin, err := exec.LookPath("clickhouse-server")
	if err != nil {
		for _, p := range []string{"/usr/sbin/clickhouse-server", "/usr/bin/clickhouse-server"} {
			if _, err := os.Stat(p); err == nil {
				bin = p
			}
		}
	}
	if bin == "" {
		t.Fatal("clickhouse-server is not installed: .ci/services installs it (make test runs it)")
	}
	dir := t.TempDir()
	src, err := os.ReadFile("../.ci/clickhouse/config.xml")
	if err != nil {
		t.Fatal(err)
	}
	users, err := os.ReadFile("../.ci/clickhouse/users.xml")
	if err != nil {
		t.Fatal(err)
	}
	port, httpPort := mqtttest.FreePort(t), mqtttest.FreePort(t)
	cfg := strings.ReplaceAll(string(src), "@DATA@", dir)
	cfg = strings.Replace(cfg, "<tcp_port>9000</tcp_port>", "<tcp_port>"+strconv.Itoa(port)+"</tcp_port>", 1)
	cfg = strings.Replace(cfg, "<http_port>8123</http_port>", "<http_port>"+strconv.Itoa(httpPort)+"</http_port>", 1)
	for _, f := range []struct {
		name string
		data []byte
	}{{"config.xml", []byte(cfg)}, {"users.xml", users}} {
		if err := os.WriteFile(filepath.Join(dir, f.name), f.data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ch := &privateClickHouse{t: t, bin: bin, dir: dir, port: port}
	ch.start()
	t.Cleanup(ch.kill)
	return ch
}

func (ch *privateClickHouse) addr() string { return "127.0.0.1:" + strconv.Itoa(ch.port) }

func (ch *privateClickHouse) start() {
	ch.t.Helper()
	cmd := exec.Command(ch.bin, "--config-file="+filepath.Join(ch.dir, "config.xml"))
	cmd.Dir = ch.dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		ch.t.Fatal(err)
	}
	ch.cmd, ch.exited = cmd, make(chan struct{})
	go func() { _ = cmd.Wait(); close(ch.exited) }()
	testkit.Eventually(ch.t, 60*time.Second, "private ClickHouse up", func() bool {
		c, err := net.DialTimeout("tcp", ch.addr(), time.Second)
		if err == nil {
			c.Close()
		}
		return err == nil
	})

}

// open opens database on the server (tsdb.Open migrates it), closed at
// the end of the test; its queries give up within seconds while the
// server is down.
func (ch *privateClickHouse) open(database string) *tsdb.DB {
	ch.t.Helper()
	opt := tsdb.DefaultOptions()
	opt.Addr = ch.addr()
	opt.Database = database
	opt.TimeZone = time.UTC
	opt.DialTimeout = time.Second
	opt.QueryTimeout = 3 * time.Second
	db, err := tsdb.Open(ctxT(ch.t, 60*time.Second), opt)
	if err != nil {
		ch.t.Fatal(err)
	}
	ch.t.Cleanup(func() { db.Close() })
	return db
}

// privateEnv is an env on a private ClickHouse (database on it) with a
// product of n devices, <product>-d0 and on.
func privateEnv(t *testing.T, database string, n int) (*env, *privateClickHouse, string) {
	ch := startPrivateClickHouse(t)
	e := &env{t: t, store: metatest.NewStore(t), ch: ch.open(database)}
	p := randID("p")
	e.product(p)
	e.devices(p, n)
	return e, ch, p
}

// kill SIGKILLs the server (only the process this test started).
func (ch *privateClickHouse) kill() {
	if ch.cmd == nil {
		return
	}
	_ = syscall.Kill(-ch.cmd.Process.Pid, syscall.SIGKILL)
	<-ch.exited
	ch.cmd = nil
}

// TestClickHouseOutageLosesNothing kills ClickHouse while devices publish
// at QoS 1 and restarts it: every published message ends up stored at
// least once (nothing is acknowledged before it is stored).
func TestClickHouseOutageLosesNothing(t *testing.T) {
	const devices = 4
	e, ch, p := privateEnv(t, "devicehub_outage", devices)
	db := e.ch
	iopt := testOptions(p)
	iopt.Writer.RetryMin = 50 * time.Millisecond
	iopt.Writer.RetryMax = 500 * time.Millisecond
	iopt.Writer.MaxRows = 500
	in := e.startIngester(iopt)

	dev := newPublisher(t, nil)
	const n = 4000
	var published atomic.Int64
	pubDone := make(chan error, 1)
	go func() {
		for i := range n {
			tok := dev.Publish(fmt.Sprintf("/%s/%s-d%d/properties/report", p, p, i%devices), 1, false,
				fmt.Sprintf(`{"messageId":"m%d","properties":{"i":%d,"s":"m%d"}}`, i, i, i))
			if !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
				pubDone <- fmt.Errorf("publish %d: %v", i, tok.Error())
				return
			}
			published.Add(1)
			time.Sleep(time.Millisecond) // ~ several seconds of traffic
		}
		pubDone <- nil
	}()
	testkit.Eventually(t, 30*time.Second, "some traffic stored", func() bool { return in.Stats().Stored > 200 })
	ch.kill()
	killedAt := published.Load()
	time.Sleep(2 * time.Second) // the outage itself, not an assertion
	acksDuringOutage := in.Stats().Acked
	t.Logf("ClickHouse killed after %d published; restarting", killedAt)
	ch.start()
	if err := <-pubDone; err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 90*time.Second, "every published message stored", func() bool {
		var got uint64
		err := db.Conn().QueryRow(context.Background(), "SELECT uniqExact(message_id) FROM device_message").Scan(&got)
		return err == nil && got == n
	})

	total := e.count("SELECT count() FROM device_message")
	props := e.count("SELECT uniqExact(property, num_value, str_value) FROM device_property") // each value is its message's
	s := in.Stats()
	t.Logf("published %d (QoS 1), acked %d (by the outage's end: %d), stored %d rows: %d duplicates; distinct property values %d",
		n, s.Acked, acksDuringOutage, total, total-n, props)
	if props != 2*n {
		t.Fatalf("distinct property values %d, want %d", props, 2*n)
	}
}
