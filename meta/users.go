// Users: the auth errors, the User of a token check and a login's Session,
// the admin bootstrap, passwords, and user administration (the list,
// creation, changes, deletion, password changes) under the last-admin rule.

package meta

import (
	"context"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"
	"golang.org/x/crypto/bcrypt"

	"devicehub/schema"
)

// Auth errors.
var (
	// ErrBadCredentials is the one answer for an unknown user or a wrong
	// password, so that a client cannot tell which.
	ErrBadCredentials = errors.New("bad username or password")
	// ErrUnauthorized is a missing, unknown or expired token.
	ErrUnauthorized = errors.New("token missing or expired")
	// ErrLoginLocked refuses logins from a client address to a username
	// (an account's or not) after repeated failures from that address,
	// until the lock expires.
	ErrLoginLocked = errors.New("too many failed logins; try again later")
)

// User is a platform user, as a token check gives it: Permissions are
// the union of those of its enabled roles (role_permissions), each held
// on every product or, when Products lists it, on those products only
// (role_products; scope.go: Can, Scope, CanProduct, Restrict). Both are
// read with the token and cached with it (a change of its roles, or of
// their permissions or products, is announced like an ended token,
// WatchTokens).
type User struct {
	ID          string   `db:"id"`
	Username    string   `db:"username"`
	Name        string   `db:"name"`
	Roles       []string `db:"-"`
	Permissions []string `db:"-"`
	// Products maps each permission held on listed products only to
	// them (sorted, never empty); a permission of Permissions absent here
	// is held on every product.
	Products map[Permission][]string `db:"-"`
	// KeyID is the API key the request came with (keys.go); "" for a
	// login's token. Its rights are the key's, within the user's.
	KeyID string `db:"-"`
}

// Session is the result of a login.
type Session struct {
	Token   string
	User    User
	Expires time.Time
}

