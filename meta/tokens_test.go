package meta_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"devicehub/bench/testkit"
	"devicehub/meta"
	"devicehub/meta/metatest"
)

// TestWatchTokens: the tokens that end early are announced by their
// TokenID, whoever ends them, in as many announcements as they take
// (a user with 300 tokens disabled); expired tokens swept are not; a
// TRUNCATE asks for every token to be checked again (nil); Stop stops.
func TestWatchTokens(t *testing.T) {
	t.Parallel()
	s := metatest.NewStore(t)
	ctx := context.Background()
	heard := make(chan []string, 100)
	w := s.WatchTokens(func(ids []string) { heard <- ids })
	defer w.Stop()
	testkit.Eventually(t, 5*time.Second, "the watcher listening", w.Listening)
	if ids := <-heard; ids != nil { // once listening: check everything
		t.Fatalf("first announcement %v, want nil", ids)
	}
	// wait collects announced ids until want are all in, failing after 2 s.
	wait := func(what string, want []string) {
		t.Helper()
		got := map[string]bool{}
		timeout := time.After(2 * time.Second)
		for {
			missing := 0
			for _, id := range want {
				if !got[id] {
					missing++
				}
			}
			if missing == 0 {
				return
			}
			select {
			case ids := <-heard:
				if ids == nil {
					t.Fatalf("%s: nil announcement", what)
				}
				for _, id := range ids {
					got[id] = true
				}
			case <-timeout:
				t.Fatalf("%s: %d of %d tokens not announced", what, missing, len(want))
			}
		}
	}

	if _, err := s.CreateUser(ctx, "many", "password-many"); err != nil {
		t.Fatal(err)
	}
	login := func(user string) string {
		t.Helper()
		sess, err := s.Login(ctx, "127.0.0.1", user, "password-"+user, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		return sess.Token
	}
	// Logins are slow (bcrypt): one, and 299 more rows of the same user.
	first := login("many")
	var want []string
	if err := s.DB().Select(&want, `INSERT INTO tokens (hash, user_id, lifetime_ms, expires_at)
		SELECT sha256(('t' || i)::bytea), u.id, 3600000, now() + interval '1 hour'
		FROM users u, generate_series(1, 299) i WHERE u.username = 'many'
		RETURNING encode(hash, 'hex')`); err != nil {
		t.Fatal(err)
	}
	want = append(want, meta.TokenID(first))
	if len(want) != 300 {
		t.Fatalf("%d tokens", len(want))
	}
	if _, err := s.DB().Exec(`UPDATE users SET state = 'disabled' WHERE username = 'many'`); err != nil {
		t.Fatal(err)
	}
	wait("user disabled", want)
	if _, err := s.TokenExpiry(ctx, first); err != meta.ErrUnauthorized {
		t.Fatalf("expiry of a disabled user's token: %v", err)
	}

	// A logout; and an expired token swept by a login is not announced,
	// the logout after it is.
	if _, err := s.CreateUser(ctx, "one", "password-one"); err != nil {
		t.Fatal(err)
	}
	tok := login("one")
	if exp, err := s.TokenExpiry(ctx, tok); err != nil || time.Until(exp) < 59*time.Minute {
		t.Fatalf("expiry %v %v", exp, err)
	}
	if err := s.Logout(ctx, tok); err != nil {
		t.Fatal(err)
	}
	wait("logout", []string{meta.TokenID(tok)})
	stale, tok := login("one"), login("one")
	if _, err := s.DB().Exec(`UPDATE tokens SET expires_at = now() - interval '2 days' WHERE hash = sha256($1::bytea)`, stale); err != nil {
		t.Fatal(err)
	}
	login("one") // sweeps the stale token
	if err := s.Logout(ctx, tok); err != nil {
		t.Fatal(err)
	}
	select {
	case ids := <-heard:
		if !slices.Equal(ids, []string{meta.TokenID(tok)}) {
			t.Fatalf("after a sweep and a logout: %v, want only the logout's %s", ids, meta.TokenID(tok))
		}
	case <-time.After(2 * time.Second):
		t.Fatal("logout not announced")
	}

	if _, err := s.DB().Exec(`TRUNCATE tokens`); err != nil {
		t.Fatal(err)
	}
	select {
	case ids := <-heard:
		if ids != nil {
			t.Fatalf("truncate: %v, want nil", ids)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("truncate not announced")
	}

	w.Stop()
	if w.Listening() {
		t.Fatal("listening after Stop")
	}
}
