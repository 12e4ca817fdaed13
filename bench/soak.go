package bench

import (
	"cmp"
	"context"
	"devicehub/ingest/wire"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
)

// SoakParams configure RunSoak. The faults are real: the project's
// Mosquitto and ClickHouse are signalled through their pid files in
// .data/, PostgreSQL is stopped with pg_ctlcluster, and `.ci/services`
// brings each back, as an operator's supervisor would. Nothing else may
// use the services meanwhile (stop `make run`).
type SoakParams struct {
	BrokerURL string        // the project's broker, default tcp://127.0.0.1:1884
	Duration  time.Duration // publishing time, default 10m
	Rate      int           // QoS 1 reports per second, default 2000
	Devices   int           // default 100
	// When each fault starts, as a share of Duration, and how long it
	// lasts: broker restart (SIGTERM, back after BrokerDown), ClickHouse
	// SIGKILL, PostgreSQL stop.
	BrokerAt, ClickHouseAt, PostgresAt       float64
	BrokerDown, ClickHouseDown, PostgresDown time.Duration
	// ChildParams: the devicehub child.
	ChildParams
}

func (p SoakParams) withDefaults() SoakParams {
	p.BrokerURL = cmp.Or(p.BrokerURL, "tcp://127.0.0.1:1884")
	p.childDefaults()
	if p.Duration <= 0 {
		p.Duration = 10 * time.Minute
	}
	if p.Rate <= 0 {
		p.Rate = 2000
	}
	if p.Devices <= 0 {
		p.Devices = 100
	}
	if p.BrokerAt <= 0 {
		p.BrokerAt, p.ClickHouseAt, p.PostgresAt = 0.2, 0.45, 0.7
	}
	if p.BrokerDown <= 0 {
		p.BrokerDown, p.ClickHouseDown, p.PostgresDown = 3*time.Second, 30*time.Second, 20*time.Second
	}
	return p
}

// SoakResult is what RunSoak saw.
type SoakResult struct {
	Duration        time.Duration
	Published       int64 // QoS 1 reports sent
	Acknowledged    int64 // of them, acknowledged by the broker
	Stored          int64 // distinct acknowledged reports in ClickHouse
	Lost            int64 // acknowledged, not stored
	Duplicates      int64 // rows beyond one per stored report
	ServerPeakRSS   int64 // bytes
	ServerRestarted bool  // devicehub exited during the run (it must not)
	Faults          []string
}

func (r SoakResult) String() string {
	return fmt.Sprintf("published=%d acknowledged=%d stored=%d lost=%d duplicates=%d server peakRSS=%.0fMiB faults=[%s]",
		r.Published, r.Acknowledged, r.Stored, r.Lost, r.Duplicates, float64(r.ServerPeakRSS)/(1<<20), strings.Join(r.Faults, "; "))
}

