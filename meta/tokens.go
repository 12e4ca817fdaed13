// Tokens: their check (Authenticate, sliding expiry), logout and expiry,
// and their hashing (TokenDigest, TokenID, ParseTokenID).

package meta

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/lib/pq"
)

// tokenSlideSlack is how far a token's expiry may lag its full lifetime
// before a request pushes it forward.
const tokenSlideSlack = time.Minute

// Authenticate resolves a token to its user and slides its expiry.
// An API key (KeyPrefix) gives its user restricted to the key (keys.go),
// and its expiry, which does not slide.
func (s *Store) Authenticate(ctx context.Context, token string) (User, time.Time, error) {
	if token == "" || len(token) > 128 {
		return User{}, time.Time{}, ErrUnauthorized
	}
	if IsKey(token) {
		return s.authenticateKey(ctx, token)
	}
	ctx, cancel := s.timeout(ctx)
	defer cancel()
	var row struct {
		User
		Expires  time.Time      `db:"expires_at"`
		Lifetime int64          `db:"lifetime_ms"`
		RoleIDs  pq.StringArray `db:"roles"`
		Grants   []byte         `db:"grants"`
	}
	hash := hashToken(token)
	// The user's permissions: the union of those of its enabled roles,
	// with their products.
	err := s.db.GetContext(ctx, &row, `SELECT u.id, u.username, u.name, t.expires_at, t.lifetime_ms,
			ARRAY(SELECT ur.role_id FROM user_roles ur WHERE ur.user_id = u.id ORDER BY ur.role_id) AS roles,
			`+grantsSQL("u.id")+` AS grants
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
	row.User.Roles = append([]string{}, row.RoleIDs...)
	if err := row.User.setGrants(row.Grants); err != nil {
		return User{}, time.Time{}, err
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

// TokenExpiry returns when token expires unless a request slides it, or
// ErrUnauthorized if it has ended (expired, logged out, its user not
// enabled). Unlike Authenticate it does not slide the expiry: a live
// stream checking its token again is no use of it.
func (s *Store) TokenExpiry(ctx context.Context, token string) (time.Time, error) {
	if token == "" || len(token) > 128 {
		return time.Time{}, ErrUnauthorized
	}
	if IsKey(token) {
		return s.keyExpiry(ctx, token)
	}
	ctx, cancel := s.timeout(ctx)
	defer cancel()
	var expires time.Time
	err := s.db.GetContext(ctx, &expires, `SELECT t.expires_at FROM tokens t JOIN users u ON u.id = t.user_id
		WHERE t.hash = $1 AND t.expires_at > now() AND u.state = 'enabled'`, hashToken(token))
	if errors.Is(err, sql.ErrNoRows) {
		return time.Time{}, ErrUnauthorized
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("meta: token expiry: %w", err)
	}
	return expires, nil
}

func hashToken(token string) []byte {
	h := TokenDigest(token)
	return h[:]
}

// TokenDigest is the SHA-256 of a token (or API key) that the tokens
// table keeps (api_keys: of the key's secret): TokenID is its hex. A cache
// of tokens keyed by it can find a token without comparing secrets.
func TokenDigest(token string) [sha256.Size]byte {
	var b [128]byte // the longest token Authenticate takes, hashed without allocating
	if len(token) <= len(b) {
		return sha256.Sum256(b[:copy(b[:], token)])
	}
	return sha256.Sum256([]byte(token))
}

// TokenID names a token without being it: the hex of the SHA-256 the
// tokens table keeps, which the announcements of WatchTokens carry. A
// cache of tokens keyed by it can drop what they name.
func TokenID(token string) string { return hex.EncodeToString(hashToken(token)) }

// ParseTokenID is the TokenDigest a TokenID names; false for text that is
// no TokenID (it names no token).
func ParseTokenID(id string) ([sha256.Size]byte, bool) {
	var d [sha256.Size]byte
	if len(id) != 2*len(d) {
		return d, false
	}
	if _, err := hex.Decode(d[:], []byte(id)); err != nil {
		return d, false
	}
	return d, true
}
