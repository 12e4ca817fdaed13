package forward

import (
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	"devicehub/schema"
)

// Sink kinds.
const (
	KindWebhook = "webhook"
	KindMQTT    = "mqtt"
)

// Message types a rule forwards (Rule.Types; none: all).
const (
	TypeProperty = "property" // a property report
	TypeEvent    = "event"    // a thing-model event
	TypeOnline   = "online"   // a birth
	TypeOffline  = "offline"  // a last will
)

var allTypes = []string{TypeProperty, TypeEvent, TypeOnline, TypeOffline}

// Rule is a forwarding rule: which messages of a product (DeviceIDs,
// Types, Properties narrow them; empty: all) go to which sink. Exactly
// one of Webhook and MQTT is set, the one Kind names. Secret is
// write-only (the webhook's HMAC key, the broker password); an update
// with an empty Secret keeps the stored one. Status is the forwarder's
// last word on the rule (API answers only).
type Rule struct {
	ID         string       `json:"id"`
	Name       string       `json:"name"`
	ProductID  string       `json:"productId"`
	DeviceIDs  []string     `json:"deviceIds"`
	Types      []string     `json:"types"`
	Properties []string     `json:"properties"`
	Kind       string       `json:"kind"`
	Webhook    *WebhookSink `json:"webhook,omitempty"`
	MQTT       *MQTTSink    `json:"mqtt,omitempty"`
	Secret     string       `json:"secret,omitempty"`
	HasSecret  bool         `json:"hasSecret"`
	Enabled    bool         `json:"enabled"`
	CreatorID  string       `json:"creatorId,omitempty"`
	CreateTime int64        `json:"createTime"`
	ModifyTime int64        `json:"modifyTime"`
	Status     *Status      `json:"status,omitempty"`
}

// WebhookSink posts batches of messages as JSON lines
// (application/x-ndjson): a request when BatchSize messages are waiting or
// the oldest has waited BatchMs. Only a 2xx answer is success. With a
// secret the body is signed as notify's webhook channel signs:
// X-Devicehub-Signature: sha256=<hex of HMAC-SHA256(secret, body)>.
type WebhookSink struct {
	URL       string            `json:"url"`
	Headers   map[string]string `json:"headers,omitempty"`
	BatchSize int               `json:"batchSize"`
	BatchMs   int64             `json:"batchMs"`
	TimeoutMs int64             `json:"timeoutMs"`
}

// MQTTSink publishes each message at QoS 1 to Topic on another broker;
// Topic may name {productId}, {deviceId}, {type} and {eventId}. The
// secret is Username's password. BatchSize is the window: how many
// publishes may await their PUBACK at once (the sender publishes on
// while earlier ones are unacknowledged); TimeoutMs how long one may.
type MQTTSink struct {
	Broker    string `json:"broker"`
	Topic     string `json:"topic"`
	Username  string `json:"username,omitempty"`
	ClientID  string `json:"clientId,omitempty"`
	BatchSize int    `json:"batchSize"`
	TimeoutMs int64  `json:"timeoutMs"`
}

// Status is a rule's forwarding state, as the forwarder's owner last
// wrote it (about every second). LagMs is the age of the oldest message
// not yet accepted by the sink (0: caught up); Pending the messages
// spooled and not yet accepted, SpooledBytes the spool's size on disk;
// Dropped the messages removed unsent at the spool's bound, Sent those
// the sink accepted, Failed the requests (or publishes) it refused or
// that failed.
type Status struct {
	Owner        string `json:"owner"`
	LagMs        int64  `json:"lagMs"`
	Pending      int64  `json:"pending"`
	SpooledBytes int64  `json:"spooledBytes"`
	Dropped      int64  `json:"dropped"`
	Sent         int64  `json:"sent"`
	Failed       int64  `json:"failed"`
	LastError    string `json:"lastError,omitempty"`
	UpdateTime   int64  `json:"updateTime"`
}

// Defaults and limits.
const (
	DefaultBatchSize = 500
	DefaultBatchMs   = 100
	DefaultTimeout   = 10 * time.Second
	DefaultTopic     = "devicehub/{productId}/{deviceId}/{type}"
	maxBatchSize     = 10000
)

// Public is r as the API shows it: without its secret.
func (r Rule) Public() Rule {
	r.Secret = ""
	return r
}

