package meta

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"devicehub/schema"
)

// API keys (schema/postgres/00014_api_keys.sql): long-lived credentials a
// signed-in user makes for a program, sent in X-Access-Token like a
// login's token and told from one by KeyPrefix. A key holds a subset of
// its user's permissions, optionally on listed products only, and never
// more than the user holds at each request: Authenticate reads the user's
// roles with the key and restricts them (User.Restrict). A disabled or
// deleted user's keys are refused. The secret is shown once, at creation;
// its SHA-256 is kept.

// KeyPrefix starts every API key's secret (and no login token, which is
// hex).
const KeyPrefix = "dhk_"

// Limits of API keys.
const (
	MaxKeysPerUser   = 100
	maxKeyProducts   = 1000
	keyLastUsedEvery = time.Minute // last_used is written at most this often per key
)

// ErrTooManyKeys refuses a key past MaxKeysPerUser.
var ErrTooManyKeys = fmt.Errorf("at most %d API keys per user: revoke one first: %w", MaxKeysPerUser, schema.ErrIllegalArgument)

// NewKey is the body of a key's creation.
type NewKey struct {
	Name        string       `json:"name"`
	Permissions []Permission `json:"permissions"`
	// Products limits the key to these products (and their devices); nil
	// leaves it the products of its user's grants.
	Products []string `json:"products"`
	// ExpiresAt is when the key ends, epoch ms; nil: never.
	ExpiresAt *int64 `json:"expiresAt"`
}

// Key is an API key as lists show it: never its secret.
type Key struct {
	ID          string       `db:"id"`
	Name        string       `db:"name"`
	UserID      string       `db:"user_id"`
	Username    string       `db:"username"`
	Permissions []Permission `db:"-"`
	Products    []string     `db:"-"` // null: no limit of its own
	CreateTime  Millis       `db:"-"`
	ExpiresAt   Millis       `db:"-"` // 0: never
	LastUsed    Millis       `db:"-"` // 0: not yet; written at most once a minute
}

// CreatedKey is a key with its secret, answered once at its creation.
type CreatedKey struct {
	Key
	Secret string
}

type keyRow struct {
	Key
	Perms     pq.StringArray `db:"permissions"`
	Prods     pq.StringArray `db:"products"`
	CreatedAt time.Time      `db:"create_time"`
	Expires   sql.NullTime   `db:"expires_at"`
	Used      sql.NullTime   `db:"last_used"`
}

func (r *keyRow) key() Key {
	k := r.Key
	k.Permissions = make([]Permission, len(r.Perms))
	for i, p := range r.Perms {
		k.Permissions[i] = Permission(p)
	}
	if r.Prods != nil {
		k.Products = append([]string{}, r.Prods...)
	}
	k.CreateTime = Millis(r.CreatedAt)
	if r.Expires.Valid {
		k.ExpiresAt = Millis(r.Expires.Time)
	}
	if r.Used.Valid {
		k.LastUsed = Millis(r.Used.Time)
	}
	return k
}

const keyColumns = `k.id, k.name, k.user_id, u.username, k.permissions, k.products, k.create_time, k.expires_at, k.last_used`

// KeyResource allows terms on id, name, userId, username, createTime,
// expiresAt and lastUsed; sorts on name, createTime, expiresAt and
// lastUsed. The secret and its hash are no column.
var KeyResource = &Resource{
	Name: "key",
	Columns: map[string]Column{
		"id":         {Expr: "k.id", Kind: KindText},
		"name":       {Expr: "k.name", Kind: KindText},
		"userId":     {Expr: "k.user_id", Kind: KindText},
		"username":   {Expr: "u.username", Kind: KindText},
		"createTime": {Expr: "k.create_time", Kind: KindTime},
		"expiresAt":  {Expr: "k.expires_at", Kind: KindTime},
		"lastUsed":   {Expr: "k.last_used", Kind: KindTime},
	},
	Sorts: map[string]string{
		"name":       Natural("k.name"),
		"createTime": "k.create_time",
		"expiresAt":  "k.expires_at",
		"lastUsed":   "k.last_used",
	},
	DefaultSort: "k.create_time DESC, k.id",
	TieBreak:    Natural("k.id"),
}

