// Command devicesim connects simulated devices of one product to the broker:
// each announces itself (birth), leaves a last will, reports properties from
// a thing model at an interval, and answers property reads and function
// invokes. Each device logs in as itself; devicesim learns the logins from
// devicehub's API, creating and deploying what is missing through the bulk
// API (one call per 10,000 devices) and rotating the keys of devices that
// exist (only a new key is ever shown). With -firmware each device runs a
// firmware updater (bench/fwdevice), with -fw-* flags to make it fail,
// stall, cut its download, reboot into its old version or compute a wrong
// hash. See README "Try it with simulated devices".
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"devicehub/bench/sim"
	"devicehub/schema"
)

// demoModel is used when no -model file is given.
const demoModel = `{"properties":[
 {"id":"temperature","name":"Temperature","valueType":{"type":"float","scale":1}},
 {"id":"humidity","name":"Humidity","valueType":{"type":"int","unit":"percent"}},
 {"id":"switch","name":"Switch","valueType":{"type":"boolean","trueText":"On","trueValue":true,"falseText":"Off","falseValue":false}},
 {"id":"mode","name":"Mode","valueType":{"type":"enum","elements":[{"value":"eco","text":"Eco"},{"value":"boost","text":"Boost"}]}}
],"events":[],"functions":[{"id":"DeviceCtrl","name":"Device control","async":false,"inputs":[]}],"tags":[]}`

func main() {
	var (
		broker   = flag.String("broker", "tcp://127.0.0.1:1884", "MQTT broker URL")
		product  = flag.String("product", "demo", "product id")
		prefix   = flag.String("prefix", "sim-", "device id prefix; devices are <prefix>1..<prefix>N")
		n        = flag.Int("devices", 10, "number of devices")
		model    = flag.String("model", "", "thing model JSON file (default: a demo model)")
		interval = flag.Duration("interval", 5*time.Second, "property report interval per device (0: none)")
		qos      = flag.Int("qos", 1, "QoS of reports")
		latency  = flag.Duration("latency", 0, "delay before each reply")
		silent   = flag.Bool("silent", false, "never reply to reads and invokes (for time_out)")
		failure  = flag.Float64("failure-rate", 0, "share of replies with success=false")
		duration = flag.Duration("duration", 0, "stop after this long (0: until interrupted)")
		apiURL   = flag.String("api", "http://127.0.0.1:8848", "devicehub's API, for the devices' logins")
		user     = flag.String("user", "admin", "devicehub user")
		password = flag.String("password", "admin123", "devicehub user's password")
		fw       fwFlags
	)
	fw.register(flag.CommandLine)
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	src := []byte(demoModel)
	if *model != "" {
		b, err := os.ReadFile(*model)
		if err != nil {
			fail(err)
		}
		src = b
	}
	tm, err := schema.ParseThingModel(src)
	if err != nil {
		fail(err)
	}
	faults, err := fw.faults()
	if err != nil {
		fail(err)
	}
	ids := make([]string, *n)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s%d", *prefix, i+1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *duration)
		defer cancel()
	}
	api, err := login(ctx, *apiURL, *user, *password)
	if err != nil {
		fail(err)
	}
	creds, err := api.deviceLogins(ctx, *product, tm.String(), ids)
	if err != nil {
		fail(err)
	}
	firmware := fw.options(ids, creds, faults, log)
	var fleet *sim.Fleet
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		// The broker learns a deployed device's login within moments.
		fleet, err = sim.Start(ctx, sim.Options{
			BrokerURL: *broker, ProductID: *product, DeviceIDs: ids, Model: tm,
			ReportInterval: *interval, QoS: byte(*qos), Login: sim.OwnLogins(creds),
			ReplyLatency: *latency, Silent: *silent, FailureRate: *failure, Firmware: firmware,
		})
		if err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		fail(err)
	}
	log.Info("devices connected", "product", *product, "devices", *n, "first", ids[0], "broker", *broker)
	<-ctx.Done()
	fleet.Close()
	log.Info("devices disconnected", "reports", fleet.Reports.Load(), "reads", fleet.Reads.Load(), "invokes", fleet.Invokes.Load())
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "devicesim:", err)
	os.Exit(1)
}
