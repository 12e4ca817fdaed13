package tsdb

import (
	"cmp"
	"slices"
	"strings"
)

// Rows are inserted in the order of their table's ORDER BY key. A
// MergeTree sorts every inserted block by that key unless it is sorted
// already (18.16 and later check, and count the blocks they need not sort
// in MergeTreeDataWriterBlocksAlreadySorted); sorting, and permuting each
// string column after it, was a quarter of ClickHouse's CPU at full ingest
// load.
//
// A general sort of a flush's rows costs about as much here as it saves
// there (2.1 µs per message in BenchmarkOrder), so the order uses what a
// flush looks like: many rows per device, rows of one message next to
// each other sharing their strings, a few distinct property ids, and rows
// of a device arriving in time order nearly always. Devices and property
// ids are ranked once each, rows are put in (device, property) order by
// two stable counting passes (a radix sort on the ranks), and only a run
// of one device and property whose times are out of order is sorted.
//
// device_message's key ends in time, a DateTime of seconds; ordering by
// the millisecond time (ts) is finer, so it is sorted for ClickHouse too.
// device_property's key (since schema 00006) is (product_id, device_id,
// ts, property): reportOrder.
// Strings compare as bytes, as ClickHouse compares String.

type deviceKey struct{ product, device string }

// orderer holds the scratch space of one ordering, reused between inserts.
type orderer struct {
	devices map[deviceKey]int32
	keys    []deviceKey
	names   map[string]int32
	ids     []string
	rank    []int32 // index in keys or ids -> rank in sorted order
	dev     []int32 // row -> device index, then rank
	prop    []int32 // row -> property index, then rank
	t       []int64 // row -> time, ms
	start   []int32 // rank -> next position in the pass's output
	by      []int32 // rows in property order, the device pass's input (properties)
	perm    []int32
}

// messageOrder returns the indexes of b's messages in (product_id,
// device_id, time) order.
func (o *orderer) messageOrder(b *Batch) []int32 {
	n := len(b.msgs)
	o.dev, o.t = resize(o.dev, n), resize(o.t, n)
	for i := range b.msgs {
		r, prev := &b.msgs[i], &b.msgs[max(i-1, 0)]
		o.dev[i] = o.rowDevice(b, i, r.product, r.device, prev.product, prev.device)
		o.t[i] = r.ms
	}
	o.byDevice(nil)
	o.sortRuns(func(a, b int32) bool { return o.dev[a] == o.dev[b] }, nil)
	o.reset()
	return o.perm
}

// propertyOrder returns the indexes of b's property values in
// (product_id, device_id, property, time) order: device_property's key
// before schema 00006 (Options.SchemaVersion).
func (o *orderer) propertyOrder(b *Batch) []int32 {
	o.rankProps(b)
	o.by = resize(o.by, len(b.props))
	countingPass(o.prop, len(o.ids), nil, o.by, &o.start)
	o.byDevice(o.by)
	o.sortRuns(func(a, b int32) bool { return o.dev[a] == o.dev[b] && o.prop[a] == o.prop[b] }, nil)
	o.reset()
	return o.perm
}

// reportOrder returns the indexes of b's property values in (product_id,
// device_id, ts, property) order, device_property's key since schema
// 00006: by device (a counting pass), then each device's run by time and
// property, sorted only when not in that order already (a message's
// values arrive together, mostly in the thing model's order, which is
// not the names' order: such a run is sorted).
func (o *orderer) reportOrder(b *Batch) []int32 {
	o.rankProps(b)
	o.byDevice(nil)
	o.sortRuns(func(a, b int32) bool { return o.dev[a] == o.dev[b] }, func(a, b int32) int {
		if c := cmp.Compare(o.t[a], o.t[b]); c != 0 {
			return c
		}
		return cmp.Compare(o.prop[a], o.prop[b])
	})
	o.reset()
	return o.perm
}

// rankProps fills o.dev (device indexes), o.prop (property ranks) and o.t
// for b's property values.
func (o *orderer) rankProps(b *Batch) {
	n := len(b.props)
	o.dev, o.prop, o.t = resize(o.dev, n), resize(o.prop, n), resize(o.t, n)
	if o.names == nil {
		o.names = make(map[string]int32)
	}
	for i := range b.props {
		r, prev := &b.props[i], &b.props[max(i-1, 0)]
		o.dev[i] = o.rowDevice(b, i, r.product, r.device, prev.product, prev.device)
		name := b.str(r.prop)
		k, ok := o.names[name]
		if !ok {
			k = int32(len(o.ids))
			o.names[name] = k
			o.ids = append(o.ids, name)
		}
		o.prop[i] = k
		o.t[i] = r.ms
	}
	o.rankInto(len(o.ids), func(a, b int32) int { return strings.Compare(o.ids[a], o.ids[b]) })
	for i, k := range o.prop {
		o.prop[i] = o.rank[k]
	}
}

