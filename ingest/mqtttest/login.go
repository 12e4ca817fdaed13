package mqtttest

import (
	"context"
	"crypto/rand"
	"os"
	"strings"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"devicehub/ingest/dynsec"
	"devicehub/ingest/mqttconn"
)

// SharedURL is the broker the tests share (the one `make test` starts):
// $DEVICEHUB_TEST_MQTT_URL, default tcp://127.0.0.1:1884.
func SharedURL() string {
	if v := os.Getenv("DEVICEHUB_TEST_MQTT_URL"); v != "" {
		return v
	}
	return "tcp://127.0.0.1:1884"
}

// Service returns devicehub's service login, the one the project's
// brokers are set up with (.ci/mosquitto-setup): $DEVICEHUB_MQTT_USERNAME
// and $DEVICEHUB_MQTT_PASSWORD, default devicehub / devicehub-dev.
func Service() (username, password string) {
	username, password = os.Getenv("DEVICEHUB_MQTT_USERNAME"), os.Getenv("DEVICEHUB_MQTT_PASSWORD")
	if username == "" {
		username = "devicehub"
	}
	if password == "" {
		password = "devicehub-dev"
	}
	return username, password
}

// ServiceOptions are paho options for brokerURL with the service login.
func ServiceOptions(brokerURL, clientID string) *mqtt.ClientOptions {
	u, p := Service()
	return mqtt.NewClientOptions().AddBroker(brokerURL).SetClientID(clientID).SetUsername(u).SetPassword(p)
}

// ServiceConfig is the mqttconn setup of a client of brokerURL with the
// service login (dynsec.Dial takes one).
func ServiceConfig(brokerURL, clientID string) mqttconn.Config {
	u, p := Service()
	return mqttconn.Config{Broker: brokerURL, ClientID: clientID, Login: mqttconn.Login{Username: u, Password: p}}
}

// Gateway gives the test a broker login with dynsec.GatewayRole (and the
// service login its rights): it may publish on every device's topics and
// subscribe to them, as a gateway in front of simulated devices would. For tests of what devicehub does with
// device traffic (device trust is tested with each device's own login).
// It returns an option setter for ConnectDevice or mqtt.NewClientOptions;
// the login is removed when the test ends.
func Gateway(t testing.TB, brokerURL string) func(*mqtt.ClientOptions) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin := dialAdmin(ctx, t, brokerURL)
	defer admin.Close()
	username, password := "test-gw-"+strings.ToLower(rand.Text()[:10]), rand.Text()
	// Tests that use the gateway send downlinks with the service login,
	// which has their rights once a devicehub has run on the broker.
	svc, _ := Service()
	if err := dynsec.EnsureService(ctx, admin, svc); err != nil {
		t.Fatalf("service login rights: %v", err)
	}
	if err := dynsec.AddGateway(ctx, admin, username, password); err != nil {
		t.Fatalf("gateway login: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		admin := dialAdmin(ctx, t, brokerURL)
		defer admin.Close()
		_ = dynsec.RemoveLogin(ctx, admin, username)
	})
	return func(o *mqtt.ClientOptions) { o.SetUsername(username).SetPassword(password) }
}

// dialAdmin connects to the broker's dynamic-security plugin with the
// service login.
func dialAdmin(ctx context.Context, t testing.TB, brokerURL string) *dynsec.Client {
	t.Helper()
	c, err := dynsec.Dial(ctx, ServiceConfig(brokerURL, "test-admin-"+strings.ToLower(rand.Text()[:10])), nil)
	if err != nil {
		t.Fatalf("dynsec admin: %v", err)
	}
	return c
}
