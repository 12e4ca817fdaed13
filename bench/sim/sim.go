// Package sim simulates devices over MQTT: each device connects with a
// birth message and a last will, reports properties from its thing model,
// answers property reads and function invokes, and can be told to be slow,
// silent or failing; with Options.Firmware it updates its firmware
// (bench/fwdevice), rebooting by reconnecting. cmd/devicesim, tests and
// bench use it.
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
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"devicehub/bench/fwdevice"
	"devicehub/ingest/wire"
	"devicehub/schema"
	"devicehub/schema/backoff"
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
	// Firmware, if set, gives a device a firmware updater: the options it
	// returns for deviceID (its secureId/secureKey for the download, its
	// version, its faults), nil for none. ProductID, DeviceID and Reboot
	// are filled in: the device reboots by reconnecting (offline, then a
	// new connection with its birth and its version report).
	Firmware func(deviceID string) *fwdevice.Options
}

// Fleet is a set of connected simulated devices.
type Fleet struct {
	opts    Options
	devices map[string]*Device
	sorted  []*schema.Property // the model's, by id: the order of a reply's keys
	wg      sync.WaitGroup
	cancel  context.CancelFunc
	// Counters for tests and bench.
	Reads, Invokes, Reports atomic.Int64
}

// Device is one simulated device with its own MQTT connection.
type Device struct {
	ID     string
	fleet  *Fleet
	mu     sync.Mutex
	client mqtt.Client // guarded by mu: a reboot replaces it
	conn   net.Conn
	// Invoked receives every function invoke payload, if not nil.
	Invoked chan []byte
	// Updater is the device's firmware updater (Options.Firmware), or nil.
	Updater *fwdevice.Updater
}

func (d *Device) cli() mqtt.Client {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.client
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
	f := &Fleet{opts: opts, devices: map[string]*Device{}, sorted: sortedProperties(opts.Model), cancel: cancel}
	for _, id := range opts.DeviceIDs {
		d := &Device{ID: id, fleet: f}
		if opts.Firmware != nil {
			if fo := opts.Firmware(id); fo != nil {
				o := *fo
				o.ProductID, o.DeviceID, o.Reboot = opts.ProductID, id, d.Reboot
				u, err := fwdevice.New(o)
				if err != nil {
					f.Close()
					return nil, err
				}
				d.Updater = u
			}
		}
		f.devices[id] = d // before its connect: Close then stops its updater
		if err := d.connect(ctx); err != nil {
			f.Close()
			return nil, err
		}
		if opts.ReportInterval > 0 {
			f.wg.Add(1)
			go d.reportLoop(rctx)
		}
	}
	return f, nil
}

