package api_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"devicehub/api"
	"devicehub/bench/testkit"
	"devicehub/meta/metatest"
	"devicehub/tsdb/tsdbtest"
)

// BenchmarkExport exports the history of one device's property as CSV
// over HTTP, every value, and reports values/s and how much the export
// raised the process's peak RSS above its RSS before it (server and the
// client, which discards what it reads). Values are generated in
// ClickHouse (INSERT ... SELECT FROM numbers()); how many:
// DEVICEHUB_EXPORT_BENCH_VALUES (default 1,000,000), e.g.
//
//	DEVICEHUB_EXPORT_BENCH_VALUES=10000000 go test -run '^$' -bench Export -benchtime 1x ./api/
func BenchmarkExport(b *testing.B) {
	n := 1_000_000
	if v := os.Getenv("DEVICEHUB_EXPORT_BENCH_VALUES"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil {
			b.Fatal(err)
		}
	}
	db := tsdbtest.NewDB(b, shanghai)
	store := metatest.NewStore(b)
	srv := api.New(api.DefaultOptions(), api.Deps{Auth: store, Products: store, Roles: store, Devices: store,
		Dashboard: db, Models: store})
	base := testkit.Serve(b, srv.App().Listener, srv.Shutdown)
	post := func(path, token string, body any) []byte {
		js, _ := json.Marshal(body)
		req, _ := http.NewRequest("POST", base+path, bytes.NewReader(js))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Access-Token", token)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		defer res.Body.Close()
		out, _ := io.ReadAll(res.Body)
		if res.StatusCode != 200 {
			b.Fatalf("%s: %d %s", path, res.StatusCode, out)
		}
		return out
	}
	var login struct{ Result struct{ Token string } }
	if err := json.Unmarshal(post("/api/authorize/login", "", map[string]string{"username": "admin", "password": "admin123"}), &login); err != nil {
		b.Fatal(err)
	}
	token := login.Result.Token
	post("/api/device/product", token, map[string]any{"id": "bp", "name": "Bench", "classifiedId": "m", "modelFrom": "custom",
		"accessId": "mqtt", "deviceType": "device", "metadata": `{"properties":[{"id":"temp","name":"T","valueType":{"type":"float","scale":2}}]}`})
	post("/api/device/instance", token, map[string]any{"id": "bd", "name": "Bench device", "productId": "bp"})
	ctx := context.Background()
	start := time.Now().Add(-30 * 24 * time.Hour).UnixMilli()
	for off := 0; off < n; off += 5_000_000 { // chunks, within the query timeout
		if err := db.Conn().Exec(ctx, fmt.Sprintf(`INSERT INTO device_property (ts, product_id, device_id, property, value_type, num_value, str_value)
			SELECT t, 'bp', 'bd', 'temp', 'number', (number %% 10000) / 100, ''
			FROM (SELECT number, %d + number * 100 AS t FROM numbers(%d, %d))`, start, off, min(5_000_000, n-off))); err != nil {
			b.Fatal(err)
		}
	}
	body, _ := json.Marshal(map[string]any{"dashboard": "device", "object": "bp", "measurement": "properties", "dimension": "history",
		"params": map[string]any{"deviceId": "bd", "properties": []string{"temp"}}})
	runtime.GC()
	rssBefore := procStatusKB(b, "VmRSS")
	resetPeakRSS(b)
	b.ResetTimer()
	var rows, bytes int64
	for range b.N {
		req, _ := http.NewRequest("POST", base+"/api/dashboard/_export?format=csv&formatValue=true", strings.NewReader(string(body)))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Access-Token", token)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		r := bufio.NewReaderSize(res.Body, 1<<16)
		for {
			line, err := r.ReadSlice('\n')
			bytes += int64(len(line))
			if len(line) > 0 && line[len(line)-1] == '\n' {
				rows++
			}
			if err == io.EOF {
				break
			}
			if err != nil && err != bufio.ErrBufferFull {
				b.Fatal(err)
			}
		}
		res.Body.Close()
		if res.StatusCode != 200 {
			b.Fatalf("export: %d", res.StatusCode)
		}
	}
	b.StopTimer()
	if want := int64(b.N) * int64(n+1); rows != want {
		b.Fatalf("%d lines, want %d", rows, want)
	}
	peak := procStatusKB(b, "VmHWM")
	b.ReportMetric(float64(int64(b.N)*int64(n))/b.Elapsed().Seconds(), "values/s")
	b.ReportMetric(float64(bytes)/float64(b.N)/float64(n), "bytes/value")
	b.ReportMetric(float64(peak-rssBefore)/1024, "peakRSS+MB")
	b.Logf("%d values: RSS before %d MiB, peak during %d MiB", n, rssBefore/1024, peak/1024)
}

// procStatusKB reads a kB field of /proc/self/status.
func procStatusKB(b *testing.B, field string) int64 {
	raw, err := os.ReadFile("/proc/self/status")
	if err != nil {
		b.Skip("no /proc/self/status:", err)
	}
	for _, l := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb
		}
	}
	b.Fatalf("no %s in /proc/self/status", field)
	return 0
}

// resetPeakRSS sets VmHWM to the current RSS (Linux: clear_refs 5).
func resetPeakRSS(b *testing.B) {
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		b.Skip("cannot reset the peak RSS:", err)
	}
}