// EnsureAdmin creates the admin role and the admin user with password on
// first start; an existing admin keeps its password. Role admin is given
// every permission of Permissions it lacks.
//
// The password is held to the password policy (checkPassword) when the
// admin is created, not after: an installation whose admin exists starts
// whatever the setting says.
func (s *Store) EnsureAdmin(ctx context.Context, password string) error {
	var exists bool
	lctx, cancel := s.timeout(ctx)
	err := s.db.GetContext(lctx, &exists, `SELECT EXISTS (SELECT 1 FROM users WHERE username = 'admin')`)
	cancel()
	if err != nil {
		return fmt.Errorf("meta: ensure admin: %w", err)
	}
	// The hash (one bcrypt, costly) is made only for an admin to create.
	var hash []byte
	if !exists {
		if err := checkPassword("admin password", password, "admin", MinPasswordLen); err != nil {
			return fmt.Errorf("meta: %w", err)
		}
		if hash, err = s.hashPassword(password); err != nil {
			return err
		}
	}
	ctx, cancel = s.timeout(ctx)
	defer cancel()
	stmts := []struct {
		q      string
		args   []any
		create bool // only when the admin was not there
	}{
		{`INSERT INTO roles (id, name, description, creator_id) VALUES ('admin', 'Administrator', 'Full access to the platform', 'admin') ON CONFLICT (id) DO NOTHING`, nil, false},
		{`INSERT INTO users (id, username, name, password_hash) VALUES ('admin', 'admin', 'Administrator', $1) ON CONFLICT (username) DO NOTHING`, []any{string(hash)}, true},
		{`INSERT INTO user_roles (user_id, role_id) SELECT id, 'admin' FROM users WHERE username = 'admin' ON CONFLICT DO NOTHING`, nil, false},
		// Role admin holds every permission, those added since too.
		{`INSERT INTO role_permissions (role_id, permission) SELECT 'admin', unnest($1::text[]) ON CONFLICT DO NOTHING`, []any{pq.Array(Permissions)}, false},
	}
	err = s.inTx(ctx, func(tx *sqlx.Tx) error {
		for _, st := range stmts {
			if st.create && exists {
				continue
			}
			if _, err := tx.ExecContext(ctx, st.q, st.args...); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("meta: ensure admin: %w", err)
	}
	return nil
}

// hashPassword is how every password is stored: bcrypt, at
// Options.PasswordCost (default bcrypt.DefaultCost).
func (s *Store) hashPassword(password string) ([]byte, error) {
	return hashPassword(s.opts.PasswordCost, password)
}

func hashPassword(cost int, password string) ([]byte, error) {
	if cost == 0 {
		cost = bcrypt.DefaultCost
	}
	hash, err := bcrypt.GenerateFromPassword([]byte(password), cost)
	if err != nil {
		return nil, fmt.Errorf("meta: hash password: %w", err)
	}
	return hash, nil
}

// HasPassword reports whether the enabled user username has password
// (one bcrypt check; the start's warning about a development default).
func (s *Store) HasPassword(ctx context.Context, username, password string) (bool, error) {
	var hash string
	lctx, cancel := s.timeout(ctx)
	err := s.db.GetContext(lctx, &hash, `SELECT password_hash FROM users WHERE username = $1 AND state = 'enabled'`, username)
	cancel()
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("meta: check password: %w", err)
	}
	return bcrypt.CompareHashAndPassword([]byte(hash), []byte(password)) == nil, nil
}

// CreateUser adds a user with the given roles (tests and administration);
// its name is its username. See AddUser; its password may be as short as
// 6 characters.
func (s *Store) CreateUser(ctx context.Context, username, password string, roles ...string) (User, error) {
	d, err := s.addUser(ctx, NewUser{Username: username, Password: password, Roles: roles}, 6)
	if err != nil {
		return User{}, err
	}
	return User{ID: d.ID, Username: d.Username, Name: d.Name, Roles: d.Roles}, nil
}

func (s *Store) userRoles(ctx context.Context, userID string) ([]string, error) {
	roles := []string{}
	if err := s.db.SelectContext(ctx, &roles, `SELECT role_id FROM user_roles WHERE user_id = $1 ORDER BY role_id`, userID); err != nil {
		return nil, fmt.Errorf("meta: user roles: %w", err)
	}
	return roles, nil
}

// User administration (api/users.go): the list, creation, changes,
// deletion and passwords. Every change runs under one lock
// (usersLock) and is refused if no enabled user would be left holding
// user:admin (ErrLastAdmin): the platform cannot lose its last
// administrator by a deletion, a disabling or a change of roles.

// UserDetail is a user as the user list shows it; never its password.
type UserDetail struct {
	ID         string   `db:"id"`
	Username   string   `db:"username"`
	Name       string   `db:"name"`
	State      Enum     `db:"state"` // enabled or disabled
	Roles      []string `db:"-"`
	CreateTime Millis   `db:"-"`
}

type userRow struct {
	UserDetail
	CreatedAt time.Time      `db:"create_time"`
	RoleIDs   pq.StringArray `db:"roles"`
}

func (r *userRow) detail() UserDetail {
	d := r.UserDetail
	d.CreateTime = Millis(r.CreatedAt)
	d.Roles = append([]string{}, r.RoleIDs...)
	return d
}

const userColumns = `u.id, u.username, u.name, u.state, u.create_time,
	ARRAY(SELECT ur.role_id FROM user_roles ur WHERE ur.user_id = u.id ORDER BY ur.role_id) AS roles`

// UserResource allows terms on id, username, name, state and createTime,
// and sorts on id, username, name and createTime.
var UserResource = &Resource{
	Name: "user",
	Columns: map[string]Column{
		"id":         {Expr: "u.id", Kind: KindText},
		"username":   {Expr: "u.username", Kind: KindText},
		"name":       {Expr: "u.name", Kind: KindText},
		"state":      {Expr: "u.state", Kind: KindText},
		"createTime": {Expr: "u.create_time", Kind: KindTime},
	},
	Sorts: map[string]string{
		"id":         Natural("u.id"),
		"username":   Natural("u.username"),
		"name":       Natural("u.name"),
		"createTime": "u.create_time",
	},
	DefaultSort: "u.create_time DESC, u.id",
	TieBreak:    Natural("u.id"),
}

// ErrLastAdmin refuses a change that would leave no enabled user
// holding user:admin.
var ErrLastAdmin = fmt.Errorf("the last administrator cannot be deleted, disabled or lose the admin role: give another enabled user the admin role first: %w", schema.ErrIllegalArgument)

// Password lengths: at least MinPasswordLen characters (Unicode code
// points), at most maxPasswordLen bytes, all bcrypt reads.
const (
	MinPasswordLen = 8
	maxPasswordLen = 72
)

// NewUser is the body of a user's creation.
type NewUser struct {
	Username string   `json:"username"`
	Name     string   `json:"name"`
	Password string   `json:"password"`
	Roles    []string `json:"roles"`
}

// UserPatch changes a user; absent fields stay.
type UserPatch struct {
	Name  *string   `json:"name"`
	Roles *[]string `json:"roles"`
	State *Enum     `json:"state"` // enabled or disabled
}

// QueryUsers answers POST /api/user/_query.
func (s *Store) QueryUsers(ctx context.Context, q *Query) (Page[UserDetail], error) {
	return userList.Query(ctx, s, q, nil)
}

// userList is POST /api/user/_query's statement.
var userList = NewList(UserResource, ListSQL{
	Select: userColumns,
	From:   "users u",
}, (*userRow).detail)

// GetUser returns one user, or ErrNotFound.
func (s *Store) GetUser(ctx context.Context, id string) (UserDetail, error) {
	ctx, cancel := s.timeout(ctx)
	defer cancel()
	return s.getUser(ctx, s.db, id)
}

type getter interface {
	GetContext(ctx context.Context, dest any, query string, args ...any) error
}

func (s *Store) getUser(ctx context.Context, db getter, id string) (UserDetail, error) {
	var r userRow
	err := db.GetContext(ctx, &r, `SELECT `+userColumns+` FROM users u WHERE u.id = $1`, id)
	if errors.Is(err, sql.ErrNoRows) {
		return UserDetail{}, fmt.Errorf("user %q: %w", id, ErrNotFound)
	}
	if err != nil {
		return UserDetail{}, fmt.Errorf("meta: get user: %w", err)
	}
	return r.detail(), nil
}

// checkPassword is the password policy, for every password set (a
// user's creation, a change, a reset, the admin's first): at least
// minLen characters (MinPasswordLen but for CreateUser), at most
// maxPasswordLen bytes (bcrypt ignores the rest, so a longer one would
// be accepted for less than it says), not only white space, and not the
// user's username in any letter case. A login checks none of it: a
// password stored before keeps working.
func checkPassword(field, password, username string, minLen int) error {
	switch {
	case utf8.RuneCountInString(password) < minLen:
		return schema.Invalid(field, "must be at least %d characters", minLen)
	case len(password) > maxPasswordLen:
		return schema.Invalid(field, "must be at most %d bytes (bcrypt reads no more)", maxPasswordLen)
	case strings.TrimSpace(password) == "":
		return schema.Invalid(field, "must not be only white space")
	case strings.EqualFold(password, username):
		return schema.Invalid(field, "must not be the username")
	}
	return nil
}

// AddUser creates a user holding roles (each must exist), enabled. Its
// name defaults to its username.
func (s *Store) AddUser(ctx context.Context, n NewUser) (UserDetail, error) {
	return s.addUser(ctx, n, MinPasswordLen)
}

func (s *Store) addUser(ctx context.Context, n NewUser, minPassword int) (UserDetail, error) {
	if err := checkText("username", n.Username, 64, true); err != nil {
		return UserDetail{}, err
	}
	if n.Name == "" {
		n.Name = n.Username
	}
	if err := checkText("name", n.Name, 128, true); err != nil {
		return UserDetail{}, err
	}
	if err := checkPassword("password", n.Password, n.Username, minPassword); err != nil {
		return UserDetail{}, err
	}
	hash, err := s.hashPassword(n.Password)
	if err != nil {
		return UserDetail{}, err
	}
	id := NewID()
	err = s.changeUsers(ctx, false, func(ctx context.Context, tx *sqlx.Tx) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO users (id, username, name, password_hash) VALUES ($1, $2, $3, $4)`,
			id, n.Username, n.Name, string(hash)); err != nil {
			if isUniqueViolation(err) {
				return fmt.Errorf("user %q: %w", n.Username, ErrDuplicateKey)
			}
			return fmt.Errorf("meta: create user: %w", err)
		}
		return setUserRoles(ctx, tx, id, n.Roles)
	})
	if err != nil {
		return UserDetail{}, err
	}
	return s.GetUser(ctx, id)
}

// setUserRoles makes roles (each an existing role; an unknown one is an
// input error) the user's only ones.
func setUserRoles(ctx context.Context, tx *sqlx.Tx, userID string, roles []string) error {
	if len(roles) > 32 {
		return schema.Invalid("roles", "at most 32")
	}
	var known []string
	if err := tx.SelectContext(ctx, &known, `SELECT id FROM roles WHERE id = ANY($1)`, pq.StringArray(roles)); err != nil {
		return fmt.Errorf("meta: user roles: %w", err)
	}
	for i, r := range roles {
		found := false
		for _, k := range known {
			found = found || k == r
		}
		if !found {
			return schema.Invalid(fmt.Sprintf("roles[%d]", i), "no role %q", r)
		}
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM user_roles WHERE user_id = $1 AND NOT role_id = ANY($2)`, userID, pq.StringArray(roles)); err != nil {
		return fmt.Errorf("meta: user roles: %w", err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO user_roles (user_id, role_id) SELECT $1, unnest($2::text[]) ON CONFLICT DO NOTHING`,
		userID, pq.StringArray(roles)); err != nil {
		return fmt.Errorf("meta: user roles: %w", err)
	}
	return nil
}

// UpdateUser changes a user's name, roles or state. Disabling a user ends
// its tokens, and changing its roles has its tokens' permissions read
// again, on every instance (00010, 00011).
func (s *Store) UpdateUser(ctx context.Context, id string, p UserPatch) (UserDetail, error) {
	if p.Name != nil {
		if err := checkText("name", *p.Name, 128, true); err != nil {
			return UserDetail{}, err
		}
	}
	if p.State != nil && *p.State != "enabled" && *p.State != "disabled" {
		return UserDetail{}, schema.Invalid("state", "must be enabled or disabled")
	}
	err := s.changeUsers(ctx, true, func(ctx context.Context, tx *sqlx.Tx) error {
		if _, err := s.getUser(ctx, tx, id); err != nil {
			return err
		}
		if p.Name != nil {
			if _, err := tx.ExecContext(ctx, `UPDATE users SET name = $2 WHERE id = $1`, id, *p.Name); err != nil {
				return fmt.Errorf("meta: update user: %w", err)
			}
		}
		if p.State != nil {
			if _, err := tx.ExecContext(ctx, `UPDATE users SET state = $2 WHERE id = $1 AND state IS DISTINCT FROM $2`, id, string(*p.State)); err != nil {
				return fmt.Errorf("meta: update user: %w", err)
			}
		}
		if p.Roles != nil {
			return setUserRoles(ctx, tx, id, *p.Roles)
		}
		return nil
	})
	if err != nil {
		return UserDetail{}, err
	}
	return s.GetUser(ctx, id)
}

// DeleteUser deletes a user; its tokens end with it, on every instance.
func (s *Store) DeleteUser(ctx context.Context, id string) (UserDetail, error) {
	var d UserDetail
	err := s.changeUsers(ctx, true, func(ctx context.Context, tx *sqlx.Tx) error {
		var err error
		if d, err = s.getUser(ctx, tx, id); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM users WHERE id = $1`, id); err != nil {
			return fmt.Errorf("meta: delete user: %w", err)
		}
		return nil
	})
	return d, err
}

