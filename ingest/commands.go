package ingest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"devicehub/tsdb"
)

// Command errors, mapped to the spec's codes by api.
var (
	// ErrOffline: the device is not connected; nothing was published.
	ErrOffline = errors.New("device is offline")
	// ErrTimeout: the device is connected but did not reply in time.
	ErrTimeout = errors.New("device did not reply in time")
	// ErrTooBusy: too many commands are waiting for replies.
	ErrTooBusy = errors.New("too many pending commands")
)

// DeviceError is a reply with success=false: the device's own code and
// message.
type DeviceError struct {
	Code    string
	Message string
}

func (e *DeviceError) Error() string {
	if e.Message == "" {
		return "device reported failure: " + e.Code
	}
	return e.Message
}

// Target is the device a command goes to, with what the downlink headers
// carry.
type Target struct {
	DeviceID, DeviceName string
	ProductID            string
	ProductName          string
	CreatorID            string
}

// Input is one function input.
type Input struct {
	Name  string `json:"name"`
	Value any    `json:"value"`
}

// CommandOptions configures the command path.
type CommandOptions struct {
	// Timeout is the default wait for a reply.
	Timeout time.Duration
	// MaxPending bounds the replies waited for at once (memory stays bounded).
	MaxPending int
	// ReadQoS is the QoS of property reads. A read is confirmed by its
	// reply, so the broker's PUBACK adds packets and nothing a caller can
	// see: a read lost on the way ends in time_out either way.
	// DefaultCommandOptions: 0.
	ReadQoS byte
	// InvokeQoS is the QoS of function invokes, which are answered before
	// the device replies: the broker's PUBACK is the only confirmation
	// that the command was taken. DefaultCommandOptions: 1; unlike the
	// fields above, a zero here is taken as is (QoS 0), not as the default.
	InvokeQoS byte
}

// DefaultCommandOptions: 10 s replies, 100k pending, reads at QoS 0,
// invokes at QoS 1.
func DefaultCommandOptions() CommandOptions {
	return CommandOptions{Timeout: 10 * time.Second, MaxPending: 100_000, ReadQoS: 0, InvokeQoS: 1}
}

// Link is the instance's own (non-shared) MQTT client: Presence.
type Link interface {
	IsOnline(deviceID string) bool
	Subscribe(filter string, qos byte, h Handler) error
	Publish(ctx context.Context, topic string, qos byte, payload []byte) error
	OnPresenceChange(func(deviceID string, online bool))
	OnConnectionLost(func())
}

var _ Link = (*Presence)(nil)

// DownlinkRecorder stores what the platform sends (optional).
type DownlinkRecorder interface {
	RecordDownlink(ctx context.Context, m tsdb.Message) error
}

// Commands publishes downlink messages and correlates replies by messageId.
// Every instance subscribes to replies with a plain subscription and drops
// the ids it is not waiting for.
type Commands struct {
	opt  CommandOptions
	link Link
	rec  DownlinkRecorder

	mu      sync.Mutex
	pending map[string]*waiter // messageId -> waiter
}

type waiter struct {
	deviceID string
	deadline time.Time
	done     chan result // buffered 1
	// stop interrupts the request's publish: a QoS 1 publish caught by a
	// broker loss waits for the reconnection, and its waiter's outcome
	// (client_offline) must not wait with it.
	stop context.CancelFunc
}

// fail hands the waiter its error and interrupts its publish; the caller
// has removed it from pending, so it happens once. A reply is only handed
// over (w.done): its publish completes on its own, and then records the
// downlink.
func (w *waiter) fail(err error) {
	w.done <- result{err: err}
	w.stop()
}

type result struct {
	reply reply
	err   error
}

// reply is what a device answers on .../reply.
type reply struct {
	MessageID  string          `json:"messageId"`
	DeviceID   string          `json:"deviceId"`
	Success    *bool           `json:"success"`
	Code       string          `json:"code"`
	Message    string          `json:"message"`
	Properties map[string]any  `json:"properties"`
	Output     json.RawMessage `json:"output"`
}

