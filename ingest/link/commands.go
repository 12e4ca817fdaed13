package link

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"devicehub/ingest/wire"
	"devicehub/schema/backoff"
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
	// Registerer receives the devicehub_command* metrics (metrics.go);
	// nil registers nothing.
	Registerer prometheus.Registerer
}

// DefaultCommandOptions: 10 s replies, 100k pending, reads at QoS 0,
// invokes at QoS 1, no metrics.
func DefaultCommandOptions() CommandOptions {
	return CommandOptions{Timeout: 10 * time.Second, MaxPending: 100_000, ReadQoS: 0, InvokeQoS: 1}
}

// Client is the instance's own (non-shared) MQTT client that commands ride
// on: *Presence.
type Client interface {
	IsOnline(deviceID string) bool
	Subscribe(filter string, qos byte, h Handler) error
	Publish(ctx context.Context, topic string, qos byte, payload []byte) error
	OnPresenceChange(func(deviceID string, online bool))
	OnConnectionLost(func())
}

var _ Client = (*Presence)(nil)

// DownlinkRecorder stores what the platform sends (optional).
type DownlinkRecorder interface {
	RecordDownlink(ctx context.Context, m tsdb.Message) error
}

// Commands publishes downlink messages and correlates replies by messageId.
// Every instance subscribes to replies with a plain subscription and drops
// the ids it is not waiting for.
//
// The table of waiters is split into shards, each with its own lock, so
// that concurrent requests and the reply callback rarely wait for one
// another; a device's waiters share one shard (the shard's number is the
// first byte of every messageId), so that its going offline looks at one
// shard only. No lock is held across a publish or any other call that
// waits.
type Commands struct {
	opt    CommandOptions
	client Client
	rec    DownlinkRecorder
	m      *commandMetrics

	pending atomic.Int64 // waiters in all shards, at most opt.MaxPending
	shards  [shardCount]shard
}

// shardCount is a power of two: a shard is the low bits of a hash.
const shardCount = 64

type shard struct {
	mu      sync.Mutex
	waiters map[string]*waiter // messageId -> waiter
	_       [48]byte           // one shard per cache line
}

type waiter struct {
	productID, deviceID string // a reply counts from this device's topic only
	deadline            time.Time
	done                chan result // buffered 1
	// stop ends the request's context: it interrupts a publish (a QoS 1
	// publish caught by a broker loss waits for the reconnection, and its
	// waiter's outcome, client_offline, must not wait with it).
	stop context.CancelFunc
}

// fail hands the waiter its error and ends its request's context; the
// caller has removed it from its shard, so it happens once. A reply is only
// handed over (w.done): its publish completes on its own, and then records
// the downlink.
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

// NewCommands subscribes to the reply topics on client.
func NewCommands(client Client, rec DownlinkRecorder, opt CommandOptions) (*Commands, error) {
	d := DefaultCommandOptions()
	if opt.Timeout <= 0 {
		opt.Timeout = d.Timeout
	}
	if opt.MaxPending <= 0 {
		opt.MaxPending = d.MaxPending
	}
	c := &Commands{opt: opt, client: client, rec: rec}
	for i := range c.shards {
		c.shards[i].waiters = make(map[string]*waiter)
	}
	c.m = newCommandMetrics(c)
	if opt.Registerer != nil {
		if err := c.m.register(opt.Registerer); err != nil {
			return nil, fmt.Errorf("link: command metrics: %w", err)
		}
	}
	// QoS 0: this subscription only correlates replies; the ingester stores
	// them through its own QoS 1 subscription. If this connection is lost,
	// its waiters fail at once (client_offline); a reply the broker drops
	// under load ends its request in time_out, as a lost read does.
	for _, f := range []string{wire.DeviceTopic("+", "+", wire.LevelReadReply), wire.DeviceTopic("+", "+", wire.LevelInvokeReply),
		wire.DeviceTopic("+", "+", wire.LevelWriteReply)} {
		if err := client.Subscribe(f, 0, c.onReply); err != nil {
			if opt.Registerer != nil {
				c.m.unregister(opt.Registerer)
			}
			return nil, err
		}
	}
	client.OnPresenceChange(func(deviceID string, online bool) {
		if !online {
			c.failDevice(deviceID, ErrOffline)
		}
	})
	client.OnConnectionLost(func() { c.failAll(ErrOffline) })
	return c, nil
}

// ReadProperties sends READ_PROPERTY and waits for the reply's properties.
// timeout <= 0 uses the default; the call ends by then at the latest
// (earlier if ctx ends first), so a caller needs no deadline of its own.
func (c *Commands) ReadProperties(ctx context.Context, t Target, properties []string, timeout time.Duration) (map[string]any, error) {
	start := time.Now()
	r, err := c.read(ctx, start, t, properties, timeout)
	c.m.observe(kindRead, start, err)
	if err != nil {
		return nil, err
	}
	if r.Properties == nil {
		r.Properties = map[string]any{}
	}
	return r.Properties, nil
}

