package wire

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"devicehub/schema"
	"devicehub/tsdb"
)

// Limits of one uplink message.
const (
	MaxPayload       = 256 << 10 // bytes
	MaxProperties    = 1000      // property values per message
	MaxPropertyIDLen = 64        // characters
	maxDepth         = 64        // JSON nesting
)

// Sentinel errors of decoding; Ingester counts drops by them.
var (
	// ErrMalformed: the payload is not what the topic calls for.
	ErrMalformed = errors.New("ingest: malformed payload")
	// ErrTooLarge: the payload or its property count is over the limits.
	ErrTooLarge = errors.New("ingest: payload over limits")
)

// Rows are the tsdb rows decoded from uplink messages; decoders append.
type Rows struct {
	Msgs  []tsdb.Message
	Props []tsdb.PropertyValue
	// BadTimes counts messages whose timestamp was there but not used
	// (not a number, before 2000, more than 10 minutes ahead): they are
	// stored at their arrival time.
	BadTimes int
}

// Reset empties r, keeping its memory.
func (r *Rows) Reset() { r.Msgs, r.Props, r.BadTimes = r.Msgs[:0], r.Props[:0], 0 }

// Reply is the correlation part of a read or invoke reply, for the
// command router.
type Reply struct {
	MessageID  string
	DeviceID   string
	Success    bool
	Code       string
	Message    string
	Properties json.RawMessage // the raw "properties" object, nil if absent
	Output     json.RawMessage // the raw "output" value, nil if absent
}

// Decode decodes payload arriving on t at now and appends its rows to dst.
// rep, if not nil, receives the reply fields of reply kinds. On error
// nothing is appended. The rows and rep refer to payload (its bytes and
// strings of them), which must not change while they are in use.
func Decode(dst *Rows, t Topic, payload []byte, now time.Time, rep *Reply) error {
	switch t.Kind {
	case KindReport:
		return DecodeReport(dst, t, payload, now)
	case KindEvent:
		return DecodeEvent(dst, t, payload, now)
	case KindOnline, KindOffline:
		_, err := DecodePresence(dst, t, payload, now)
		return err
	case KindReadReply, KindInvokeReply, KindWriteReply:
		return DecodeReply(dst, t, payload, now, rep)
	case KindShadowGet:
		_, err := DecodePresence(dst, t, payload, now) // a header and nothing to store but the message
		return err
	case KindFirmwareProgress:
		return DecodeFirmwareProgress(dst, t, payload, now, nil)
	case KindFirmwareVersion:
		return DecodeFirmwareVersion(dst, t, payload, now, nil)
	}
	return fmt.Errorf("topic %q: %w", t.Name, ErrMalformed)
}

// header is what every uplink object may carry.
type header struct {
	messageID string
	ts        float64
	hasTS     bool
}

func (h *header) field(s *scanner, key string) (bool, error) {
	switch key {
	case "messageId":
		v, err := s.scalarString()
		if err != nil {
			return true, err
		}
		h.messageID = v
		return true, nil
	case "timestamp":
		start := s.i
		if err := s.skip(0); err != nil {
			return true, err
		}
		raw := s.b[start:s.i]
		if len(raw) > 0 && raw[0] == '"' {
			raw = raw[1 : len(raw)-1]
		}
		if string(raw) == "null" {
			return true, nil
		}
		h.ts, h.hasTS = math.NaN(), true // not a number: replaced, and counted
		if f, err := strconv.ParseFloat(string(raw), 64); err == nil {
			h.ts = f
		}
		return true, nil
	}
	return false, nil
}

func (h *header) message(dst *Rows, t Topic, payload []byte, now time.Time) tsdb.Message {
	id := h.messageID
	if id == "" {
		id = NewMessageID()
	}
	at, ok := messageTime(h.ts, h.hasTS, now)
	if !ok {
		dst.BadTimes++
	}
	return tsdb.Message{
		Time:        at,
		ProductID:   t.ProductID,
		DeviceID:    t.DeviceID,
		Direction:   "up",
		MessageType: t.Kind.MessageType(),
		MessageID:   id,
		Topic:       t.Name,
		Payload:     payload,
	}
}

var (
	minSaneTime  = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	maxClockSkew = 10 * time.Minute
)

// MessageTime is the time a message is stored at: its own timestamp (epoch
// ms, or seconds when below 1e11) when it is after 2000-01-01 and at most
// 10 minutes ahead of now, else now.
func MessageTime(ts float64, has bool, now time.Time) time.Time {
	t, _ := messageTime(ts, has, now)
	return t
}

