package forward

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"devicehub/ingest/mqtttest"
)

// sinkLogin is a login the private broker b lets publish on
// /fwdsink/...: the gateway's.
func sinkLogin(t testing.TB, b *mqtttest.Broker) (username, password string) {
	t.Helper()
	o := mqtt.NewClientOptions()
	mqtttest.Gateway(t, b.URL())(o)
	return o.Username, o.Password
}

// spooled fills a spool in a directory of its own with n synced messages
// of devices d0..d<devs-1>, messageId "<dev>-<i>", as the intake does.
func spooled(t testing.TB, n, devs int) *spool {
	t.Helper()
	sp, err := openSpool(t.TempDir(), 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sp.close)
	at := time.Now()
	for i := range n {
		d := fmt.Sprintf("d%d", i%devs)
		msg := fmt.Sprintf(`"productId":"p","deviceId":"%s","type":"property","messageId":"%s-%d","time":%d,"received":%d,"properties":{"temp":%d}}`,
			d, d, i/devs, at.UnixMilli(), at.UnixMilli(), i)
		if err := sp.append([]byte(msg), at); err != nil {
			t.Fatal(err)
		}
	}
	if err := sp.sync(); err != nil {
		t.Fatal(err)
	}
	return sp
}

// bareForwarder runs senders without a database or an intake.
func bareForwarder() *Forwarder {
	o := Options{BackoffMin: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond, Retry: 50 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}.withDefaults()
	return &Forwarder{opt: o, log: o.Logger, crashed: make(chan struct{}, 1)}
}

// BenchmarkMQTTSink is the MQTT sender's rate: b.N messages spooled and
// synced beforehand, published to a private Mosquitto on this machine
// (the rule's default batchSize), timed until the cursor is past them
// all. Run it with a fixed count: -bench MQTTSink -benchtime 50000x.
func BenchmarkMQTTSink(b *testing.B) {
	br := mqtttest.StartBroker(b)
	user, pass := sinkLogin(b, br)
	sp := spooled(b, b.N, 10)
	r := Rule{ID: "bench", Kind: KindMQTT, Secret: pass,
		MQTT: &MQTTSink{Broker: br.URL(), Topic: "/fwdsink/{deviceId}/event/{type}", Username: user}}
	if err := r.MQTT.normalize(); err != nil {
		b.Fatal(err)
	}
	f := bareForwarder()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	b.ResetTimer()
	start := time.Now()
	go func() { defer close(done); f.send(ctx, r, sp) }()
	for sp.position() < uint64(b.N) {
		time.Sleep(time.Millisecond)
	}
	el := time.Since(start)
	b.StopTimer()
	cancel()
	<-done
	b.ReportMetric(float64(b.N)/el.Seconds(), "msg/s")
}
