package forward

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
)

// httpClient follows no redirect: a 3xx is not success.
var httpClient = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

type webhook struct {
	cfg    WebhookSink
	secret string
	body   []byte
}

// Sign is the webhook's signature of body with secret, as notify's
// webhook channel signs: "sha256=" and the hex of HMAC-SHA256.
func Sign(secret string, body []byte) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write(body)
	return "sha256=" + hex.EncodeToString(m.Sum(nil))
}

// ErrRefused is a sink's answer that is not success.
type ErrRefused struct {
	Status int
	Body   string
}

func (e *ErrRefused) Error() string {
	return fmt.Sprintf("refused: HTTP %d %s", e.Status, e.Body)
}

func (w *webhook) send(ctx context.Context, ruleID string, batch []record) error {
	w.body = w.body[:0]
	for _, r := range batch {
		w.body = line(w.body, ruleID, r)
		w.body = append(w.body, '\n')
	}
	ctx, cancel := context.WithTimeout(ctx, time.Duration(w.cfg.TimeoutMs)*time.Millisecond)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.cfg.URL, bytes.NewReader(w.body))
	if err != nil {
		return err
	}
	for k, v := range w.cfg.Headers {
		req.Header.Set(k, v)
	}
	req.Header.Set("Content-Type", "application/x-ndjson")
	req.Header.Set("User-Agent", "devicehub-forward")
	// The batch's messages: the receiver's key to drop a repeat is
	// (ruleId, seq) of each line; a batch resent after a restart may be
	// cut differently.
	req.Header.Set("X-Devicehub-Rule", ruleID)
	req.Header.Set("X-Devicehub-Seq", strconv.FormatUint(batch[0].seq, 10)+"-"+strconv.FormatUint(batch[len(batch)-1].seq, 10))
	if w.secret != "" {
		req.Header.Set("X-Devicehub-Signature", Sign(w.secret, w.body))
	}
	res, err := httpClient.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(res.Body, 512))
	_, _ = io.Copy(io.Discard, io.LimitReader(res.Body, 1<<20)) // keep the connection
	if res.StatusCode < 200 || res.StatusCode > 299 {
		return &ErrRefused{Status: res.StatusCode, Body: strings.TrimSpace(string(b))}
	}
	return nil
}

// mqttSink is an MQTT rule's connection to its broker: records are
// published at QoS 1, each with its own token (its PUBACK); the sender
// (sendMQTT) keeps a window of them in flight.
type mqttSink struct {
	cfg    MQTTSink
	secret string
	ruleID string
	c      mqtt.Client
	buf    []byte
}

func (m *mqttSink) topic(r record) string {
	t := m.cfg.Topic
	if !strings.Contains(t, "{") {
		return t
	}
	var hdr struct {
		ProductID string `json:"productId"`
		DeviceID  string `json:"deviceId"`
		Type      string `json:"type"`
		EventID   string `json:"eventId"`
	}
	_ = json.Unmarshal(append([]byte{'{'}, r.msg...), &hdr)
	return strings.NewReplacer("{productId}", hdr.ProductID, "{deviceId}", hdr.DeviceID, "{type}", hdr.Type,
		"{eventId}", hdr.EventID).Replace(t)
}

// connected reports an open connection.
func (m *mqttSink) connected() bool { return m.c != nil && m.c.IsConnectionOpen() }

// connect dials the broker; a connection paho lost is dropped first.
func (m *mqttSink) connect() error {
	m.drop()
	c, err := dialSink(m.cfg, m.secret, m.ruleID, time.Duration(m.cfg.TimeoutMs)*time.Millisecond)
	if err != nil {
		return err
	}
	m.c = c
	return nil
}

// publish sends r; its token completes at its PUBACK (or with an error).
// paho writes publishes in the order of the calls.
func (m *mqttSink) publish(r record) mqtt.Token {
	m.buf = line(m.buf[:0], m.ruleID, r)
	return m.c.Publish(m.topic(r), 1, false, bytes.Clone(m.buf))
}

// drop closes the connection at once: what is in flight is abandoned.
func (m *mqttSink) drop() {
	if m.c != nil {
		m.c.Disconnect(0)
		m.c = nil
	}
}

func (m *mqttSink) close() {
	if m.c != nil {
		m.c.Disconnect(250)
		m.c = nil
	}
}
