package ingest

import (
	"context"
	"fmt"
	"strconv"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"devicehub/ingest/mqttconn"
	"devicehub/ingest/wire"
)

// An instance's sessions at each broker of its pool, all persistent:
//   - data sessions, "<ClientID>-<n>" for n < Connections: every uplink but
//     births and wills (wire.DataFilters), in the share group if any;
//   - the presence session, "<ClientID>-presence": births and wills
//     (wire.PresenceFilters), in the same group. A birth queued behind
//     reports waited for every report ahead of it to be stored: in a
//     storm of 100,000 devices, 25 s to 88 s (bench fleet-connect), which
//     is how long PostgreSQL showed a connected device offline. In their
//     own session they are not behind the reports, only behind other
//     births and wills. The state writer orders a device's state by the
//     arrival of its births and wills, which all travel in this one
//     session, in the order the broker took them; reports change no state,
//     so their order against births does not matter to it (the shadow
//     reads reported values from ClickHouse, up to a flush late anyway);
//   - sessions a run with more connections, or with the other
//     subscription form, left on the broker (below).

// role of a subscriber session.
type role uint8

const (
	roleData     role = iota // every uplink but births and wills
	rolePresence             // births and wills
	roleRetired              // left by a run with more connections: stores its backlog, subscribes to nothing
)

// session is what a subscriber connection's callback knows of itself.
type session struct {
	order  *ackOrder // its acknowledgements, in the broker's order
	broker int8      // Ingester.brokers' index
	key    string    // Ingester.sessionKey
	role   role
}

// presenceID is the client id of the presence session, the same at each
// broker of the pool.
func (in *Ingester) presenceID() string { return in.opt.ClientID + presenceSuffix }

const presenceSuffix = "-presence"

// SessionIDs are the client ids of the subscriber sessions an Ingester
// with options o keeps at each broker: its data sessions, then its
// presence session (not those it retires). An instance removed for good
// leaves them behind; a clean-session connect with each id ends them.
func SessionIDs(o Options) []string {
	o = o.withDefaults()
	ids := make([]string, 0, o.Connections+1)
	for n := range o.Connections {
		ids = append(ids, o.ClientID+"-"+strconv.Itoa(n))
	}
	return append(ids, o.ClientID+presenceSuffix)
}

// shared is filter f in the subscription form of Options.ShareGroup.
func (in *Ingester) shared(f string) string {
	if in.opt.ShareGroup == NoShareGroup {
		return f
	}
	return "$share/" + in.opt.ShareGroup + "/" + f
}

// handOver ends the data sessions' subscription to births and wills at
// broker b, once presence session p holds its own (kept from an earlier
// run, or new and subscribed). Only data sessions kept from a run before
// the presence session existed still hold them; for the others the
// unsubscription is a no-op. In a share group the presence session is a
// member of the same group, and each birth goes to one of them. With
// plain subscriptions the broker sends what comes in between to both: h,
// set when a data session was kept and the presence session is new,
// splits the two streams at a marker (handoff.go), which is published
// before the data sessions let go.
func (in *Ingester) handOver(b int, p mqtt.Client, data []mqtt.Client, h *handoff) error {
	if h != nil {
		if in.opt.handoffSubscribed != nil {
			in.opt.handoffSubscribed()
		}
		wait := in.opt.ConnectTimeout * connectAttempts // a broker in a storm answers late
		if err := mqttconn.WaitToken(p.Publish(in.backlog.topicOf(true), 1, false, h.split), wait); err != nil {
			return fmt.Errorf("ingest: handing births and wills over to %s at %s: %w", in.presenceID(), mqttconn.BrokerName(in.brokers[b]), err)
		}
		go logFailure(in.log, "ingest: publishing the handoff's data marker failed", in.presenceID(), p.Publish(in.backlog.topicOf(false), 1, false, h.after))
	}
	for n, c := range data {
		in.releasePresence(c, in.sessionID(n))
	}
	return nil
}

// releasePresence unsubscribes data session c from births and wills,
// without waiting: the broker answers behind the session's backlog.
func (in *Ingester) releasePresence(c mqtt.Client, id string) {
	fs := make([]string, 0, len(in.presenceFilters))
	for f := range in.presenceFilters {
		fs = append(fs, f)
	}
	go logFailure(in.log, "ingest: unsubscribing a data session from births and wills failed", id, c.Unsubscribe(fs...))
}

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
		c, present, err := in.connect(ctx, b, in.sessionID(n), roleRetired, nil)
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
