package mqtttest

import (
	"context"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"devicehub/bench/sim"
)

// StartFleet starts the simulated devices of opts (bench/sim) logged in
// with the gateway login (Gateway) unless opts.Login is set; they stop
// when the test ends.
func StartFleet(t testing.TB, opts sim.Options) *sim.Fleet {
	t.Helper()
	if opts.Login == nil {
		gw := Gateway(t, opts.BrokerURL)
		opts.Login = func(_ string, o *mqtt.ClientOptions) { gw(o) }
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
