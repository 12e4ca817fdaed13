package bench

import (
	"context"
	"testing"
	"time"
)

// TestRunAPISmall runs the api scenario at a toy size.
func TestRunAPISmall(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := RunAPI(ctx, APIParams{Devices: 200, Products: 20, Concurrency: 2, Requests: 20, Warmup: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Log(res)
	if len(res.Queries) != 4 || res.Ceiling == nil || res.PeakRSS <= 0 {
		t.Fatalf("%+v", res)
	}
	for _, q := range res.Queries {
		if q.Load.Requests != 20 || q.Load.Latency.P50Ms <= 0 || q.P50Ratio <= 0 {
			t.Fatalf("%s: %+v", q.Name, q)
		}
	}
}
