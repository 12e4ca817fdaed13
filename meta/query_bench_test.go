package meta_test

import (
	"testing"

	"devicehub/meta"
)

// BenchmarkQueryBody: decoding and compiling a typical device list body
// (a like and an eq term in a group, a sort, a page) to SQL. No services
// needed:
//
//	go test -run '^$' -bench QueryBody -benchmem ./meta/
func BenchmarkQueryBody(b *testing.B) {
	body := []byte(`{"pageIndex":2,"pageSize":25,"sorts":[{"name":"createTime","order":"desc"}],
		"terms":[{"terms":[{"column":"name","value":"%kitchen%","termType":"like"},
		{"column":"productId","value":"product-3","termType":"eq","type":"and"},
		{"column":"state","value":"online,offline","termType":"in","type":"and"}]}]}`)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		q, err := meta.DecodeQuery(body)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := meta.DeviceResource.Compile(q); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "bodies/s")
}
