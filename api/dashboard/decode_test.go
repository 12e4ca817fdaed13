package dashboard

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
)

// sameAsJSON fails t unless what decodeQueriesFast,
// decodeCountParamsFast and decodePropAggParamsFast decode of body is what encoding/json decodes,
// whenever they decode it.
func sameAsJSON(t *testing.T, body []byte) (fast int) {
	t.Helper()
	if !json.Valid(body) {
		return 0
	}
	var want []Query
	werr := json.Unmarshal(body, &want)
	got, ok := decodeQueriesFast(body)
	if ok {
		fast++
		if werr != nil {
			t.Fatalf("%s: decoded, json: %v", body, werr)
		}
		if !reflect.DeepEqual(got, want) && !(len(got) == 0 && len(want) == 0 && got != nil && want != nil) {
			t.Fatalf("%s:\n got %+v\nwant %+v", body, got, want)
		}
	}
	if werr != nil {
		return fast
	}
	for _, q := range want {
		var wp countParams
		perr := json.Unmarshal(q.Params, &wp)
		if len(q.Params) == 0 {
			perr = nil
		}
		var gp countParams
		var limit int
		if decodeCountParamsFast(q.Params, &gp.aggParams, &gp.bucketParams, &limit) {
			fast++
			if perr != nil {
				t.Fatalf("params %s: decoded, json: %v", q.Params, perr)
			}
			if !reflect.DeepEqual(gp, wp) {
				t.Fatalf("params %s:\n got %+v\nwant %+v", q.Params, gp, wp)
			}
		}
		fast += samePropAggParams(t, q.Params)
	}
	return fast
}

// samePropAggParams fails t unless what decodePropAggParamsFast decodes
// of raw, a query's params, is what encoding/json decodes of them into
// propAggParams and into bucketParams (decodePropAggParams), whenever it
// decodes them.
func samePropAggParams(t *testing.T, raw json.RawMessage) (fast int) {
	t.Helper()
	var gp, wp propAggParams
	var gbp, wbp bucketParams
	var limit int
	if !decodePropAggParamsFast(raw, &gp, &gbp, &limit) {
		return 0
	}
	if len(raw) > 0 {
		if err := errors.Join(json.Unmarshal(raw, &wp), json.Unmarshal(raw, &wbp)); err != nil {
			t.Fatalf("params %s: decoded, json: %v", raw, err)
		}
	}
	if !reflect.DeepEqual(gp, wp) || !reflect.DeepEqual(gbp, wbp) {
		t.Fatalf("params %s:\n got %+v %+v\nwant %+v %+v", raw, gp, gbp, wp, wbp)
	}
	return 1
}

var decodeSeeds = []string{
	`[{"dashboard":"device","object":"message","measurement":"quantity","dimension":"agg","group":"g","params":{"productId":"mp7","time":"15m","limit":96,"from":1732500000000,"to":1732600000000}}]`,
	`[{"dashboard":"device","object":"message","measurement":"quantity","dimension":"agg","params":{"time":"1d","format":"yyyy-MM-dd","limit":30,"from":"now-30d","to":"now"}}]`,
	`[{"dashboard":"device","object":"p","measurement":"properties","dimension":"agg","group":"g","params":{"deviceId":"d","properties":["temp"],"agg":"avg","time":"1h","from":"now-1d","to":"now","limit":24}}]`,
	` [ { "dashboard" : "device" , "params" : { "limit" : -0 , "to" : null } } , { } ] `,
	`[]`, `[{}]`, `[{"params":null}]`, `null`, `{}`, `[null]`, `[1]`, `[[]]`, `["x"]`,
	`[{"Dashboard":"device"}]`, `[{"daſhboard":"device"}]`, `[{"\u0064ashboard":"device"}]`, `[{"dashboard":"d\u00e9vice"}]`,
	`[{"dashboard":"device","dashboard":"other"}]`, `[{"dashboard":null}]`, `[{"dashboard":1}]`, `[{"group":{"a":[1,"]}"]}}]`,
	`[{"params":{"limit":1.5}}]`, `[{"params":{"limit":1e2}}]`, `[{"params":{"limit":99999999999999999999}}]`, `[{"params":{"limit":null}}]`,
	`[{"params":{"limit":5,"limit":null}}]`, `[{"params":{"Limit":5}}]`, `[{"params":{"productid":"x"}}]`, `[{"params":{"productId":"a\"b"}}]`,
	`[{"params":{"other":{"productId":"x"},"time":"1h","x":[1,{"y":"}"}]}}]`, `[{"params":[]}]`, `[{"params":"x"}]`, `[{"params":{"time":true}}]`,
	`[{"params":{"from":{"a":1},"to":[1,2]}}]`, `[{"x":1,"y":true,"z":null,"w":"\\"}]`,
	`[{"dashboard":"device","object":"mp3","measurement":"properties","dimension":"agg","group":"g","params":{"properties":["p1"],"agg":"sum","time":"1h","limit":168,"from":1732000000000,"to":1732600000000}}]`,
	`[{"params":{"properties":[]}}]`, `[{"params":{"properties":null}}]`, `[{"params":{"properties":["a",null]}}]`, `[{"params":{"properties":["a\u0062"]}}]`,
	`[{"params":{"properties":["a","b"],"properties":["c"]}}]`, `[{"params":{"properties":["a","b"],"properties":[null]}}]`, `[{"params":{"properties":"a"}}]`,
	`[{"params":{"properties":[1]}}]`, `[{"params":{"properties":[["a"]]}}]`, `[{"params":{"Properties":["a"]}}]`, `[{"params":{"AGG":"avg"}}]`,
	`[{"params":{"deviceid":"d"}}]`, `[{"params":{"deviceId":"d","deviceId":null}}]`, `[{"params":{"agg":"avg","agg":"max"}}]`, `[{"params":{"properties":[ "a" , "é" ]}}]`,
}

