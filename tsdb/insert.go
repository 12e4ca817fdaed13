package tsdb

import (
	"context"
	"fmt"
	"time"

	"devicehub/schema"
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
	if s := t.Unix(); s < minTime.Unix() || s > maxTime.Unix() {
		return fmt.Errorf("time %s outside 1970..2106: %w", t.Format(time.RFC3339), schema.ErrIllegalArgument)
	}
	return nil
}

// Validate reports why m cannot be stored, or nil.
func (m *Message) Validate() error {
	if m.Direction != "up" && m.Direction != "down" {
		return fmt.Errorf("message %q: direction %q not up/down: %w", m.MessageID, m.Direction, schema.ErrIllegalArgument)
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
		return fmt.Errorf("property %q: value type %q: %w", p.Property, p.ValueType, schema.ErrIllegalArgument)
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
	insertProps    = "INSERT INTO device_property (ts, product_id, device_id, property, value_type, num_value, str_value)"
	// insertPropsOld is insertProps before schema 00006 (Options.SchemaVersion).
	insertPropsOld = "INSERT INTO device_property (time, ts, product_id, device_id, property, value_type, num_value, str_value)"
)

// Insert stores msgs and props, one INSERT per table. It neither keeps
// nor modifies its arguments, so after an error the caller may retry with
// the same slices. Messages are written first; when the property insert
// fails after that, a retry writes the messages again (MergeTree does not
// deduplicate), so a caller that cares retries the two parts separately,
// as Writer does.
func (db *DB) Insert(ctx context.Context, msgs []Message, props []PropertyValue) error {
	b := take(batchFree)
	defer func() {
		b.Reset()
		give(batchFree, b)
	}()
	if err := b.Append(msgs, props); err != nil {
		return err
	}
	return db.InsertBatch(ctx, b)
}

// InsertBatch stores the rows of b, one INSERT per table, in the same way
// as Insert; b is not modified.
func (db *DB) InsertBatch(ctx context.Context, b *Batch) error {
	ctx, cancel := db.ctx(ctx)
	defer cancel()
	// Once the rows are stored (or may be, after an error), cached
	// dashboard answers no longer count them all.
	defer db.invalidate()
	if len(b.msgs) > 0 {
		// The messages patch the kept totals and those of closed days the
		// kept months (daycounts.go, daytotals.go).
		db.days.totals.begin()
		start := time.Now()
		all := b.batchQuarters()
		late := db.days.late(all, start)
		err := db.insertMessages(ctx, b)
		db.days.stored(late, start, err == nil)
		db.days.totals.stored(all, start, err == nil)
		if err != nil {
			return fmt.Errorf("tsdb: insert %d messages: %w", len(b.msgs), err)
		}
	}
	if len(b.props) > 0 {
		// The numeric values patch the kept property totals and chunks
		// alike (propaggs.go).
		db.props.totals.begin()
		start := time.Now()
		all := b.batchHours()
		late := db.props.late(all, start)
		err := db.insertProps(ctx, b)
		db.props.stored(late, start, err == nil)
		db.props.totals.stored(all, start, err == nil)
		if err != nil {
			return fmt.Errorf("tsdb: insert %d property values: %w", len(b.props), err)
		}
	}
	return nil
}

// Column buffers are reused between inserts (sendBlocks copies them into
// the driver's block), so a flush allocates nothing per row. The strings
// point into the Batch's arena and are cleared after use.
type (
	messageColumns struct {
		order                                    orderer
		sec, ts                                  []int64
		product, device, dir, typ, id, topic, pl []string
	}
	propColumns struct {
		order                          orderer
		sec, ts                        []int64
		product, device, prop, vt, str []string
		num                            []float64
	}
)

// Free lists, not sync.Pools: a pool drops what was not taken again
// within two GC cycles, and at full ingest load the GC ran about as often
// as a table was inserted into, so the buffers (and the orderer's space)
// were often allocated again, a sixth of what a flush allocated. A handful
// of inserts run at once (one per table per writer); more just allocate.
var (
	messageColumnFree = make(chan *messageColumns, 8)
	propColumnFree    = make(chan *propColumns, 8)
	batchFree         = make(chan *Batch, 8) // Insert's
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

// seconds is the DateTime of epoch ms (validated: not negative).
func seconds(ms int64) int64 { return ms / 1000 }

func (db *DB) insertMessages(ctx context.Context, b *Batch) error {
	c := take(messageColumnFree)
	defer func() {
		for _, col := range [][]string{c.product, c.device, c.dir, c.typ, c.id, c.topic, c.pl} {
			clear(col)
		}
		give(messageColumnFree, c)
	}()
	perm := c.order.messageOrder(b)
	return db.sendBlocks(ctx, insertMessages, len(b.msgs), func(lo, hi int) []any {
		n := hi - lo
		c.sec, c.ts = resize(c.sec, n), resize(c.ts, n)
		c.product, c.device, c.dir, c.typ = resize(c.product, n), resize(c.device, n), resize(c.dir, n), resize(c.typ, n)
		c.id, c.topic, c.pl = resize(c.id, n), resize(c.topic, n), resize(c.pl, n)
		for i := range n {
			m := &b.msgs[perm[lo+i]]
			c.sec[i], c.ts[i] = seconds(m.ms), m.ms
			c.product[i], c.device[i], c.dir[i] = b.str(m.product), b.str(m.device), b.str(m.dir)
			c.typ[i], c.id[i], c.topic[i], c.pl[i] = b.str(m.typ), b.str(m.id), b.str(m.topic), b.str(m.payload)
		}
		return []any{c.sec, c.ts, c.product, c.device, c.dir, c.typ, c.id, c.topic, c.pl}
	})
}

func (db *DB) insertProps(ctx context.Context, b *Batch) error {
	c := take(propColumnFree)
	defer func() {
		for _, col := range [][]string{c.product, c.device, c.prop, c.vt, c.str} {
			clear(col)
		}
		give(propColumnFree, c)
	}()
	perm, query := c.order.reportOrder(b), insertProps
	if db.oldLayout {
		perm, query = c.order.propertyOrder(b), insertPropsOld
	}
	return db.sendBlocks(ctx, query, len(b.props), func(lo, hi int) []any {
		n := hi - lo
		c.sec, c.ts, c.num = resize(c.sec, n), resize(c.ts, n), resize(c.num, n)
		c.product, c.device, c.prop = resize(c.product, n), resize(c.device, n), resize(c.prop, n)
		c.vt, c.str = resize(c.vt, n), resize(c.str, n)
		for i := range n {
			p := &b.props[perm[lo+i]]
			c.sec[i], c.ts[i] = seconds(p.ms), p.ms
			c.product[i], c.device[i], c.prop[i], c.vt[i] = b.str(p.product), b.str(p.device), b.str(p.prop), b.str(p.vt)
			c.num[i], c.str[i] = p.num, b.str(p.str)
		}
		if db.oldLayout {
			return []any{c.sec, c.ts, c.product, c.device, c.prop, c.vt, c.num, c.str}
		}
		return []any{c.ts, c.product, c.device, c.prop, c.vt, c.num, c.str}
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
