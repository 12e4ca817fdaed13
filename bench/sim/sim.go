// Package sim simulates devices over MQTT: each device connects with a
// birth message and a last will, reports properties from its thing model,
// answers property reads and function invokes, and can be told to be slow,
// silent or failing. cmd/devicesim, tests and bench use it.
//
// It speaks only the wire protocol (topics and JSON payloads of DESIGN.md)
// and imports nothing of the platform but the thing-model types.
package sim

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"devicehub/schema"
)

// Options configures a fleet of simulated devices of one product.
type Options struct {
	BrokerURL string             // default tcp://127.0.0.1:1884
	ProductID string             // required
	DeviceIDs []string           // required
	Model     *schema.ThingModel // properties to report and answer; nil: none
	// ReportInterval between property reports of each device; 0: none.
	ReportInterval time.Duration
	QoS            byte
	// ReplyLatency delays every reply; Silent never replies; FailureRate
	// is the share of replies with success=false.
	ReplyLatency time.Duration
	Silent       bool
	FailureRate  float64
	// Login sets a device's broker login on its client options: its own
	// (OwnLogins) or, in tests of the traffic itself, a gateway's. nil
	// connects anonymously, with a random client id.
	Login func(deviceID string, o *mqtt.ClientOptions)
	// ConnectTimeout bounds each device's connection.
	ConnectTimeout time.Duration
	// ValueFunc, if set, chooses the values of reads and reports instead of
	// random plausible ones (tests use it to tell replies apart).
	ValueFunc func(deviceID, property string, vt *schema.ValueType) (any, bool)
}

// Fleet is a set of connected simulated devices.
type Fleet struct {
	opts    Options
	devices map[string]*Device
	wg      sync.WaitGroup
	cancel  context.CancelFunc
	// Counters for tests and bench.
	Reads, Invokes, Reports atomic.Int64
}

// Device is one simulated device with its own MQTT connection.
type Device struct {
	ID     string
	fleet  *Fleet
	client mqtt.Client
	mu     sync.Mutex
	conn   net.Conn
	// Invoked receives every function invoke payload, if not nil.
	Invoked chan []byte
}

// Start connects every device (birth message after connect, will on
// /{p}/{d}/offline) and starts reporting.
func Start(ctx context.Context, opts Options) (*Fleet, error) {
	if opts.ProductID == "" || len(opts.DeviceIDs) == 0 {
		return nil, errors.New("sim: ProductID and DeviceIDs are required")
	}
	if opts.BrokerURL == "" {
		opts.BrokerURL = "tcp://127.0.0.1:1884"
	}
	if opts.ConnectTimeout == 0 {
		opts.ConnectTimeout = 10 * time.Second
	}
	if opts.Model == nil {
		opts.Model = schema.EmptyThingModel()
	}
	rctx, cancel := context.WithCancel(context.Background())
	f := &Fleet{opts: opts, devices: map[string]*Device{}, cancel: cancel}
	for _, id := range opts.DeviceIDs {
		d := &Device{ID: id, fleet: f}
		if err := d.connect(ctx); err != nil {
			f.Close()
			return nil, err
		}
		f.devices[id] = d
		if opts.ReportInterval > 0 {
			f.wg.Add(1)
			go d.reportLoop(rctx)
		}
	}
	return f, nil
}

// Device returns the simulated device with id, or nil.
func (f *Fleet) Device(id string) *Device { return f.devices[id] }

// Close stops reporting and disconnects every device cleanly, after
// publishing its offline message.
func (f *Fleet) Close() {
	f.cancel()
	f.wg.Wait()
	for _, d := range f.devices {
		d.Disconnect()
	}
}

func (d *Device) topic(suffix string) string {
	return "/" + d.fleet.opts.ProductID + "/" + d.ID + "/" + suffix
}

func (d *Device) connect(ctx context.Context) error {
	o := d.fleet.opts
	opts := mqtt.NewClientOptions().AddBroker(o.BrokerURL).
		SetClientID(fmt.Sprintf("sim-%s-%s-%d", o.ProductID, d.ID, rand.Int64())).
		SetCleanSession(true).
		SetAutoReconnect(false).
		SetConnectTimeout(o.ConnectTimeout).
		SetWill(d.topic("offline"), `{"reason":"will"}`, 1, false).
		SetCustomOpenConnectionFn(func(uri *url.URL, _ mqtt.ClientOptions) (net.Conn, error) {
			c, err := net.DialTimeout("tcp", uri.Host, o.ConnectTimeout)
			if err != nil {
				return nil, err
			}
			d.mu.Lock()
			d.conn = c
			d.mu.Unlock()
			return readBuffered(c), nil
		})
	if o.Login != nil {
		o.Login(d.ID, opts)
	}
	d.client = mqtt.NewClient(opts)
	if err := wait(ctx, d.client.Connect()); err != nil {
		return fmt.Errorf("sim: connect %s: %w", d.ID, err)
	}
	if err := wait(ctx, d.client.Subscribe(d.topic("properties/read"), 1, d.onRead)); err != nil {
		return fmt.Errorf("sim: subscribe %s: %w", d.ID, err)
	}
	if err := wait(ctx, d.client.Subscribe(d.topic("function/invoke"), 1, d.onInvoke)); err != nil {
		return fmt.Errorf("sim: subscribe %s: %w", d.ID, err)
	}
	return wait(ctx, d.client.Publish(d.topic("online"), 1, false, fmt.Sprintf(`{"timestamp":%d}`, time.Now().UnixMilli())))
}