// messageTime is MessageTime; ok is false when a timestamp was there but
// not used.
func messageTime(ts float64, has bool, now time.Time) (t time.Time, ok bool) {
	if !has {
		return now, true
	}
	if ts != ts || ts <= 0 || ts > 1e15 {
		return now, false
	}
	ms := int64(ts)
	if ts < 1e11 {
		ms = int64(ts * 1000)
	}
	t = time.UnixMilli(ms)
	if t.Before(minSaneTime) || t.After(now.Add(maxClockSkew)) {
		return now, false
	}
	return t, true
}

var (
	idPrefix = func() string {
		var b [6]byte
		_, _ = rand.Read(b[:])
		return hex.EncodeToString(b[:]) + "-"
	}()
	idSeq atomic.Uint64
)

// NewMessageID returns a process-unique message id, for messages that do
// not carry one: a random per-process prefix and a counter.
func NewMessageID() string {
	return idPrefix + strconv.FormatUint(idSeq.Add(1), 36)
}

func checkSize(payload []byte) error {
	if len(payload) > MaxPayload {
		return fmt.Errorf("payload of %d bytes > %d: %w", len(payload), MaxPayload, ErrTooLarge)
	}
	return nil
}

// DecodeReport decodes a property report
// {messageId?, timestamp?, properties:{id:value}}: one message row and one
// property row per non-null value.
func DecodeReport(dst *Rows, t Topic, payload []byte, now time.Time) error {
	return decodeWithProps(dst, t, payload, now, true, nil)
}

// DecodeReply decodes a read or invoke reply {messageId, deviceId,
// timestamp?, properties?, success, code?, message?, output?}; its
// properties are stored like reported ones. rep may be nil.
func DecodeReply(dst *Rows, t Topic, payload []byte, now time.Time, rep *Reply) error {
	if rep == nil {
		rep = new(Reply)
	}
	*rep = Reply{}
	if err := decodeWithProps(dst, t, payload, now, false, rep); err != nil {
		return err
	}
	return nil
}

func decodeWithProps(dst *Rows, t Topic, payload []byte, now time.Time, report bool, rep *Reply) error {
	if err := checkSize(payload); err != nil {
		return err
	}
	var h header
	s := scanner{b: payload}
	nprops := len(dst.Props)
	var propsSpan []byte
	fail := func(err error) error {
		dst.Props = dst.Props[:nprops]
		return fmt.Errorf("%s from %q: %w", t.Kind, t.DeviceID, err)
	}
	haveProps := false
	err := s.object(0, func(key string) error {
		if ok, err := h.field(&s, key); ok {
			return err
		}
		switch key {
		case "properties":
			if s.peek() == 'n' && !report {
				return s.skip(0)
			}
			start := s.i
			if err := s.properties(dst, t); err != nil {
				return err
			}
			haveProps = true
			propsSpan = s.b[start:s.i]
			return nil
		}
		if rep == nil {
			return s.skip(0)
		}
		var err error
		switch key {
		case "deviceId":
			rep.DeviceID, err = s.scalarString()
		case "success":
			switch s.peek() {
			case 't', 'f':
				start := s.i
				err = s.skip(0)
				rep.Success = s.b[start] == 't'
			default:
				err = s.skip(0)
			}
		case "code":
			rep.Code, err = s.scalarString()
		case "message":
			rep.Message, err = s.scalarString()
		case "output":
			start := s.i
			err = s.skip(0)
			rep.Output = s.b[start:s.i]
		default:
			err = s.skip(0)
		}
		return err
	})
	if err == nil {
		err = s.end()
	}
	if err != nil {
		return fail(err)
	}
	if report && !haveProps {
		return fail(fmt.Errorf("no properties object: %w", ErrMalformed))
	}
	if rep != nil && h.messageID == "" {
		return fail(fmt.Errorf("reply without messageId: %w", ErrMalformed))
	}
	// Rows are copied only when a duplicate or a null removes some.
	if ps := dst.Props[nprops:]; len(ps) > 1 {
		if d := dedupe(ps); len(d) != len(ps) {
			dst.Props = append(dst.Props[:nprops], d...)
		}
	}
	kept := slices.DeleteFunc(dst.Props[nprops:], func(p tsdb.PropertyValue) bool { return p.ValueType == "" }) // null tombstones
	dst.Props = dst.Props[:nprops+len(kept)]
	m := h.message(dst, t, payload, now)
	for i := nprops; i < len(dst.Props); i++ {
		p := &dst.Props[i]
		p.Time, p.ProductID, p.DeviceID = m.Time, m.ProductID, m.DeviceID
	}
	if rep != nil {
		rep.MessageID = h.messageID
		rep.Properties = propsSpan
	}
	dst.Msgs = append(dst.Msgs, m)
	return nil
}