// sortedProperties are m's properties ordered by id.
func sortedProperties(m *schema.ThingModel) []*schema.Property {
	out := make([]*schema.Property, len(m.Properties))
	for i := range m.Properties {
		out[i] = &m.Properties[i]
	}
	slices.SortStableFunc(out, func(a, b *schema.Property) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// Device returns the simulated device with id, or nil.
func (f *Fleet) Device(id string) *Device { return f.devices[id] }

// Close stops reporting and disconnects every device cleanly, after
// publishing its offline message.
func (f *Fleet) Close() {
	f.cancel()
	f.wg.Wait()
	for _, d := range f.devices {
		if d.Updater != nil {
			d.Updater.Close()
		}
		d.Disconnect()
	}
}

func (d *Device) topic(level string) string {
	return wire.DeviceTopic(d.fleet.opts.ProductID, d.ID, level)
}

func (d *Device) connect(ctx context.Context) error {
	o := d.fleet.opts
	opts := mqtt.NewClientOptions().AddBroker(o.BrokerURL).
		SetClientID(fmt.Sprintf("sim-%s-%s-%d", o.ProductID, d.ID, rand.Int64())).
		SetCleanSession(true).
		SetAutoReconnect(false).
		SetConnectTimeout(o.ConnectTimeout).
		SetWill(d.topic(wire.LevelOffline), `{"reason":"will"}`, 1, false).
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
	c := mqtt.NewClient(opts)
	d.mu.Lock()
	d.client = c
	d.mu.Unlock()
	if err := wait(ctx, c.Connect()); err != nil {
		return fmt.Errorf("sim: connect %s: %w", d.ID, err)
	}
	if err := wait(ctx, c.Subscribe(d.topic(wire.LevelRead), 1, d.onRead)); err != nil {
		return fmt.Errorf("sim: subscribe %s: %w", d.ID, err)
	}
	if err := wait(ctx, c.Subscribe(d.topic(wire.LevelInvoke), 1, d.onInvoke)); err != nil {
		return fmt.Errorf("sim: subscribe %s: %w", d.ID, err)
	}
	if err := wait(ctx, c.Publish(d.topic(wire.LevelOnline), 1, false, fmt.Sprintf(`{"timestamp":%d}`, time.Now().UnixMilli()))); err != nil {
		return err
	}
	if d.Updater != nil {
		// After the birth: subscribe to firmware/upgrade, report the version.
		if err := d.Updater.Connected(fwdevice.Paho(c)); err != nil {
			return fmt.Errorf("sim: %s: %w", d.ID, err)
		}
	}
	return nil
}

// Reboot disconnects the device (offline message, reason "reboot") and
// connects it again (birth, and the firmware version report if it has an
// updater): the firmware updater's reboot.
func (d *Device) Reboot(ctx context.Context) error {
	if c := d.cli(); c != nil && c.IsConnected() {
		c.Publish(d.topic(wire.LevelOffline), 1, false, `{"reason":"reboot"}`).WaitTimeout(2 * time.Second)
		c.Disconnect(50)
	}
	return d.connect(ctx)
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
	c := d.cli()
	if c == nil || !c.IsConnected() {
		return
	}
	t := c.Publish(d.topic(wire.LevelOffline), 1, false, `{"reason":"disconnect"}`)
	t.WaitTimeout(2 * time.Second)
	c.Disconnect(250)
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
	d.cli().Disconnect(0)
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
	return wait(ctx, d.cli().Publish(d.topic(wire.LevelReport), d.fleet.opts.QoS, false, body))
}

func (d *Device) reportLoop(ctx context.Context) {
	defer d.fleet.wg.Done()
	backoff.Every(ctx.Done(), d.fleet.opts.ReportInterval, func(time.Time) bool {
		_ = d.Report(ctx)
		return true
	})
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
	d.answer(wire.LevelReadReply, req.MessageID, func(b []byte) []byte {
		return d.appendProperties(b, req.Properties)
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
	d.answer(wire.LevelInvokeReply, req.MessageID, func(b []byte) []byte { return append(b, `,"output":"ok"`...) })
}

// answer replies on the message handler's goroutine, which may publish as
// long as it does not wait for the token; a delayed reply gets a goroutine
// of its own, so that the device's other messages are not held up.
func (d *Device) answer(suffix, messageID string, fill func([]byte) []byte) {
	if d.fleet.opts.ReplyLatency > 0 {
		go d.reply(suffix, messageID, fill)
		return
	}
	d.reply(suffix, messageID, fill)
}

func (d *Device) reply(suffix, messageID string, fill func([]byte) []byte) {
	if l := d.fleet.opts.ReplyLatency; l > 0 {
		time.Sleep(l)
	}
	d.cli().Publish(d.topic(suffix), 1, false, d.replyBody(messageID, fill))
}

// replyBody is a reply's JSON object: messageId, deviceId, timestamp and
// success, with fill's fields (each written with a leading comma) on
// success, or a failure's code and message. It is written by hand, keys
// in the order encoding/json gives a map's (sorted), rather than as a map
// through reflection: a device answers every command of a load run.
func (d *Device) replyBody(messageID string, fill func([]byte) []byte) []byte {
	b := make([]byte, 0, 192)
	if r := d.fleet.opts.FailureRate; r > 0 && rand.Float64() < r {
		b = append(b, `{"code":"simulated_failure","deviceId":`...)
		b = appendString(b, d.ID)
		b = append(b, `,"message":"the simulated device failed on purpose","messageId":`...)
		b = appendString(b, messageID)
		b = append(b, `,"success":false`...)
	} else {
		b = append(b, `{"deviceId":`...)
		b = appendString(b, d.ID)
		b = append(b, `,"messageId":`...)
		b = appendString(b, messageID)
		b = fill(b)
		b = append(b, `,"success":true`...)
	}
	b = append(b, `,"timestamp":`...)
	b = strconv.AppendInt(b, time.Now().UnixMilli(), 10)
	return append(b, '}')
}

// appendProperties writes the "properties" field of a read's reply: a
// value of each wanted property of the model (every one if want is
// empty), in key order.
func (d *Device) appendProperties(b []byte, want []string) []byte {
	b = append(b, `,"properties":{`...)
	first := true
	for _, p := range d.fleet.sorted {
		if len(want) > 0 && !slices.Contains(want, p.ID) {
			continue
		}
		v, ok := d.value(p)
		if !ok {
			continue
		}
		if !first {
			b = append(b, ',')
		}
		first = false
		b = appendString(b, p.ID)
		b = append(b, ':')
		b = appendValue(b, v)
	}
	return append(b, '}')
}

// appendValue writes v as encoding/json does: the types Value returns by
// hand, anything else (from a ValueFunc) through json.Marshal, null if
// that fails.
func appendValue(b []byte, v any) []byte {
	switch v := v.(type) {
	case float64:
		// encoding/json's plain notation range; outside it, its exponent form.
		if a := math.Abs(v); a == 0 || a >= 1e-6 && a < 1e21 {
			return strconv.AppendFloat(b, v, 'f', -1, 64)
		}
	case int:
		return strconv.AppendInt(b, int64(v), 10)
	case int64:
		return strconv.AppendInt(b, v, 10)
	case bool:
		return strconv.AppendBool(b, v)
	case string:
		return appendString(b, v)
	}
	j, err := json.Marshal(v)
	if err != nil {
		return append(b, "null"...)
	}
	return append(b, j...)
}

// appendString writes s as a JSON string the way encoding/json does:
// printable ASCII that needs no escape as is, anything else through
// json.Marshal (which escapes HTML characters and invalid UTF-8 too).
func appendString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			j, _ := json.Marshal(s)
			return append(b, j...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
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