// TestDecodeQueriesFast: endpoint 14's reader without reflection decodes
// what encoding/json decodes, the same, over the seeds and many bodies
// made of fields' names in other cases and with escapes, unknown keys,
// duplicates, values of every JSON kind and whitespace; it decodes most
// of them.
func TestDecodeQueriesFast(t *testing.T) {
	t.Parallel()
	fast := 0
	for _, s := range decodeSeeds {
		fast += sameAsJSON(t, []byte(s))
	}
	keys := []string{"dashboard", "object", "measurement", "dimension", "group", "params", "Group", "GROUP", "daſhboard", `\u0067roup`, "x", "paramsx", ""}
	pkeys := []string{"productId", "time", "format", "limit", "from", "to", "ProductId", "TIME", "limiT", `\u0074ime`, "agg", "deviceId", "Ṫime",
		"properties", "Properties", "deviceID", "aGG", `\u0061gg`, "propertieſ"}
	values := []string{`"device"`, `"message"`, `"g"`, `"a b"`, `"é"`, `"a\"b"`, `"\u00e9"`, `""`, `1`, `-5`, `0`, `1.5`, `1e3`, `12345678901234567890`,
		`-9223372036854775808`, `null`, `true`, `false`, `{}`, `[]`, `{"a":[1,"}"]}`, `["x",{"y":null}]`, `"now-7d/d"`, `1732600000000`,
		`"avg"`, `["p0"]`, `["a","b","a"]`, `[ "x" , "" ]`, `["a",null]`, `["\u0061"]`, `[1,"a"]`}
	ws := []string{"", " ", "\n\t", "\r\n "}
	r := rand.New(rand.NewPCG(3, 4))
	pick := func(s []string) string { return s[r.IntN(len(s))] }
	object := func(ks []string, value func() string) string {
		var b strings.Builder
		b.WriteString("{" + pick(ws))
		for i := range r.IntN(7) {
			if i > 0 {
				b.WriteString(pick(ws) + "," + pick(ws))
			}
			fmt.Fprintf(&b, "%q%s:%s%s", pick(ks), pick(ws), pick(ws), value())
		}
		b.WriteString(pick(ws) + "}")
		return strings.ReplaceAll(b.String(), `\\u`, `\u`)
	}
	for range 20000 {
		var b bytes.Buffer
		b.WriteString(pick(ws) + "[")
		for i := range r.IntN(4) {
			if i > 0 {
				b.WriteString(",")
			}
			b.WriteString(object(keys, func() string {
				if r.IntN(3) == 0 {
					return object(pkeys, func() string { return pick(values) })
				}
				return pick(values)
			}))
		}
		b.WriteString("]" + pick(ws))
		fast += sameAsJSON(t, b.Bytes())
	}
	t.Logf("decoded %d fast", fast)
	if fast < 5000 {
		t.Errorf("decoded only %d bodies and params without encoding/json", fast)
	}
}

// FuzzDecodeQueriesFast: whatever the body, the reader without
// reflection never panics and decodes nothing differently from
// encoding/json.
func FuzzDecodeQueriesFast(f *testing.F) {
	for _, s := range decodeSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		sameAsJSON(t, body)
		var p countParams
		var limit int
		decodeCountParamsFast(body, &p.aggParams, &p.bucketParams, &limit) // never panics, valid or not
		var ap propAggParams
		var bp bucketParams
		decodePropAggParamsFast(body, &ap, &bp, &limit)
		decodeQueriesFast(body)
	})
}

// countParams are a message-count query's params as encoding/json
// decodes them at once: the reference of decodeCountParamsFast.
type countParams struct {
	aggParams
	bucketParams
}
