package notify

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"devicehub/ingest/mqttconn"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/smtp"
	"strconv"
	"strings"
	"text/template"
	"time"
	"unicode/utf8"
)

// Notification is what a channel sends: the outbox row (its id is the
// idempotency key) and the alarm as the outbox holds it. Templates read
// its fields: {{.IdempotencyKey}}, {{.Kind}}, {{.Alarm.deviceId}}, ...
type Notification struct {
	ID             int64          `json:"id"`
	IdempotencyKey string         `json:"idempotencyKey"`
	Kind           string         `json:"kind"` // a transition kind, "escalation", "reminder" or "test"
	Step           string         `json:"step"`
	SubscriptionID string         `json:"subscriptionId"`
	ChannelID      string         `json:"channelId"`
	Attempt        int            `json:"attempt"`
	Alarm          map[string]any `json:"alarm"`
}

// SampleNotification is the notification templates are checked against
// and a channel's _test sends.
func SampleNotification() Notification {
	now := time.Now().UnixMilli()
	return Notification{ID: 0, IdempotencyKey: "test-" + strings.ToLower(rand.Text()[:12]), Kind: "test", Step: "test",
		Alarm: map[string]any{"recordId": 0, "ruleId": "test-rule", "ruleName": "Test", "productId": "test-product",
			"deviceId": "test-device", "state": "active", "severity": "info", "count": 1, "firstValue": "", "lastValue": "",
			"raisedTime": now, "lastTime": now, "acked": false, "kind": "test", "transitionId": nil, "time": now,
			"value": "", "username": "", "comment": "a test message from devicehub"}}
}

// Result is what the other side answered.
type Result struct {
	Status int    `json:"status,omitempty"` // the HTTP status, the SMTP reply code
	Body   string `json:"body,omitempty"`   // the start of the answer
}

// ErrRefused wraps a non-success answer (a non-2xx status and so on).
type ErrRefused struct{ Result Result }

func (e *ErrRefused) Error() string {
	return fmt.Sprintf("refused: %d %s", e.Result.Status, e.Result.Body)
}

func render(t *template.Template, n Notification, fallback func() ([]byte, error)) ([]byte, error) {
	if t == nil {
		return fallback()
	}
	var b bytes.Buffer
	if err := t.Execute(&b, n); err != nil {
		return nil, fmt.Errorf("template: %w", err)
	}
	return b.Bytes(), nil
}

// Sign is the X-Devicehub-Signature value of body with secret.
func Sign(secret string, body []byte) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write(body)
	return "sha256=" + hex.EncodeToString(m.Sum(nil))
}

// Send sends n over c and returns what the other side answered; an error
// unless it accepted (a 2xx, an SMTP server taking the message, an MQTT
// publish acknowledged or, at QoS 0, written).
func Send(ctx context.Context, c Channel, n Notification) (Result, error) {
	n.ChannelID = c.ID
	switch c.Kind {
	case KindWebhook:
		return sendWebhook(ctx, c, n)
	case KindEmail:
		return sendEmail(ctx, c, n)
	case KindMQTT:
		return sendMQTT(ctx, c, n)
	}
	return Result{}, fmt.Errorf("notify: channel kind %q", c.Kind)
}

func jsonBody(n Notification) func() ([]byte, error) {
	return func() ([]byte, error) { return json.Marshal(n) }
}

func clip(b []byte) string {
	if len(b) > 512 {
		b = b[:512]
	}
	for !utf8.Valid(b) && len(b) > 0 {
		b = b[:len(b)-1]
	}
	return string(b)
}

func sendWebhook(ctx context.Context, c Channel, n Notification) (Result, error) {
	w := c.Webhook
	t, err := parseTemplate("webhook.template", w.Template)
	if err != nil {
		return Result{}, err
	}
	body, err := render(t, n, jsonBody(n))
	if err != nil {
		return Result{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, timeoutOf(w.TimeoutMs))
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, w.Method, w.URL, bytes.NewReader(body))
	if err != nil {
		return Result{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "devicehub-notify")
	for k, v := range w.Headers {
		req.Header.Set(k, v)
	}
	req.Header.Set("Idempotency-Key", n.IdempotencyKey)
	if c.Secret != "" {
		req.Header.Set("X-Devicehub-Signature", Sign(c.Secret, body))
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return Result{}, err
	}
	defer resp.Body.Close()
	got, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	res := Result{Status: resp.StatusCode, Body: clip(got)}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return res, &ErrRefused{res}
	}
	return res, nil
}

// httpClient follows no redirect: a 3xx is not the receiver's 2xx. It
// keeps up to 16 idle connections per receiver (http's default is 2):
// workers sending to one webhook at once reuse theirs instead of dialing
// anew.
var httpClient = &http.Client{
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	Transport: func() *http.Transport {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConnsPerHost = 16
		return t
	}(),
}

