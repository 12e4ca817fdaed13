package mqttconn

import (
	"context"
	"errors"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
)

// Login is devicehub's own login at the broker: with Mosquitto, a client
// of the dynamic-security plugin whose rights the dynsec package keeps
// (every uplink, downlinks, the plugin's control topic). An empty Username
// connects anonymously, which the project's broker refuses.
type Login struct {
	Username, Password string
}

// DefaultLogin is the service login `make run` and the tests' brokers are
// set up with (.ci/mosquitto-setup).
var DefaultLogin = Login{Username: "devicehub", Password: "devicehub-dev"}

// DefaultBrokerURL is the broker a role's options default to: the
// project's Mosquitto (.ci/services).
const DefaultBrokerURL = "tcp://127.0.0.1:1884"

// Defaults fills a role's broker setting left empty: url with
// DefaultBrokerURL, login with DefaultLogin.
func Defaults(url *string, login *Login) {
	if *url == "" {
		*url = DefaultBrokerURL
	}
	if *login == (Login{}) {
		*login = DefaultLogin
	}
}

// ReconnectEvery is how often a Resume client tries a lost connection
// again: the broker's return is noticed within this long.
const ReconnectEvery = 250 * time.Millisecond

// DefaultConnectTimeout bounds a connect when Config.ConnectTimeout is 0.
const DefaultConnectTimeout = 10 * time.Second

// Config is one client's setup, every option a devicehub role chooses in
// one field; the rest is the same for all (see Options).
type Config struct {
	// Broker is the broker's URL, one element of a Brokers list.
	Broker string
	// ClientID must be unique among the broker's clients.
	ClientID string
	// Login is the client's login; the zero Login connects anonymously.
	Login Login
	// Persistent asks the broker to keep the session (clean session off):
	// its subscriptions and the QoS 1 messages queued while the client was
	// away are there at the next connect with the same ClientID. Without
	// it the session starts and ends with the connection.
	Persistent bool
	// Resume reconnects a lost connection, trying every ReconnectEvery,
	// and resends what was in flight; without it a lost connection stays
	// lost.
	Resume bool
	// ManualAck leaves each received QoS 1 message unacknowledged until
	// its Ack is called: one not acknowledged when the connection ends is
	// delivered again (to a Persistent session's next connection).
	ManualAck bool
	// Store keeps the client's in-flight messages; nil is paho's memory
	// store without the inbound publishes paho never reads back
	// (store.go).
	Store mqtt.Store
	// KeepAlive and PingTimeout of the connection; 0 takes paho's (30 s
	// and 10 s).
	KeepAlive, PingTimeout time.Duration
	// ConnectTimeout bounds dialling and the broker's CONNACK; 0 is
	// DefaultConnectTimeout.
	ConnectTimeout time.Duration
	// OnMessage receives the messages no subscription's own handler takes
	// (those of a Persistent session's kept subscriptions, among others).
	OnMessage mqtt.MessageHandler
	// OnConnect runs after every connection (the first and each resumed
	// one), OnLost when a connection is lost.
	OnConnect mqtt.OnConnectHandler
	OnLost    mqtt.ConnectionLostHandler
}

// Options are the paho options of c. Besides c's own choices every client
// delivers messages in order, on one goroutine (a blocked handler holds
// the connection: the backpressure that keeps a broker's flow bounded),
// never retries its first connect (the caller decides), speaks MQTT 3.1.1
// only, and reads and
// writes a tcp:// or mqtt:// broker through a buffered connection without
// Nagle's delay (BufferedDialer).
func (c Config) Options() *mqtt.ClientOptions {
	timeout := c.ConnectTimeout
	if timeout <= 0 {
		timeout = DefaultConnectTimeout
	}
	o := mqtt.NewClientOptions().AddBroker(c.Broker).SetClientID(c.ClientID).
		SetCleanSession(!c.Persistent).
		SetOrderMatters(true).
		SetAutoReconnect(c.Resume).
		SetConnectRetry(false).
		SetAutoAckDisabled(c.ManualAck).
		SetConnectTimeout(timeout).
		// MQTT 3.1.1 only: left to itself, paho answers a CONNECT that
		// timed out with a second connection in MQTT 3.1, past the
		// deadline already, and would keep 3.1 if a late broker took it.
		SetProtocolVersion(4)
	if c.Login.Username != "" {
		o.SetUsername(c.Login.Username)
		o.SetPassword(c.Login.Password)
	}
	if c.Resume {
		o.SetMaxReconnectInterval(ReconnectEvery) // back within moments of the broker
	}
	if c.Store != nil {
		o.SetStore(c.Store)
	} else {
		o.SetStore(newLeanStore())
	}
	if c.KeepAlive > 0 {
		o.SetKeepAlive(c.KeepAlive)
	}
	if c.PingTimeout > 0 {
		o.SetPingTimeout(c.PingTimeout)
	}
	if c.OnMessage != nil {
		o.SetDefaultPublishHandler(c.OnMessage)
	}
	if c.OnConnect != nil {
		o.SetOnConnectHandler(c.OnConnect)
	}
	if c.OnLost != nil {
		o.SetConnectionLostHandler(c.OnLost)
	}
	if fn := BufferedDialer(c.Broker, timeout); fn != nil {
		o.SetCustomOpenConnectionFn(fn)
	}
	return o
}

// New returns c's client, not connected: Connect it (or Dial instead).
func New(c Config) mqtt.Client { return mqtt.NewClient(c.Options()) }

// Connect connects cl and waits for the broker's answer or ctx's end,
// whichever comes first; on ctx's end the attempt is abandoned and cl
// disconnected. sessionPresent reports that the broker resumed a kept
// session (Config.Persistent), whose subscriptions stand.
func Connect(ctx context.Context, cl mqtt.Client) (sessionPresent bool, err error) {
	t := cl.Connect()
	select {
	case <-t.Done():
	case <-ctx.Done():
		cl.Disconnect(0)
		return false, ctx.Err()
	}
	if err := t.Error(); err != nil {
		return false, err
	}
	ct, ok := t.(*mqtt.ConnectToken)
	return ok && ct.SessionPresent(), nil
}

// Dial is New and Connect: c's client, connected. On an error the client
// is dropped.
func Dial(ctx context.Context, c Config) (cl mqtt.Client, sessionPresent bool, err error) {
	cl = New(c)
	sessionPresent, err = Connect(ctx, cl)
	if err != nil {
		return nil, false, err
	}
	return cl, sessionPresent, nil
}

// WaitToken waits for t up to d and returns its error, or
// ErrBrokerTimeout.
func WaitToken(t mqtt.Token, d time.Duration) error {
	if !t.WaitTimeout(d) {
		return ErrBrokerTimeout
	}
	return t.Error()
}

// ErrBrokerTimeout: an MQTT operation (connect, subscribe) was not
// answered in time.
var ErrBrokerTimeout = errors.New("mqttconn: MQTT operation timed out")
