package ingest

import (
	"context"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"devicehub/ingest/mqttconn"
	"devicehub/ingest/wire"
)

// Subscriber sessions beyond this run's own: those a run with more
// connections, or with the other subscription form, left on the broker.

// maxRetired bounds how many session ids past Connections New looks at.
const maxRetired = 64

// retireSessions takes over, at broker b, the persistent sessions that a run with more
// connections left behind: ids ClientID-n for n = Connections,
// Connections+1, ... up to the first one the broker does not have. Such a
// session stays in the share group while nobody is connected to it, and
// Mosquitto keeps queueing its share of every device's messages for it,
// so lowering Connections would have parked part of the traffic on the
// broker until a connection with that id came back. Each one found is
// connected like a subscriber, so its backlog is stored and acknowledged
// as usual, and unsubscribed, so it gets no new share; it stays connected
// until Close. Its session, now without subscriptions, is left on the
// broker (removing it could drop a message not yet acknowledged), so each
// start takes it over again, for one idle connection.
func (in *Ingester) retireSessions(ctx context.Context, b int) (out []mqtt.Client, err error) {
	for n := in.opt.Connections; n < in.opt.Connections+maxRetired; n++ {
		c, present, err := in.connect(ctx, b, in.sessionID(n), true)
		if err != nil {
			return out, err
		}
		if !present {
			return out, nil
		}
		out = append(out, c)
		in.log.Info("ingest retired a subscriber session left by a run with more connections",
			"client", in.sessionID(n), "broker", mqttconn.BrokerName(in.brokers[b]))
	}
	return out, nil
}

// retiredFilters are the filters a retired session may still hold: the
// uplink filters, plain and in this share group, so that a session of a
// run without a share group leaves too. (A session subscribed in another
// share group keeps that subscription.)
func (in *Ingester) retiredFilters() []string {
	var fs []string
	for _, f := range wire.UplinkFilters(in.opt.ProductIDs...) {
		fs = append(fs, f)
		if in.opt.ShareGroup != NoShareGroup {
			fs = append(fs, "$share/"+in.opt.ShareGroup+"/"+f)
		}
	}
	return fs
}

// otherFilters are the uplink filters in the subscription form this
// instance does not use: plain ones for a share group, and those of the
// former default group "devicehub" without one. A session kept from a run
// with the other form would otherwise get every message twice.
func (in *Ingester) otherFilters() []string {
	var fs []string
	for _, f := range wire.UplinkFilters(in.opt.ProductIDs...) {
		if in.opt.ShareGroup == NoShareGroup {
			fs = append(fs, "$share/devicehub/"+f)
		} else {
			fs = append(fs, f)
		}
	}
	return fs
}

// removeSession ends the broker's session for id with a clean-session
// connect; failing that, an empty session without subscriptions stays,
// which costs the broker nothing but its entry.
func (in *Ingester) removeSession(broker, id string) {
	c := mqttconn.New(mqttconn.Config{Broker: broker, ClientID: id, Login: in.opt.Login, ConnectTimeout: in.opt.ConnectTimeout})
	if err := mqttconn.WaitToken(c.Connect(), in.opt.ConnectTimeout); err != nil {
		in.log.Debug("ingest: removing an empty session failed", "client", id, "err", err)
		return
	}
	c.Disconnect(0)
}
