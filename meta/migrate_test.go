package meta_test

import (
	"context"
	"io/fs"
	"testing"
	"time"

	"devicehub/meta"
	"devicehub/meta/metatest"
	"devicehub/schema"
)

// Instances starting together on a new database all open it; the
// migrations run once (the advisory lock makes the others wait for the
// first and then find nothing to do), and the waiting costs about a
// second, not goose's default five.
func TestMigrateTogether(t *testing.T) {
	t.Parallel()
	dsn := metatest.NewDatabase(t)
	const instances = 4
	type result struct {
		s   *meta.Store
		err error
		d   time.Duration
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	results := make(chan result, instances)
	start := time.Now()
	for range instances {
		go func() {
			opts := meta.DefaultOptions()
			opts.DSN, opts.MaxOpenConns = dsn, 2
			s, err := meta.Open(ctx, opts)
			results <- result{s, err, time.Since(start)}
		}()
	}
	fastest, slowest := time.Hour, time.Duration(0)
	for range instances {
		r := <-results
		if r.err != nil {
			t.Fatalf("open with %d instances at once: %v", instances, r.err)
		}
		defer r.s.Close()
		fastest, slowest = min(fastest, r.d), max(slowest, r.d)
		if err := r.s.EnsureAdmin(ctx, "admin123"); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d instances opened a new database within %s, the first after %s", instances, slowest, fastest)
	// Each waiting instance takes the lock within a second of its release
	// (goose's default: 5 s, so 15 s here).
	if slowest-fastest > 4500*time.Millisecond {
		t.Errorf("the last of %d instances started together opened %s after the first", instances, slowest-fastest)
	}

	files, err := fs.Glob(schema.Postgres, "postgres/*.sql")
	if err != nil {
		t.Fatal(err)
	}
	opts := meta.DefaultOptions()
	opts.DSN = dsn
	s, err := meta.Open(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var applied, distinct, installations, admins int
	if err := s.DB().QueryRowContext(ctx, "SELECT count(*), count(DISTINCT version_id) FROM goose_db_version WHERE version_id > 0").Scan(&applied, &distinct); err != nil {
		t.Fatal(err)
	}
	if applied != len(files) || distinct != len(files) {
		t.Errorf("goose_db_version: %d rows, %d versions; want %d migrations applied once each", applied, distinct, len(files))
	}
	if err := s.DB().QueryRowContext(ctx, "SELECT count(*) FROM installation").Scan(&installations); err != nil {
		t.Fatal(err)
	}
	if installations != 1 {
		t.Errorf("%d installation ids, want 1", installations)
	}
	if err := s.DB().QueryRowContext(ctx, "SELECT count(*) FROM users WHERE username = 'admin'").Scan(&admins); err != nil {
		t.Fatal(err)
	}
	if admins != 1 {
		t.Errorf("%d admin users, want 1", admins)
	}
}
