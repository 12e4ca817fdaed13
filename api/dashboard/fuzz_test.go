package dashboard

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"devicehub/schema"
)

// FuzzDashboardQuery: planning any decoded _multi body never panics, and
// every refusal is an input error (meta's or tsdb's) naming where.
func FuzzDashboardQuery(f *testing.F) {
	for _, seed := range []string{
		`[{"dashboard":"device","object":"message","measurement":"quantity","dimension":"agg","params":{"time":"1d","format":"yyyy-MM-dd","limit":30,"from":"now-30d","to":"now"}}]`,
		`[{"dashboard":"device","object":"message","measurement":"quantity","dimension":"agg","params":{"time":"1M","format":"MM月dd日","limit":12,"from":1700000000000,"to":1710000000000}}]`,
		`[{"dashboard":"device","object":"p","measurement":"properties","dimension":"history","params":{"deviceId":"d","history":10,"properties":["a","b"]}}]`,
		`[{"dashboard":"device","object":"message","measurement":"quantity","dimension":"agg","params":{"format":"'x''y' yy-M-d h:m:s.SSS a EEEE"}}]`,
		`[{"dashboard":"device","object":"message","measurement":"quantity","dimension":"agg","params":{"time":"1h","limit":10000,"from":"now-1M/M+2h","to":"now/w"}}]`,
		`[{"dashboard":"device","object":"p","measurement":"properties","dimension":"agg","group":"g","params":{"deviceId":"d","properties":["temp"],"agg":"avg","time":"1h","from":"now-1d","to":"now","limit":24,"format":"yyyy-MM-dd HH:mm"}}]`,
		`[{"dashboard":"device","object":"p","measurement":"properties","dimension":"agg","params":{"properties":["a","b","a"],"agg":"last","time":"15m","from":1700000000000,"to":"now-1h/h"}}]`,
		`[{"dashboard":"device","object":"p","measurement":"properties","dimension":"agg","params":{"properties":[""],"agg":"median","time":"5m","limit":10000}}]`,
		`[{"dashboard":"device","object":"p","measurement":"properties","dimension":"agg","params":{"properties":["t"],"agg":"count","time":"1m","from":"now-7d"}}]`,
		`[{"dashboard":"device","object":"p","measurement":"properties","dimension":"history","params":{"deviceId":"d","history":3,"from":"now-1d","to":1710000000000}}]`,
		`[{"dashboard":"device","object":"p","measurement":"properties","dimension":"history","params":{"deviceId":"d","from":"now","to":"now-1h"}}]`,
		`[{"dashboard":"","object":"message"}]`, `[]`, `[{}]`, `[{"params":null}]`,
	} {
		f.Add([]byte(seed))
	}
	s := New(Options{}, Deps{})
	now := time.Date(2024, 2, 29, 12, 0, 0, 0, time.UTC)
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var qs []Query
		if json.Unmarshal(body, &qs) != nil {
			return
		}
		for i := range qs {
			at := fmt.Sprintf("[%d]", i)
			_, err := s.planQuery(at, &qs[i], now, berlin, false)
			if err == nil {
				continue
			}
			var ae *schema.ArgError
			if !errors.As(err, &ae) && !errors.Is(err, schema.ErrIllegalArgument) {
				t.Fatalf("query %d: not an input error: %v", i, err)
			}
			if !strings.HasPrefix(err.Error(), at) {
				t.Fatalf("query %d: %q does not say where", i, err)
			}
		}
	})
}
