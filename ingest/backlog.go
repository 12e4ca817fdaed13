package ingest

import (
	"crypto/rand"
	"log/slog"
	"strings"
	"sync"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"devicehub/ingest/wire"
)

// A kept session's backlog (what the broker queued for it while devicehub
// was away) is delivered ahead of anything published after the session
// connects: Mosquitto queues a session's QoS 1 messages in order. So on
// each (re)connect a subscriber publishes a marker, QoS 1, to a topic its
// own uplink filters match, and its backlog is drained once that marker's
// acknowledgement is released: acks go out in broker order (ackorder.go),
// so every message that came before it has been stored or dropped by then.
// Readiness (/readyz "mqtt_backlog") waits for every session's marker.
//
// The marker topic is /{p}/$devicehub/online for the presence session and
// /{p}/$devicehub/properties/report for the data sessions (sessions.go),
// a level each one's filters hold: "$" is in no device id (meta's id
// rule), so no device can publish to it or be mistaken for it;
// {p} is "$devicehub", or the first product when the subscription is
// limited to some. The service login needs the right to publish there
// (ingest/dynsec ServiceACLs, granted on start); a broker that refuses it
// drops the connection, so after markerGiveUp connections lost with a
// marker out, readiness stops waiting for backlogs and says why in the log.
//
// Without a kept QoS 1 backlog there is nothing to wait for: at QoS 0 the
// broker queues nothing for an absent session, and a shared subscription's
// queue belongs to the group, whose markers any member may receive.
type backlog struct {
	data, presence string // the marker topics
	log            *slog.Logger

	// alarms, if set, is told of the alarm evaluator's markers
	// (AlarmHook.Marked) once their acknowledgement is released.
	alarms func(payload string)

	mu   sync.Mutex
	want map[string]marker // session key -> the marker it waits for
	lost int               // connections lost in a row with a marker out
	off  bool
}

// marker is a session's marker out: its payload, and the session's
// broker (Ingester.brokers' index).
type marker struct {
	payload string
	broker  int
}

// markerGiveUp is how many connections lost in a row with a marker out
// make readiness stop waiting for backlogs.
const markerGiveUp = 3

// markerTopic is the topic subscribers publish their markers to on level.
func markerTopic(productIDs []string, level string) string {
	p := wire.MarkerDevice
	if len(productIDs) > 0 {
		p = productIDs[0]
	}
	return wire.DeviceTopic(p, wire.MarkerDevice, level)
}

func newBacklog(opt Options, log *slog.Logger) *backlog {
	var alarms func(string)
	if opt.Alarms != nil {
		alarms = opt.Alarms.Marked
	}
	return &backlog{
		alarms:   alarms,
		data:     markerTopic(opt.ProductIDs, wire.LevelReport),
		presence: markerTopic(opt.ProductIDs, wire.LevelOnline),
		log:      log,
		want:     make(map[string]marker),
		off:      opt.QoS == 0 || opt.ShareGroup != NoShareGroup,
	}
}

// topicOf is the marker topic of the presence session, or of a data
// session.
func (b *backlog) topicOf(presence bool) string {
	if presence {
		return b.presence
	}
	return b.data
}

// mark publishes the marker of session id (Ingester.sessionKey) of broker
// on its connection c, which has just connected and subscribed (or renewed
// its subscription); presence: it is the presence session.
func (b *backlog) mark(c mqtt.Client, broker int, id string, presence bool) {
	payload := id + " " + rand.Text()
	b.mu.Lock()
	if b.off {
		b.mu.Unlock()
		return
	}
	b.want[id] = marker{payload, broker}
	b.mu.Unlock()
	go logFailure(b.log, "ingest: publishing the backlog marker failed", id, c.Publish(b.topicOf(presence), 1, false, payload))
}

// connectionLost notes that session id lost its connection; with its
// marker still out markerGiveUp times in a row, markers are given up.
func (b *backlog) connectionLost(id string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, out := b.want[id]; !out || b.off {
		return
	}
	if b.lost++; b.lost >= markerGiveUp {
		b.off = true
		clear(b.want)
		b.log.Warn("ingest: the broker dropped the connection "+
			"before the backlog marker came back, again and again; "+
			"the service login may lack the right to publish it: readiness no longer waits for backlogs",
			"topics", b.data+" "+b.presence, "times", b.lost)
	}
}

// arrived takes a marker received by session id on the connection whose
// acknowledgements order keeps. Any marker is acknowledged in its turn
// (other sessions' too: every session receives every marker); the one id
// waits for drains its backlog when its acknowledgement is released.
func (b *backlog) arrived(order *ackOrder, id string, m mqtt.Message) {
	mm := markerMessage{Message: m}
	payload := string(m.Payload())
	switch {
	case strings.HasPrefix(payload, id+" "):
		mm.drained = func() { b.drained(id, payload) }
	case b.alarms != nil && strings.HasPrefix(payload, AlarmMarkerPrefix):
		mm.drained = func() { b.alarms(payload) }
	}
	if m.Qos() == 0 {
		mm.Ack()
		return
	}
	order.settle(order.add(mm), true)
}

func (b *backlog) drained(id, payload string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.want[id].payload == payload {
		delete(b.want, id)
		b.lost = 0
	}
}

// Drained reports whether no session of broker (-1: of any broker) waits
// for its marker.
func (b *backlog) Drained(broker int) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.off || len(b.want) == 0 {
		return true
	}
	if broker < 0 {
		return false
	}
	for _, m := range b.want {
		if m.broker == broker {
			return false
		}
	}
	return true
}

// markerMessage is a marker in its connection's ack order: acknowledging
// it is not counted as a device message (Ingester.ack), and may drain the
// backlog.
type markerMessage struct {
	mqtt.Message
	drained func() // nil: another session's marker
}

// Ack acknowledges the marker to the broker and, if it is the one its
// session waits for, marks the backlog drained.
func (m markerMessage) Ack() {
	m.Message.Ack()
	if m.drained != nil {
		m.drained()
	}
}
