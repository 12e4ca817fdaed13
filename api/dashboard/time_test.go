package dashboard

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"devicehub/schema"
)

func TestJavaPattern(t *testing.T) {
	t.Parallel()
	at := time.Date(2024, 2, 9, 7, 5, 3, 42e6, time.UTC)
	f := func(pattern, want string) {
		t.Helper()
		l, err := parseJavaPattern(pattern)
		if err != nil {
			t.Fatalf("%q: %v", pattern, err)
		}
		if got := l.format(at); got != want {
			t.Fatalf("%q: got %q, want %q", pattern, got, want)
		}
	}
	f("yyyy-MM-dd", "2024-02-09")
	f("yyyy-MM", "2024-02")
	f("MM月dd日", "02月09日")
	f("yyyy-MM-dd HH:mm:ss", "2024-02-09 07:05:03")
	f("yy/M/d H:m:s.SSS", "24/2/9 7:5:3.042")
	f("'week of' yyyy-MM-dd", "week of 2024-02-09")
	f("dd MMM yyyy, EEE", "09 Feb 2024, Fri")
	f("hh a", "07 AM")
	f("''yyyy''", "'2024'")
	// The zone, as Java's DateTimeFormatter writes it.
	f("HH:mm X", "07:05 Z")
	f("HH:mm x", "07:05 +00")
	f("HH:mm Z", "07:05 +0000")
	f("yyyy-MM-dd'T'HH:mm:ssXXX", "2024-02-09T07:05:03Z")
	f("HH:mm z VV zzzz", "07:05 UTC UTC UTC")
	kolkata, err := time.LoadLocation("Asia/Kolkata")
	if err != nil {
		t.Fatal(err)
	}
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	g := func(pattern string, at time.Time, want string) {
		t.Helper()
		l, err := parseJavaPattern(pattern)
		if err != nil {
			t.Fatalf("%q: %v", pattern, err)
		}
		if got := l.format(at); got != want {
			t.Fatalf("%q: got %q, want %q", pattern, got, want)
		}
	}
	g("HH:mm X|XX|XXX|x|Z|z|VV", at.In(kolkata), "12:35 +0530|+0530|+05:30|+0530|+0530|IST|Asia/Kolkata")
	g("HH:mm X|XX|XXX|Z|z", at.In(ny), "02:05 -05|-0500|-05:00|-0500|EST")
	g("HH:mm XXX z", time.Date(2024, 7, 1, 12, 0, 0, 0, time.UTC).In(ny), "08:00 -04:00 EDT")
	bad := func(pattern string) {
		t.Helper()
		if _, err := parseJavaPattern(pattern); err == nil {
			t.Fatalf("%q: want an error", pattern)
		}
	}
	bad("yyyy-QQ")
	bad("HH V")
	bad("HH XXXX")
	if _, err := parseJavaPattern("yyyy-QQ"); err == nil || !strings.Contains(err.Error(), "XXX") || !strings.Contains(err.Error(), "EEE") {
		t.Fatalf("the error does not list every letter that works: %v", err)
	}
	bad("'unterminated")
	bad("yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy")
}

func TestTimeParam(t *testing.T) {
	t.Parallel()
	shanghai, err := time.LoadLocation("Asia/Shanghai")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2024, 3, 15, 10, 30, 0, 0, time.UTC) // 18:30 in Shanghai
	def := time.Unix(0, 0)
	f := func(raw string, want time.Time) {
		t.Helper()
		got, err := parseTimeParam("from", json.RawMessage(raw), now, shanghai, def)
		if err != nil {
			t.Fatalf("%s: %v", raw, err)
		}
		if !got.Equal(want) {
			t.Fatalf("%s: got %v, want %v", raw, got, want)
		}
		if raw != `` && raw != `null` && got.Location() != shanghai {
			t.Fatalf("%s: %v is not in the platform zone", raw, got)
		}
	}
	f(``, def)
	f(`null`, def)
	f(`1700000000000`, time.UnixMilli(1700000000000))
	f(`"1700000000000"`, time.UnixMilli(1700000000000))
	f(`" now "`, now)
	f(`"now-7d"`, now.AddDate(0, 0, -7))
	// Rounding is in the platform zone, not in now's (UTC here).
	f(`"now/d"`, time.Date(2024, 3, 15, 0, 0, 0, 0, shanghai))
	f(`"now-1M/M"`, time.Date(2024, 2, 1, 0, 0, 0, 0, shanghai))
	bad := func(raw, mention string) {
		t.Helper()
		_, err := parseTimeParam("[0].params.from", json.RawMessage(raw), now, shanghai, def)
		if err == nil {
			t.Fatalf("%s: want an error", raw)
		}
		var ae *schema.ArgError
		if !errors.As(err, &ae) && !errors.Is(err, schema.ErrIllegalArgument) {
			t.Fatalf("%s: %v is not an input error", raw, err)
		}
		if !strings.HasPrefix(err.Error(), "[0].params.from: ") || !strings.Contains(err.Error(), mention) {
			t.Fatalf("%s: %q does not name the field and mention %q", raw, err, mention)
		}
	}
	bad(`"yesterday"`, "date math")
	bad(`"now-7q"`, "date math")
	bad(`"now-"`, "date math")
	bad(`true`, "date math")
	bad(`{}`, "date math")
	bad(`1.5`, "date math")
	bad(`-99999999999999`, "1971")
	bad(`99999999999999`, "2105")
	bad(`"now+999999y"`, "2105")
}
