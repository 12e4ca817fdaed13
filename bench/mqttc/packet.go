// Package mqttc is a lean MQTT 3.1.1 client for the bench's simulated
// fleets: a connection costs a socket, one reader goroutine and a few
// hundred bytes, where a paho client costs several goroutines and tens of
// kilobytes. It speaks what a quiet device needs (CONNECT with login and
// last will, PUBLISH at QoS 0 and 1, PUBACK, SUBSCRIBE, PINGREQ,
// DISCONNECT) and nothing else: no QoS 2, no reconnection, no session
// store (the caller decides when to dial again).
//
// Packets are encoded and decoded by plain functions over bytes
// (packet.go), as mochi-mqtt does, so that the wire format is tested and
// fuzzed without a network; Client (client.go) only moves them. It must
// not import devicehub's packages: it is a device, not the platform.
package mqttc

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Packet types (the high nibble of a fixed header).
const (
	CONNECT     byte = 1
	CONNACK     byte = 2
	PUBLISH     byte = 3
	PUBACK      byte = 4
	PUBREC      byte = 5
	PUBREL      byte = 6
	PUBCOMP     byte = 7
	SUBSCRIBE   byte = 8
	SUBACK      byte = 9
	UNSUBSCRIBE byte = 10
	UNSUBACK    byte = 11
	PINGREQ     byte = 12
	PINGRESP    byte = 13
	DISCONNECT  byte = 14
)

// MaxRemaining is the largest remaining length MQTT can encode (four
// length bytes).
const MaxRemaining = 268435455

var (
	// ErrShort: the buffer holds only part of a packet; read more.
	ErrShort = errors.New("mqttc: incomplete packet")
	// ErrMalformed: the bytes are not a valid MQTT 3.1.1 packet.
	ErrMalformed = errors.New("mqttc: malformed packet")
	// ErrTooLarge: the packet is longer than the decoder's limit.
	ErrTooLarge = errors.New("mqttc: packet too large")
)

// Will is a CONNECT's last will.
type Will struct {
	Topic   string
	Payload []byte
	QoS     byte
	Retain  bool
}

// Connect is a CONNECT packet's content.
type Connect struct {
	ClientID     string
	Username     string
	Password     string
	KeepAlive    uint16 // seconds; 0 disables it
	CleanSession bool
	Will         *Will
}

// Packet is a decoded packet. Which fields are set depends on Type:
// PUBLISH: Flags' QoS, Dup, Retain, Topic, ID (QoS > 0), Payload;
// CONNACK: SessionPresent, ReturnCode; PUBACK, UNSUBACK: ID; SUBACK: ID,
// Granted; CONNECT: Connect. Topic and Payload alias the decoded buffer.
type Packet struct {
	Type           byte
	Flags          byte
	ID             uint16
	Topic          string
	Payload        []byte
	SessionPresent bool
	ReturnCode     byte
	Granted        []byte
	Connect        *Connect
}

// QoS is a PUBLISH's QoS.
func (p *Packet) QoS() byte { return p.Flags >> 1 & 3 }

// Retain reports a PUBLISH's retain flag.
func (p *Packet) Retain() bool { return p.Flags&1 != 0 }

// Dup reports a PUBLISH's duplicate flag.
func (p *Packet) Dup() bool { return p.Flags&8 != 0 }

// appendHeader appends a fixed header: type and flags, then the
// remaining length n as a variable byte integer.
func appendHeader(b []byte, typ, flags byte, n int) []byte {
	b = append(b, typ<<4|flags&0x0f)
	for {
		d := byte(n % 128)
		n /= 128
		if n > 0 {
			d |= 0x80
		}
		b = append(b, d)
		if n == 0 {
			return b
		}
	}
}

func appendString(b []byte, s string) []byte {
	b = append(b, byte(len(s)>>8), byte(len(s)))
	return append(b, s...)
}

func appendBytes(b []byte, s []byte) []byte {
	b = append(b, byte(len(s)>>8), byte(len(s)))
	return append(b, s...)
}