// NewCommands subscribes to the reply topics on link.
func NewCommands(link Link, rec DownlinkRecorder, opt CommandOptions) (*Commands, error) {
	d := DefaultCommandOptions()
	if opt.Timeout <= 0 {
		opt.Timeout = d.Timeout
	}
	if opt.MaxPending <= 0 {
		opt.MaxPending = d.MaxPending
	}
	c := &Commands{opt: opt, link: link, rec: rec, pending: map[string]*waiter{}}
	// QoS 0: this subscription only correlates replies; the ingester stores
	// them through its own QoS 1 subscription. If this connection is lost,
	// its waiters fail at once (client_offline); a reply the broker drops
	// under load ends its request in time_out, as a lost read does.
	for _, f := range []string{"/+/+/properties/read/reply", "/+/+/function/invoke/reply"} {
		if err := link.Subscribe(f, 0, c.onReply); err != nil {
			return nil, err
		}
	}
	link.OnPresenceChange(func(deviceID string, online bool) {
		if !online {
			c.failDevice(deviceID, ErrOffline)
		}
	})
	link.OnConnectionLost(func() { c.failAll(ErrOffline) })
	return c, nil
}

// ReadProperties sends READ_PROPERTY and waits for the reply's properties.
// timeout <= 0 uses the default.
func (c *Commands) ReadProperties(ctx context.Context, t Target, properties []string, timeout time.Duration) (map[string]any, error) {
	if properties == nil {
		properties = []string{}
	}
	msg := downlink{
		Headers:     c.headers(t),
		DeviceID:    t.DeviceID,
		Timestamp:   time.Now().UnixMilli(),
		Properties:  properties,
		MessageType: "READ_PROPERTY",
	}
	r, err := c.request(ctx, t, "properties/read", c.opt.ReadQoS, &msg, timeout)
	if err != nil {
		return nil, err
	}
	if r.Properties == nil {
		r.Properties = map[string]any{}
	}
	return r.Properties, nil
}

// InvokeFunction publishes INVOKE_FUNCTION and returns its messageId at
// once: the spec's 200 means "sent", not "done".
func (c *Commands) InvokeFunction(ctx context.Context, t Target, functionID string, inputs []Input) (string, error) {
	if !c.link.IsOnline(t.DeviceID) {
		return "", ErrOffline
	}
	if inputs == nil {
		inputs = []Input{}
	}
	msg := downlink{
		MessageID:   newMessageID(),
		Headers:     c.headers(t),
		DeviceID:    t.DeviceID,
		Timestamp:   time.Now().UnixMilli(),
		FunctionID:  functionID,
		Inputs:      inputs,
		MessageType: "INVOKE_FUNCTION",
	}
	// Bound the publish: while the broker is unreachable a QoS 1 publish
	// waits for the reconnection, which could be forever.
	ctx, cancel := context.WithTimeout(ctx, c.opt.Timeout)
	defer cancel()
	if err := c.publish(ctx, t, "function/invoke", c.opt.InvokeQoS, &msg); err != nil {
		if ctx.Err() != nil {
			return "", ErrTimeout
		}
		return "", err
	}
	return msg.MessageID, nil
}

// downlink is the spec's downlink message (and DESIGN's invoke message).
type downlink struct {
	Headers     map[string]string `json:"headers"`
	MessageID   string            `json:"messageId"`
	DeviceID    string            `json:"deviceId"`
	Timestamp   int64             `json:"timestamp"`
	Properties  []string          `json:"properties,omitempty"`
	FunctionID  string            `json:"functionId,omitempty"`
	Inputs      []Input           `json:"inputs,omitempty"`
	MessageType string            `json:"messageType"`
}

func (c *Commands) headers(t Target) map[string]string {
	return map[string]string{
		"deviceName":  t.DeviceName,
		"productName": t.ProductName,
		"productId":   t.ProductID,
		"_uid":        newMessageID(),
		"creatorId":   t.CreatorID,
		"traceparent": traceparent(),
	}
}