// RunSoak publishes QoS 1 reports at a steady rate into a devicehub child
// with default settings for Duration, restarting the broker, killing
// ClickHouse and stopping PostgreSQL on the way, and then compares every
// report the broker acknowledged with what ClickHouse holds.
func RunSoak(ctx context.Context, p SoakParams) (SoakResult, error) {
	p = p.withDefaults()
	var res SoakResult
	root, err := repoRoot()
	if err != nil {
		return res, err
	}
	tmp, bin, err := p.workDir(ctx, "soak")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(tmp)
	gateway, removeGateway, err := newGateway(ctx, p.BrokerURL)
	if err != nil {
		return res, err
	}
	defer removeGateway()

	product := "soak-" + randHex(3)
	ids := make([]string, p.Devices)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s-%04d", product, i)
	}
	db, err := openRunDB(ctx, p.PostgresDSN, p.ClickHouseAddr, "", "devicehub_soak_", product, ids)
	if err != nil {
		return res, err
	}
	defer db.close()
	ch, name := db.ch, db.name

	clientID := "bench-soak-" + randHex(4)
	srv, err := startServer(ctx, bin, tmp, serverConfig{Args: p.ServerArgs, Env: map[string]string{
		"POSTGRES_DSN":     db.dsn,
		"CLICKHOUSE_ADDR":  p.ClickHouseAddr,
		"CLICKHOUSE_DB":    name,
		"TIMEZONE":         "UTC",
		"MQTT_URL":         p.BrokerURL,
		"MQTT_CLIENT_ID":   clientID,
		"ADMIN_PASSWORD":   randHex(8),
		"LOG_LEVEL":        "warn",
		"DEVICE_AUTH":      "none", // the publisher logs in as a gateway
		"SHUTDOWN_TIMEOUT": "60s",
	}})
	if err != nil {
		return res, err
	}
	defer func() {
		_ = srv.stop(65 * time.Second)
		purgeSessions(p.BrokerURL, clientID, 1)
	}()
	stopRSS := pidRSSSampler(srv.pid())

	// The publisher keeps its session and paho its unacknowledged
	// publishes across the broker's restart, as a device should.
	n := int64(p.Rate) * int64(p.Duration/time.Second)
	acked := make([]atomic.Bool, n)
	var published atomic.Int64
	pub := mqtt.NewClient(pahoOptions(gateway, p.BrokerURL, "bench-soak-pub-"+randHex(4)).
		SetCleanSession(false).SetAutoReconnect(true).SetMaxReconnectInterval(250 * time.Millisecond).
		SetWriteTimeout(10 * time.Second))
	if t := pub.Connect(); !t.WaitTimeout(10*time.Second) || t.Error() != nil {
		return res, fmt.Errorf("bench: soak publisher: %v", t.Error())
	}
	defer pub.Disconnect(250)
	var waiters sync.WaitGroup
	pubDone := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(pubDone)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		perTick := int64(p.Rate / 100)
		for k := int64(0); k < n; {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			for j := int64(0); j < perTick && k < n; j, k = j+1, k+1 {
				id := ids[k%int64(len(ids))]
				tok := pub.Publish(wire.DeviceTopic(product, id, wire.LevelReport), 1, false,
					`{"messageId":"s`+strconv.FormatInt(k, 10)+`","properties":{"v":`+strconv.FormatInt(k, 10)+`}}`)
				published.Add(1)
				waiters.Add(1)
				go func(k int64) {
					defer waiters.Done()
					if tok.WaitTimeout(5*time.Minute) && tok.Error() == nil {
						acked[k].Store(true)
					}
				}(k)
			}
		}
	}()

	faults := []struct {
		at   float64
		name string
		run  func() error
	}{
		{p.BrokerAt, "broker restart", func() error {
			return signalProc(brokerPID(p.BrokerURL), syscall.SIGTERM, p.BrokerDown)
		}},
		{p.ClickHouseAt, "ClickHouse SIGKILL", func() error {
			return signalProc(clickhousePID(p.ClickHouseAddr), syscall.SIGKILL, p.ClickHouseDown)
		}},
		{p.PostgresAt, "PostgreSQL stop", func() error { return stopPostgres(p.PostgresDown) }},
	}
	for _, f := range faults {
		at := start.Add(time.Duration(f.at * float64(p.Duration)))
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-time.After(time.Until(at)):
		}
		p.Logf("soak: %s at %s (published %d)", f.name, time.Since(start).Round(time.Second), published.Load())
		t0 := time.Now()
		if err := f.run(); err != nil {
			return res, fmt.Errorf("bench: soak %s: %w", f.name, err)
		}
		if out, err := exec.CommandContext(ctx, "bash", filepath.Join(root, ".ci", "services")).CombinedOutput(); err != nil {
			return res, fmt.Errorf("bench: soak: .ci/services after %s: %w\n%s", f.name, err, out)
		}
		res.Faults = append(res.Faults, fmt.Sprintf("%s at %s, back after %s", f.name,
			t0.Sub(start).Round(time.Second), time.Since(t0).Round(100*time.Millisecond)))
		p.Logf("soak: %s over after %s", f.name, time.Since(t0).Round(100*time.Millisecond))
	}
	<-pubDone
	res.Duration = time.Since(start)
	waiters.Wait()
	res.Published = published.Load()
	for k := range acked {
		if acked[k].Load() {
			res.Acknowledged++
		}
	}
	p.Logf("soak: published %d, acknowledged %d; waiting for storage", res.Published, res.Acknowledged)

	// Every acknowledged report, stored? Wait while the count still grows.
	var counts map[string]uint64
	last, lastGrowth := int64(-1), time.Now()
	for time.Since(lastGrowth) < 20*time.Second {
		if counts, err = ch.MessageIDCounts(ctx, "up"); err != nil {
			return res, err
		}
		if got := int64(len(counts)); got != last {
			last, lastGrowth = got, time.Now()
		}
		if last >= res.Acknowledged {
			break
		}
		time.Sleep(time.Second)
	}
	for k := range acked {
		c := counts["s"+strconv.Itoa(k)]
		switch {
		case acked[k].Load() && c == 0:
			res.Lost++
		case c > 0:
			res.Stored++
			res.Duplicates += int64(c - 1)
		}
	}
	res.ServerPeakRSS = stopRSS()
	select {
	case <-srv.exited:
		res.ServerRestarted = true
	default:
	}
	return res, nil
}

// signalProc signals process pid, waits until it is gone and then for
// down, leaving its restart to .ci/services.
func signalProc(pid int, sig syscall.Signal, down time.Duration) error {
	if pid <= 0 {
		return errors.New("the server's process was not found")
	}
	if err := syscall.Kill(pid, sig); err != nil {
		return err
	}
	for i := 0; i < 100 && syscall.Kill(pid, 0) == nil; i++ {
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(down)
	return nil
}

// stopPostgres stops the machine's PostgreSQL cluster for down.
func stopPostgres(down time.Duration) error {
	vers, err := os.ReadDir("/etc/postgresql")
	if err != nil || len(vers) == 0 {
		return fmt.Errorf("no PostgreSQL cluster in /etc/postgresql: %v", err)
	}
	ver := vers[len(vers)-1].Name()
	if out, err := exec.Command("pg_ctlcluster", "--skip-systemctl-redirect", ver, "main", "stop", "-m", "fast").CombinedOutput(); err != nil {
		return fmt.Errorf("pg_ctlcluster stop: %w: %s", err, out)
	}
	time.Sleep(down)
	return nil
}

// repoRoot is the folder holding go.mod, above the working directory.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("bench: run inside the repository (no go.mod above %s)", dir)
		}
		dir = parent
	}
}
