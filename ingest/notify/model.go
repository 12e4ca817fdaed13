package notify

import (
	"bytes"
	"fmt"
	"net/mail"
	"net/url"
	"slices"
	"strings"
	"text/template"
	"time"

	"devicehub/schema"
)

// Channel kinds.
const (
	KindWebhook = "webhook"
	KindEmail   = "email"
	KindMQTT    = "mqtt"
)

// Channel is where notifications go. Exactly one of Webhook, Email and
// MQTT is set, the one Kind names. Secret is write-only: the webhook's
// HMAC key, the SMTP or MQTT password; an update with an empty Secret
// keeps the stored one. HasSecret says whether one is stored.
type Channel struct {
	ID         string   `json:"id"`
	Name       string   `json:"name"`
	Kind       string   `json:"kind"`
	Webhook    *Webhook `json:"webhook,omitempty"`
	Email      *Email   `json:"email,omitempty"`
	MQTT       *MQTT    `json:"mqtt,omitempty"`
	Secret     string   `json:"secret,omitempty"`
	HasSecret  bool     `json:"hasSecret"`
	CreatorID  string   `json:"creatorId,omitempty"`
	CreateTime int64    `json:"createTime"`
	ModifyTime int64    `json:"modifyTime"`
}

// Webhook is an HTTP request per notification. Template (Go text/template
// over a Notification) makes the body; empty: the notification as JSON.
// With a secret the body is signed: X-Devicehub-Signature: sha256=<hex of
// HMAC-SHA256(secret, body)>.
type Webhook struct {
	URL       string            `json:"url"`
	Method    string            `json:"method,omitempty"`
	Headers   map[string]string `json:"headers,omitempty"`
	Template  string            `json:"template,omitempty"`
	TimeoutMs int64             `json:"timeoutMs,omitempty"`
}

// Email is a message over SMTP per notification; the secret is the
// password of Username (PLAIN auth, over STARTTLS or to localhost only).
type Email struct {
	Host      string   `json:"host"`
	Port      int      `json:"port"`
	StartTLS  bool     `json:"starttls,omitempty"`
	Username  string   `json:"username,omitempty"`
	From      string   `json:"from"`
	To        []string `json:"to"`
	Subject   string   `json:"subject,omitempty"`
	Template  string   `json:"template,omitempty"`
	TimeoutMs int64    `json:"timeoutMs,omitempty"`
}

// MQTT is a publish to a topic of another broker per notification; the
// secret is Username's password.
type MQTT struct {
	Broker    string `json:"broker"`
	Topic     string `json:"topic"`
	QoS       byte   `json:"qos"`
	Retain    bool   `json:"retain,omitempty"`
	Username  string `json:"username,omitempty"`
	ClientID  string `json:"clientId,omitempty"`
	Template  string `json:"template,omitempty"`
	TimeoutMs int64  `json:"timeoutMs,omitempty"`
}

// Defaults.
const (
	DefaultTimeout      = 10 * time.Second
	DefaultEmailSubject = `[devicehub] {{.Alarm.severity}} {{.Alarm.ruleName}} on {{.Alarm.deviceId}}: {{.Kind}}`
	DefaultEmailBody    = `Alarm {{.Alarm.ruleName}} ({{.Alarm.severity}}) on device {{.Alarm.deviceId}} of product {{.Alarm.productId}}: {{.Kind}}.
State: {{.Alarm.state}}, acknowledged: {{.Alarm.acked}}, count: {{.Alarm.count}}, last value: {{.Alarm.lastValue}}.
Record {{.Alarm.recordId}}; idempotency key {{.IdempotencyKey}}.
`
)

func timeoutOf(ms int64) time.Duration {
	if ms <= 0 {
		return DefaultTimeout
	}
	return time.Duration(ms) * time.Millisecond
}