// ChangePassword sets the password of user id, who gave its current one
// (old): its other tokens and all its API keys end (everywhere), the
// token of keepTokenID (a TokenID) stays.
func (s *Store) ChangePassword(ctx context.Context, id, keepTokenID, old, password string) error {
	if old == "" {
		return schema.Invalid("oldPassword", "is required")
	}
	var row struct {
		Username string `db:"username"`
		Hash     string `db:"password_hash"`
	}
	lctx, cancel := s.timeout(ctx)
	err := s.db.GetContext(lctx, &row, `SELECT username, password_hash FROM users WHERE id = $1`, id)
	cancel()
	hash := row.Hash
	if errors.Is(err, sql.ErrNoRows) {
		return ErrUnauthorized
	}
	if err != nil {
		return fmt.Errorf("meta: change password: %w", err)
	}
	if err := checkPassword("newPassword", password, row.Username, MinPasswordLen); err != nil {
		return err
	}
	if len(old) > maxPasswordLen || bcrypt.CompareHashAndPassword([]byte(hash), []byte(old)) != nil {
		return schema.Invalid("oldPassword", "is not the current password")
	}
	keep, err := hex.DecodeString(keepTokenID)
	if err != nil {
		return fmt.Errorf("meta: change password: token id: %w", err)
	}
	return s.setPassword(ctx, id, password, keep)
}

