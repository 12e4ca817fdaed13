package tsdb

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
	"unsafe"
)

// Batch holds rows waiting for an INSERT in a compact form: a fixed-size
// record per row (64 bytes a message, 56 a property value) whose strings, payloads included, are copied
// into one byte arena. Nothing in it is a pointer, so however many rows a
// Writer buffers, the GC neither scans them nor tracks their strings one
// by one, and a buffered row costs its record and its bytes, not the
// decoder's objects, which become garbage at once.
//
// As []Message and []PropertyValue (128 bytes a property value, plus a
// string header and object per id and value), batches of 100,000 rows
// held devicehub at its memory limit, with the GC running two to three
// times a second; batches three times that size, which ClickHouse merges
// far less often, took it to 360 MiB without a limit (BENCHMARKS.md).
//
// A Batch is not safe for concurrent use. Strings it hands out (to the
// orderer and the INSERT's columns) point into the arena and are valid
// until the next Reset.
type Batch struct {
	arena []byte
	msgs  []msgRec
	props []propRec
}

// span is a string of the arena.
type span struct{ off, n uint32 }

// Strings that repeat from one row to the next (a message's product and
// device on each of its property values) are stored once: a row's span
// then equals the previous row's.
type (
	msgRec struct {
		ms                                            int64 // epoch ms
		product, device, dir, typ, id, topic, payload span
	}
	propRec struct {
		ms                             int64 // epoch ms
		num                            float64
		product, device, prop, vt, str span
	}
)

// maxArena is the most bytes a Batch holds; spans are 32-bit. A Writer
// flushes long before (MaxBytes).
const maxArena = math.MaxUint32

// ErrBatchFull is returned by Append (and Writer.Add) when the rows would
// not fit.
var ErrBatchFull = errors.New("tsdb: batch full")

// Len returns the rows held.
func (b *Batch) Len() int { return len(b.msgs) + len(b.props) }

// Bytes returns the memory the rows take: records and arena.
func (b *Batch) Bytes() int {
	return len(b.arena) + len(b.msgs)*int(unsafe.Sizeof(msgRec{})) + len(b.props)*int(unsafe.Sizeof(propRec{}))
}

// Reset empties b, keeping its memory.
func (b *Batch) Reset() {
	b.arena, b.msgs, b.props = b.arena[:0], b.msgs[:0], b.props[:0]
}

// Append validates msgs and props and copies them into b, payloads
// included; on error nothing is added.
func (b *Batch) Append(msgs []Message, props []PropertyValue) error {
	if err := validate(msgs, props); err != nil {
		return err
	}
	if err := b.fits(rowBytes(msgs, props)); err != nil {
		return err
	}
	b.appendRows(msgs, props)
	return nil
}

// rowBytes is what msgs and props take in a Batch at most: their records
// and every string (a string repeated from the previous row takes none).
func rowBytes(msgs []Message, props []PropertyValue) int {
	need := len(msgs)*int(unsafe.Sizeof(msgRec{})) + len(props)*int(unsafe.Sizeof(propRec{}))
	for i := range msgs {
		m := &msgs[i]
		need += len(m.ProductID) + len(m.DeviceID) + len(m.Direction) + len(m.MessageType) + len(m.MessageID) + len(m.Topic) + len(m.Payload)
	}
	for i := range props {
		p := &props[i]
		need += len(p.ProductID) + len(p.DeviceID) + len(p.Property) + len(p.ValueType) + len(p.Str)
	}
	return need
}

// fits returns ErrBatchFull unless rows of need bytes (rowBytes) fit.
func (b *Batch) fits(need int) error {
	if len(b.arena)+need > maxArena {
		return fmt.Errorf("%w: %d bytes more than %d", ErrBatchFull, len(b.arena)+need, maxArena)
	}
	return nil
}

// appendRows is Append of validated rows that fit.
func (b *Batch) appendRows(msgs []Message, props []PropertyValue) {
	// Records are written in place, each string compared with the one
	// of the previous row (the zero record before the first).
	var zm msgRec
	n := len(b.msgs)
	b.msgs = slices.Grow(b.msgs, len(msgs))[:n+len(msgs)]
	for i := range msgs {
		m, r, prev := &msgs[i], &b.msgs[n+i], &zm
		if n+i > 0 {
			prev = &b.msgs[n+i-1]
		}
		r.ms = m.Time.UnixMilli()
		r.product = b.intern(m.ProductID, prev.product)
		r.device = b.intern(m.DeviceID, prev.device)
		r.dir = b.intern(m.Direction, prev.dir)
		r.typ = b.intern(m.MessageType, prev.typ)
		r.id = b.add(m.MessageID)
		r.topic = b.intern(m.Topic, prev.topic)
		r.payload = b.add(unsafe.String(unsafe.SliceData(m.Payload), len(m.Payload)))
	}
	var zp propRec
	n = len(b.props)
	b.props = slices.Grow(b.props, len(props))[:n+len(props)]
	for i := range props {
		p, r, prev := &props[i], &b.props[n+i], &zp
		if n+i > 0 {
			prev = &b.props[n+i-1]
		}
		r.ms, r.num = p.Time.UnixMilli(), p.Num
		r.product = b.intern(p.ProductID, prev.product)
		r.device = b.intern(p.DeviceID, prev.device)
		r.prop = b.add(p.Property)
		r.vt = b.intern(p.ValueType, prev.vt)
		r.str = b.add(p.Str)
	}
}

// add copies s into the arena.
func (b *Batch) add(s string) span {
	sp := span{uint32(len(b.arena)), uint32(len(s))}
	b.arena = append(b.arena, s...)
	return sp
}

// intern returns prev when it holds s already, else adds s.
func (b *Batch) intern(s string, prev span) span {
	if int(prev.n) == len(s) && b.str(prev) == s {
		return prev
	}
	return b.add(s)
}

// str returns the string of sp, in the arena: read-only, valid until Reset.
func (b *Batch) str(sp span) string {
	if sp.n == 0 {
		return ""
	}
	return unsafe.String(&b.arena[sp.off], int(sp.n))
}

// text returns a copy of sp's string, which outlives the batch.
func (b *Batch) text(sp span) string { return strings.Clone(b.str(sp)) }

// bytes returns a copy of sp, nil if empty.
func (b *Batch) bytes(sp span) []byte {
	if sp.n == 0 {
		return nil
	}
	return []byte(b.str(sp))
}

// Messages returns copies of the messages held, in the order added.
func (b *Batch) Messages() []Message {
	out := make([]Message, len(b.msgs))
	for i := range b.msgs {
		r := &b.msgs[i]
		out[i] = Message{
			Time:        time.UnixMilli(r.ms),
			ProductID:   b.text(r.product),
			DeviceID:    b.text(r.device),
			Direction:   b.text(r.dir),
			MessageType: b.text(r.typ),
			MessageID:   b.text(r.id),
			Topic:       b.text(r.topic),
			Payload:     b.bytes(r.payload),
		}
	}
	return out
}

// Properties returns copies of the property values held, in the order
// added.
func (b *Batch) Properties() []PropertyValue {
	out := make([]PropertyValue, len(b.props))
	for i := range b.props {
		r := &b.props[i]
		out[i] = PropertyValue{
			Time:      time.UnixMilli(r.ms),
			ProductID: b.text(r.product),
			DeviceID:  b.text(r.device),
			Property:  b.text(r.prop),
			ValueType: b.text(r.vt),
			Num:       r.num,
			Str:       b.text(r.str),
		}
	}
	return out
}