// AppendConnect appends a CONNECT packet. Strings longer than 65,535
// bytes cannot be encoded: an error, and b unchanged.
func AppendConnect(b []byte, c Connect) ([]byte, error) {
	flags := byte(0)
	n := 10 + 2 + len(c.ClientID)
	long := len(c.ClientID) > 0xffff
	if c.CleanSession {
		flags |= 0x02
	}
	if w := c.Will; w != nil {
		if w.QoS > 2 {
			return b, fmt.Errorf("mqttc: will QoS %d: %w", w.QoS, ErrMalformed)
		}
		flags |= 0x04 | w.QoS<<3
		if w.Retain {
			flags |= 0x20
		}
		n += 4 + len(w.Topic) + len(w.Payload)
		long = long || len(w.Topic) > 0xffff || len(w.Payload) > 0xffff
	}
	// A password needs the username flag (MQTT-3.1.2-22): an empty
	// username is sent then.
	withUser := c.Username != "" || c.Password != ""
	if withUser {
		flags |= 0x80
		n += 2 + len(c.Username)
		long = long || len(c.Username) > 0xffff
	}
	if c.Password != "" {
		flags |= 0x40
		n += 2 + len(c.Password)
		long = long || len(c.Password) > 0xffff
	}
	if long {
		return b, fmt.Errorf("mqttc: CONNECT field longer than 65535 bytes: %w", ErrMalformed)
	}
	b = appendHeader(b, CONNECT, 0, n)
	b = append(b, 0, 4, 'M', 'Q', 'T', 'T', 4, flags, byte(c.KeepAlive>>8), byte(c.KeepAlive))
	b = appendString(b, c.ClientID)
	if w := c.Will; w != nil {
		b = appendString(b, w.Topic)
		b = appendBytes(b, w.Payload)
	}
	if withUser {
		b = appendString(b, c.Username)
	}
	if c.Password != "" {
		b = appendString(b, c.Password)
	}
	return b, nil
}

// AppendPublish appends a PUBLISH packet; id is used only at QoS > 0.
func AppendPublish(b []byte, topic string, payload []byte, qos byte, retain, dup bool, id uint16) ([]byte, error) {
	if qos > 2 || len(topic) > 0xffff || topic == "" {
		return b, fmt.Errorf("mqttc: publish qos %d, topic of %d bytes: %w", qos, len(topic), ErrMalformed)
	}
	n := 2 + len(topic) + len(payload)
	if qos > 0 {
		n += 2
	}
	if n > MaxRemaining {
		return b, ErrTooLarge
	}
	flags := qos << 1
	if retain {
		flags |= 1
	}
	if dup {
		flags |= 8
	}
	b = appendHeader(b, PUBLISH, flags, n)
	b = appendString(b, topic)
	if qos > 0 {
		b = append(b, byte(id>>8), byte(id))
	}
	return append(b, payload...), nil
}

// AppendPuback appends a PUBACK of id.
func AppendPuback(b []byte, id uint16) []byte {
	return append(b, PUBACK<<4, 2, byte(id>>8), byte(id))
}

// AppendSubscribe appends a SUBSCRIBE of one filter.
func AppendSubscribe(b []byte, id uint16, filter string, qos byte) ([]byte, error) {
	if qos > 2 || filter == "" || len(filter) > 0xffff {
		return b, fmt.Errorf("mqttc: subscribe qos %d, filter of %d bytes: %w", qos, len(filter), ErrMalformed)
	}
	b = appendHeader(b, SUBSCRIBE, 2, 2+2+len(filter)+1)
	b = append(b, byte(id>>8), byte(id))
	b = appendString(b, filter)
	return append(b, qos), nil
}

// AppendPingreq appends a PINGREQ.
func AppendPingreq(b []byte) []byte { return append(b, PINGREQ<<4, 0) }

// AppendDisconnect appends a DISCONNECT.
func AppendDisconnect(b []byte) []byte { return append(b, DISCONNECT<<4, 0) }

// Decode decodes the packet at the start of b. It returns the packet and
// its length in bytes; ErrShort if b holds only part of it (read more and
// call again), ErrTooLarge if it is longer than limit bytes (limit <= 0: no
// limit but MQTT's), ErrMalformed for anything MQTT 3.1.1 forbids in the
// packets this package knows (the others are returned with only Type and
// Flags). It never panics and never allocates beyond the packet it
// returns (strings are copied, payloads alias b).
func Decode(b []byte, limit int) (Packet, int, error) {
	var p Packet
	if len(b) < 2 {
		return p, 0, ErrShort
	}
	p.Type, p.Flags = b[0]>>4, b[0]&0x0f
	n, mult, i := 0, 1, 1
	for {
		if i >= len(b) {
			return p, 0, ErrShort
		}
		if i > 4 {
			return p, 0, fmt.Errorf("remaining length over 4 bytes: %w", ErrMalformed)
		}
		d := b[i]
		n += int(d&0x7f) * mult
		mult *= 128
		i++
		if d&0x80 == 0 {
			break
		}
	}
	total := i + n
	if limit > 0 && total > limit {
		return p, 0, ErrTooLarge
	}
	if len(b) < total {
		return p, 0, ErrShort
	}
	body := b[i:total]
	var err error
	switch p.Type {
	case 0, 15:
		err = fmt.Errorf("reserved packet type %d: %w", p.Type, ErrMalformed)
	case CONNACK:
		if p.Flags != 0 || len(body) != 2 || body[0]&0xfe != 0 {
			err = fmt.Errorf("CONNACK: %w", ErrMalformed)
			break
		}
		p.SessionPresent, p.ReturnCode = body[0] == 1, body[1]
	case PUBLISH:
		err = decodePublish(&p, body)
	case PUBACK, PUBREC, PUBCOMP, UNSUBACK:
		if p.Flags != 0 || len(body) != 2 {
			err = fmt.Errorf("ack type %d: %w", p.Type, ErrMalformed)
			break
		}
		p.ID = binary.BigEndian.Uint16(body)
	case PUBREL:
		if p.Flags != 2 || len(body) != 2 {
			err = fmt.Errorf("PUBREL: %w", ErrMalformed)
			break
		}
		p.ID = binary.BigEndian.Uint16(body)
	case SUBACK:
		if p.Flags != 0 || len(body) < 3 {
			err = fmt.Errorf("SUBACK: %w", ErrMalformed)
			break
		}
		p.ID = binary.BigEndian.Uint16(body)
		p.Granted = append([]byte(nil), body[2:]...)
		for _, g := range p.Granted {
			if g > 2 && g != 0x80 {
				err = fmt.Errorf("SUBACK return code %#x: %w", g, ErrMalformed)
				break
			}
		}
	case PINGREQ, PINGRESP, DISCONNECT:
		if p.Flags != 0 || len(body) != 0 {
			err = fmt.Errorf("type %d with a body: %w", p.Type, ErrMalformed)
		}
	case CONNECT:
		p.Connect, err = decodeConnect(p.Flags, body)
	}
	if err != nil {
		return Packet{}, 0, err
	}
	return p, total, nil
}

