package bench

import (
	"context"
	"crypto/rand"
	"os"
	"strings"
	"time"

	"devicehub/ingest/dynsec"
	"devicehub/ingest/mqttconn"

	mqtt "github.com/eclipse/paho.mqtt.golang"
)

// serviceLogin is devicehub's own broker login: the bench reads the
// broker's $SYS counters and removes ingest sessions with it, as the
// server under test uses it ($DEVICEHUB_MQTT_USERNAME and _PASSWORD, or
// mqttconn.DefaultLogin).
func serviceLogin() mqttconn.Login {
	l := mqttconn.DefaultLogin
	if u := os.Getenv("DEVICEHUB_MQTT_USERNAME"); u != "" {
		l.Username = u
	}
	if pw := os.Getenv("DEVICEHUB_MQTT_PASSWORD"); pw != "" {
		l.Password = pw
	}
	return l
}

// newGateway creates a broker login that may publish on every device's
// topics (dynsec.GatewayRole): the ingest generator plays a thousand
// devices on a few connections. remove deletes it.
func newGateway(ctx context.Context, broker string) (login mqttconn.Login, remove func(), err error) {
	admin, err := dialAdmin(ctx, broker)
	if err != nil {
		return login, nil, err
	}
	defer admin.Close()
	login = mqttconn.Login{Username: "bench-gw-" + strings.ToLower(rand.Text()[:8]), Password: rand.Text()}
	if err := dynsec.AddGateway(ctx, admin, login.Username, login.Password); err != nil {
		return login, nil, err
	}
	return login, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if admin, err := dialAdmin(ctx, broker); err == nil {
			_ = dynsec.RemoveLogin(ctx, admin, login.Username)
			admin.Close()
		}
	}, nil
}

func dialAdmin(ctx context.Context, broker string) (*dynsec.Client, error) {
	return dynsec.Dial(ctx, mqttconn.Config{Broker: broker, ClientID: "bench-admin-" + randHex(4), Login: serviceLogin()}, nil)
}

// pahoOptions are plain paho options for broker with l's login: the
// bench's load clients stand for devices and tools, not for devicehub's
// own clients (mqttconn), and keep paho's defaults.
func pahoOptions(l mqttconn.Login, broker, clientID string) *mqtt.ClientOptions {
	o := mqtt.NewClientOptions().AddBroker(broker).SetClientID(clientID)
	if l.Username != "" {
		o.SetUsername(l.Username)
		o.SetPassword(l.Password)
	}
	return o
}