// SetPassword sets the password of user id (an administrator's reset):
// every token and API key of it ends, on every instance.
func (s *Store) SetPassword(ctx context.Context, id, password string) error {
	u, err := s.GetUser(ctx, id)
	if err != nil {
		return err
	}
	if err := checkPassword("password", password, u.Username, MinPasswordLen); err != nil {
		return err
	}
	return s.setPassword(ctx, id, password, nil)
}

func (s *Store) setPassword(ctx context.Context, id, password string, keep []byte) error {
	hash, err := s.hashPassword(password)
	if err != nil {
		return err
	}
	ctx, cancel := s.timeout(ctx)
	defer cancel()
	return s.inTx(ctx, func(tx *sqlx.Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE users SET password_hash = $2 WHERE id = $1`, id, string(hash))
		if err != nil {
			return fmt.Errorf("meta: set password: %w", err)
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return fmt.Errorf("user %q: %w", id, ErrNotFound)
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM tokens WHERE user_id = $1 AND hash IS DISTINCT FROM $2`, id, keep); err != nil {
			return fmt.Errorf("meta: set password: %w", err)
		}
		// Whoever knew the old password could have made keys with it: a
		// change or reset ends every credential made before it but the
		// token that changed it (announced as revocations, 00014).
		if _, err := tx.ExecContext(ctx, `DELETE FROM api_keys WHERE user_id = $1`, id); err != nil {
			return fmt.Errorf("meta: set password: revoke keys: %w", err)
		}
		return nil
	})
}