func (c *Commands) read(ctx context.Context, start time.Time, t Target, properties []string, timeout time.Duration) (reply, error) {
	if !c.client.IsOnline(t.DeviceID) {
		return reply{}, ErrOffline
	}
	if properties == nil {
		properties = []string{}
	}
	msg := newDownlink(t, start, "READ_PROPERTY")
	msg.Properties = properties
	return c.request(ctx, start, kindRead, t, wire.LevelRead, c.opt.ReadQoS, &msg, timeout)
}

// WriteProperties sends WRITE_PROPERTY with values (property id to value,
// checked by the caller against the thing model) on .../properties/write
// and waits for the reply, as ReadProperties does: the same table, the
// same client_offline and time_out rules. It returns the reply's
// properties (the values the device now holds, when it says), never nil.
func (c *Commands) WriteProperties(ctx context.Context, t Target, values map[string]any, timeout time.Duration) (map[string]any, error) {
	start := time.Now()
	r, err := c.write(ctx, start, t, values, timeout)
	c.m.observe(kindWrite, start, err)
	if err != nil {
		return nil, err
	}
	if r.Properties == nil {
		r.Properties = map[string]any{}
	}
	return r.Properties, nil
}

func (c *Commands) write(ctx context.Context, start time.Time, t Target, values map[string]any, timeout time.Duration) (reply, error) {
	if !c.client.IsOnline(t.DeviceID) {
		return reply{}, ErrOffline
	}
	if values == nil {
		values = map[string]any{}
	}
	msg := newDownlink(t, start, "WRITE_PROPERTY")
	msg.Properties = values
	// A write changes the device: its publish is confirmed by the broker
	// (the invokes' QoS), and its reply says it was applied.
	return c.request(ctx, start, kindWrite, t, wire.LevelWrite, c.opt.InvokeQoS, &msg, timeout)
}

// ShadowMessage is a message about a device's shadow (ingest/shadow) that
// devicehub sends the device: its delta, or the answer to its request for
// the whole shadow. Every one carries the shadow's version.
type ShadowMessage struct {
	// Level is the topic level: wire.LevelShadowDelta or
	// wire.LevelShadowGetReply.
	Level string
	// MessageType is the message's messageType (SHADOW_DELTA,
	// SHADOW_GET_REPLY).
	MessageType string
	// ReplyTo, when set, is the messageId of the device's request, which
	// the message carries instead of a fresh one.
	ReplyTo string
	Version int64
	State   any // the delta's properties, or the whole shadow
}

// SendShadow publishes m to the device t, recorded as a downlink, and
// returns its messageId. Unlike a command it is sent whether or not the
// device is online as this instance sees it, and to every broker of a
// pool: a device that subscribed before its birth reached this instance's
// view must not miss it, and a broker drops what nobody is subscribed to.
// The publish waits at most the default timeout.
func (c *Commands) SendShadow(ctx context.Context, t Target, m ShadowMessage) (string, error) {
	msg := newDownlink(t, time.Now(), m.MessageType)
	if m.ReplyTo != "" {
		msg.MessageID = m.ReplyTo
	}
	v := m.Version
	msg.Version, msg.State = &v, m.State
	ctx, cancel := context.WithTimeout(ctx, c.opt.Timeout)
	defer cancel()
	if err := c.publish(ctx, kindShadow, t, m.Level, c.opt.InvokeQoS, &msg); err != nil {
		if ctx.Err() != nil {
			return "", ErrTimeout
		}
		return "", err
	}
	return msg.MessageID, nil
}

// InvokeFunction publishes INVOKE_FUNCTION and returns its messageId at
// once: the spec's 200 means "sent", not "done". The publish waits at most
// the default timeout.
func (c *Commands) InvokeFunction(ctx context.Context, t Target, functionID string, inputs []Input) (string, error) {
	start := time.Now()
	id, err := c.invoke(ctx, start, t, functionID, inputs)
	c.m.observe(kindInvoke, start, err)
	return id, err
}