// rowDevice returns the device index of row i, of product and device;
// prevProduct and prevDevice are row i-1's. Rows of one message share
// their spans (Batch stores a string repeated from the previous row once),
// so most rows compare equal to the previous one at once.
func (o *orderer) rowDevice(b *Batch, i int, product, device, prevProduct, prevDevice span) int32 {
	if i > 0 && (device == prevDevice || b.str(device) == b.str(prevDevice)) &&
		(product == prevProduct || b.str(product) == b.str(prevProduct)) {
		return o.dev[i-1]
	}
	return o.device(b.str(product), b.str(device))
}

// device returns the index of (product, device) in o.keys, adding it.
func (o *orderer) device(product, device string) int32 {
	if o.devices == nil {
		o.devices = make(map[deviceKey]int32)
	}
	k := deviceKey{product, device}
	d, ok := o.devices[k]
	if !ok {
		d = int32(len(o.keys))
		o.devices[k] = d
		o.keys = append(o.keys, k)
	}
	return d
}

// rankInto sets o.rank[i] to the rank of item i of n under compare.
func (o *orderer) rankInto(n int, compare func(a, b int32) int) {
	order := identity(o.start, n) // borrowed: start is not in use yet
	slices.SortFunc(order, compare)
	o.rank = resize(o.rank, n)
	for r, i := range order {
		o.rank[i] = int32(r)
	}
	o.start = order
}

// byDevice ranks the devices and fills o.perm with the rows of in (nil:
// every row, in row order), stably ordered by device rank; o.dev holds
// ranks afterwards.
func (o *orderer) byDevice(in []int32) {
	o.rankInto(len(o.keys), func(a, b int32) int {
		ka, kb := &o.keys[a], &o.keys[b]
		if c := strings.Compare(ka.product, kb.product); c != 0 {
			return c
		}
		return strings.Compare(ka.device, kb.device)
	})
	for i, d := range o.dev {
		o.dev[i] = o.rank[d]
	}
	o.perm = resize(o.perm, len(o.dev))
	countingPass(o.dev, len(o.keys), in, o.perm, &o.start)
}

// countingPass writes the rows of in (nil: 0..len(key)-1) to out, stably
// ordered by key[row], a rank below ranks; start is its scratch space.
func countingPass(key []int32, ranks int, in, out []int32, start *[]int32) {
	next := resize(*start, ranks+1)
	clear(next)
	for _, k := range key {
		next[k+1]++
	}
	for r := 1; r <= ranks; r++ {
		next[r] += next[r-1]
	}
	if in == nil {
		for i, k := range key {
			out[next[k]] = int32(i)
			next[k]++
		}
	} else {
		for _, i := range in {
			k := key[i]
			out[next[k]] = i
			next[k]++
		}
	}
	*start = next
}

// sortRuns sorts by order (nil: by time) each run of o.perm whose rows
// are alike (same device, or device and property) and not in that order
// already.
func (o *orderer) sortRuns(alike func(a, b int32) bool, order func(a, b int32) int) {
	if order == nil {
		order = func(a, b int32) int { return cmp.Compare(o.t[a], o.t[b]) }
	}
	byTime := order
	p := o.perm
	for lo := 0; lo < len(p); {
		hi, sorted := lo+1, true
		for ; hi < len(p) && alike(p[lo], p[hi]); hi++ {
			if order(p[hi-1], p[hi]) > 0 {
				sorted = false
			}
		}
		if !sorted {
			slices.SortFunc(p[lo:hi], byTime)
		}
		lo = hi
	}
}

// reset forgets the strings of this ordering, keeping the space.
func (o *orderer) reset() {
	clear(o.devices)
	clear(o.keys)
	o.keys = o.keys[:0]
	clear(o.names)
	clear(o.ids)
	o.ids = o.ids[:0]
}

func identity(perm []int32, n int) []int32 {
	perm = resize(perm, n)
	for i := range perm {
		perm[i] = int32(i)
	}
	return perm
}
