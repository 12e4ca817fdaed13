package mqttc

import (
	"bytes"
	"errors"
	"testing"
)

// FuzzDecode: any bytes decode without a panic, to a packet no longer than
// the input, or to one of the package's errors; a decoded PUBLISH or
// CONNECT encodes back to a packet that decodes the same.
func FuzzDecode(f *testing.F) {
	for _, seed := range [][]byte{
		{0x20, 2, 0, 0}, {0x40, 2, 0, 1}, {0x90, 3, 0, 9, 1}, {0xd0, 0},
		{0x32, 7, 0, 3, '/', 'a', 'b', 0, 1}, {0x30, 0xff, 0xff, 0xff, 0x7f},
	} {
		f.Add(seed)
	}
	if b, err := AppendConnect(nil, Connect{ClientID: "d", Username: "u", Password: "p", KeepAlive: 60, CleanSession: true,
		Will: &Will{Topic: "/p/d/offline", Payload: []byte("{}"), QoS: 1}}); err == nil {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		p, n, err := Decode(b, 1<<20)
		if err != nil {
			if !errors.Is(err, ErrShort) && !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrTooLarge) {
				t.Fatalf("unexpected error %v", err)
			}
			return
		}
		if n < 2 || n > len(b) {
			t.Fatalf("length %d of %d bytes", n, len(b))
		}
		switch p.Type {
		case PUBLISH:
			out, err := AppendPublish(nil, p.Topic, p.Payload, p.QoS(), p.Retain(), p.Dup(), p.ID)
			if err != nil {
				t.Fatalf("re-encode %+v: %v", p, err)
			}
			q, _, err := Decode(out, 0)
			if err != nil || q.Topic != p.Topic || !bytes.Equal(q.Payload, p.Payload) || q.Flags != p.Flags || q.ID != p.ID {
				t.Fatalf("round trip %+v -> %+v (%v)", p, q, err)
			}
		case CONNECT:
			out, err := AppendConnect(nil, *p.Connect)
			if err != nil {
				t.Fatalf("re-encode %+v: %v", p.Connect, err)
			}
			q, _, err := Decode(out, 0)
			if err != nil || q.Connect.ClientID != p.Connect.ClientID || q.Connect.Username != p.Connect.Username ||
				q.Connect.Password != p.Connect.Password || (q.Connect.Will == nil) != (p.Connect.Will == nil) {
				t.Fatalf("round trip %+v -> %+v (%v)", p.Connect, q.Connect, err)
			}
		}
	})
}