// request registers a waiter, publishes, and waits for the reply, the
// deadline, the device going offline or ctx, whichever comes first.
func (c *Commands) request(ctx context.Context, t Target, suffix string, qos byte, msg *downlink, timeout time.Duration) (reply, error) {
	if !c.link.IsOnline(t.DeviceID) {
		return reply{}, ErrOffline
	}
	if timeout <= 0 {
		timeout = c.opt.Timeout
	}
	msg.MessageID = newMessageID()
	deadline := time.Now().Add(timeout)
	// The timeout bounds the publish too: while the broker is unreachable
	// a QoS 1 publish waits for the reconnection, which could be forever.
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	w := &waiter{deviceID: t.DeviceID, deadline: deadline, done: make(chan result, 1), stop: cancel}
	c.mu.Lock()
	if len(c.pending) >= c.opt.MaxPending {
		c.mu.Unlock()
		return reply{}, ErrTooBusy
	}
	c.pending[msg.MessageID] = w
	c.mu.Unlock()
	defer c.forget(msg.MessageID)

	if err := c.publish(ctx, t, suffix, qos, msg); err != nil {
		select {
		case r := <-w.done: // failed while publishing
			return r.outcome()
		default:
		}
		if ctx.Err() != nil {
			return reply{}, ErrTimeout
		}
		return reply{}, err
	}
	// The device may have gone offline between the check and the waiter's
	// registration; the presence hook fails waiters only after it.
	if !c.link.IsOnline(t.DeviceID) {
		return reply{}, ErrOffline
	}
	timer := time.NewTimer(time.Until(w.deadline))
	defer timer.Stop()
	select {
	case r := <-w.done:
		return r.outcome()
	case <-timer.C:
	case <-ctx.Done():
	}
	select {
	case r := <-w.done: // finished as the deadline passed: its outcome wins
		return r.outcome()
	default:
		return reply{}, ErrTimeout
	}
}

// outcome is what request returns for r: the reply, or the waiter's error,
// or the device's own failure.
func (r result) outcome() (reply, error) {
	if r.err != nil {
		return reply{}, r.err
	}
	if r.reply.Success != nil && !*r.reply.Success {
		code := r.reply.Code
		if code == "" {
			code = "device_error"
		}
		return reply{}, &DeviceError{Code: code, Message: r.reply.Message}
	}
	return r.reply, nil
}

func (c *Commands) publish(ctx context.Context, t Target, suffix string, qos byte, msg *downlink) error {
	body, err := json.Marshal(msg)
	if err != nil {
		return fmt.Errorf("ingest: encode downlink: %w", err)
	}
	topic := "/" + t.ProductID + "/" + t.DeviceID + "/" + suffix
	if err := c.link.Publish(ctx, topic, qos, body); err != nil {
		return err
	}
	if c.rec != nil {
		// Recording is best effort: the command was sent either way.
		_ = c.rec.RecordDownlink(ctx, tsdb.Message{
			Time: time.Now(), ProductID: t.ProductID, DeviceID: t.DeviceID, Direction: "down",
			MessageType: msg.MessageType, MessageID: msg.MessageID, Topic: topic, Payload: body,
		})
	}
	return nil
}

// onReply hands a reply to its waiter; ids nobody here waits for (another
// instance's, or late ones) are dropped.
func (c *Commands) onReply(topic string, payload []byte) {
	var r reply
	if json.Unmarshal(payload, &r) != nil || r.MessageID == "" {
		return
	}
	c.mu.Lock()
	w, ok := c.pending[r.MessageID]
	if ok {
		delete(c.pending, r.MessageID)
	}
	c.mu.Unlock()
	if ok {
		w.done <- result{reply: r}
	}
}

func (c *Commands) forget(id string) {
	c.mu.Lock()
	delete(c.pending, id)
	c.mu.Unlock()
}

// failDevice fails every waiter of one device at once.
func (c *Commands) failDevice(deviceID string, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for id, w := range c.pending {
		if w.deviceID == deviceID {
			delete(c.pending, id)
			w.fail(err)
		}
	}
}

func (c *Commands) failAll(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for id, w := range c.pending {
		delete(c.pending, id)
		w.fail(err)
	}
}

// Expire fails the waiters whose deadline is before now and returns how
// many; a sweep for waiters whose callers went away (now is an argument so
// tests are deterministic).
func (c *Commands) Expire(now time.Time) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for id, w := range c.pending {
		if w.deadline.Before(now) {
			delete(c.pending, id)
			w.fail(ErrTimeout)
			n++
		}
	}
	return n
}

// RunExpiry calls Expire every interval until ctx ends. Each request
// forgets its waiter when it returns, so this only catches waiters whose
// callers went away without it; it bounds the table either way.
func (c *Commands) RunExpiry(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			c.Expire(now)
		}
	}
}

// Pending is the number of replies waited for.
func (c *Commands) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.pending)
}

func newMessageID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// traceparent is a W3C trace context header for the downlink.
func traceparent() string {
	var b [24]byte
	_, _ = rand.Read(b[:])
	return "00-" + hex.EncodeToString(b[:16]) + "-" + hex.EncodeToString(b[16:]) + "-01"
}
