package meta

import (
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/lib/pq"
)

// TestTotalKey checks that different terms or values never share a key,
// and that paging and order do not change it.
func TestTotalKey(t *testing.T) {
	t.Parallel()
	key := func(body string) string {
		t.Helper()
		q, err := DecodeQuery([]byte(body))
		if err != nil {
			t.Fatal(err)
		}
		c, err := DeviceResource.Compile(q)
		if err != nil {
			t.Fatal(err)
		}
		return totalKey("device", c)
	}
	same := [][]string{
		{`{"terms":[{"column":"name","value":"a","termType":"like"}]}`,
			`{"pageIndex":3,"pageSize":7,"sorts":[{"name":"name"}],"terms":[{"column":"name","value":"a","termType":"like"}]}`,
			`{"terms":[{"column":"name$like","value":"%a%"}]}`},
		{`{}`, `{"terms":[]}`, `{"paging":false}`},
		// "a,b" is the list a, b.
		{`{"terms":[{"column":"name","value":"a,b","termType":"in"}]}`, `{"terms":[{"column":"name","value":["a","b"],"termType":"in"}]}`},
	}
	for _, group := range same {
		for _, body := range group[1:] {
			if key(body) != key(group[0]) {
				t.Errorf("%s and %s have different keys", body, group[0])
			}
		}
	}
	different := []string{
		`{}`,
		`{"terms":[{"column":"name","value":"a"}]}`,
		`{"terms":[{"column":"name","value":"b"}]}`,
		`{"terms":[{"column":"id","value":"a"}]}`,
		`{"terms":[{"column":"name","value":"a","termType":"like"}]}`,
		`{"terms":[{"column":"name","value":"a,b","termType":"in"}]}`,
		`{"terms":[{"column":"name","value":["a,b"],"termType":"in"}]}`,
		`{"terms":[{"column":"name","value":"a"},{"column":"id","value":"b"}]}`,
		`{"terms":[{"column":"name","value":"a"},{"column":"id","value":"b","type":"or"}]}`,
		`{"terms":[{"column":"createTime","value":1,"termType":"gt"}]}`,
		`{"terms":[{"column":"createTime","value":10,"termType":"gt"}]}`,
		`{"terms":[{"column":"createTime","value":[1,2],"termType":"in"}]}`,
	}
	seen := map[string]string{}
	for _, body := range different {
		k := key(body)
		if other, ok := seen[k]; ok {
			t.Errorf("%s and %s share a key", body, other)
		}
		seen[k] = body
	}
	// Values that would run together without their lengths.
	a := totalKey("device", &Compiled{Where: "x", Args: []any{"a\x00s1:b"}})
	b := totalKey("device", &Compiled{Where: "x", Args: []any{"a", "b"}})
	c := totalKey("device", &Compiled{Where: "x", Args: []any{pq.StringArray{"a", "b"}}})
	d := totalKey("device", &Compiled{Where: "x", Args: []any{pq.StringArray{"a,b"}}})
	if a == b || c == d || totalKey("product", &Compiled{Where: "x"}) == totalKey("device", &Compiled{Where: "x"}) {
		t.Error("ambiguous keys")
	}
}

// TestTotalCache checks expiry, the size bound and the key bound.
func TestTotalCache(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		off := newTotalCache(0)
		off.put("a", 1)
		if _, ok := off.get("a"); ok {
			t.Error("a cache with no TTL keeps")
		}
		c := newTotalCache(50 * time.Millisecond)
		c.put("a", 7)
		if n, ok := c.get("a"); !ok || n != 7 {
			t.Fatalf("get a = %d, %v", n, ok)
		}
		c.put(strings.Repeat("k", totalKeyMax+1), 1)
		if _, ok := c.get(strings.Repeat("k", totalKeyMax+1)); ok {
			t.Error("kept a key above totalKeyMax")
		}
		for i := range totalCacheSize + 10 {
			c.put(strings.Repeat("x", i%50)+string(rune('a'+i%26))+strings.Repeat("y", i/50), i)
		}
		if n := c.c.Len(); n > totalCacheSize {
			t.Errorf("%d entries, above %d", n, totalCacheSize)
		}
		time.Sleep(60 * time.Millisecond)
		if _, ok := c.get("a"); ok {
			t.Error("an expired estimate was kept")
		}
	})
}