func sendEmail(ctx context.Context, c Channel, n Notification) (Result, error) {
	e := c.Email
	st, err := parseTemplate("email.subject", e.Subject)
	if err != nil {
		return Result{}, err
	}
	if st == nil {
		st = template.Must(template.New("subject").Parse(DefaultEmailSubject))
	}
	bt, err := parseTemplate("email.template", e.Template)
	if err != nil {
		return Result{}, err
	}
	if bt == nil {
		bt = template.Must(template.New("body").Parse(DefaultEmailBody))
	}
	subject, err := render(st, n, nil)
	if err != nil {
		return Result{}, err
	}
	body, err := render(bt, n, nil)
	if err != nil {
		return Result{}, err
	}
	timeout := timeoutOf(e.TimeoutMs)
	addr := net.JoinHostPort(e.Host, strconv.Itoa(e.Port))
	d := net.Dialer{Timeout: timeout}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return Result{}, err
	}
	deadline := time.Now().Add(timeout)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	_ = conn.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	cl, err := smtp.NewClient(conn, e.Host)
	if err != nil {
		conn.Close()
		return Result{}, err
	}
	defer cl.Close()
	if e.StartTLS {
		if ok, _ := cl.Extension("STARTTLS"); !ok {
			return Result{}, fmt.Errorf("smtp: %s offers no STARTTLS", addr)
		}
		if err := cl.StartTLS(&tls.Config{ServerName: e.Host}); err != nil {
			return Result{}, err
		}
	}
	if e.Username != "" {
		if err := cl.Auth(smtp.PlainAuth("", e.Username, c.Secret, e.Host)); err != nil {
			return Result{}, err
		}
	}
	from, _ := parseAddr(e.From)
	if err := cl.Mail(from); err != nil {
		return Result{}, err
	}
	for _, to := range e.To {
		a, _ := parseAddr(to)
		if err := cl.Rcpt(a); err != nil {
			return Result{}, err
		}
	}
	wc, err := cl.Data()
	if err != nil {
		return Result{}, err
	}
	var m bytes.Buffer
	fmt.Fprintf(&m, "From: %s\r\nTo: %s\r\nSubject: %s\r\nDate: %s\r\nMessage-ID: <%s@devicehub>\r\nIdempotency-Key: %s\r\n",
		e.From, strings.Join(e.To, ", "), headerText(string(subject)), time.Now().Format(time.RFC1123Z), n.IdempotencyKey, n.IdempotencyKey)
	m.WriteString("MIME-Version: 1.0\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Transfer-Encoding: 8bit\r\n\r\n")
	m.Write(bytes.ReplaceAll(bytes.ReplaceAll(body, []byte("\r\n"), []byte("\n")), []byte("\n"), []byte("\r\n")))
	if _, err := wc.Write(m.Bytes()); err != nil {
		return Result{}, err
	}
	if err := wc.Close(); err != nil {
		return Result{}, err
	}
	_ = cl.Quit()
	return Result{Status: 250, Body: "accepted by " + addr}, nil
}

func headerText(s string) string {
	return strings.NewReplacer("\r", " ", "\n", " ").Replace(s)
}

func parseAddr(s string) (string, error) {
	a, err := mailParse(s)
	if err != nil {
		return s, err
	}
	return a, nil
}

func sendMQTT(ctx context.Context, c Channel, n Notification) (Result, error) {
	m := c.MQTT
	t, err := parseTemplate("mqtt.template", m.Template)
	if err != nil {
		return Result{}, err
	}
	body, err := render(t, n, jsonBody(n))
	if err != nil {
		return Result{}, err
	}
	timeout := timeoutOf(m.TimeoutMs)
	id := m.ClientID
	if id == "" {
		// One client id per send: two workers never take each other's session.
		id = "devicehub-notify-" + strings.ToLower(rand.Text()[:12])
	}
	cl := mqttconn.New(mqttconn.Config{Broker: m.Broker, ClientID: id,
		Login: mqttconn.Login{Username: m.Username, Password: c.Secret}, ConnectTimeout: timeout})
	if err := mqttconn.WaitToken(cl.Connect(), timeout); err != nil {
		return Result{}, fmt.Errorf("mqtt connect: %w", err)
	}
	defer cl.Disconnect(100)
	if err := ctx.Err(); err != nil {
		return Result{}, err
	}
	if err := mqttconn.WaitToken(cl.Publish(m.Topic, m.QoS, m.Retain, body), timeout); err != nil {
		return Result{}, fmt.Errorf("mqtt publish: %w", err)
	}
	return Result{Body: fmt.Sprintf("published to %s at QoS %d", m.Topic, m.QoS)}, nil
}