// Normalize fills defaults and checks c; the error names the field.
func (c *Channel) Normalize() error {
	c.Name = strings.TrimSpace(c.Name)
	if c.Name == "" || len(c.Name) > 200 {
		return schema.Invalid("name", "required, at most 200 characters")
	}
	set := 0
	for _, p := range []bool{c.Webhook != nil, c.Email != nil, c.MQTT != nil} {
		if p {
			set++
		}
	}
	if set != 1 {
		return schema.Invalid("kind", "exactly one of webhook, email and mqtt must be given")
	}
	switch {
	case c.Webhook != nil:
		if c.Kind != "" && c.Kind != KindWebhook {
			return schema.Invalid("kind", "%q does not match the webhook settings", c.Kind)
		}
		c.Kind = KindWebhook
		return c.Webhook.normalize()
	case c.Email != nil:
		if c.Kind != "" && c.Kind != KindEmail {
			return schema.Invalid("kind", "%q does not match the email settings", c.Kind)
		}
		c.Kind = KindEmail
		return c.Email.normalize()
	default:
		if c.Kind != "" && c.Kind != KindMQTT {
			return schema.Invalid("kind", "%q does not match the mqtt settings", c.Kind)
		}
		c.Kind = KindMQTT
		return c.MQTT.normalize()
	}
}

func checkTimeout(field string, ms int64) error {
	if ms < 0 || ms > 120_000 {
		return schema.Invalid(field, "between 0 (the default, 10 s) and 120000")
	}
	return nil
}

func (w *Webhook) normalize() error {
	u, err := url.Parse(w.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return schema.Invalid("webhook.url", "an http or https URL is required")
	}
	w.Method = strings.ToUpper(strings.TrimSpace(w.Method))
	if w.Method == "" {
		w.Method = "POST"
	}
	if !slices.Contains([]string{"POST", "PUT", "PATCH"}, w.Method) {
		return schema.Invalid("webhook.method", "one of POST, PUT, PATCH")
	}
	for k, v := range w.Headers {
		if k == "" || strings.ContainsAny(k, " :\r\n") || strings.ContainsAny(v, "\r\n") {
			return schema.Invalid("webhook.headers", "header %q is not a valid header", k)
		}
	}
	if _, err := parseTemplate("webhook.template", w.Template); err != nil {
		return err
	}
	return checkTimeout("webhook.timeoutMs", w.TimeoutMs)
}

func (e *Email) normalize() error {
	e.Host = strings.TrimSpace(e.Host)
	if e.Host == "" || strings.ContainsAny(e.Host, " /:") {
		return schema.Invalid("email.host", "a host name or address is required")
	}
	if e.Port == 0 {
		e.Port = 25
	}
	if e.Port < 1 || e.Port > 65535 {
		return schema.Invalid("email.port", "between 1 and 65535")
	}
	if _, err := mail.ParseAddress(e.From); err != nil {
		return schema.Invalid("email.from", "not an e-mail address")
	}
	if len(e.To) == 0 || len(e.To) > 100 {
		return schema.Invalid("email.to", "1 to 100 recipients")
	}
	for i, to := range e.To {
		if _, err := mail.ParseAddress(to); err != nil {
			return schema.Invalid(fmt.Sprintf("email.to[%d]", i), "not an e-mail address")
		}
	}
	if _, err := parseTemplate("email.subject", e.Subject); err != nil {
		return err
	}
	if _, err := parseTemplate("email.template", e.Template); err != nil {
		return err
	}
	return checkTimeout("email.timeoutMs", e.TimeoutMs)
}

func (m *MQTT) normalize() error {
	u, err := url.Parse(m.Broker)
	if err != nil || !slices.Contains([]string{"tcp", "mqtt", "ssl", "tls", "mqtts", "ws", "wss"}, u.Scheme) || u.Host == "" {
		return schema.Invalid("mqtt.broker", "a broker URL (tcp://host:port, ssl://, ws://) is required")
	}
	if m.Topic == "" || strings.ContainsAny(m.Topic, "+#\x00") {
		return schema.Invalid("mqtt.topic", "a topic without wildcards is required")
	}
	if m.QoS > 2 {
		return schema.Invalid("mqtt.qos", "0, 1 or 2")
	}
	if _, err := parseTemplate("mqtt.template", m.Template); err != nil {
		return err
	}
	return checkTimeout("mqtt.timeoutMs", m.TimeoutMs)
}

// parseTemplate parses src and runs it over a sample notification, so a
// template naming a field an alarm does not have is refused when saved.
func parseTemplate(field, src string) (*template.Template, error) {
	if src == "" {
		return nil, nil
	}
	if len(src) > 64<<10 {
		return nil, schema.Invalid(field, "at most 64 KiB")
	}
	t, err := template.New(field).Option("missingkey=error").Parse(src)
	if err != nil {
		return nil, schema.Invalid(field, "%v", err)
	}
	if err := t.Execute(&bytes.Buffer{}, SampleNotification()); err != nil {
		return nil, schema.Invalid(field, "%v", err)
	}
	return t, nil
}

