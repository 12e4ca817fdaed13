package wire

import "strings"

// Topic levels after /{productId}/{deviceId}/ (DESIGN.md): uplink, then
// downlink.
const (
	LevelReport      = "properties/report"
	LevelEvent       = "event/" // + eventId
	LevelOnline      = "online"
	LevelOffline     = "offline"
	LevelReadReply   = "properties/read/reply"
	LevelInvokeReply = "function/invoke/reply"
	LevelRead        = "properties/read"
	LevelInvoke      = "function/invoke"

	// Property writes and the device shadow (meta/shadow): the write's
	// reply and the device's request for its whole shadow are uplinks;
	// the write, the shadow's delta and the answer to the request are
	// downlinks.
	LevelWriteReply     = "properties/write/reply"
	LevelShadowGet      = "shadow/get"
	LevelWrite          = "properties/write"
	LevelShadowDelta    = "shadow/delta"
	LevelShadowGetReply = "shadow/get/reply"

	// Firmware updates (ingest/firmware, FIRMWARE protocol): the device's
	// progress and version are uplinks, the upgrade a downlink.
	LevelFirmwareProgress = "firmware/progress"
	LevelFirmwareVersion  = "firmware/version"
	LevelFirmwareUpgrade  = "firmware/upgrade"
)

// MarkerDevice is the device level of the subscriber sessions' backlog
// markers (/{p}/$devicehub/online and /{p}/$devicehub/properties/report,
// ingest/backlog.go): "$" is in no device id, so no device can publish or
// receive on it.
const MarkerDevice = "$devicehub"

// DeviceTopic is /{productID}/{deviceID}/{level}; "+" as either id makes
// it a filter.
func DeviceTopic(productID, deviceID, level string) string {
	return "/" + productID + "/" + deviceID + "/" + level
}

// Kind is the kind of an uplink topic.
type Kind uint8

// Uplink topic kinds.
const (
	KindUnknown          Kind = iota
	KindReport                // /{p}/{d}/properties/report
	KindEvent                 // /{p}/{d}/event/{eventId}
	KindOnline                // /{p}/{d}/online (birth)
	KindOffline               // /{p}/{d}/offline (last will)
	KindReadReply             // /{p}/{d}/properties/read/reply
	KindInvokeReply           // /{p}/{d}/function/invoke/reply
	KindWriteReply            // /{p}/{d}/properties/write/reply
	KindShadowGet             // /{p}/{d}/shadow/get
	KindFirmwareProgress      // /{p}/{d}/firmware/progress
	KindFirmwareVersion       // /{p}/{d}/firmware/version
)

var messageTypes = [...]string{
	KindUnknown:     "UNKNOWN",
	KindReport:      "REPORT_PROPERTY",
	KindEvent:       "EVENT",
	KindOnline:      "ONLINE",
	KindOffline:     "OFFLINE",
	KindReadReply:   "READ_PROPERTY_REPLY",
	KindInvokeReply: "INVOKE_FUNCTION_REPLY",
	KindWriteReply:  "WRITE_PROPERTY_REPLY",
	KindShadowGet:   "SHADOW_GET",

	KindFirmwareProgress: "FIRMWARE_PROGRESS",
	KindFirmwareVersion:  "FIRMWARE_VERSION",
}

// MessageType is the message_type stored for the kind.
func (k Kind) MessageType() string {
	if int(k) < len(messageTypes) {
		return messageTypes[k]
	}
	return messageTypes[KindUnknown]
}

func (k Kind) String() string { return k.MessageType() }

// UplinkFilters are the MQTT topic filters of every uplink kind for the
// products in productIDs ("+" for all when empty): DataFilters and
// PresenceFilters.
func UplinkFilters(productIDs ...string) []string {
	return append(DataFilters(productIDs...), PresenceFilters(productIDs...)...)
}

// DataFilters are UplinkFilters but births and wills.
func DataFilters(productIDs ...string) []string {
	return filters(productIDs, LevelReport, LevelEvent+"+", LevelReadReply, LevelInvokeReply, LevelWriteReply, LevelShadowGet,
		LevelFirmwareProgress, LevelFirmwareVersion)
}

// PresenceFilters are the filters of births and wills (online, offline).
func PresenceFilters(productIDs ...string) []string {
	return filters(productIDs, LevelOnline, LevelOffline)
}

func filters(productIDs []string, levels ...string) []string {
	if len(productIDs) == 0 {
		productIDs = []string{"+"}
	}
	var out []string
	for _, p := range productIDs {
		for _, l := range levels {
			out = append(out, DeviceTopic(p, "+", l))
		}
	}
	return out
}

// IsMarker reports whether topic is on the device level MarkerDevice
// (/{p}/$devicehub/...): a subscriber session's backlog marker, which no
// device can publish.
func IsMarker(topic string) bool {
	rest, ok := strings.CutPrefix(topic, "/")
	if !ok {
		return false
	}
	_, rest, ok = strings.Cut(rest, "/")
	return ok && strings.HasPrefix(rest, MarkerDevice+"/")
}

// Topic is a parsed uplink topic.
type Topic struct {
	Kind      Kind
	ProductID string
	DeviceID  string
	EventID   string // KindEvent only
	Name      string // the topic as received
}

// ParseTopic parses an uplink topic; ok is false for anything else.
func ParseTopic(topic string) (t Topic, ok bool) {
	if len(topic) < 2 || topic[0] != '/' {
		return Topic{}, false
	}
	rest := topic[1:]
	i := strings.IndexByte(rest, '/')
	if i <= 0 {
		return Topic{}, false
	}
	t.ProductID, rest = rest[:i], rest[i+1:]
	i = strings.IndexByte(rest, '/')
	if i <= 0 {
		return Topic{}, false
	}
	t.DeviceID, rest = rest[:i], rest[i+1:]
	switch rest {
	case LevelReport:
		t.Kind = KindReport
	case LevelOnline:
		t.Kind = KindOnline
	case LevelOffline:
		t.Kind = KindOffline
	case LevelReadReply:
		t.Kind = KindReadReply
	case LevelInvokeReply:
		t.Kind = KindInvokeReply
	case LevelWriteReply:
		t.Kind = KindWriteReply
	case LevelShadowGet:
		t.Kind = KindShadowGet
	case LevelFirmwareProgress:
		t.Kind = KindFirmwareProgress
	case LevelFirmwareVersion:
		t.Kind = KindFirmwareVersion
	default:
		ev, found := strings.CutPrefix(rest, LevelEvent)
		if !found || ev == "" || strings.IndexByte(ev, '/') >= 0 {
			return Topic{}, false
		}
		t.Kind, t.EventID = KindEvent, ev
	}
	if strings.ContainsAny(t.ProductID, "+#") || strings.ContainsAny(t.DeviceID, "+#") {
		return Topic{}, false
	}
	t.Name = topic
	return t, true
}

// ParsePresenceTopic reads /{p}/{d}/online (birth) and /{p}/{d}/offline
// (last will); ok is false for any other topic, and for a device level
// with "$", which no device id has: the ingest sessions' backlog markers
// (MarkerDevice) are no device.
func ParsePresenceTopic(topic string) (deviceID string, online, ok bool) {
	t, ok := ParseTopic(topic)
	if !ok || (t.Kind != KindOnline && t.Kind != KindOffline) || strings.IndexByte(t.DeviceID, '$') >= 0 {
		return "", false, false
	}
	return t.DeviceID, t.Kind == KindOnline, true
}
