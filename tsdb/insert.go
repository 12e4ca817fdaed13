package tsdb

import (
	"context"
	"fmt"
	"time"
	"unsafe"
)

// Message is one uplink or downlink message, a row of device_message.
type Message struct {
	Time        time.Time // stored as DateTime (seconds) plus ts (epoch ms)
	ProductID   string
	DeviceID    string
	Direction   string // "up" or "down"
	MessageType string
	MessageID   string
	Topic       string
	Payload     []byte // raw payload; must not be modified after Add/Insert
}

// PropertyValue is one property value, a row of device_property.
type PropertyValue struct {
	Time      time.Time
	ProductID string
	DeviceID  string
	MessageID string
	Property  string
	ValueType string  // "number", "string", "bool" or "json"
	Num       float64 // the value when ValueType is "number" (bool: 0/1 if the caller wants)
	Str       string  // the value as text otherwise
}

// DateTime covers 1970-01-01 .. 2106-02-07 UTC; outside it the server
// would store garbage, so such rows are refused before they are queued.
var (
	minTime = time.Unix(0, 0)
	maxTime = time.Unix(1<<32-1, 0)
)

func checkTime(t time.Time) error {
	if t.Before(minTime) || t.After(maxTime) {
		return fmt.Errorf("time %s outside 1970..2106: %w", t.Format(time.RFC3339), ErrInvalidArgument)
	}
	return nil
}

// Validate reports why m cannot be stored, or nil.
func (m *Message) Validate() error {
	if m.Direction != "up" && m.Direction != "down" {
		return fmt.Errorf("message %q: direction %q not up/down: %w", m.MessageID, m.Direction, ErrInvalidArgument)
	}
	if err := checkTime(m.Time); err != nil {
		return fmt.Errorf("message %q: %w", m.MessageID, err)
	}
	return nil
}

// Validate reports why p cannot be stored, or nil.
func (p *PropertyValue) Validate() error {
	switch p.ValueType {
	case "number", "string", "bool", "json":
	default:
		return fmt.Errorf("property %q: value type %q: %w", p.Property, p.ValueType, ErrInvalidArgument)
	}
	if err := checkTime(p.Time); err != nil {
		return fmt.Errorf("property %q: %w", p.Property, err)
	}
	return nil
}

func validate(msgs []Message, props []PropertyValue) error {
	for i := range msgs {
		if err := msgs[i].Validate(); err != nil {
			return fmt.Errorf("tsdb: %w", err)
		}
	}
	for i := range props {
		if err := props[i].Validate(); err != nil {
			return fmt.Errorf("tsdb: %w", err)
		}
	}
	return nil
}

const (
	insertMessages = "INSERT INTO device_message (time, ts, product_id, device_id, direction, message_type, message_id, topic, payload)"
	insertProps    = "INSERT INTO device_property (time, ts, product_id, device_id, property, value_type, num_value, str_value, message_id)"
)

// Insert stores msgs and props, one INSERT per table, columns appended
// whole. It neither keeps nor modifies its arguments, so after an error the
// caller may retry with the same slices. Messages are written first; when
// the property insert fails after that, a retry writes the messages again
// (MergeTree does not deduplicate), so a caller that cares retries the two
// parts separately, as Writer does.
func (db *DB) Insert(ctx context.Context, msgs []Message, props []PropertyValue) error {
	if err := validate(msgs, props); err != nil {
		return err
	}
	ctx, cancel := db.ctx(ctx)
	defer cancel()
	if len(msgs) > 0 {
		if err := db.insertMessages(ctx, msgs); err != nil {
			return fmt.Errorf("tsdb: insert %d messages: %w", len(msgs), err)
		}
	}
	if len(props) > 0 {
		if err := db.insertProps(ctx, props); err != nil {
			return fmt.Errorf("tsdb: insert %d property values: %w", len(props), err)
		}
	}
	return nil
}

// Column buffers are reused between inserts (sendBlocks copies them into
// the driver's block), so a flush allocates nothing per row.
type (
	messageColumns struct {
		order                                    orderer
		tm                                       []time.Time
		ts                                       []int64
		product, device, dir, typ, id, topic, pl []string
	}
	propColumns struct {
		order                              orderer
		tm                                 []time.Time
		ts                                 []int64
		product, device, prop, vt, str, id []string
		num                                []float64
	}
)

// Free lists, not sync.Pools: a pool drops what was not taken again
// within two GC cycles, and at full ingest load the GC runs about as often
// as a table is inserted into, so the buffers (and the orderer's space)
// were often allocated again, a sixth of what a flush allocated. A handful
// of inserts run at once (one per table per writer); more just allocate.
var (
	messageColumnFree = make(chan *messageColumns, 8)
	propColumnFree    = make(chan *propColumns, 8)
)

