package api

import (
	"encoding/json"
	"testing"
	"time"
)

// BenchmarkEnvelope: encoding a page of 25 devices in the response
// envelope with encoding/json (what Fiber's c.JSON runs, plus a copy into
// the response): the encoding cost of a list answer. No services needed:
//
//	go test -run '^$' -bench Envelope -benchmem ./api/
func BenchmarkEnvelope(b *testing.B) {
	type device struct {
		ID          string            `json:"id"`
		Name        string            `json:"name"`
		ProductID   string            `json:"productId"`
		ProductName string            `json:"productName"`
		State       map[string]string `json:"state"`
		CreateTime  int64             `json:"createTime"`
		Describe    string            `json:"describe,omitempty"`
	}
	type page struct {
		PageIndex, PageSize, Total int
		Data                       []device `json:"data"`
	}
	p := page{PageSize: 25, Total: 12500}
	for i := range 25 {
		p.Data = append(p.Data, device{ID: "dev-00000" + string(rune('0'+i%10)), Name: "Kitchen meter 1234",
			ProductID: "product-3", ProductName: "Product 3", State: map[string]string{"text": "Online", "value": "online"},
			CreateTime: 1795432565768})
	}
	var n int
	b.ReportAllocs()
	for b.Loop() {
		js, err := json.Marshal(envelope{Message: "success", Result: p, Status: 200, Timestamp: time.Now().UnixMilli()})
		if err != nil {
			b.Fatal(err)
		}
		n = len(js)
	}
	b.SetBytes(int64(n))
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "envelopes/s")
}
