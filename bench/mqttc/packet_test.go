package mqttc

import (
	"bytes"
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestConnectRoundTrip(t *testing.T) {
	f := func(c Connect) {
		t.Helper()
		b, err := AppendConnect(nil, c)
		if err != nil {
			t.Fatal(err)
		}
		p, n, err := Decode(b, 0)
		if err != nil || n != len(b) || p.Type != CONNECT {
			t.Fatalf("decode %+v: %v, %d of %d bytes, type %d", c, err, n, len(b), p.Type)
		}
		if c.Will != nil && c.Will.Payload == nil {
			c.Will.Payload = []byte{}
		}
		if !reflect.DeepEqual(*p.Connect, c) {
			t.Errorf("round trip: got %+v, want %+v", *p.Connect, c)
		}
	}
	f(Connect{ClientID: "d1", Username: "u", Password: "p", KeepAlive: 60, CleanSession: true})
	f(Connect{ClientID: "", CleanSession: true})
	f(Connect{ClientID: "d2", Username: "u", KeepAlive: 1,
		Will: &Will{Topic: "/p/d2/offline", Payload: []byte(`{"messageId":"w1"}`), QoS: 1}})
	f(Connect{ClientID: "d3", Will: &Will{Topic: "t", QoS: 2, Retain: true}})
	f(Connect{ClientID: strings.Repeat("x", 300), Username: strings.Repeat("u", 200), Password: strings.Repeat("k", 20000)})
}

func TestConnectBytes(t *testing.T) {
	// The CONNECT the bench's tryLogin has always sent, byte for byte.
	b, err := AppendConnect(nil, Connect{ClientID: "a", Username: "b", Password: "c", KeepAlive: 60, CleanSession: true})
	if err != nil {
		t.Fatal(err)
	}
	want := []byte{0x10, 19, 0, 4, 'M', 'Q', 'T', 'T', 4, 0xc2, 0, 60, 0, 1, 'a', 0, 1, 'b', 0, 1, 'c'}
	if !bytes.Equal(b, want) {
		t.Errorf("got % x\nwant % x", b, want)
	}
	if _, err := AppendConnect(nil, Connect{ClientID: strings.Repeat("x", 70000)}); !errors.Is(err, ErrMalformed) {
		t.Errorf("70,000-byte client id: %v", err)
	}
	if _, err := AppendConnect(nil, Connect{Will: &Will{Topic: "t", QoS: 3}}); !errors.Is(err, ErrMalformed) {
		t.Errorf("will QoS 3: %v", err)
	}
}

func TestPublishRoundTrip(t *testing.T) {
	f := func(topic string, payload []byte, qos byte, retain, dup bool, id uint16) {
		t.Helper()
		b, err := AppendPublish(nil, topic, payload, qos, retain, dup, id)
		if err != nil {
			t.Fatal(err)
		}
		p, n, err := Decode(b, 0)
		if err != nil || n != len(b) {
			t.Fatalf("decode: %v, %d of %d", err, n, len(b))
		}
		wantID := id
		if qos == 0 {
			wantID = 0
		}
		if p.Type != PUBLISH || p.Topic != topic || !bytes.Equal(p.Payload, payload) || p.QoS() != qos ||
			p.Retain() != retain || p.Dup() != dup || p.ID != wantID {
			t.Errorf("got %+v", p)
		}
	}
	f("/p/d/properties/report", []byte(`{"properties":{"t":1}}`), 1, false, false, 7)
	f("a", nil, 0, true, false, 0)
	f("a/b", bytes.Repeat([]byte{1}, 200), 1, false, true, 65535) // two length bytes
	f("a/b", bytes.Repeat([]byte{2}, 20000), 0, false, false, 0)  // three
	if _, err := AppendPublish(nil, "", nil, 0, false, false, 0); err == nil {
		t.Error("empty topic accepted")
	}
	if _, err := AppendPublish(nil, "t", nil, 3, false, false, 1); err == nil {
		t.Error("QoS 3 accepted")
	}
}

func TestDecode(t *testing.T) {
	f := func(in []byte, wantErr error, want Packet, wantN int) {
		t.Helper()
		p, n, err := Decode(in, 0)
		if !errors.Is(err, wantErr) || wantErr == nil && err != nil {
			t.Fatalf("% x: err %v, want %v", in, err, wantErr)
		}
		if err != nil {
			return
		}
		if n != wantN || !reflect.DeepEqual(p, want) {
			t.Errorf("% x: got %+v (%d bytes), want %+v (%d)", in, p, n, want, wantN)
		}
	}
	f(nil, ErrShort, Packet{}, 0)
	f([]byte{0x20}, ErrShort, Packet{}, 0)
	f([]byte{0x20, 2, 0}, ErrShort, Packet{}, 0)
	f([]byte{0x20, 2, 0, 0}, nil, Packet{Type: CONNACK}, 4)
	f([]byte{0x20, 2, 1, 5, 0xff}, nil, Packet{Type: CONNACK, SessionPresent: true, ReturnCode: 5}, 4)
	f([]byte{0x20, 2, 2, 0}, ErrMalformed, Packet{}, 0)
	f([]byte{0x20, 3, 0, 0, 0}, ErrMalformed, Packet{}, 0)
	f([]byte{0x40, 2, 0x12, 0x34}, nil, Packet{Type: PUBACK, ID: 0x1234}, 4)
	f([]byte{0x41, 2, 0x12, 0x34}, ErrMalformed, Packet{}, 0)
	f([]byte{0x90, 3, 0, 9, 1}, nil, Packet{Type: SUBACK, ID: 9, Granted: []byte{1}}, 5)
	f([]byte{0x90, 3, 0, 9, 0x80}, nil, Packet{Type: SUBACK, ID: 9, Granted: []byte{0x80}}, 5)
	f([]byte{0x90, 3, 0, 9, 3}, ErrMalformed, Packet{}, 0)
	f([]byte{0xd0, 0}, nil, Packet{Type: PINGRESP}, 2)
	f([]byte{0xd0, 1, 0}, ErrMalformed, Packet{}, 0)
	f([]byte{0xe0, 0}, nil, Packet{Type: DISCONNECT}, 2)
	f([]byte{0x00, 0}, ErrMalformed, Packet{}, 0)
	f([]byte{0xf0, 0}, ErrMalformed, Packet{}, 0)
	f([]byte{0x30, 0xff, 0xff, 0xff, 0xff, 0x01}, ErrMalformed, Packet{}, 0) // five length bytes
	f([]byte{0x30, 3, 0, 1, 'a'}, nil, Packet{Type: PUBLISH, Topic: "a", Payload: []byte{}}, 5)
	f([]byte{0x30, 3, 0, 1, '#'}, ErrMalformed, Packet{}, 0)
	f([]byte{0x32, 5, 0, 1, 'a', 0, 0}, ErrMalformed, Packet{}, 0) // id 0
	f([]byte{0x36, 5, 0, 1, 'a', 0, 1}, ErrMalformed, Packet{}, 0) // QoS 3
	f([]byte{0x38, 3, 0, 1, 'a'}, ErrMalformed, Packet{}, 0)       // dup at QoS 0
	f([]byte{0x30, 1, 0}, ErrMalformed, Packet{}, 0)
	// Two packets in a row: the first is decoded, its length returned.
	f([]byte{0x40, 2, 0, 1, 0x40, 2, 0, 2}, nil, Packet{Type: PUBACK, ID: 1}, 4)
	if _, _, err := Decode([]byte{0x30, 0x80, 0x80, 0x01}, 1000); !errors.Is(err, ErrTooLarge) {
		t.Errorf("16 KiB packet with limit 1000: %v", err)
	}
}

func TestAppendSmall(t *testing.T) {
	if b := AppendPuback(nil, 0x0102); !bytes.Equal(b, []byte{0x40, 2, 1, 2}) {
		t.Errorf("PUBACK % x", b)
	}
	if b := AppendPingreq(nil); !bytes.Equal(b, []byte{0xc0, 0}) {
		t.Errorf("PINGREQ % x", b)
	}
	if b := AppendDisconnect(nil); !bytes.Equal(b, []byte{0xe0, 0}) {
		t.Errorf("DISCONNECT % x", b)
	}
	b, err := AppendSubscribe(nil, 3, "/p/d/#", 1)
	if err != nil || !bytes.Equal(b, []byte{0x82, 11, 0, 3, 0, 6, '/', 'p', '/', 'd', '/', '#', 1}) {
		t.Errorf("SUBSCRIBE % x, %v", b, err)
	}
}