func (c *Commands) invoke(ctx context.Context, start time.Time, t Target, functionID string, inputs []Input) (string, error) {
	if !c.client.IsOnline(t.DeviceID) {
		return "", ErrOffline
	}
	if inputs == nil {
		inputs = []Input{}
	}
	msg := newDownlink(t, start, "INVOKE_FUNCTION")
	msg.FunctionID, msg.Inputs = functionID, inputs
	// Bound the publish: while the broker is unreachable a QoS 1 publish
	// waits for the reconnection, which could be forever.
	ctx, cancel := context.WithDeadline(ctx, start.Add(c.opt.Timeout))
	defer cancel()
	if err := c.publish(ctx, kindInvoke, t, wire.LevelInvoke, c.opt.InvokeQoS, &msg); err != nil {
		if ctx.Err() != nil {
			return "", ErrTimeout
		}
		return "", err
	}
	return msg.MessageID, nil
}

// newDownlink is a command of messageType to t made at start, with new
// ids; its caller adds what it carries.
func newDownlink(t Target, start time.Time, messageType string) downlink {
	ids := newIDs(shardOf(t.DeviceID))
	return downlink{
		Headers:     headers(t, ids),
		MessageID:   ids.messageID,
		DeviceID:    t.DeviceID,
		Timestamp:   start.UnixMilli(),
		MessageType: messageType,
	}
}

// downlink is the spec's downlink message (and DESIGN's invoke message).
type downlink struct {
	Headers     downlinkHeaders `json:"headers"`
	MessageID   string          `json:"messageId"`
	DeviceID    string          `json:"deviceId"`
	Timestamp   int64           `json:"timestamp"`
	Properties  any             `json:"properties,omitempty"` // a read's ids ([]string), a write's values (map)
	FunctionID  string          `json:"functionId,omitempty"`
	Inputs      []Input         `json:"inputs,omitempty"`
	MessageType string          `json:"messageType"`
	Version     *int64          `json:"version,omitempty"` // shadow messages
	State       any             `json:"state,omitempty"`   // shadow messages
}

// downlinkHeaders are the downlink's headers, fields in the order of
// their names, as a map of them would be written.
type downlinkHeaders struct {
	UID         string `json:"_uid"`
	CreatorID   string `json:"creatorId"`
	DeviceName  string `json:"deviceName"`
	ProductID   string `json:"productId"`
	ProductName string `json:"productName"`
	TraceParent string `json:"traceparent"`
}

func headers(t Target, ids requestIDs) downlinkHeaders {
	return downlinkHeaders{
		UID:         ids.uid,
		CreatorID:   t.CreatorID,
		DeviceName:  t.DeviceName,
		ProductID:   t.ProductID,
		ProductName: t.ProductName,
		TraceParent: ids.traceparent,
	}
}