// Normalize fills defaults and checks r; the error names the field.
func (r *Rule) Normalize() error {
	r.Name = strings.TrimSpace(r.Name)
	if r.Name == "" || len(r.Name) > 200 {
		return schema.Invalid("name", "required, at most 200 characters")
	}
	if r.ProductID == "" || len(r.ProductID) > 64 || strings.ContainsAny(r.ProductID, "/+#") {
		return schema.Invalid("productId", "required, at most 64 characters, no / + #")
	}
	if len(r.DeviceIDs) > 10000 {
		return schema.Invalid("deviceIds", "at most 10000")
	}
	for i, d := range r.DeviceIDs {
		if d == "" || len(d) > 64 || strings.ContainsAny(d, "/+#") {
			return schema.Invalid(fmt.Sprintf("deviceIds[%d]", i), "a device id: 1 to 64 characters, no / + #")
		}
	}
	for i, t := range r.Types {
		if !slices.Contains(allTypes, t) {
			return schema.Invalid(fmt.Sprintf("types[%d]", i), "%q is none of property, event, online, offline", clip(t))
		}
	}
	if len(r.Properties) > 1000 {
		return schema.Invalid("properties", "at most 1000")
	}
	for i, p := range r.Properties {
		if p == "" || len(p) > 64 {
			return schema.Invalid(fmt.Sprintf("properties[%d]", i), "a property id: 1 to 64 characters")
		}
	}
	if len(r.Properties) > 0 && len(r.Types) > 0 && !slices.Contains(r.Types, TypeProperty) {
		return schema.Invalid("properties", "given while types leave out property")
	}
	r.DeviceIDs, r.Types, r.Properties = uniq(r.DeviceIDs), uniq(r.Types), uniq(r.Properties)
	if (r.Webhook == nil) == (r.MQTT == nil) {
		return schema.Invalid("kind", "exactly one of webhook and mqtt must be given")
	}
	if r.Webhook != nil {
		if r.Kind != "" && r.Kind != KindWebhook {
			return schema.Invalid("kind", "%q does not match the webhook settings", clip(r.Kind))
		}
		r.Kind = KindWebhook
		return r.Webhook.normalize()
	}
	if r.Kind != "" && r.Kind != KindMQTT {
		return schema.Invalid("kind", "%q does not match the mqtt settings", clip(r.Kind))
	}
	r.Kind = KindMQTT
	return r.MQTT.normalize()
}

func (w *WebhookSink) normalize() error {
	u, err := url.Parse(w.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return schema.Invalid("webhook.url", "an http or https URL")
	}
	for k, v := range w.Headers {
		if k == "" || strings.ContainsAny(k, " :\r\n") || strings.ContainsAny(v, "\r\n") {
			return schema.Invalid("webhook.headers", "header %q: a name without spaces or colons, a value on one line", clip(k))
		}
	}
	if w.BatchSize == 0 {
		w.BatchSize = DefaultBatchSize
	}
	if w.BatchSize < 1 || w.BatchSize > maxBatchSize {
		return schema.Invalid("webhook.batchSize", "1 to %d", maxBatchSize)
	}
	if w.BatchMs == 0 {
		w.BatchMs = DefaultBatchMs
	}
	if w.BatchMs < 1 || w.BatchMs > 60000 {
		return schema.Invalid("webhook.batchMs", "1 to 60000")
	}
	if w.TimeoutMs == 0 {
		w.TimeoutMs = DefaultTimeout.Milliseconds()
	}
	if w.TimeoutMs < 1 || w.TimeoutMs > 300000 {
		return schema.Invalid("webhook.timeoutMs", "1 to 300000")
	}
	return nil
}

func (m *MQTTSink) normalize() error {
	u, err := url.Parse(m.Broker)
	if err != nil || (u.Scheme != "tcp" && u.Scheme != "ssl" && u.Scheme != "mqtt" && u.Scheme != "mqtts") || u.Host == "" {
		return schema.Invalid("mqtt.broker", "a tcp://, ssl://, mqtt:// or mqtts:// URL")
	}
	if m.Topic == "" {
		m.Topic = DefaultTopic
	}
	if len(m.Topic) > 1000 || strings.ContainsAny(m.Topic, "+#\x00") {
		return schema.Invalid("mqtt.topic", "a topic (placeholders {productId} {deviceId} {type} {eventId}), no wildcards")
	}
	if m.BatchSize == 0 {
		m.BatchSize = DefaultBatchSize
	}
	if m.BatchSize < 1 || m.BatchSize > maxBatchSize {
		return schema.Invalid("mqtt.batchSize", "1 to %d", maxBatchSize)
	}
	if m.TimeoutMs == 0 {
		m.TimeoutMs = DefaultTimeout.Milliseconds()
	}
	if m.TimeoutMs < 1 || m.TimeoutMs > 300000 {
		return schema.Invalid("mqtt.timeoutMs", "1 to 300000")
	}
	if len(m.ClientID) > 200 {
		return schema.Invalid("mqtt.clientId", "at most 200 characters")
	}
	return nil
}

func clip(s string) string {
	if len(s) > 80 {
		return s[:80]
	}
	return s
}

func uniq(xs []string) []string {
	if len(xs) == 0 {
		return []string{}
	}
	out := slices.Clone(xs)
	slices.Sort(out)
	return slices.Compact(out)
}

// batchSize is how many messages a request carries at most (an MQTT
// sink's window); batchWait how long a partial batch waits for more.
func (r *Rule) batchSize() int {
	if r.Webhook != nil {
		return r.Webhook.BatchSize
	}
	return r.MQTT.BatchSize
}

func (r *Rule) batchWait() time.Duration {
	if r.Webhook != nil {
		return time.Duration(r.Webhook.BatchMs) * time.Millisecond
	}
	return 0
}
