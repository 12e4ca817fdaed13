package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"devicehub/meta"
)

// FuzzDashboardQuery: planning any decoded _multi body never panics, and
// every refusal is an input error naming where.
func FuzzDashboardQuery(f *testing.F) {
	for _, seed := range []string{
		`[{"dashboard":"device","object":"message","measurement":"quantity","dimension":"agg","params":{"time":"1d","format":"yyyy-MM-dd","limit":30,"from":"now-30d","to":"now"}}]`,
		`[{"dashboard":"device","object":"message","measurement":"quantity","dimension":"agg","params":{"time":"1M","format":"MM月dd日","limit":12,"from":1700000000000,"to":1710000000000}}]`,
		`[{"dashboard":"device","object":"p","measurement":"properties","dimension":"history","params":{"deviceId":"d","history":10,"properties":["a","b"]}}]`,
		`[{"dashboard":"device","object":"message","measurement":"quantity","dimension":"agg","params":{"format":"'x''y' yy-M-d h:m:s.SSS a EEEE"}}]`,
		`[{"dashboard":"","object":"message"}]`, `[]`, `[{}]`, `[{"params":null}]`,
	} {
		f.Add([]byte(seed))
	}
	s := &Server{}
	now := time.Date(2024, 2, 29, 12, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, body []byte) {
		var qs []dashboardQuery
		if json.Unmarshal(body, &qs) != nil {
			return
		}
		for i := range qs {
			_, err := s.planDashboard(fmt.Sprintf("[%d]", i), &qs[i], now)
			var ae *meta.ArgError
			if err != nil && !errors.As(err, &ae) {
				t.Fatalf("query %d: not an input error: %v", i, err)
			}
		}
	})
}