// CreateKey makes a key of user for what n asks: each permission must be
// one user holds, on each of n's products if it names some (else the
// field is refused, naming it): a key is made with no more than its user
// holds, and names no product its user does not hold.
func (s *Store) CreateKey(ctx context.Context, user User, n NewKey) (CreatedKey, error) {
	if err := checkText("name", n.Name, 128, true); err != nil {
		return CreatedKey{}, err
	}
	if len(n.Permissions) == 0 {
		return CreatedKey{}, schema.Invalid("permissions", "is required: the permissions the key holds, a subset of yours")
	}
	perms := make([]string, 0, len(n.Permissions))
	for i, p := range n.Permissions {
		if !slices.Contains(Permissions, p) {
			return CreatedKey{}, schema.Invalid(fmt.Sprintf("permissions[%d]", i), "unknown permission %q", schema.Truncate(string(p), 80))
		}
		if !slices.Contains(perms, string(p)) {
			perms = append(perms, string(p))
		}
	}
	var products pq.StringArray // NULL: no limit of its own
	if n.Products != nil {
		if len(n.Products) == 0 {
			return CreatedKey{}, schema.Invalid("products", "an empty list reaches no product: leave it out for every product of yours")
		}
		if len(n.Products) > maxKeyProducts {
			return CreatedKey{}, schema.Invalid("products", "at most %d", maxKeyProducts)
		}
		for i, id := range n.Products {
			if err := checkID(fmt.Sprintf("products[%d]", i), id); err != nil {
				return CreatedKey{}, err
			}
		}
		products = sortedSet(n.Products)
		// Each product named must be one the user holds each of the
		// key's permissions on: one it does not would be kept, reaching
		// nothing now, and widen the key silently the day the user is
		// given it.
		for i, id := range n.Products {
			for _, p := range n.Permissions {
				if ProductPermission(p) && !user.CanProduct(p, id) {
					return CreatedKey{}, schema.Invalid(fmt.Sprintf("products[%d]", i),
						"you do not hold %s on product %q: a key names only products its user holds each of its permissions on", p, id)
				}
			}
		}
	}
	granted := user.Restrict(n.Permissions, n.Products)
	for i, p := range n.Permissions {
		if !granted.Can(p) {
			where := ""
			if n.Products != nil {
				where = " on these products"
			}
			return CreatedKey{}, schema.Invalid(fmt.Sprintf("permissions[%d]", i), "you do not hold %s%s: a key holds at most what its user holds", p, where)
		}
	}
	var expires *time.Time
	if n.ExpiresAt != nil {
		t := time.UnixMilli(*n.ExpiresAt)
		if !t.After(time.Now()) || *n.ExpiresAt > maxMillis {
			return CreatedKey{}, schema.Invalid("expiresAt", "must be a time to come, in epoch ms")
		}
		expires = &t
	}
	var raw [32]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return CreatedKey{}, fmt.Errorf("meta: key: %w", err)
	}
	secret := KeyPrefix + hex.EncodeToString(raw[:])
	id := NewID()
	ctx, cancel := s.timeout(ctx)
	defer cancel()
	err := s.inTx(ctx, func(tx *sqlx.Tx) error {
		// Keys of one user are made one at a time: the count holds.
		var found bool
		if err := tx.GetContext(ctx, &found, `SELECT true FROM users WHERE id = $1 AND state = 'enabled' FOR UPDATE`, user.ID); err != nil {
			if errors.Is(err, sql.ErrNoRows) {
				return ErrUnauthorized
			}
			return fmt.Errorf("meta: create key: %w", err)
		}
		var count int
		if err := tx.GetContext(ctx, &count, `SELECT count(*) FROM api_keys WHERE user_id = $1`, user.ID); err != nil {
			return fmt.Errorf("meta: create key: %w", err)
		}
		if count >= MaxKeysPerUser {
			return ErrTooManyKeys
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO api_keys (id, hash, user_id, name, permissions, products, expires_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7)`, id, hashToken(secret), user.ID, n.Name, pq.StringArray(perms), products, expires)
		if err != nil {
			return fmt.Errorf("meta: create key: %w", err)
		}
		return nil
	})
	if err != nil {
		return CreatedKey{}, err
	}
	k, err := s.getKey(ctx, id)
	if err != nil {
		return CreatedKey{}, err
	}
	return CreatedKey{Key: k, Secret: secret}, nil
}

func (s *Store) getKey(ctx context.Context, id string) (Key, error) {
	var r keyRow
	err := s.db.GetContext(ctx, &r, `SELECT `+keyColumns+` FROM api_keys k JOIN users u ON u.id = k.user_id WHERE k.id = $1`, id)
	if errors.Is(err, sql.ErrNoRows) {
		return Key{}, fmt.Errorf("key %q: %w", id, ErrNotFound)
	}
	if err != nil {
		return Key{}, fmt.Errorf("meta: get key: %w", err)
	}
	return r.key(), nil
}

// QueryKeys answers POST /api/user/key/_query: the keys of user userID,
// or of every user when userID is "".
func (s *Store) QueryKeys(ctx context.Context, q *Query, userID string) (Page[Key], error) {
	var user Params
	if userID != "" {
		user = Params{"user": userID}
	}
	return keyList.Query(ctx, s, q, user)
}

// keyList is POST /api/user/key/_query's statement: the keys of @user
// when it is bound, ANDed to the client's terms (never widened by them).
var keyList = NewList(KeyResource, ListSQL{
	Select: keyColumns,
	From:   "api_keys k",
	Joins:  " JOIN users u ON u.id = k.user_id",
	Where:  []string{"k.user_id = @user"},
}, (*keyRow).key)

// DeleteKey revokes key id of user userID (of any user when userID is
// ""): it ends on every instance at once (00014's announcement). A key
// of another user is ErrNotFound, as one that does not exist.
func (s *Store) DeleteKey(ctx context.Context, id, userID string) (Key, error) {
	ctx, cancel := s.timeout(ctx)
	defer cancel()
	var r keyRow
	err := s.db.GetContext(ctx, &r, `WITH gone AS (DELETE FROM api_keys k WHERE k.id = $1 AND ($2 = '' OR k.user_id = $2) RETURNING k.*)
		SELECT `+keyColumns+` FROM gone k JOIN users u ON u.id = k.user_id`, id, userID)
	if errors.Is(err, sql.ErrNoRows) {
		return Key{}, fmt.Errorf("key %q: %w", id, ErrNotFound)
	}
	if err != nil {
		return Key{}, fmt.Errorf("meta: delete key: %w", err)
	}
	return r.key(), nil
}

// IsKey reports whether token is an API key's secret (KeyPrefix), not a
// login's token.
func IsKey(token string) bool { return strings.HasPrefix(token, KeyPrefix) }

// authenticateKey is Authenticate for an API key: its user, as its roles
// grant now, restricted to the key's permissions and products, with
// KeyID set; the key's expiry (zero: none). last_used is written when
// more than keyLastUsedEvery old.
func (s *Store) authenticateKey(ctx context.Context, secret string) (User, time.Time, error) {
	ctx, cancel := s.timeout(ctx)
	defer cancel()
	var row struct {
		User
		KeyID    string         `db:"key_id"`
		RoleIDs  pq.StringArray `db:"roles"`
		Grants   []byte         `db:"grants"`
		Perms    pq.StringArray `db:"key_permissions"`
		Products pq.StringArray `db:"key_products"`
		Expires  sql.NullTime   `db:"expires_at"`
		Used     sql.NullTime   `db:"last_used"`
	}
	err := s.db.GetContext(ctx, &row, `SELECT u.id, u.username, u.name, k.id AS key_id, k.permissions AS key_permissions,
			k.products AS key_products, k.expires_at, k.last_used,
			ARRAY(SELECT ur.role_id FROM user_roles ur WHERE ur.user_id = u.id ORDER BY ur.role_id) AS roles,
			`+grantsSQL("u.id")+` AS grants
		FROM api_keys k JOIN users u ON u.id = k.user_id
		WHERE k.hash = $1 AND (k.expires_at IS NULL OR k.expires_at > now()) AND u.state = 'enabled'`, hashToken(secret))
	if errors.Is(err, sql.ErrNoRows) {
		return User{}, time.Time{}, ErrUnauthorized
	}
	if err != nil {
		return User{}, time.Time{}, fmt.Errorf("meta: authenticate key: %w", err)
	}
	if !row.Used.Valid || time.Since(row.Used.Time) > keyLastUsedEvery {
		if _, err := s.db.ExecContext(ctx, `UPDATE api_keys SET last_used = now()
			WHERE id = $1 AND (last_used IS NULL OR last_used < now() - $2::bigint * interval '1 millisecond')`,
			row.KeyID, keyLastUsedEvery.Milliseconds()); err != nil {
			return User{}, time.Time{}, fmt.Errorf("meta: authenticate key: %w", err)
		}
	}
	u := row.User
	u.Roles = append([]string{}, row.RoleIDs...)
	if err := u.setGrants(row.Grants); err != nil {
		return User{}, time.Time{}, err
	}
	perms := make([]Permission, len(row.Perms))
	for i, p := range row.Perms {
		perms[i] = Permission(p)
	}
	var products []string
	if row.Products != nil {
		products = []string(row.Products)
	}
	u = u.Restrict(perms, products)
	u.KeyID = row.KeyID
	var expires time.Time
	if row.Expires.Valid {
		expires = row.Expires.Time
	}
	return u, expires, nil
}

// keyExpiry is TokenExpiry for an API key: its expiry, or a day from now
// for a key that does not expire (a live stream reads it again then; a
// revocation ends the stream at once anyway).
func (s *Store) keyExpiry(ctx context.Context, secret string) (time.Time, error) {
	ctx, cancel := s.timeout(ctx)
	defer cancel()
	var expires sql.NullTime
	err := s.db.GetContext(ctx, &expires, `SELECT k.expires_at FROM api_keys k JOIN users u ON u.id = k.user_id
		WHERE k.hash = $1 AND (k.expires_at IS NULL OR k.expires_at > now()) AND u.state = 'enabled'`, hashToken(secret))
	if errors.Is(err, sql.ErrNoRows) {
		return time.Time{}, ErrUnauthorized
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("meta: key expiry: %w", err)
	}
	if !expires.Valid {
		return time.Now().Add(24 * time.Hour), nil
	}
	return expires.Time, nil
}
