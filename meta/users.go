package meta

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"golang.org/x/crypto/bcrypt"
)

// Auth errors.
var (
	// ErrBadCredentials is the one answer for an unknown user or a wrong
	// password, so that a client cannot tell which.
	ErrBadCredentials = errors.New("bad username or password")
	// ErrUnauthorized is a missing, unknown or expired token.
	ErrUnauthorized = errors.New("token missing or expired")
	// ErrLoginLocked refuses logins to an account locked after repeated
	// failures, until the lock expires.
	ErrLoginLocked = errors.New("too many failed logins; try again later")
)

// User is a platform user.
type User struct {
	ID       string   `db:"id" json:"id"`
	Username string   `db:"username" json:"username"`
	Name     string   `db:"name" json:"name"`
	Roles    []string `db:"-" json:"roles"`
}

// Session is the result of a login.
type Session struct {
	Token   string
	User    User
	Expires time.Time
}

// EnsureAdmin creates the admin role and the admin user with password on
// first start; an existing admin keeps its password.
func (s *Store) EnsureAdmin(ctx context.Context, password string) error {
	if len(password) < 6 {
		return fmt.Errorf("meta: admin password must be at least 6 characters")
	}
	hash, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.DefaultCost)
	if err != nil {
		return fmt.Errorf("meta: hash password: %w", err)
	}
	ctx, cancel := s.timeout(ctx)
	defer cancel()
	tx, err := s.db.BeginTxx(ctx, nil)
	if err != nil {
		return fmt.Errorf("meta: ensure admin: %w", err)
	}
	defer tx.Rollback()
	stmts := []struct {
		q    string
		args []any
	}{
		{`INSERT INTO roles (id, name, description, creator_id) VALUES ('admin', 'Administrator', 'Full access to the platform', 'admin') ON CONFLICT (id) DO NOTHING`, nil},
		{`INSERT INTO users (id, username, name, password_hash) VALUES ('admin', 'admin', 'Administrator', $1) ON CONFLICT (username) DO NOTHING`, []any{string(hash)}},
		{`INSERT INTO user_roles (user_id, role_id) SELECT id, 'admin' FROM users WHERE username = 'admin' ON CONFLICT DO NOTHING`, nil},
	}
	for _, st := range stmts {
		if _, err := tx.ExecContext(ctx, st.q, st.args...); err != nil {
			return fmt.Errorf("meta: ensure admin: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("meta: ensure admin: %w", err)
	}
	return nil
}

// CreateUser adds a user with the given roles (tests and administration).
func (s *Store) CreateUser(ctx context.Context, username, password string, roles ...string) (User, error) {
	if err := checkText("username", username, 64, true); err != nil {
		return User{}, err
	}
	if len(password) < 6 || len(password) > 72 {
		return User{}, Invalid("password", "must be 6 to 72 bytes")
	}
	hash, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.DefaultCost)
	if err != nil {
		return User{}, fmt.Errorf("meta: hash password: %w", err)
	}
	u := User{ID: NewID(), Username: username, Name: username, Roles: roles}
	ctx, cancel := s.timeout(ctx)
	defer cancel()
	tx, err := s.db.BeginTxx(ctx, nil)
	if err != nil {
		return User{}, fmt.Errorf("meta: create user: %w", err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `INSERT INTO users (id, username, name, password_hash) VALUES ($1, $2, $3, $4)`,
		u.ID, u.Username, u.Name, string(hash)); err != nil {
		if isUniqueViolation(err) {
			return User{}, fmt.Errorf("user %q: %w", username, ErrDuplicateKey)
		}
		return User{}, fmt.Errorf("meta: create user: %w", err)
	}
	for _, r := range roles {
		if _, err := tx.ExecContext(ctx, `INSERT INTO user_roles (user_id, role_id) VALUES ($1, $2)`, u.ID, r); err != nil {
			return User{}, fmt.Errorf("meta: create user role %q: %w", r, err)
		}
	}
	return u, tx.Commit()
}

// Login checks a password and issues a token living lifetime, renewed on
// every use (sliding expiry).
func (s *Store) Login(ctx context.Context, username, password string, lifetime time.Duration) (Session, error) {
	ctx, cancel := s.timeout(ctx)
	defer cancel()
	var row struct {
		User
		Hash   string `db:"password_hash"`
		Locked bool   `db:"locked"`
	}
	err := s.db.GetContext(ctx, &row, `SELECT id, username, name, password_hash, coalesce(locked_until > now(), false) AS locked
		FROM users WHERE username = $1 AND state = 'enabled'`, username)
	if errors.Is(err, sql.ErrNoRows) {
		// Spend the same time as a real check, so timing tells nothing.
		_ = bcrypt.CompareHashAndPassword(dummyHash, []byte(password))
		return Session{}, ErrBadCredentials
	}
	if err != nil {
		return Session{}, fmt.Errorf("meta: login: %w", err)
	}
	if row.Locked {
		return Session{}, ErrLoginLocked
	}
	if bcrypt.CompareHashAndPassword([]byte(row.Hash), []byte(password)) != nil {
		if s.opts.LoginMaxFailures > 0 {
			// The failure that reaches the limit locks the account; after an
			// expired lock the count starts again.
			_, err := s.db.ExecContext(ctx, `UPDATE users SET
				failed_logins = CASE WHEN locked_until <= now() THEN 1 ELSE failed_logins + 1 END,
				locked_until = CASE WHEN (CASE WHEN locked_until <= now() THEN 1 ELSE failed_logins + 1 END) >= $2
					THEN now() + $3::bigint * interval '1 millisecond' END
				WHERE id = $1`, row.ID, s.opts.LoginMaxFailures, s.opts.LoginLockout.Milliseconds())
			if err != nil {
				return Session{}, fmt.Errorf("meta: login: %w", err)
			}
		}
		return Session{}, ErrBadCredentials
	}
	if _, err := s.db.ExecContext(ctx, `UPDATE users SET failed_logins = 0, locked_until = NULL WHERE id = $1 AND failed_logins > 0`, row.ID); err != nil {
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

// tokenSlideSlack is how far a token's expiry may lag its full lifetime
// before a request pushes it forward.
const tokenSlideSlack = time.Minute

var dummyHash, _ = bcrypt.GenerateFromPassword([]byte("not a password"), bcrypt.DefaultCost)

// Authenticate resolves a token to its user and slides its expiry.
func (s *Store) Authenticate(ctx context.Context, token string) (User, time.Time, error) {
	if token == "" || len(token) > 128 {
		return User{}, time.Time{}, ErrUnauthorized
	}
	ctx, cancel := s.timeout(ctx)
	defer cancel()
	var row struct {
		User
		Expires  time.Time `db:"expires_at"`
		Lifetime int64     `db:"lifetime_ms"`
	}
	hash := hashToken(token)
	err := s.db.GetContext(ctx, &row, `SELECT u.id, u.username, u.name, t.expires_at, t.lifetime_ms
		FROM tokens t JOIN users u ON u.id = t.user_id
		WHERE t.hash = $1 AND t.expires_at > now() AND u.state = 'enabled'`, hash)
	if errors.Is(err, sql.ErrNoRows) {
		return User{}, time.Time{}, ErrUnauthorized
	}
	if err != nil {
		return User{}, time.Time{}, fmt.Errorf("meta: authenticate: %w", err)
	}
	// Slide the expiry, but write only when it has drifted by more than
	// tokenSlideSlack: a busy client would otherwise write on every request.
	lifetime := time.Duration(row.Lifetime) * time.Millisecond
	if time.Until(row.Expires) < lifetime-tokenSlideSlack {
		err := s.db.GetContext(ctx, &row.Expires, `UPDATE tokens SET expires_at = now() + lifetime_ms * interval '1 millisecond'
			WHERE hash = $1 RETURNING expires_at`, hash)
		if err != nil {
			return User{}, time.Time{}, fmt.Errorf("meta: authenticate: %w", err)
		}
	}
	return row.User, row.Expires, nil
}

// Logout revokes a token.
func (s *Store) Logout(ctx context.Context, token string) error {
	ctx, cancel := s.timeout(ctx)
	defer cancel()
	_, err := s.db.ExecContext(ctx, `DELETE FROM tokens WHERE hash = $1`, hashToken(token))
	if err != nil {
		return fmt.Errorf("meta: logout: %w", err)
	}
	return nil
}

func (s *Store) userRoles(ctx context.Context, userID string) ([]string, error) {
	roles := []string{}
	if err := s.db.SelectContext(ctx, &roles, `SELECT role_id FROM user_roles WHERE user_id = $1 ORDER BY role_id`, userID); err != nil {
		return nil, fmt.Errorf("meta: user roles: %w", err)
	}
	return roles, nil
}

func hashToken(token string) []byte {
	h := sha256.Sum256([]byte(token))
	return h[:]
}