func decodePublish(p *Packet, body []byte) error {
	qos := p.QoS()
	if qos == 3 || qos == 0 && p.Dup() {
		return fmt.Errorf("PUBLISH flags %#x: %w", p.Flags, ErrMalformed)
	}
	topic, rest, ok := readString(body)
	if !ok || len(topic) == 0 {
		return fmt.Errorf("PUBLISH topic: %w", ErrMalformed)
	}
	for _, c := range topic {
		if c == '+' || c == '#' || c == 0 {
			return fmt.Errorf("PUBLISH topic with a wildcard: %w", ErrMalformed)
		}
	}
	if qos > 0 {
		if len(rest) < 2 {
			return fmt.Errorf("PUBLISH id: %w", ErrMalformed)
		}
		p.ID = binary.BigEndian.Uint16(rest)
		if p.ID == 0 {
			return fmt.Errorf("PUBLISH id 0: %w", ErrMalformed)
		}
		rest = rest[2:]
	}
	p.Topic, p.Payload = string(topic), rest
	return nil
}

func decodeConnect(flags byte, body []byte) (*Connect, error) {
	bad := func(what string) (*Connect, error) { return nil, fmt.Errorf("CONNECT %s: %w", what, ErrMalformed) }
	if flags != 0 {
		return bad("header flags")
	}
	proto, rest, ok := readString(body)
	if !ok || string(proto) != "MQTT" || len(rest) < 4 || rest[0] != 4 {
		return bad("protocol")
	}
	cf := rest[1]
	c := &Connect{KeepAlive: binary.BigEndian.Uint16(rest[2:]), CleanSession: cf&0x02 != 0}
	rest = rest[4:]
	willQoS := cf >> 3 & 3
	if cf&1 != 0 || willQoS == 3 || cf&0x04 == 0 && (willQoS != 0 || cf&0x20 != 0) || cf&0x80 == 0 && cf&0x40 != 0 {
		return bad("flags")
	}
	var id, s []byte
	if id, rest, ok = readString(rest); !ok {
		return bad("client id")
	}
	c.ClientID = string(id)
	if cf&0x04 != 0 {
		w := &Will{QoS: willQoS, Retain: cf&0x20 != 0}
		if s, rest, ok = readString(rest); !ok {
			return bad("will topic")
		}
		w.Topic = string(s)
		if s, rest, ok = readString(rest); !ok {
			return bad("will payload")
		}
		w.Payload = append([]byte{}, s...)
		c.Will = w
	}
	if cf&0x80 != 0 {
		if s, rest, ok = readString(rest); !ok {
			return bad("username")
		}
		c.Username = string(s)
	}
	if cf&0x40 != 0 {
		if s, rest, ok = readString(rest); !ok {
			return bad("password")
		}
		c.Password = string(s)
	}
	if len(rest) != 0 {
		return bad("trailing bytes")
	}
	return c, nil
}

// readString reads a two-byte length and that many bytes.
func readString(b []byte) (s, rest []byte, ok bool) {
	if len(b) < 2 {
		return nil, b, false
	}
	n := int(binary.BigEndian.Uint16(b))
	if len(b) < 2+n {
		return nil, b, false
	}
	return b[2 : 2+n], b[2+n:], true
}