// dedupe keeps the last value of a property named twice (JSON object
// semantics), in first-seen order.
func dedupe(ps []tsdb.PropertyValue) []tsdb.PropertyValue {
	if len(ps) <= 16 {
		// Ids of one report rarely share length, first and last byte;
		// only those that do are compared in full.
		var sig [16]uint32
		dup := false
		for i := 0; i < len(ps) && !dup; i++ {
			id := ps[i].Property // not empty (properties)
			sig[i] = uint32(len(id))<<16 | uint32(id[0])<<8 | uint32(id[len(id)-1])
			for j := 0; j < i; j++ {
				if sig[i] == sig[j] && id == ps[j].Property {
					dup = true
					break
				}
			}
		}
		if !dup {
			return ps
		}
	}
	idx := make(map[string]int, len(ps))
	out := ps[:0:0]
	for _, p := range ps {
		if i, ok := idx[p.Property]; ok {
			out[i] = p
			continue
		}
		idx[p.Property] = len(out)
		out = append(out, p)
	}
	return out
}

// DecodeEvent decodes an event {messageId?, timestamp?, data}: one message
// row; the data stays in the stored payload.
func DecodeEvent(dst *Rows, t Topic, payload []byte, now time.Time) error {
	if err := checkSize(payload); err != nil {
		return err
	}
	var h header
	s := scanner{b: payload}
	err := s.object(0, func(key string) error {
		if ok, err := h.field(&s, key); ok {
			return err
		}
		return s.skip(0)
	})
	if err == nil {
		err = s.end()
	}
	if err != nil {
		return fmt.Errorf("event %q from %q: %w", t.EventID, t.DeviceID, err)
	}
	dst.Msgs = append(dst.Msgs, h.message(dst, t, payload, now))
	return nil
}

// DecodePresence decodes an online (birth) or offline (last will) message,
// whose payload is optional and free-form: a JSON object's messageId and
// timestamp are used, anything else is ignored. It returns the time of the
// change. Only an oversize payload is an error.
func DecodePresence(dst *Rows, t Topic, payload []byte, now time.Time) (time.Time, error) {
	if err := checkSize(payload); err != nil {
		return time.Time{}, err
	}
	var h header
	s := scanner{b: payload}
	s.ws()
	if s.peek() == '{' {
		var hh header
		err := s.object(0, func(key string) error {
			if ok, err := hh.field(&s, key); ok {
				return err
			}
			return s.skip(0)
		})
		if err == nil && s.end() == nil {
			h = hh
		}
	}
	m := h.message(dst, t, payload, now)
	dst.Msgs = append(dst.Msgs, m)
	return m.Time, nil
}

// properties reads the properties object, appending one row per non-null
// value with Property, ValueType, Num and Str set.
func (s *scanner) properties(dst *Rows, t Topic) error {
	n := 0
	return s.object(0, func(key string) error {
		if key == "" || len(key) > MaxPropertyIDLen && (len(key) > 4*MaxPropertyIDLen || utf8.RuneCountInString(key) > MaxPropertyIDLen) {
			return fmt.Errorf("property id %q: length must be 1..%d: %w", schema.Truncate(key, 80), MaxPropertyIDLen, ErrMalformed)
		}
		p := tsdb.PropertyValue{Property: key}
		switch c := s.peek(); c {
		case 'n':
			// Kept as a tombstone until duplicates are resolved: a later
			// null overrides an earlier value of the same id.
			if err := s.lit("null"); err != nil {
				return err
			}
		case 't', 'f':
			if err := s.skip(0); err != nil {
				return err
			}
			p.ValueType = "bool"
			if c == 't' {
				p.Num, p.Str = 1, "true"
			} else {
				p.Str = "false"
			}
		case '"':
			v, err := s.str()
			if err != nil {
				return err
			}
			p.ValueType, p.Str = "string", v
		case '{', '[':
			start := s.i
			if err := s.skip(1); err != nil {
				return err
			}
			// Raw text: str's decoding, which replaces bytes that are not
			// UTF-8, does not run on it.
			p.ValueType, p.Str = "json", validUTF8(string(s.b[start:s.i]))
		default:
			txt, err := s.number()
			if err != nil {
				return err
			}
			f, err := parseNumber(txt)
			if err != nil {
				return fmt.Errorf("property %q: number %s out of range: %w", key, schema.Truncate(string(txt), 40), ErrMalformed)
			}
			p.ValueType, p.Num = "number", f
		}
		n++
		if n > MaxProperties {
			return fmt.Errorf("more than %d properties: %w", MaxProperties, ErrTooLarge)
		}
		dst.Props = append(dst.Props, p)
		return nil
	})
}

// validUTF8 is s with each invalid UTF-8 sequence replaced by U+FFFD, as
// str does for strings: a device's bytes reach the API's JSON as text,
// never as invalid UTF-8. Valid text, nearly all of it, is returned as it
// is.
func validUTF8(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}