// Subscription says which alarms' notifications go where. Products must
// be named (a caller's own); Rules empty means every rule of them.
// Channels is the escalation chain: Channels[0] hears the transitions of
// Kinds; Channels[i] hears an alarm still active and unacknowledged
// EscalateMs[i-1] after it first concerned the subscription (the
// server's clock). RemindMs: a reminder every so long
// while active and unacknowledged, to the chain's channel reached by
// then. QuietMs: at most one transition notification per (rule, device)
// per so long.
type Subscription struct {
	ID          string   `json:"id"`
	Name        string   `json:"name"`
	Products    []string `json:"products"`
	Rules       []string `json:"rules"`
	MinSeverity string   `json:"minSeverity"`
	Kinds       []string `json:"kinds"`
	Channels    []string `json:"channels"`
	EscalateMs  []int64  `json:"escalateMs"`
	RemindMs    int64    `json:"remindMs"`
	QuietMs     int64    `json:"quietMs"`
	Enabled     bool     `json:"enabled"`
	CreatorID   string   `json:"creatorId,omitempty"`
	CreateTime  int64    `json:"createTime"`
	ModifyTime  int64    `json:"modifyTime"`
}

// Severities from the lowest; a rank is the index + 1.
var Severities = []string{"info", "warning", "minor", "major", "critical"}

// TransitionKinds a subscription may name (alarm_transitions.kind).
var TransitionKinds = []string{"raised", "escalated", "deescalated", "acknowledged", "cleared"}

func severityRank(s string) int { return slices.Index(Severities, s) + 1 }

// Normalize fills defaults and checks s; the error names the field.
func (s *Subscription) Normalize() error {
	s.Name = strings.TrimSpace(s.Name)
	if s.Name == "" || len(s.Name) > 200 {
		return schema.Invalid("name", "required, at most 200 characters")
	}
	if len(s.Products) == 0 || len(s.Products) > 1000 {
		return schema.Invalid("products", "1 to 1000 products")
	}
	for i, p := range s.Products {
		if p == "" {
			return schema.Invalid(fmt.Sprintf("products[%d]", i), "empty")
		}
	}
	if s.Rules == nil {
		s.Rules = []string{}
	}
	for i, r := range s.Rules {
		if r == "" {
			return schema.Invalid(fmt.Sprintf("rules[%d]", i), "empty")
		}
	}
	if s.MinSeverity == "" {
		s.MinSeverity = Severities[0]
	}
	if severityRank(s.MinSeverity) == 0 {
		return schema.Invalid("minSeverity", "one of %s", strings.Join(Severities, ", "))
	}
	if len(s.Kinds) == 0 {
		s.Kinds = []string{"raised"}
	}
	for i, k := range s.Kinds {
		if !slices.Contains(TransitionKinds, k) {
			return schema.Invalid(fmt.Sprintf("kinds[%d]", i), "one of %s", strings.Join(TransitionKinds, ", "))
		}
	}
	if len(s.Channels) == 0 || len(s.Channels) > 10 {
		return schema.Invalid("channels", "1 to 10 channels, the escalation chain")
	}
	if s.EscalateMs == nil {
		s.EscalateMs = []int64{}
	}
	if len(s.EscalateMs) != len(s.Channels)-1 {
		return schema.Invalid("escalateMs", "one delay per channel after the first (%d)", len(s.Channels)-1)
	}
	var prev int64
	for i, ms := range s.EscalateMs {
		if ms <= prev {
			return schema.Invalid(fmt.Sprintf("escalateMs[%d]", i), "positive and growing")
		}
		prev = ms
	}
	if s.RemindMs < 0 || (s.RemindMs > 0 && s.RemindMs < 1000) {
		return schema.Invalid("remindMs", "0 (none) or at least 1000")
	}
	if s.QuietMs < 0 {
		return schema.Invalid("quietMs", "0 (none) or positive")
	}
	return nil
}

func mailParse(s string) (string, error) {
	a, err := mail.ParseAddress(s)
	if err != nil {
		return "", err
	}
	return a.Address, nil
}