// take returns a free T or a new one; give keeps t for the next take
// unless the list is full.
func take[T any](free chan *T) *T {
	select {
	case t := <-free:
		return t
	default:
		return new(T)
	}
}

func give[T any](free chan *T, t *T) {
	select {
	case free <- t:
	default:
	}
}

// resize returns s with length n, reusing its array when it is big enough;
// the caller overwrites every element.
func resize[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

// insertBlockRows is the most rows one block of an INSERT carries. The
// client holds a copy of one block at a time, not of the whole batch;
// the server squashes an INSERT's blocks into one part (up to its
// min_insert_block_size_rows, about a million), so a batch is still stored
// all or nothing.
const insertBlockRows = 8192

func (db *DB) insertMessages(ctx context.Context, msgs []Message) error {
	c := take(messageColumnFree)
	defer func() {
		// Drop the references to payloads and ids before pooling.
		for _, col := range [][]string{c.product, c.device, c.dir, c.typ, c.id, c.topic, c.pl} {
			clear(col)
		}
		give(messageColumnFree, c)
	}()
	perm := c.order.messageOrder(msgs)
	return db.sendBlocks(ctx, insertMessages, len(msgs), func(lo, hi int) []any {
		n := hi - lo
		c.tm, c.ts = resize(c.tm, n), resize(c.ts, n)
		c.product, c.device, c.dir, c.typ = resize(c.product, n), resize(c.device, n), resize(c.dir, n), resize(c.typ, n)
		c.id, c.topic, c.pl = resize(c.id, n), resize(c.topic, n), resize(c.pl, n)
		for i := range n {
			m := &msgs[perm[lo+i]]
			c.tm[i] = m.Time
			c.ts[i] = m.Time.UnixMilli()
			c.product[i], c.device[i], c.dir[i] = m.ProductID, m.DeviceID, m.Direction
			c.typ[i], c.id[i], c.topic[i] = m.MessageType, m.MessageID, m.Topic
			c.pl[i] = unsafe.String(unsafe.SliceData(m.Payload), len(m.Payload)) // read-only: Payload must not change after Add
		}
		return []any{c.tm, c.ts, c.product, c.device, c.dir, c.typ, c.id, c.topic, c.pl}
	})
}

func (db *DB) insertProps(ctx context.Context, props []PropertyValue) error {
	c := take(propColumnFree)
	defer func() {
		for _, col := range [][]string{c.product, c.device, c.prop, c.vt, c.str, c.id} {
			clear(col)
		}
		give(propColumnFree, c)
	}()
	perm := c.order.propertyOrder(props)
	return db.sendBlocks(ctx, insertProps, len(props), func(lo, hi int) []any {
		n := hi - lo
		c.tm, c.ts, c.num = resize(c.tm, n), resize(c.ts, n), resize(c.num, n)
		c.product, c.device, c.prop = resize(c.product, n), resize(c.device, n), resize(c.prop, n)
		c.vt, c.str, c.id = resize(c.vt, n), resize(c.str, n), resize(c.id, n)
		for i := range n {
			p := &props[perm[lo+i]]
			c.tm[i] = p.Time
			c.ts[i] = p.Time.UnixMilli()
			c.product[i], c.device[i], c.prop[i], c.vt[i] = p.ProductID, p.DeviceID, p.Property, p.ValueType
			c.num[i], c.str[i], c.id[i] = p.Num, p.Str, p.MessageID
		}
		return []any{c.tm, c.ts, c.product, c.device, c.prop, c.vt, c.num, c.str, c.id}
	})
}

// sendBlocks runs one INSERT of n rows, sent in blocks of insertBlockRows;
// block(lo, hi) returns the columns of rows lo..hi-1, in the query's order.
func (db *DB) sendBlocks(ctx context.Context, query string, n int, block func(lo, hi int) []any) error {
	batch, err := db.conn.PrepareBatch(ctx, query)
	if err != nil {
		return err
	}
	defer batch.Close()
	for lo := 0; lo < n; lo += insertBlockRows {
		hi := min(n, lo+insertBlockRows)
		for i, c := range block(lo, hi) {
			if err := batch.Column(i).Append(c); err != nil {
				return fmt.Errorf("column %d: %w", i, err)
			}
		}
		if hi < n {
			if err := batch.Flush(); err != nil {
				return err
			}
		}
	}
	return batch.Send()
}
