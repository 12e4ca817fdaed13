package forward

import (
	"fmt"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"devicehub/ingest/link"
)

// dialSink connects to a rule's other broker: the one place this package
// configures an MQTT client for a sink (to move to the project's shared
// MQTT client package once it exists). Clean session: what was not
// PUBACKed is published again by the sender, from the spool.
func dialSink(cfg MQTTSink, password, ruleID string, timeout time.Duration) (mqtt.Client, error) {
	id := cfg.ClientID
	if id == "" {
		id = "devicehub-forward-" + ruleID
	}
	o := link.Login{Username: cfg.Username, Password: password}.NewClientOptions(cfg.Broker, id).
		SetCleanSession(true).
		SetAutoReconnect(false).
		SetConnectRetry(false).
		SetConnectTimeout(timeout).
		SetWriteTimeout(timeout)
	if d := link.BufferedDialer(cfg.Broker, timeout); d != nil {
		o.SetCustomOpenConnectionFn(d)
	}
	c := mqtt.NewClient(o)
	if err := link.WaitToken(c.Connect(), timeout); err != nil {
		return nil, fmt.Errorf("mqtt connect %s: %w", link.BrokerName(cfg.Broker), err)
	}
	return c, nil
}
