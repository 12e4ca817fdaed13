package meta_test

import (
	"context"
	"database/sql"
	"slices"
	"testing"
	"time"

	"devicehub/meta"
	"devicehub/meta/metatest"
)

// TestKeyLastUsed: a key's last use is written on its first use, then
// only once it is more than a minute old, not on every check.
func TestKeyLastUsed(t *testing.T) {
	t.Parallel()
	s := metatest.NewStore(t)
	ctx := context.Background()
	if _, err := s.CreateUser(ctx, "prog", "password-prog", meta.RoleViewer); err != nil {
		t.Fatal(err)
	}
	u, _, err := s.Authenticate(ctx, login(t, s, "prog", "password-prog"))
	if err != nil {
		t.Fatal(err)
	}
	k, err := s.CreateKey(ctx, u, meta.NewKey{Name: "p", Permissions: []meta.Permission{meta.PermDeviceRead}})
	if err != nil {
		t.Fatal(err)
	}
	lastUsed := func() sql.NullTime {
		var v sql.NullTime
		if err := s.DB().Get(&v, `SELECT last_used FROM api_keys WHERE id = $1`, k.ID); err != nil {
			t.Fatal(err)
		}
		return v
	}
	use := func() meta.User {
		t.Helper()
		got, _, err := s.Authenticate(ctx, k.Secret)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	if lastUsed().Valid {
		t.Fatal("a new key has a last use")
	}
	got := use()
	if got.KeyID != k.ID || got.ID != u.ID || !slices.Equal(got.Permissions, []string{"device:read"}) {
		t.Fatalf("the key's user: %+v", got)
	}
	first := lastUsed()
	if !first.Valid {
		t.Fatal("no last use after a use")
	}
	// 30 s ago: a use does not write it again.
	if _, err := s.DB().Exec(`UPDATE api_keys SET last_used = now() - interval '30 seconds' WHERE id = $1`, k.ID); err != nil {
		t.Fatal(err)
	}
	before := lastUsed()
	use()
	if after := lastUsed(); !after.Time.Equal(before.Time) {
		t.Fatalf("last use written again after 30 s: %v, then %v", before.Time, after.Time)
	}
	// Two minutes ago: written.
	if _, err := s.DB().Exec(`UPDATE api_keys SET last_used = now() - interval '2 minutes' WHERE id = $1`, k.ID); err != nil {
		t.Fatal(err)
	}
	use()
	if after := lastUsed(); time.Since(after.Time) > 30*time.Second {
		t.Fatalf("last use not written after 2 minutes: %v", after.Time)
	}
	// The secret is kept as its hash only.
	var n int
	if err := s.DB().Get(&n, `SELECT count(*) FROM api_keys WHERE position(convert_to($1, 'UTF8') in hash) > 0 OR encode(hash, 'hex') = $1`, k.Secret); err != nil || n != 0 {
		t.Fatalf("the secret is stored: %d %v", n, err)
	}
}

func login(t *testing.T, s *meta.Store, user, pass string) string {
	t.Helper()
	sess, err := s.Login(context.Background(), "127.0.0.1", user, pass, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return sess.Token
}
