package meta_test

import (
	"context"
	"testing"

	"github.com/lib/pq"

	"devicehub/meta/metatest"
)

// TestOneTrip: the one-trip pool runs the statements of the alarm
// writer's kind (text, integers, pq's arrays as parameters) on the same
// database as the main pool, and sees what the main pool committed.
func TestOneTrip(t *testing.T) {
	s := metatest.NewStore(t)
	ctx := context.Background()
	if _, err := s.DB().ExecContext(ctx, `CREATE TABLE one_trip (id TEXT PRIMARY KEY, n BIGINT, tags TEXT[])`); err != nil {
		t.Fatal(err)
	}
	tx, err := s.OneTrip().BeginTxx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO one_trip (id, n, tags)
		SELECT id, n, ARRAY[$3::text, $3::text] FROM unnest($1::text[], $2::bigint[]) AS x(id, n)`,
		pq.StringArray{"a", `b"c`}, pq.Int64Array{1, 2}, "t,{x}"); err != nil {
		t.Fatal(err)
	}
	var n int64
	if err := tx.GetContext(ctx, &n, `SELECT sum(n) FROM one_trip WHERE id = ANY($1) AND $2::int > 0`, pq.StringArray{"a", `b"c`}, 1); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if n != 3 {
		t.Fatalf("sum %d in the one-trip transaction, want 3", n)
	}
	var got []struct {
		ID   string         `db:"id"`
		Tags pq.StringArray `db:"tags"`
	}
	if err := s.DB().SelectContext(ctx, &got, `SELECT id, tags FROM one_trip ORDER BY id`); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[1].ID != `b"c` || len(got[1].Tags) != 2 || got[1].Tags[0] != "t,{x}" {
		t.Fatalf("rows %+v", got)
	}
	// The pool is the one-trip one: a []byte goes in binary there, which
	// a jsonb parameter does not read (OneTrip's doc), while the main
	// pool sends it as text.
	doc := []byte(`{"a":1}`)
	if _, err := s.DB().ExecContext(ctx, `SELECT $1::jsonb`, doc); err != nil {
		t.Fatalf("main pool: %v", err)
	}
	if _, err := s.OneTrip().ExecContext(ctx, `SELECT $1::jsonb`, doc); err == nil {
		t.Fatal("a []byte jsonb parameter read on OneTrip's pool: binary_parameters is not on")
	}
}

// BenchmarkOneTrip times a statement with one parameter on the main pool
// (prepared, then executed: two round trips) and on OneTrip's (one):
//
//	go test -run '^$' -bench OneTrip ./meta/
func BenchmarkOneTrip(b *testing.B) {
	s := metatest.NewStore(b)
	ctx := context.Background()
	for _, name := range []string{"main", "one-trip"} {
		db := s.DB()
		if name == "one-trip" {
			db = s.OneTrip()
		}
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				if _, err := db.ExecContext(ctx, `SELECT $1::bigint`, 1); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