// changeUsers runs change in a transaction holding the users lock (a
// transaction-level advisory lock: changes of users run one at a time),
// and commits it only if an enabled user still holds user:admin (when
// checkAdmins: a creation takes no rights away).
func (s *Store) changeUsers(ctx context.Context, checkAdmins bool, change func(ctx context.Context, tx *sqlx.Tx) error) error {
	ctx, cancel := s.timeout(ctx)
	defer cancel()
	tx, err := s.db.BeginTxx(ctx, nil)
	if err != nil {
		return fmt.Errorf("meta: users: %w", err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock($1)`, usersLock); err != nil {
		return fmt.Errorf("meta: users lock: %w", err)
	}
	if err := change(ctx, tx); err != nil {
		return err
	}
	if !checkAdmins {
		return tx.Commit()
	}
	var admins int
	if err := tx.GetContext(ctx, &admins, `SELECT count(*) FROM users u WHERE u.state = 'enabled' AND EXISTS (
		SELECT 1 FROM user_roles ur JOIN roles r ON r.id = ur.role_id AND r.state = 'enabled' AND r.all_products
		JOIN role_permissions p ON p.role_id = ur.role_id
		WHERE ur.user_id = u.id AND p.permission = $1)`, string(PermUserAdmin)); err != nil {
		return fmt.Errorf("meta: count administrators: %w", err)
	}
	if admins == 0 {
		return ErrLastAdmin
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("meta: users: %w", err)
	}
	return nil
}

// usersLock is the advisory lock key of changeUsers.
const usersLock int64 = 0x6465766963650001
