// Login: the password check that issues a token, and its lockout (the
// attempts counted per address and username, and their sweep).

package meta

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"golang.org/x/crypto/bcrypt"
)

// Login checks a password sent from the client at address and issues a
// token living lifetime, renewed on every use (sliding expiry).
//
// Attempts are limited per address and username (Options.LoginMaxFailures,
// LoginLockout): each one is counted before its password is checked, so
// that attempts sent in parallel get no more checks than attempts sent one
// after another, and the attempt that reaches the limit locks that address
// out of that username. A success clears the count. Unknown usernames are
// counted, and checked against a dummy hash, like real ones: the answers
// and their timing do not tell which accounts exist.
func (s *Store) Login(ctx context.Context, address, username, password string, lifetime time.Duration) (Session, error) {
	if err := s.reserveLoginAttempt(ctx, address, username); err != nil {
		return Session{}, err
	}
	var row struct {
		User
		Hash string `db:"password_hash"`
	}
	lctx, cancel := s.timeout(ctx)
	err := s.db.GetContext(lctx, &row, `SELECT id, username, name, password_hash
		FROM users WHERE username = $1 AND state = 'enabled'`, username)
	cancel()
	known := err == nil
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return Session{}, fmt.Errorf("meta: login: %w", err)
	}
	hash := s.dummyHash()
	if known {
		hash = []byte(row.Hash)
	}
	// The check runs outside any statement timeout: under load it may
	// wait for a CPU longer than a query may take.
	if bcrypt.CompareHashAndPassword(hash, []byte(password)) != nil || !known {
		if err := s.sweepLoginAttempts(ctx); err != nil {
			return Session{}, err
		}
		return Session{}, ErrBadCredentials
	}
	ctx, cancel = s.timeout(ctx)
	defer cancel()
	if _, err := s.db.ExecContext(ctx, `DELETE FROM login_attempts WHERE address = $1 AND username = $2`, address, username); err != nil {
		return Session{}, fmt.Errorf("meta: login: %w", err)
	}
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return Session{}, fmt.Errorf("meta: token: %w", err)
	}
	token := hex.EncodeToString(raw[:])
	sess := Session{Token: token, User: row.User}
	err = s.db.GetContext(ctx, &sess.Expires, `INSERT INTO tokens (hash, user_id, lifetime_ms, expires_at)
		VALUES ($1, $2, $3::bigint, now() + $3::bigint * interval '1 millisecond') RETURNING expires_at`,
		hashToken(token), row.ID, lifetime.Milliseconds())
	if err != nil {
		return Session{}, fmt.Errorf("meta: login: %w", err)
	}
	if sess.User.Roles, err = s.userRoles(ctx, row.ID); err != nil {
		return Session{}, err
	}
	// Expired tokens are swept here rather than by a timer: logins are rare.
	if _, err := s.db.ExecContext(ctx, `DELETE FROM tokens WHERE expires_at < now() - interval '1 day'`); err != nil {
		return Session{}, fmt.Errorf("meta: sweep tokens: %w", err)
	}
	return sess, nil
}

// reserveLoginAttempt counts one attempt of address at username, in one
// statement (the row lock of the upsert orders concurrent attempts), or
// returns ErrLoginLocked if that pair is locked. The attempt that reaches
// LoginMaxFailures sets the lock: if its password is right, its success
// clears it again. After an expired lock, or an attempt more than a
// lockout after the previous one, the count starts again: failures in a
// row are those less than a lockout apart.
func (s *Store) reserveLoginAttempt(ctx context.Context, address, username string) error {
	if s.opts.LoginMaxFailures <= 0 {
		return nil
	}
	ctx, cancel := s.timeout(ctx)
	defer cancel()
	var n int
	err := s.db.GetContext(ctx, &n, `INSERT INTO login_attempts AS a (address, username, failures, locked_until)
		VALUES ($1, $2, 1, CASE WHEN $3 <= 1 THEN now() + $4::bigint * interval '1 millisecond' END)
		ON CONFLICT (address, username) DO UPDATE SET
			failures = CASE WHEN a.locked_until <= now() OR a.last_attempt < now() - $4::bigint * interval '1 millisecond'
				THEN 1 ELSE a.failures + 1 END,
			locked_until = CASE WHEN (CASE WHEN a.locked_until <= now() OR a.last_attempt < now() - $4::bigint * interval '1 millisecond'
				THEN 1 ELSE a.failures + 1 END) >= $3
				THEN now() + $4::bigint * interval '1 millisecond' END,
			last_attempt = now()
		WHERE a.locked_until IS NULL OR a.locked_until <= now()
		RETURNING failures`, address, username, s.opts.LoginMaxFailures, s.opts.LoginLockout.Milliseconds())
	if errors.Is(err, sql.ErrNoRows) {
		return ErrLoginLocked
	}
	if err != nil {
		return fmt.Errorf("meta: login: %w", err)
	}
	return nil
}

// sweepLoginAttempts forgets the counts of pairs with no attempt for
// longer than the lockout (their lock, if any, has expired): failures in
// a row are those less than a lockout apart. It runs after each failed
// check, so that guesses at ever new usernames or from ever new
// addresses cannot grow the table without bound.
func (s *Store) sweepLoginAttempts(ctx context.Context) error {
	if s.opts.LoginMaxFailures <= 0 {
		return nil
	}
	ctx, cancel := s.timeout(ctx)
	defer cancel()
	if _, err := s.db.ExecContext(ctx, `DELETE FROM login_attempts WHERE last_attempt < now() - $1::bigint * interval '1 millisecond'`,
		s.opts.LoginLockout.Milliseconds()); err != nil {
		return fmt.Errorf("meta: sweep login attempts: %w", err)
	}
	return nil
}

// dummyHashes holds the hash an unknown username's password is checked
// against, one per bcrypt cost (Options.PasswordCost), made at the
// first such login of the process.
var dummyHashes sync.Map // int → func() []byte

func (s *Store) dummyHash() []byte {
	cost := s.opts.PasswordCost
	if cost == 0 {
		cost = bcrypt.DefaultCost
	}
	f, _ := dummyHashes.LoadOrStore(cost, sync.OnceValue(func() []byte {
		hash, _ := hashPassword(cost, "not a password")
		return hash
	}))
	return f.(func() []byte)()
}
