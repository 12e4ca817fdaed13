// Package dynsec speaks the control protocol of Mosquitto's
// dynamic-security plugin over MQTT (client.go), which holds the logins that
// are not devices': devicehub's service login and its rights, operators',
// and gateway logins of tests and the bench (rules.go). Device logins are in
// devicehub's own plugin (ingest/devauth), which speaks the same protocol on
// its own topic (DialTopic).
//
// It imports ingest/wire for the device topics its rules name, and
// nothing else of devicehub; it must not import api, meta or ingest.
package dynsec

import (
	"context"
	"crypto/rand"
	"devicehub/ingest/mqttconn"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
)

// ControlTopic is the dynamic-security plugin's control topic (Mosquitto
// 2.0); a plugin answers on its control topic + "/response".
const ControlTopic = "$CONTROL/dynamic-security/v1"

// Command is one command of the control API, e.g.
// {"command":"createClient","username":...}.
type Command map[string]any

// Response is the plugin's answer to one command.
type Response struct {
	Command         string          `json:"command"`
	Error           string          `json:"error"`
	CorrelationData string          `json:"correlationData"`
	Data            json.RawMessage `json:"data"`
}

// Err is the command's failure, or nil.
func (r Response) Err() error {
	if r.Error == "" {
		return nil
	}
	return fmt.Errorf("dynsec %s: %s", r.Command, r.Error)
}

// Client sends commands to the plugin on an MQTT connection whose login has
// the plugin's admin rights. It reconnects by itself.
type Client struct {
	c      mqtt.Client
	topic  string // the plugin's control topic
	prefix string // makes correlation data unique among the plugin's admins
	seq    atomic.Uint64

	mu      sync.Mutex
	waiting map[string]chan []Response
	// subscribed is closed while the responses' subscription of the
	// current connection stands; a new, open one replaces it when the
	// connection is lost. Do publishes only then: a response to a command
	// sent before the resubscription would be dropped, and its caller
	// would wait out its whole context.
	subscribed chan struct{}
	isSub      bool
}

// Dial connects as c (broker, client id, login; its session, resuming
// and handlers are Dial's) to the
// dynamic-security plugin's control topic and returns once the plugin's
// responses are subscribed. onConnect, when not nil, runs after every
// (re)connection once they are: what the plugin held may have changed
// while the connection was down.
func Dial(ctx context.Context, c mqttconn.Config, onConnect func()) (*Client, error) {
	return DialTopic(ctx, c, ControlTopic, onConnect)
}

// DialTopic is Dial for another plugin that speaks the dynamic-security
// plugin's control protocol on its own topic (devicehub's device-login
// plugin, ingest/devauth).
func DialTopic(ctx context.Context, c mqttconn.Config, topic string, onConnect func()) (*Client, error) {
	var b [6]byte
	_, _ = rand.Read(b[:])
	cl := &Client{topic: topic, prefix: fmt.Sprintf("%x", b), waiting: make(map[string]chan []Response),
		subscribed: make(chan struct{})}
	ready := make(chan error, 1)
	c.Persistent, c.Resume = false, true
	c.OnConnect = func(c mqtt.Client) {
		tok := c.Subscribe(topic+"/response", 0, cl.onResponse)
		err := errors.New("dynsec: subscribing to the plugin's responses timed out")
		if tok.WaitTimeout(10 * time.Second) {
			err = tok.Error()
		}
		select {
		case ready <- err:
		default:
		}
		if err == nil {
			cl.mu.Lock()
			if !cl.isSub {
				close(cl.subscribed)
				cl.isSub = true
			}
			cl.mu.Unlock()
		}
		if err == nil && onConnect != nil {
			onConnect()
		}
	}
	c.OnLost = func(mqtt.Client, error) { cl.failAll() }
	cl.c = mqttconn.New(c)
	if _, err := mqttconn.Connect(ctx, cl.c); err != nil {
		return nil, fmt.Errorf("dynsec: connect: %w", err)
	}
	select {
	case err := <-ready:
		if err != nil {
			cl.c.Disconnect(0)
			return nil, fmt.Errorf("dynsec: %w", err)
		}
	case <-ctx.Done():
		cl.c.Disconnect(0)
		return nil, fmt.Errorf("dynsec: connect: %w", ctx.Err())
	}
	return cl, nil
}

// Close disconnects.
func (cl *Client) Close() {
	cl.c.Disconnect(250)
	cl.failAll()
}

// ErrConnectionLost fails the commands in flight when the connection drops;
// whether the plugin carried them out is unknown.
var ErrConnectionLost = errors.New("dynsec: connection to the broker lost")

func (cl *Client) failAll() {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if cl.isSub {
		cl.subscribed, cl.isSub = make(chan struct{}), false
	}
	for id, ch := range cl.waiting {
		close(ch)
		delete(cl.waiting, id)
	}
}

// Do sends cmds in one control message and returns the plugin's response to
// each, in order. The error is about the exchange; each command's own
// failure is in its Response.
func (cl *Client) Do(ctx context.Context, cmds ...Command) ([]Response, error) {
	if len(cmds) == 0 {
		return nil, nil
	}
	id := cl.prefix + "-" + strconv.FormatUint(cl.seq.Add(1), 10)
	for i, c := range cmds {
		c["correlationData"] = id + "." + strconv.Itoa(i)
	}
	payload, err := json.Marshal(map[string]any{"commands": cmds})
	if err != nil {
		return nil, fmt.Errorf("dynsec: %w", err)
	}
	ch := make(chan []Response, 1)
	cl.mu.Lock()
	subscribed := cl.subscribed
	cl.mu.Unlock()
	select {
	case <-subscribed:
	case <-ctx.Done():
		return nil, fmt.Errorf("dynsec: waiting for the connection: %w", ctx.Err())
	}
	cl.mu.Lock()
	cl.waiting[id] = ch
	cl.mu.Unlock()
	defer func() {
		cl.mu.Lock()
		delete(cl.waiting, id)
		cl.mu.Unlock()
	}()
	tok := cl.c.Publish(cl.topic, 1, false, payload)
	select {
	case <-tok.Done():
		if err := tok.Error(); err != nil {
			return nil, fmt.Errorf("dynsec: publish: %w", err)
		}
	case <-ctx.Done():
		return nil, fmt.Errorf("dynsec: publish: %w", ctx.Err())
	}
	select {
	case rs, ok := <-ch:
		if !ok {
			return nil, ErrConnectionLost
		}
		if len(rs) != len(cmds) {
			return nil, fmt.Errorf("dynsec: %d responses to %d commands", len(rs), len(cmds))
		}
		return rs, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("dynsec: waiting for the plugin: %w", ctx.Err())
	}
}

// onResponse hands a response message to the Do call whose correlation
// data it carries; other admins' responses are ignored.
func (cl *Client) onResponse(_ mqtt.Client, m mqtt.Message) {
	var body struct {
		Responses []Response `json:"responses"`
	}
	if json.Unmarshal(m.Payload(), &body) != nil || len(body.Responses) == 0 {
		return
	}
	id, _, ok := strings.Cut(body.Responses[0].CorrelationData, ".")
	if !ok {
		return
	}
	cl.mu.Lock()
	ch := cl.waiting[id]
	delete(cl.waiting, id)
	cl.mu.Unlock()
	if ch != nil {
		ch <- body.Responses
	}
}