func wait(ctx context.Context, t mqtt.Token) error {
	select {
	case <-t.Done():
		return t.Error()
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Disconnect publishes the offline message and disconnects cleanly (no will).
func (d *Device) Disconnect() {
	if d.client == nil || !d.client.IsConnected() {
		return
	}
	t := d.client.Publish(d.topic("offline"), 1, false, `{"reason":"disconnect"}`)
	t.WaitTimeout(2 * time.Second)
	d.client.Disconnect(250)
}

// Kill drops the TCP connection without DISCONNECT, so the broker sends the
// device's last will.
func (d *Device) Kill() {
	d.mu.Lock()
	c := d.conn
	d.mu.Unlock()
	if c != nil {
		c.Close()
	}
	d.client.Disconnect(0)
}

// Report publishes one property report with values from the thing model.
func (d *Device) Report(ctx context.Context) error {
	props := map[string]any{}
	for i := range d.fleet.opts.Model.Properties {
		p := &d.fleet.opts.Model.Properties[i]
		if v, ok := d.value(p); ok {
			props[p.ID] = v
		}
	}
	body, _ := json.Marshal(map[string]any{
		"messageId": strconv.FormatInt(rand.Int64(), 36), "timestamp": time.Now().UnixMilli(), "properties": props,
	})
	d.fleet.Reports.Add(1)
	return wait(ctx, d.client.Publish(d.topic("properties/report"), d.fleet.opts.QoS, false, body))
}

func (d *Device) reportLoop(ctx context.Context) {
	defer d.fleet.wg.Done()
	t := time.NewTicker(d.fleet.opts.ReportInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			_ = d.Report(ctx)
		}
	}
}

type readRequest struct {
	MessageID  string   `json:"messageId"`
	Properties []string `json:"properties"`
}

func (d *Device) onRead(c mqtt.Client, m mqtt.Message) {
	d.fleet.Reads.Add(1)
	var req readRequest
	if json.Unmarshal(m.Payload(), &req) != nil || d.fleet.opts.Silent {
		return
	}
	go d.reply("properties/read/reply", req.MessageID, func(r map[string]any) {
		props := map[string]any{}
		want := map[string]bool{}
		for _, p := range req.Properties {
			want[p] = true
		}
		for i := range d.fleet.opts.Model.Properties {
			p := &d.fleet.opts.Model.Properties[i]
			if len(want) > 0 && !want[p.ID] {
				continue
			}
			if v, ok := d.value(p); ok {
				props[p.ID] = v
			}
		}
		r["properties"] = props
	})
}

func (d *Device) onInvoke(c mqtt.Client, m mqtt.Message) {
	d.fleet.Invokes.Add(1)
	if d.Invoked != nil {
		select {
		case d.Invoked <- append([]byte(nil), m.Payload()...):
		default:
		}
	}
	var req struct {
		MessageID string `json:"messageId"`
	}
	if json.Unmarshal(m.Payload(), &req) != nil || d.fleet.opts.Silent {
		return
	}
	go d.reply("function/invoke/reply", req.MessageID, func(r map[string]any) { r["output"] = "ok" })
}

func (d *Device) reply(suffix, messageID string, fill func(map[string]any)) {
	o := d.fleet.opts
	if o.ReplyLatency > 0 {
		time.Sleep(o.ReplyLatency)
	}
	r := map[string]any{"messageId": messageID, "deviceId": d.ID, "timestamp": time.Now().UnixMilli()}
	if o.FailureRate > 0 && rand.Float64() < o.FailureRate {
		r["success"] = false
		r["code"] = "simulated_failure"
		r["message"] = "the simulated device failed on purpose"
	} else {
		r["success"] = true
		fill(r)
	}
	body, _ := json.Marshal(r)
	d.client.Publish(d.topic(suffix), 1, false, body)
}

func (d *Device) value(p *schema.Property) (any, bool) {
	if f := d.fleet.opts.ValueFunc; f != nil {
		return f(d.ID, p.ID, &p.ValueType)
	}
	return Value(&p.ValueType)
}

// Value returns a plausible value of a thing-model type (false for types a
// device does not report, like object or file).
func Value(vt *schema.ValueType) (any, bool) {
	switch vt.Type {
	case "int", "long":
		return rand.IntN(100), true
	case "float", "double":
		v := rand.Float64() * 100
		p := math.Pow(10, float64(max(vt.Scale, 2)))
		return math.Round(v*p) / p, true
	case "boolean":
		return rand.IntN(2) == 1, true
	case "enum":
		if len(vt.Elements) == 0 {
			return nil, false
		}
		return vt.Elements[rand.IntN(len(vt.Elements))].ValueString(), true
	case "string", "password":
		return "sim-" + strconv.Itoa(rand.IntN(1000)), true
	case "date":
		return time.Now().UnixMilli(), true
	case "geoPoint":
		return map[string]float64{"lon": 116.39, "lat": 39.9}, true
	}
	return nil, false
}

// bufferedConn reads through a buffer: paho reads each packet's header a
// byte at a time, a system call each, which would make a fleet of
// simulated devices cost more CPU than the platform it loads.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func readBuffered(c net.Conn) net.Conn {
	return &bufferedConn{Conn: c, r: bufio.NewReaderSize(c, 4<<10)}
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// Credential is a device's login: its configuration.secureId and secureKey.
type Credential struct{ SecureID, SecureKey string }

// OwnLogins logs each device in as itself: client id = device id,
// username = secureId, password = secureKey (README "Devices over MQTT").
func OwnLogins(creds map[string]Credential) func(string, *mqtt.ClientOptions) {
	return func(id string, o *mqtt.ClientOptions) {
		c := creds[id]
		o.SetClientID(id).SetUsername(c.SecureID).SetPassword(c.SecureKey)
	}
}
