package ingest

import (
	"context"
	"slices"

	"devicehub/ingest/mqttconn"
	"devicehub/ingest/wire"
)

// Subscriber sessions. At each broker an instance holds Connections
// sessions for the devices' data (reports, events, replies, shadow and
// firmware requests: ClientID-0 to ClientID-<Connections-1>) and one for
// their births and wills (ClientID-<Connections>). Presence has a session
// of its own so that it never waits behind telemetry: the broker queues
// each session's QoS 1 messages in order, and in a connection storm,
// with ingest behind the devices' reports by a minute, a birth on the
// shared session was stored that minute late, and PostgreSQL's online
// count trailed the devices connected (bench fleet-connect). A device's
// birth and will stay in order with each other, on the one session; its
// reports need no order with them (each row has its own time).
//
// Both kinds publish their backlog markers (backlog.go) to the same
// topic, /{p}/$devicehub/online: the presence filters match it, and the
// data sessions subscribe to it besides their own.

// sessionKind is what a subscriber session is for.
type sessionKind int

const (
	sessionData     sessionKind = iota // every uplink but births and wills
	sessionPresence                    // births and wills
	sessionRetired                     // left by a run with more connections: drained, subscribed to nothing
)

// presenceLevels are the topic levels of the presence sessions.
var presenceLevels = []string{wire.LevelOnline, wire.LevelOffline}

// presenceFilters are the filters of births and wills of the products
// ("+" for all when none).
func presenceFilters(productIDs []string) []string {
	var fs []string
	for _, p := range productsOrAll(productIDs) {
		for _, l := range presenceLevels {
			fs = append(fs, wire.DeviceTopic(p, "+", l))
		}
	}
	return fs
}

// dataFilters are the uplink filters but the presence ones, and the
// backlog markers' topic.
func dataFilters(productIDs []string) []string {
	var fs []string
	for _, f := range wire.UplinkFilters(productIDs...) {
		if !slices.Contains(presenceFilters(productIDs), f) {
			fs = append(fs, f)
		}
	}
	for _, p := range productsOrAll(productIDs) {
		fs = append(fs, wire.DeviceTopic(p, wire.MarkerDevice, wire.LevelOnline))
	}
	return fs
}

func productsOrAll(productIDs []string) []string {
	if len(productIDs) == 0 {
		return []string{"+"}
	}
	return productIDs
}

// filterSet is filters in the options' subscription form (plain or in the
// share group) at the options' QoS.
func filterSet(opt Options, filters []string) map[string]byte {
	m := make(map[string]byte, len(filters))
	for _, f := range filters {
		m[shareForm(opt.ShareGroup, f)] = opt.QoS
	}
	return m
}

// shareForm is filter f as subscribed with share group g.
func shareForm(g, f string) string {
	if g == NoShareGroup {
		return f
	}
	return "$share/" + g + "/" + f
}

// Subscriber sessions beyond this run's own: those a run with more
// connections, or with the other subscription form, left on the broker.

// maxRetired bounds how many session ids past Connections New looks at.
const maxRetired = 64

// retireSessions takes over, at broker b, the persistent sessions that a run with more
// connections left behind: ids ClientID-n for n = Connections+1,
// Connections+2, ... up to the first one the broker does not have (the
// presence session is ClientID-<Connections>). Such a
// session stays in the share group while nobody is connected to it, and
// Mosquitto keeps queueing its share of every device's messages for it,
// so lowering Connections would have parked part of the traffic on the
// broker until a connection with that id came back. Each one found is
// connected like a subscriber, so its backlog is stored and acknowledged
// as usual, and unsubscribed, so it gets no new share; it stays connected
// until Close. Its session, now without subscriptions, is left on the
// broker (removing it could drop a message not yet acknowledged), so each
// start takes it over again, for one idle connection.
func (in *Ingester) retireSessions(ctx context.Context, b int) error {
	for n := in.opt.Connections + 1; n < in.opt.Connections+1+maxRetired; n++ {
		c, present, err := in.connect(ctx, b, in.sessionID(n), sessionRetired)
		if err != nil {
			return err
		}
		if !present {
			return nil
		}
		in.clients = append(in.clients, c)
		in.atBroker = append(in.atBroker, b)
		in.log.Info("ingest retired a subscriber session left by a run with more connections",
			"client", in.sessionID(n), "broker", mqttconn.BrokerName(in.brokers[b]))
	}
	return nil
}

// retiredFilters are the filters a retired session may still hold: the
// uplink filters and the markers', plain and in this share group, so that
// a session of a run without a share group leaves too. (A session
// subscribed in another share group keeps that subscription.)
func (in *Ingester) retiredFilters() []string {
	var fs []string
	for _, f := range in.anyFilters() {
		fs = append(fs, f)
		if in.opt.ShareGroup != NoShareGroup {
			fs = append(fs, shareForm(in.opt.ShareGroup, f))
		}
	}
	return fs
}

// anyFilters are the filters of either kind of session.
func (in *Ingester) anyFilters() []string {
	return append(dataFilters(in.opt.ProductIDs), presenceFilters(in.opt.ProductIDs)...)
}

// otherFilters are the filters a session of kind may hold from an earlier
// run and must leave: those of the other kind (the session was the other
// kind's in a run with other Connections, or in a run from before
// presence had sessions of its own), and every filter in the subscription
// form this instance does not use (plain ones for a share group, and
// those of the former default group "devicehub" without one). A session
// kept so would otherwise get messages that are not its kind's, or every
// message twice.
func (in *Ingester) otherFilters(kind sessionKind) []string {
	other := "devicehub"
	if in.opt.ShareGroup != NoShareGroup {
		other = NoShareGroup
	}
	var fs []string
	for _, f := range in.anyFilters() {
		if _, mine := in.filters[kind][shareForm(in.opt.ShareGroup, f)]; !mine {
			fs = append(fs, shareForm(in.opt.ShareGroup, f))
		}
		fs = append(fs, shareForm(other, f))
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
