package meta_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"

	"devicehub/meta"
	"devicehub/meta/metatest"
)

// Users, logins and tokens (users.go, login.go, tokens.go, tokenwatch.go) against a real PostgreSQL database.

// openTestStore opens a migrated store with opts on dsn, a database of
// the test's own (metatest.NewDatabase), without the admin user
// metatest.NewStore adds; opts.DSN is ignored, so that the development
// database of meta.DefaultOptions is never touched.
func openTestStore(t *testing.T, dsn string, opts meta.Options) *meta.Store {
	t.Helper()
	if !strings.Contains(dsn, "/devicehub_test_") {
		t.Fatalf("openTestStore: %q is not a test database", dsn)
	}
	opts.DSN = dsn
	opts.MaxOpenConns = 8
	s, err := meta.Open(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// storeWithLimiter is a store with an admin (password admin123) whose
// login limiter locks after maxFailures for lockout: a copy of metatest's
// migrated template (migrating an empty database costs seconds under
// -race), hashing at metatest.PasswordCost (the unknown users' dummy hash
// too: one check at the default cost is about a second under -race).
func storeWithLimiter(t *testing.T, maxFailures int, lockout time.Duration) *meta.Store {
	t.Helper()
	opts := meta.DefaultOptions()
	opts.LoginMaxFailures, opts.LoginLockout = maxFailures, lockout
	opts.PasswordCost = metatest.PasswordCost
	s := openTestStore(t, metatest.NewMigratedDatabase(t), opts)
	if err := s.EnsureAdmin(context.Background(), "admin123"); err != nil {
		t.Fatal(err)
	}
	fastPassword(t, s, "admin", "admin123")
	return s
}

// fastPassword stores password for username hashed at bcrypt's lowest
// cost: a check at the default cost takes about a second under -race, and
// Login checks a password against whatever cost its hash has.
func fastPassword(t *testing.T, s *meta.Store, username, password string) {
	t.Helper()
	hash, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.DB().Exec(`UPDATE users SET password_hash = $2 WHERE username = $1`, username, string(hash)); err != nil {
		t.Fatal(err)
	}
}

// passwordCost is the bcrypt cost of username's stored hash.
func passwordCost(t *testing.T, s *meta.Store, username string) int {
	t.Helper()
	var hash string
	if err := s.DB().Get(&hash, `SELECT password_hash FROM users WHERE username = $1`, username); err != nil {
		t.Fatal(err)
	}
	cost, err := bcrypt.Cost([]byte(hash))
	if err != nil {
		t.Fatal(err)
	}
	return cost
}

// TestPasswordCost: a store hashes every password at its
// Options.PasswordCost (the tests' stores at bcrypt.MinCost): the
// admin's, a new user's and a changed one.
func TestPasswordCost(t *testing.T) {
	t.Parallel()
	opts := meta.DefaultOptions()
	opts.PasswordCost = bcrypt.MinCost + 1
	s := openTestStore(t, metatest.NewDatabase(t), opts)
	ctx := context.Background()
	if err := s.EnsureAdmin(ctx, "admin123"); err != nil {
		t.Fatal(err)
	}
	u, err := s.CreateUser(ctx, "lou", "lou-pass-1")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"admin", "lou"} {
		if cost := passwordCost(t, s, name); cost != opts.PasswordCost {
			t.Errorf("%s's password hashed at cost %d, want %d", name, cost, opts.PasswordCost)
		}
	}
	if err := s.SetPassword(ctx, u.ID, "lou-pass-2"); err != nil {
		t.Fatal(err)
	}
	if cost := passwordCost(t, s, "lou"); cost != opts.PasswordCost {
		t.Errorf("lou's changed password hashed at cost %d, want %d", cost, opts.PasswordCost)
	}
	if _, err := s.Login(ctx, "127.0.0.1", "lou", "lou-pass-2", time.Minute); err != nil {
		t.Fatalf("login with the changed password: %v", err)
	}
	if cost := passwordCost(t, metatest.NewStore(t), "admin"); cost != metatest.PasswordCost {
		t.Errorf("metatest's admin password hashed at cost %d, want %d", cost, metatest.PasswordCost)
	}
}

func TestEnsureAdmin(t *testing.T) {
	t.Parallel()
	s := openTestStore(t, metatest.NewDatabase(t), meta.DefaultOptions())
	ctx := context.Background()

	// A short password is refused, and nothing is created.
	if err := s.EnsureAdmin(ctx, "12345"); err == nil {
		t.Fatal("admin password of 5 characters accepted")
	}
	if n := countRows(t, s, "users"); n != 0 {
		t.Fatalf("%d users after a refused EnsureAdmin", n)
	}

	// First start: the admin user, with role admin (built in, 00011, with
	// operator and viewer) and the configured password.
	if err := s.EnsureAdmin(ctx, "first-pass"); err != nil {
		t.Fatal(err)
	}
	sess, err := s.Login(ctx, "127.0.0.1", "admin", "first-pass", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if sess.User.ID != "admin" || sess.User.Username != "admin" || !reflect.DeepEqual(sess.User.Roles, []string{"admin"}) {
		t.Fatalf("admin %+v", sess.User)
	}
	// Hashed at bcrypt's default cost (Options.PasswordCost's default).
	if cost := passwordCost(t, s, "admin"); cost != bcrypt.DefaultCost {
		t.Fatalf("admin's password hashed at cost %d, want bcrypt.DefaultCost (%d)", cost, bcrypt.DefaultCost)
	}

	// Later starts keep the existing admin's password, even when the
	// configured one differs, and create nothing twice.
	if err := s.EnsureAdmin(ctx, "second-pass"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Login(ctx, "127.0.0.1", "admin", "second-pass", time.Minute); !errors.Is(err, meta.ErrBadCredentials) {
		t.Fatalf("login with the new configured password: %v", err)
	}
	// A password changed since is kept too.
	hash, _ := bcrypt.GenerateFromPassword([]byte("changed-pass"), bcrypt.MinCost)
	if _, err := s.DB().Exec(`UPDATE users SET password_hash = $1 WHERE username = 'admin'`, string(hash)); err != nil {
		t.Fatal(err)
	}
	if err := s.EnsureAdmin(ctx, "first-pass"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Login(ctx, "127.0.0.1", "admin", "changed-pass", time.Minute); err != nil {
		t.Fatalf("changed password after EnsureAdmin: %v", err)
	}
	for table, want := range map[string]int{"users": 1, "roles": 3, "user_roles": 1} {
		if n := countRows(t, s, table); n != want {
			t.Fatalf("%d rows in %s, want %d", n, table, want)
		}
	}
}

func TestCreateUser(t *testing.T) {
	t.Parallel()
	s := metatest.NewStore(t)
	ctx := context.Background()
	if err := s.CreateRole(ctx, meta.Role{ID: "reader", Name: "Reader"}); err != nil {
		t.Fatal(err)
	}

	u, err := s.CreateUser(ctx, "bob", "bob-pass", "reader", "admin")
	if err != nil {
		t.Fatal(err)
	}
	if len(u.ID) != 16 || u.Username != "bob" || u.Name != "bob" {
		t.Fatalf("created %+v", u)
	}
	fastPassword(t, s, "bob", "bob-pass")
	sess, err := s.Login(ctx, "10.0.0.1", "bob", "bob-pass", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if sess.User.ID != u.ID || !reflect.DeepEqual(sess.User.Roles, []string{"admin", "reader"}) {
		t.Fatalf("session user %+v, want %s with roles admin, reader (sorted)", sess.User, u.ID)
	}
	// A user without roles has an empty list, not nil.
	// (Its password has 6 bytes, the least accepted.)
	if _, err := s.CreateUser(ctx, "norole", "pass-6"); err != nil {
		t.Fatal(err)
	}
	fastPassword(t, s, "norole", "pass-6")
	if sess, err := s.Login(ctx, "10.0.0.1", "norole", "pass-6", time.Minute); err != nil || sess.User.Roles == nil || len(sess.User.Roles) != 0 {
		t.Fatalf("roles of a user without roles: %#v %v", sess.User.Roles, err)
	}
	// 72 bytes, the most accepted.
	if _, err := s.CreateUser(ctx, "long", strings.Repeat("p", 72)); err != nil {
		t.Fatalf("password of 72 bytes: %v", err)
	}

	users := countRows(t, s, "users")
	for _, c := range []struct {
		name, username, password string
		roles                    []string
		field                    string
		is                       error
	}{
		{name: "no username", username: "", password: "secret1", field: "username"},
		{name: "username too long", username: strings.Repeat("u", 65), password: "secret1", field: "username"},
		{name: "password too short", username: "carol", password: "12345", field: "password"},
		{name: "password too long", username: "carol", password: strings.Repeat("p", 73), field: "password"},
		{name: "username taken", username: "bob", password: "secret1", is: meta.ErrDuplicateKey},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := s.CreateUser(ctx, c.username, c.password, c.roles...)
			if c.field != "" {
				wantArgField(t, err, c.field)
			} else if !errors.Is(err, c.is) {
				t.Fatalf("error %v, want %v", err, c.is)
			}
			if n := countRows(t, s, "users"); n != users {
				t.Fatalf("%d users after a refused create, want %d", n, users)
			}
		})
	}

	// An unknown role fails the whole creation: the user is not left behind.
	if _, err := s.CreateUser(ctx, "carol", "secret1", "reader", "no-such-role"); err == nil {
		t.Fatal("user with an unknown role created")
	}
	if n := countRows(t, s, "users"); n != users {
		t.Fatalf("%d users after a failed create, want %d", n, users)
	}
	if _, err := s.CreateUser(ctx, "carol", "secret1", "reader"); err != nil {
		t.Fatalf("create after the failed one: %v", err)
	}
}

func TestLogin(t *testing.T) {
	t.Parallel()
	s := storeWithLimiter(t, 0, time.Minute) // no limiter here
	ctx := context.Background()

	// Wrong user and wrong password get the one same answer.
	_, errUser := s.Login(ctx, "a", "nobody", "admin123", time.Minute)
	_, errPass := s.Login(ctx, "a", "admin", "wrong-pass", time.Minute)
	if errUser != meta.ErrBadCredentials || errPass != meta.ErrBadCredentials {
		t.Fatalf("unknown user: %v; wrong password: %v; want ErrBadCredentials for both", errUser, errPass)
	}

	// An unknown user is checked against a dummy hash, which no password opens.
	if _, err := s.Login(ctx, "a", "nobody", "not a password", time.Minute); err != meta.ErrBadCredentials {
		t.Fatalf("unknown user with the dummy hash's password: %v", err)
	}

	// The token lives lifetime.
	for _, lifetime := range []time.Duration{90 * time.Second, 2 * time.Hour} {
		before := time.Now()
		sess, err := s.Login(ctx, "a", "admin", "admin123", lifetime)
		after := time.Now()
		if err != nil {
			t.Fatal(err)
		}
		if sess.Expires.Before(before.Add(lifetime-time.Second)) || sess.Expires.After(after.Add(lifetime+time.Second)) {
			t.Fatalf("lifetime %v: expires %v, login at %v", lifetime, sess.Expires, before)
		}
		if len(sess.Token) != 64 {
			t.Fatalf("token %q, want 32 random bytes in hex", sess.Token)
		}
		u, exp, err := s.Authenticate(ctx, sess.Token)
		if err != nil || u.ID != "admin" || !exp.Equal(sess.Expires) {
			t.Fatalf("authenticate: %+v %v %v, want admin until %v", u, exp, err, sess.Expires)
		}
	}

	// A disabled user cannot log in, and its tokens stop working.
	sess, err := s.Login(ctx, "a", "admin", "admin123", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.DB().Exec(`UPDATE users SET state = 'disabled' WHERE id = 'admin'`); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Login(ctx, "a", "admin", "admin123", time.Hour); err != meta.ErrBadCredentials {
		t.Fatalf("login of a disabled user: %v", err)
	}
	if _, _, err := s.Authenticate(ctx, sess.Token); !errors.Is(err, meta.ErrUnauthorized) {
		t.Fatalf("token of a disabled user: %v", err)
	}
}

// TestLoginSweepsOldTokens: a login deletes the tokens expired for more
// than a day, and keeps the others.
func TestLoginSweepsOldTokens(t *testing.T) {
	t.Parallel()
	s := metatest.NewStore(t)
	fastPassword(t, s, "admin", "admin123")
	ctx := context.Background()
	var tokens []string
	for range 3 {
		sess, err := s.Login(ctx, "a", "admin", "admin123", time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		tokens = append(tokens, sess.Token)
	}
	hash := func(tok string) []byte { h := sha256.Sum256([]byte(tok)); return h[:] }
	for i, age := range []string{"2 days", "1 hour"} {
		if _, err := s.DB().Exec(`UPDATE tokens SET expires_at = now() - $2::interval WHERE hash = $1`, hash(tokens[i]), age); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Login(ctx, "a", "admin", "admin123", time.Hour); err != nil {
		t.Fatal(err)
	}
	for i, want := range []bool{false, true, true} {
		var n int
		if err := s.DB().Get(&n, `SELECT count(*) FROM tokens WHERE hash = $1`, hash(tokens[i])); err != nil {
			t.Fatal(err)
		}
		if (n == 1) != want {
			t.Fatalf("token %d kept: %v, want %v", i, n == 1, want)
		}
	}
}

func TestAuthenticate(t *testing.T) {
	t.Parallel()
	s := metatest.NewStore(t)
	fastPassword(t, s, "admin", "admin123")
	ctx := context.Background()
	const lifetime = 30 * time.Minute
	login := func() string {
		t.Helper()
		sess, err := s.Login(ctx, "a", "admin", "admin123", lifetime)
		if err != nil {
			t.Fatal(err)
		}
		return sess.Token
	}
	hash := func(tok string) []byte { h := sha256.Sum256([]byte(tok)); return h[:] }
	setExpiry := func(tok, in string) {
		t.Helper()
		if _, err := s.DB().Exec(`UPDATE tokens SET expires_at = now() + $2::interval WHERE hash = $1`, hash(tok), in); err != nil {
			t.Fatal(err)
		}
	}
	storedExpiry := func(tok string) time.Time {
		t.Helper()
		var e time.Time
		if err := s.DB().Get(&e, `SELECT expires_at FROM tokens WHERE hash = $1`, hash(tok)); err != nil {
			t.Fatal(err)
		}
		return e
	}

	// Unknown, empty and oversized tokens.
	for _, tok := range []string{"", "nope", strings.Repeat("a", 64), strings.Repeat("a", 129)} {
		if _, _, err := s.Authenticate(ctx, tok); !errors.Is(err, meta.ErrUnauthorized) {
			t.Fatalf("token %.10q: %v", tok, err)
		}
	}

	// Sliding expiry: a token near its end is pushed a full lifetime ahead.
	tok := login()
	setExpiry(tok, "1 minute")
	before := time.Now()
	u, exp, err := s.Authenticate(ctx, tok)
	if err != nil || u.ID != "admin" || u.Username != "admin" {
		t.Fatalf("authenticate: %+v %v", u, err)
	}
	if exp.Before(before.Add(lifetime-time.Second)) || !storedExpiry(tok).Equal(exp) {
		t.Fatalf("expiry after use %v (stored %v), want about %v", exp, storedExpiry(tok), before.Add(lifetime))
	}

	// Within the slack of a full lifetime, the expiry is not rewritten.
	setExpiry(tok, "29 minutes 30 seconds")
	kept := storedExpiry(tok)
	if _, exp, err := s.Authenticate(ctx, tok); err != nil || !exp.Equal(kept) || !storedExpiry(tok).Equal(kept) {
		t.Fatalf("expiry %v (stored %v), want it left at %v: %v", exp, storedExpiry(tok), kept, err)
	}

	// An expired token is refused, and not revived.
	setExpiry(tok, "-1 second")
	if _, _, err := s.Authenticate(ctx, tok); !errors.Is(err, meta.ErrUnauthorized) {
		t.Fatalf("expired token: %v", err)
	}
	if storedExpiry(tok).After(time.Now()) {
		t.Fatal("an expired token's expiry was pushed")
	}
}

func TestLogout(t *testing.T) {
	t.Parallel()
	s := metatest.NewStore(t)
	fastPassword(t, s, "admin", "admin123")
	ctx := context.Background()
	a, err := s.Login(ctx, "a", "admin", "admin123", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.Login(ctx, "a", "admin", "admin123", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Logout(ctx, a.Token); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Authenticate(ctx, a.Token); !errors.Is(err, meta.ErrUnauthorized) {
		t.Fatalf("token after logout: %v", err)
	}
	if _, _, err := s.Authenticate(ctx, b.Token); err != nil {
		t.Fatalf("another token of the user after logout: %v", err)
	}
	// Logging out an unknown or revoked token is no error.
	for _, tok := range []string{a.Token, "unknown"} {
		if err := s.Logout(ctx, tok); err != nil {
			t.Fatalf("logout %q: %v", tok, err)
		}
	}
}

// TestTokensStoredHashed: the tokens table holds the SHA-256 of each token
// and nowhere the token itself.
func TestTokensStoredHashed(t *testing.T) {
	t.Parallel()
	s := metatest.NewStore(t)
	fastPassword(t, s, "admin", "admin123")
	ctx := context.Background()
	sess, err := s.Login(ctx, "a", "admin", "admin123", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := hex.DecodeString(sess.Token)
	if err != nil {
		t.Fatal(err)
	}
	var rows []struct {
		Hash []byte `db:"hash"`
		Text string `db:"text"`
	}
	if err := s.DB().Select(&rows, `SELECT hash, t::text AS text FROM tokens t`); err != nil {
		t.Fatal(err)
	}
	want := sha256.Sum256([]byte(sess.Token))
	if len(rows) != 1 || !bytes.Equal(rows[0].Hash, want[:]) {
		t.Fatalf("stored hashes %x, want the SHA-256 of the token %x", rows, want)
	}
	row := strings.ToLower(rows[0].Text)
	if strings.Contains(row, sess.Token) || strings.Contains(row, hex.EncodeToString(raw[:8])) || bytes.Contains(rows[0].Hash, raw) {
		t.Fatalf("the tokens row holds the token: %s", row)
	}
}

// TestLoginLimiter covers the per address and username attempt limit.
func TestLoginLimiter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	fail := func(t *testing.T, s *meta.Store, addr, user string) {
		t.Helper()
		if _, err := s.Login(ctx, addr, user, "wrong-pass", time.Minute); err != meta.ErrBadCredentials {
			t.Fatalf("wrong password from %s for %s: %v, want ErrBadCredentials", addr, user, err)
		}
	}
	login := func(s *meta.Store, addr string) error {
		_, err := s.Login(ctx, addr, "admin", "admin123", time.Minute)
		return err
	}

	t.Run("trips after the limit, for that address and username only", func(t *testing.T) {
		t.Parallel()
		s := storeWithLimiter(t, 3, 10*time.Minute)
		for range 3 {
			fail(t, s, "10.0.0.1", "admin")
		}
		if err := login(s, "10.0.0.1"); err != meta.ErrLoginLocked {
			t.Fatalf("right password after 3 failures: %v, want ErrLoginLocked", err)
		}
		if _, err := s.Login(ctx, "10.0.0.1", "admin", "wrong-pass", time.Minute); err != meta.ErrLoginLocked {
			t.Fatalf("wrong password while locked: %v, want ErrLoginLocked", err)
		}
		if err := login(s, "10.0.0.2"); err != nil {
			t.Fatalf("another address: %v", err)
		}
		if _, err := s.CreateUser(ctx, "bob", "bob-pass"); err != nil {
			t.Fatal(err)
		}
		fastPassword(t, s, "bob", "bob-pass")
		if _, err := s.Login(ctx, "10.0.0.1", "bob", "bob-pass", time.Minute); err != nil {
			t.Fatalf("another username from the locked address: %v", err)
		}
	})

	t.Run("unknown usernames are limited like real ones", func(t *testing.T) {
		t.Parallel()
		s := storeWithLimiter(t, 2, 10*time.Minute)
		fail(t, s, "10.0.0.1", "ghost")
		fail(t, s, "10.0.0.1", "ghost")
		if _, err := s.Login(ctx, "10.0.0.1", "ghost", "wrong-pass", time.Minute); err != meta.ErrLoginLocked {
			t.Fatalf("unknown username after 2 failures: %v, want ErrLoginLocked", err)
		}
	})

	t.Run("a success clears the count", func(t *testing.T) {
		t.Parallel()
		s := storeWithLimiter(t, 3, 10*time.Minute)
		for range 2 {
			fail(t, s, "10.0.0.1", "admin")
			fail(t, s, "10.0.0.1", "admin")
			// The third attempt reaches the limit; its success clears it.
			if err := login(s, "10.0.0.1"); err != nil {
				t.Fatalf("right password as the third attempt: %v", err)
			}
		}
		if n := countRows(t, s, "login_attempts"); n != 0 {
			t.Fatalf("%d attempt rows after a success", n)
		}
	})

	t.Run("failures more than a lockout apart are not in a row", func(t *testing.T) {
		t.Parallel()
		s := storeWithLimiter(t, 3, 10*time.Minute)
		fail(t, s, "10.0.0.1", "admin")
		fail(t, s, "10.0.0.1", "admin")
		// No failed check swept in between: the row is still there, old.
		if _, err := s.DB().Exec(`UPDATE login_attempts SET last_attempt = now() - interval '11 minutes'`); err != nil {
			t.Fatal(err)
		}
		fail(t, s, "10.0.0.1", "admin")
		if err := login(s, "10.0.0.1"); err != nil {
			t.Fatalf("right password after two old failures and one new: %v", err)
		}
	})

	t.Run("the lock expires and the count starts again", func(t *testing.T) {
		t.Parallel()
		s := storeWithLimiter(t, 3, 10*time.Minute)
		for range 3 {
			fail(t, s, "10.0.0.1", "admin")
		}
		if err := login(s, "10.0.0.1"); err != meta.ErrLoginLocked {
			t.Fatalf("while locked: %v", err)
		}
		// The lockout passes.
		if _, err := s.DB().Exec(`UPDATE login_attempts SET locked_until = now() - interval '1 second'`); err != nil {
			t.Fatal(err)
		}
		fail(t, s, "10.0.0.1", "admin")
		fail(t, s, "10.0.0.1", "admin")
		if err := login(s, "10.0.0.1"); err != nil {
			t.Fatalf("third attempt after an expired lock: %v", err)
		}
	})

	t.Run("failed checks sweep idle pairs", func(t *testing.T) {
		t.Parallel()
		s := storeWithLimiter(t, 3, 10*time.Minute)
		if _, err := s.DB().Exec(`INSERT INTO login_attempts (address, username, failures, last_attempt) VALUES
			('old', 'x', 2, now() - interval '11 minutes'), ('recent', 'x', 2, now() - interval '9 minutes')`); err != nil {
			t.Fatal(err)
		}
		fail(t, s, "10.0.0.9", "admin")
		var left []string
		if err := s.DB().Select(&left, `SELECT address FROM login_attempts ORDER BY address`); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(left, []string{"10.0.0.9", "recent"}) {
			t.Fatalf("attempt rows left %v, want 10.0.0.9 and recent", left)
		}
	})

	t.Run("parallel attempts get no more checks", func(t *testing.T) {
		t.Parallel()
		s := storeWithLimiter(t, 3, 10*time.Minute)
		const n = 8
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, errs[i] = s.Login(ctx, "10.0.0.1", "admin", "wrong-pass", time.Minute)
			}()
		}
		wg.Wait()
		checked := 0
		for _, err := range errs {
			switch err {
			case meta.ErrBadCredentials:
				checked++
			case meta.ErrLoginLocked:
			default:
				t.Fatalf("parallel attempt: %v", err)
			}
		}
		if checked != 3 {
			t.Fatalf("%d of %d parallel attempts were checked, want 3", checked, n)
		}
		if err := login(s, "10.0.0.1"); err != meta.ErrLoginLocked {
			t.Fatalf("after parallel failures: %v, want ErrLoginLocked", err)
		}
	})

	t.Run("0 disables the limit", func(t *testing.T) {
		t.Parallel()
		s := storeWithLimiter(t, 0, 10*time.Minute)
		for range 6 {
			fail(t, s, "10.0.0.1", "admin")
		}
		if err := login(s, "10.0.0.1"); err != nil {
			t.Fatalf("without a limit: %v", err)
		}
		if n := countRows(t, s, "login_attempts"); n != 0 {
			t.Fatalf("%d attempt rows without a limit", n)
		}
	})
}

// TestUserPermissions: a token check gives the union of the permissions
// of the user's enabled roles; a disabled role grants nothing.
func TestUserPermissions(t *testing.T) {
	t.Parallel()
	s := metatest.NewStore(t)
	ctx := context.Background()
	if _, err := s.CreateUser(ctx, "both", "both-pass", meta.RoleViewer, meta.RoleOperator); err != nil {
		t.Fatal(err)
	}
	fastPassword(t, s, "both", "both-pass")
	sess, err := s.Login(ctx, "10.0.0.1", "both", "both-pass", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	u, _, err := s.Authenticate(ctx, sess.Token)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"alarm:read", "alarm:write", "dashboard:read", "device:command", "device:read", "device:write", "product:read"}
	if !reflect.DeepEqual(u.Permissions, want) || !reflect.DeepEqual(u.Roles, []string{"operator", "viewer"}) {
		t.Fatalf("user %+v: want roles operator, viewer with permissions %v", u, want)
	}
	if !u.Can(meta.PermDeviceWrite) || u.Can(meta.PermDeviceSecret) || u.Can(meta.PermUserAdmin) {
		t.Fatalf("Can: %+v", u)
	}
	if _, err := s.DB().Exec(`UPDATE roles SET state = 'disabled' WHERE id = 'operator'`); err != nil {
		t.Fatal(err)
	}
	if u, _, err = s.Authenticate(ctx, sess.Token); err != nil || !reflect.DeepEqual(u.Permissions, []string{"alarm:read", "dashboard:read", "device:read", "product:read"}) {
		t.Fatalf("with operator disabled: %+v %v", u.Permissions, err)
	}
	// The admin role holds every permission.
	sess, err = s.Login(ctx, "10.0.0.1", "admin", "admin123", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if u, _, err = s.Authenticate(ctx, sess.Token); err != nil || len(u.Permissions) != len(meta.Permissions) {
		t.Fatalf("admin's permissions %v, want all of %v (%v)", u.Permissions, meta.Permissions, err)
	}
}

// TestUserAdminStore: creation, changes and the last administrator, in
// the store; two administrators disabling each other at once leave one.
func TestUserAdminStore(t *testing.T) {
	t.Parallel()
	s := metatest.NewStore(t)
	ctx := context.Background()
	_, err := s.AddUser(ctx, meta.NewUser{Username: "ann", Password: "seven77", Roles: []string{}})
	wantArgField(t, err, "password")
	_, err = s.AddUser(ctx, meta.NewUser{Username: "ann", Password: "ann-password", Roles: []string{"viewer", "ghost"}})
	wantArgField(t, err, "roles[1]")
	ann, err := s.AddUser(ctx, meta.NewUser{Username: "ann", Password: "ann-password", Roles: []string{"viewer"}})
	if err != nil || ann.Name != "ann" || ann.State != "enabled" || !reflect.DeepEqual(ann.Roles, []string{"viewer"}) {
		t.Fatalf("ann %+v %v", ann, err)
	}
	name, state := "Ann", meta.Enum("disabled")
	roles := []string{"operator"}
	ann, err = s.UpdateUser(ctx, ann.ID, meta.UserPatch{Name: &name, State: &state, Roles: &roles})
	if err != nil || ann.Name != "Ann" || ann.State != "disabled" || !reflect.DeepEqual(ann.Roles, []string{"operator"}) {
		t.Fatalf("updated ann %+v %v", ann, err)
	}
	if _, err := s.UpdateUser(ctx, "ghost", meta.UserPatch{Name: &name}); !errors.Is(err, meta.ErrNotFound) {
		t.Fatalf("update of no user: %v", err)
	}
	disabled := meta.Enum("disabled")
	if _, err := s.UpdateUser(ctx, "admin", meta.UserPatch{State: &disabled}); !errors.Is(err, meta.ErrLastAdmin) {
		t.Fatalf("disabling the last administrator: %v", err)
	}
	if _, err := s.DeleteUser(ctx, "admin"); !errors.Is(err, meta.ErrLastAdmin) {
		t.Fatalf("deleting the last administrator: %v", err)
	}
	if n := countRows(t, s, "users"); n != 2 {
		t.Fatalf("%d users", n)
	}

	// Two administrators, each disabling the other at the same moment:
	// one change goes through, the other finds it would leave none.
	bob, err := s.AddUser(ctx, meta.NewUser{Username: "bob", Password: "bob-password", Roles: []string{"admin"}})
	if err != nil {
		t.Fatal(err)
	}
	// Rounds, as the two transactions must overlap to tell.
	for round := 0; round < 40; round++ {
		if _, err := s.DB().Exec(`UPDATE users SET state = 'enabled'`); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		errs := make([]error, 2)
		ready := make(chan struct{})
		for i, id := range []string{"admin", bob.ID} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-ready
				_, errs[i] = s.UpdateUser(ctx, id, meta.UserPatch{State: &disabled})
			}()
		}
		close(ready)
		wg.Wait()
		if (errs[0] == nil) == (errs[1] == nil) || !(errors.Is(errs[0], meta.ErrLastAdmin) || errors.Is(errs[1], meta.ErrLastAdmin)) {
			t.Fatalf("round %d: concurrent disabling of both administrators: %v, %v; want exactly one refused", round, errs[0], errs[1])
		}
		var admins int
		if err := s.DB().Get(&admins, `SELECT count(*) FROM users u JOIN user_roles r ON r.user_id = u.id AND r.role_id = 'admin' WHERE u.state = 'enabled'`); err != nil || admins != 1 {
			t.Fatalf("round %d: %d enabled administrators, want 1 (%v)", round, admins, err)
		}
	}
}
