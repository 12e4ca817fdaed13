package tsdb

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The reference orders: the tables' ORDER BY keys, compared the slow way.
func cmpMessage(a, b *Message) int {
	return cmpKey(a.ProductID, b.ProductID, a.DeviceID, b.DeviceID, "", "", a.Time, b.Time)
}

// cmpReport is device_property's key since schema 00006.
func cmpReport(a, b *PropertyValue) int {
	if c := strings.Compare(a.ProductID, b.ProductID); c != 0 {
		return c
	}
	if c := strings.Compare(a.DeviceID, b.DeviceID); c != 0 {
		return c
	}
	if c := a.Time.Compare(b.Time); c != 0 {
		return c
	}
	return strings.Compare(a.Property, b.Property)
}

func cmpProperty(a, b *PropertyValue) int {
	return cmpKey(a.ProductID, b.ProductID, a.DeviceID, b.DeviceID, a.Property, b.Property, a.Time, b.Time)
}

func cmpKey(pa, pb, da, db, na, nb string, ta, tb time.Time) int {
	if c := strings.Compare(pa, pb); c != 0 {
		return c
	}
	if c := strings.Compare(da, db); c != 0 {
		return c
	}
	if c := strings.Compare(na, nb); c != 0 {
		return c
	}
	return ta.Compare(tb)
}

// checkPerm fails unless perm holds every index below n once.
func checkPerm(t *testing.T, perm []int32, n int) {
	t.Helper()
	if len(perm) != n {
		t.Fatalf("permutation of %d indexes for %d rows", len(perm), n)
	}
	seen := make([]bool, n)
	for _, i := range perm {
		if i < 0 || int(i) >= n || seen[i] {
			t.Fatalf("index %d out of range or repeated", i)
		}
		seen[i] = true
	}
}

func TestOrder(t *testing.T) {
	base := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	type shape struct {
		name                     string
		msgs, products, devices  int
		props                    int  // distinct property ids
		shuffle                  bool // messages in random order, not time order per device
		mixProducts              bool // one device id under several products
		sameSecond, sharedString bool
	}
	for _, s := range []shape{
		{name: "empty"},
		{name: "one", msgs: 1, products: 1, devices: 1, props: 1},
		{name: "fleet in time order", msgs: 3000, products: 2, devices: 100, props: 14, sharedString: true},
		{name: "shuffled", msgs: 3000, products: 3, devices: 50, props: 9, shuffle: true},
		{name: "same second, ms apart", msgs: 2000, products: 1, devices: 7, props: 3, sameSecond: true, shuffle: true},
		{name: "one device", msgs: 500, products: 1, devices: 1, props: 20, shuffle: true},
		{name: "all devices distinct", msgs: 1000, products: 5, devices: 1000, props: 2},
		{name: "a device id under several products", msgs: 1000, products: 3, devices: 10, props: 4, mixProducts: true},
	} {
		t.Run(s.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, uint64(s.msgs)))
			var msgs []Message
			var props []PropertyValue
			for k := range s.msgs {
				d := rng.IntN(s.devices)
				product := "p" + strconv.Itoa(d%s.products)
				if s.mixProducts {
					product = "p" + strconv.Itoa(rng.IntN(s.products))
				}
				device := fmt.Sprintf("dev-%d", d) // ids of different lengths: "dev-10" < "dev-9"
				if !s.sharedString {
					product, device = strings.Clone(product), strings.Clone(device)
				}
				tm := base.Add(time.Duration(k) * time.Second)
				if s.sameSecond {
					tm = base.Add(time.Duration(rng.IntN(3000)) * time.Millisecond)
				}
				msgs = append(msgs, Message{Time: tm, ProductID: product, DeviceID: device, MessageID: strconv.Itoa(k), Direction: "up"})
				for _, j := range rng.Perm(s.props)[:1+rng.IntN(s.props)] {
					props = append(props, PropertyValue{Time: tm, ProductID: product, DeviceID: device,
						Property: "prop" + strconv.Itoa(j), ValueType: "number"})
				}
			}
			if s.shuffle {
				rng.Shuffle(len(msgs), func(i, j int) { msgs[i], msgs[j] = msgs[j], msgs[i] })
				rng.Shuffle(len(props), func(i, j int) { props[i], props[j] = props[j], props[i] })
			}
			var o orderer
			var b Batch
			for round := range 2 { // the second reuses the first's space
				b.Reset()
				if err := b.Append(msgs, props); err != nil {
					t.Fatal(err)
				}
				perm := o.messageOrder(&b)
				checkPerm(t, perm, len(msgs))
				if !slices.IsSortedFunc(perm, func(a, b int32) int { return cmpMessage(&msgs[a], &msgs[b]) }) {
					t.Fatalf("round %d: messages not in key order", round)
				}
				perm = o.propertyOrder(&b)
				checkPerm(t, perm, len(props))
				if !slices.IsSortedFunc(perm, func(a, b int32) int { return cmpProperty(&props[a], &props[b]) }) {
					t.Fatalf("round %d: properties not in key order", round)
				}
				perm = o.reportOrder(&b)
				checkPerm(t, perm, len(props))
				if !slices.IsSortedFunc(perm, func(a, b int32) int { return cmpReport(&props[a], &props[b]) }) {
					t.Fatalf("round %d: properties not in report order", round)
				}
				if len(o.devices)+len(o.keys)+len(o.names)+len(o.ids) != 0 {
					t.Fatalf("round %d: the orderer keeps strings after use", round)
				}
			}
		})
	}
}
