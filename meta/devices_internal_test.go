package meta

import "testing"

// TestDeviceCountTerms: the product counts answer the device list's total
// for no terms, eq on state, eq on productId or both, ANDed in any order
// and grouping; never for another termType, column, a repeat or an OR at
// any depth.
func TestDeviceCountTerms(t *testing.T) {
	t.Parallel()
	f := func(body string, wantOK bool, wantState, wantProduct any) {
		t.Helper()
		q, err := DecodeQuery([]byte(body))
		if err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		c, err := DeviceResource.Compile(q)
		if err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		state, product, ok := deviceCountTerms(c)
		if ok != wantOK || state != wantState || product != wantProduct {
			t.Fatalf("%s (%s): %v, %v, %v; want %v, %v, %v", body, c.Where, state, product, ok, wantState, wantProduct, wantOK)
		}
	}
	f(`{}`, true, nil, nil)
	f(`{"terms":[{"terms":[]}]}`, true, nil, nil)
	f(`{"terms":[{"column":"state","value":"online"}]}`, true, "online", nil)
	f(`{"terms":[{"column":"state$eq","value":"online"}]}`, true, "online", nil)
	f(`{"terms":[{"column":"state","termType":"EQ","value":"online"}]}`, true, "online", nil)
	f(`{"terms":[{"column":"state","value":"online","type":"or"}]}`, true, "online", nil) // the first term's type joins nothing
	f(`{"terms":[{"column":"productId","value":"p1"}]}`, true, nil, "p1")
	f(`{"terms":[{"column":"state","value":"online"},{"column":"productId","value":"p1"}]}`, true, "online", "p1")
	f(`{"terms":[{"column":"productId","value":"p1"},{"column":"state","value":"offline"}]}`, true, "offline", "p1")
	f(`{"terms":[{"terms":[{"column":"state","value":"online"},{"column":"productId","value":"p1"}]}]}`, true, "online", "p1")
	f(`{"terms":[{"terms":[{"column":"state","value":"online"}]},{"terms":[{"column":"productId","value":"p1"}]}]}`, true, "online", "p1")

	f(`{"terms":[{"column":"state","value":"online"},{"column":"productId","value":"p1","type":"or"}]}`, false, nil, nil)
	f(`{"terms":[{"terms":[{"column":"state","value":"online"},{"column":"productId","value":"p1","type":"or"}]}]}`, false, nil, nil)
	f(`{"terms":[{"column":"state","value":"online"},{"terms":[{"column":"productId","value":"p1"},{"column":"productId","value":"p2","type":"or"}]}]}`, false, nil, nil)
	f(`{"terms":[{"column":"state","termType":"not","value":"online"}]}`, false, nil, nil)
	f(`{"terms":[{"column":"state","termType":"in","value":["online"]}]}`, false, nil, nil)
	f(`{"terms":[{"column":"productId$like","value":"p1"}]}`, false, nil, nil)
	f(`{"terms":[{"column":"state","value":"online"},{"column":"state","value":"offline"}]}`, false, nil, nil)
	f(`{"terms":[{"column":"productId","value":"p1"},{"column":"productId","value":"p1"}]}`, false, nil, nil)
	f(`{"terms":[{"column":"name","value":"x"}]}`, false, nil, nil)
	f(`{"terms":[{"column":"state","value":"online"},{"column":"name","value":"x"}]}`, false, nil, nil)
}
