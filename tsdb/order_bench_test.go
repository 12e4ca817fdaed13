package tsdb

import (
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"
)

// ingestShaped builds what one flush of the ingest bench holds: messages
// of 1000 devices round robin, each with 2 + i%13 properties, the strings
// of a message shared by its rows as the decoder shares them.
func ingestShaped(msgs int) ([]Message, []PropertyValue) {
	base := time.Now()
	ms := make([]Message, 0, msgs)
	var ps []PropertyValue
	for k := range msgs {
		i := k % 1000
		topic := fmt.Sprintf("/bench-abc123/bench-abc123-%06d/properties/report", i)
		prod, dev := topic[1:13], topic[14:33]
		tm := base.Add(time.Duration(k) * 20 * time.Microsecond)
		id := dev + "-" + strconv.Itoa(k)
		ms = append(ms, Message{Time: tm, ProductID: prod, DeviceID: dev, MessageID: id, Direction: "up", Topic: topic})
		for j := range 2 + i%13 {
			ps = append(ps, PropertyValue{Time: tm, ProductID: prod, DeviceID: dev, Property: "p" + strconv.Itoa(j), ValueType: "number"})
		}
	}
	return ms, ps
}

// BenchmarkOrder is the cost of putting one flush of the ingest bench
// (11,000 messages, about 88,000 property values) in key order, per
// message: "orderer" is what Insert does, "sort" a general sort of the
// same rows, for comparison.
func BenchmarkOrder(b *testing.B) {
	ms, ps := ingestShaped(11000)
	var batch Batch
	if err := batch.Append(ms, ps); err != nil {
		b.Fatal(err)
	}
	perMessage := func(b *testing.B) {
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(ms)), "ns/msg")
	}
	var o orderer
	b.Run("orderer/messages", func(b *testing.B) {
		for b.Loop() {
			o.messageOrder(&batch)
		}
		perMessage(b)
	})
	b.Run("orderer/properties", func(b *testing.B) {
		for b.Loop() {
			o.propertyOrder(&batch)
		}
		perMessage(b)
	})
	b.Run("sort/properties", func(b *testing.B) {
		perm := make([]int32, len(ps))
		for b.Loop() {
			perm = identity(perm, len(ps))
			slices.SortFunc(perm, func(i, j int32) int { return cmpProperty(&ps[i], &ps[j]) })
		}
		perMessage(b)
	})
}