// request is a read's round trip: it registers a waiter, publishes, and
// waits for the reply, the deadline, the device going offline or ctx,
// whichever comes first. The request's context is its only timer: it
// bounds the publish and the wait, and is stopped when the request ends.
func (c *Commands) request(ctx context.Context, start time.Time, kind int, t Target, suffix string, qos byte, msg *downlink, timeout time.Duration) (reply, error) {
	if timeout <= 0 {
		timeout = c.opt.Timeout
	}
	deadline := start.Add(timeout)
	// The timeout bounds the publish too: while the broker is unreachable
	// a QoS 1 publish waits for the reconnection, which could be forever.
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	w := &waiter{productID: t.ProductID, deviceID: t.DeviceID, deadline: deadline, done: make(chan result, 1), stop: cancel}
	s := &c.shards[shardOfID(msg.MessageID)]
	if !c.add(s, msg.MessageID, w) {
		return reply{}, ErrTooBusy
	}
	defer c.forget(s, msg.MessageID)

	if err := c.publish(ctx, kind, t, suffix, qos, msg); err != nil {
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
	if !c.client.IsOnline(t.DeviceID) {
		return reply{}, ErrOffline
	}
	select {
	case r := <-w.done:
		return r.outcome()
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

// everywhere is a Client that can publish to every broker of a pool
// (*Presence): shadow messages go there.
type everywhere interface {
	PublishEverywhere(ctx context.Context, topic string, qos byte, payload []byte) error
}

func (c *Commands) publish(ctx context.Context, kind int, t Target, suffix string, qos byte, msg *downlink) error {
	body, err := json.Marshal(msg)
	if err != nil {
		return fmt.Errorf("link: encode downlink: %w", err)
	}
	topic := wire.DeviceTopic(t.ProductID, t.DeviceID, suffix)
	send := c.client.Publish
	if e, ok := c.client.(everywhere); ok && kind == kindShadow {
		// A device that just moved to another broker of the pool may
		// have published its birth there before this instance's view
		// knew: sent to its old broker only, a delta could miss it.
		send = e.PublishEverywhere
	}
	if err := send(ctx, topic, qos, body); err != nil {
		return err
	}
	c.m.sent(kind)
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
// instance's, or late ones) are dropped, and so is a reply on another
// device's topic than the one the request went to: a device that learns
// (or guesses) another's messageId cannot answer for it. It runs on the
// client's delivery goroutine and takes one shard's lock for a map lookup.
func (c *Commands) onReply(topic string, payload []byte) {
	var r reply
	if json.Unmarshal(payload, &r) != nil || r.MessageID == "" {
		return
	}
	from, parsed := wire.ParseTopic(topic)
	if !parsed {
		return
	}
	s := &c.shards[shardOfID(r.MessageID)]
	s.mu.Lock()
	w, ok := s.waiters[r.MessageID]
	ok = ok && w.deviceID == from.DeviceID && w.productID == from.ProductID
	if ok {
		delete(s.waiters, r.MessageID)
		c.pending.Add(-1)
	}
	s.mu.Unlock()
	if ok {
		w.done <- result{reply: r}
	}
}

// add registers w under id in s, unless MaxPending waiters are registered.
func (c *Commands) add(s *shard, id string, w *waiter) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c.pending.Add(1) > int64(c.opt.MaxPending) {
		c.pending.Add(-1)
		return false
	}
	s.waiters[id] = w
	return true
}

func (c *Commands) forget(s *shard, id string) {
	s.mu.Lock()
	if _, ok := s.waiters[id]; ok {
		delete(s.waiters, id)
		c.pending.Add(-1)
	}
	s.mu.Unlock()
}

// remove takes the waiters of s that match out of s and returns them, so
// that they are failed after the lock is released.
func (c *Commands) remove(s *shard, match func(*waiter) bool) []*waiter {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*waiter
	for id, w := range s.waiters {
		if match(w) {
			delete(s.waiters, id)
			out = append(out, w)
		}
	}
	c.pending.Add(-int64(len(out)))
	return out
}

// failDevice fails every waiter of one device at once; they are all in the
// device's shard.
func (c *Commands) failDevice(deviceID string, err error) {
	for _, w := range c.remove(&c.shards[shardOf(deviceID)], func(w *waiter) bool { return w.deviceID == deviceID }) {
		w.fail(err)
	}
}

func (c *Commands) failAll(err error) {
	for i := range c.shards {
		for _, w := range c.remove(&c.shards[i], func(*waiter) bool { return true }) {
			w.fail(err)
		}
	}
}

// Expire fails the waiters whose deadline is before now and returns how
// many; a sweep for waiters whose callers went away (now is an argument so
// tests are deterministic). It holds one shard's lock at a time.
func (c *Commands) Expire(now time.Time) int {
	n := 0
	for i := range c.shards {
		for _, w := range c.remove(&c.shards[i], func(w *waiter) bool { return w.deadline.Before(now) }) {
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
	backoff.Every(ctx.Done(), every, func(now time.Time) bool {
		c.Expire(now)
		return true
	})
}

// Pending is the number of replies waited for.
func (c *Commands) Pending() int { return int(c.pending.Load()) }

// shardOf is the shard of a device's waiters: FNV-1a of its id.
func shardOf(deviceID string) byte {
	h := uint32(2166136261)
	for i := 0; i < len(deviceID); i++ {
		h ^= uint32(deviceID[i])
		h *= 16777619
	}
	return byte(h & (shardCount - 1))
}

// shardOfID is the shard a messageId names in its first byte (two hex
// digits); ids of other origins land in some shard and are not found.
func shardOfID(id string) int {
	if len(id) < 2 {
		return 0
	}
	return int(unhex(id[0])<<4|unhex(id[1])) & (shardCount - 1)
}

func unhex(c byte) byte {
	switch {
	case '0' <= c && c <= '9':
		return c - '0'
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10
	}
	return 0
}

// requestIDs are a downlink's random ids, cut from one string.
type requestIDs struct {
	messageID   string // 24 hex digits, the first two the device's shard
	uid         string // 24 hex digits
	traceparent string // W3C trace context: 00-<trace id>-<span id>-01
}

// newIDs draws every random id of one downlink with one read of the
// random source and one allocation.
func newIDs(shard byte) requestIDs {
	var b [48]byte // messageId 12, _uid 12, trace id 16, span id 8
	_, _ = rand.Read(b[:])
	b[0] = shard
	const n = 24 + 24 + len("00-") + 32 + 1 + 16 + len("-01")
	var s [n]byte
	hex.Encode(s[0:24], b[0:12])
	hex.Encode(s[24:48], b[12:24])
	copy(s[48:], "00-")
	hex.Encode(s[51:83], b[24:40])
	s[83] = '-'
	hex.Encode(s[84:100], b[40:48])
	copy(s[100:], "-01")
	all := string(s[:])
	return requestIDs{messageID: all[0:24], uid: all[24:48], traceparent: all[48:]}
}
