package forward

import (
	"context"
	"fmt"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"devicehub/ingest/mqttconn"
)

// dialSink connects to a rule's other broker (mqttconn sets the client
// up). Clean session: what was not PUBACKed is published again by the
// sender, from the spool.
func dialSink(cfg MQTTSink, password, ruleID string, timeout time.Duration) (mqtt.Client, error) {
	id := cfg.ClientID
	if id == "" {
		id = "devicehub-forward-" + ruleID
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	c, _, err := mqttconn.Dial(ctx, mqttconn.Config{Broker: cfg.Broker, ClientID: id,
		Login: mqttconn.Login{Username: cfg.Username, Password: password}, ConnectTimeout: timeout})
	if err != nil {
		return nil, fmt.Errorf("mqtt connect %s: %w", mqttconn.BrokerName(cfg.Broker), err)
	}
	return c, nil
}
