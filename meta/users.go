package meta

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
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
	if !exists {
		if err := checkPassword("admin password", password, "admin", MinPasswordLen); err != nil {
			return fmt.Errorf("meta: %w", err)
		}
	}
	hash, err := hashPassword(password)
	if err != nil {
		return err
	}
	ctx, cancel = s.timeout(ctx)
	defer cancel()
	stmts := []struct {
		q    string
		args []any
	}{
		{`INSERT INTO roles (id, name, description, creator_id) VALUES ('admin', 'Administrator', 'Full access to the platform', 'admin') ON CONFLICT (id) DO NOTHING`, nil},
		{`INSERT INTO users (id, username, name, password_hash) VALUES ('admin', 'admin', 'Administrator', $1) ON CONFLICT (username) DO NOTHING`, []any{string(hash)}},
		{`INSERT INTO user_roles (user_id, role_id) SELECT id, 'admin' FROM users WHERE username = 'admin' ON CONFLICT DO NOTHING`, nil},
		// Role admin holds every permission, those added since too.
		{`INSERT INTO role_permissions (role_id, permission) SELECT 'admin', unnest($1::text[]) ON CONFLICT DO NOTHING`, []any{pq.Array(Permissions)}},
	}
	err = s.inTx(ctx, func(tx *sqlx.Tx) error {
		for _, st := range stmts {
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

// hashPassword is how every password is stored: bcrypt, default cost.
func hashPassword(password string) ([]byte, error) {
	hash, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.DefaultCost)
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
	hash := dummyHash
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

// tokenSlideSlack is how far a token's expiry may lag its full lifetime
// before a request pushes it forward.
const tokenSlideSlack = time.Minute

var dummyHash, _ = bcrypt.GenerateFromPassword([]byte("not a password"), bcrypt.DefaultCost)

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

func (s *Store) userRoles(ctx context.Context, userID string) ([]string, error) {
	roles := []string{}
	if err := s.db.SelectContext(ctx, &roles, `SELECT role_id FROM user_roles WHERE user_id = $1 ORDER BY role_id`, userID); err != nil {
		return nil, fmt.Errorf("meta: user roles: %w", err)
	}
	return roles, nil
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

// Ended tokens are announced to every instance: the triggers of
// schema/postgres/00010_token_revocations.sql send, as the transaction
// that ends them commits, the TokenIDs of tokens logged out or of a user
// disabled or deleted, comma-separated, or "*" when every token may have
// ended (TRUNCATE). Those of 00011_role_permissions.sql send the tokens
// whose permissions changed (their user's roles, those roles' grants or
// state): they have not ended, but a cache must read them again. Expiry is not announced: whoever checked a token knows
// when it expires.
const tokenChannel = "devicehub_tokens"

// WatchTokens calls ended with the TokenIDs of tokens that ended, through
// any instance or psql, within milliseconds of the commit; ended(nil)
// means that some may have ended unannounced (the watcher started
// listening, or listens again after losing its connection, or the table
// was truncated): check every token again. ended runs on the watcher's
// goroutine, one call at a time; it must not block. The watcher holds one
// PostgreSQL connection (beyond Options.MaxOpenConns) while any
// registration is open; Stop the registration, or Close the store, to end
// it.
func (s *Store) WatchTokens(ended func(ids []string)) *TokenWatch {
	t := &TokenWatch{w: s.tokens}
	s.tokens.add(t, ended)
	return t
}

// TokenWatch is one registration of WatchTokens.
type TokenWatch struct{ w *tokenWatch }

// Listening reports whether the watcher hears announcements now. While
// it does not, a token may end unannounced: a cache of tokens must not be
// trusted then (ended(nil) follows when it listens again).
func (t *TokenWatch) Listening() bool { return t != nil && t.w.live.Load() }

// Stop ends the registration: ended is not called after it returns.
func (t *TokenWatch) Stop() {
	if t != nil {
		t.w.remove(t)
	}
}

// tokenWatch is the store's one listener on tokenChannel, running while
// a registration is open.
type tokenWatch struct {
	dsn  string
	live atomic.Bool // listening

	mu     sync.Mutex // registrations and the listener's life; held while ended runs
	subs   map[*TokenWatch]func([]string)
	stop   chan struct{} // closed to stop the running listener; nil when none runs
	done   chan struct{} // closed when it has stopped
	closed bool
}

func newTokenWatch(dsn string) *tokenWatch {
	return &tokenWatch{dsn: dsn, subs: map[*TokenWatch]func([]string){}}
}

func (w *tokenWatch) add(t *TokenWatch, ended func([]string)) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return
	}
	w.subs[t] = ended
	if w.stop == nil {
		w.stop, w.done = make(chan struct{}), make(chan struct{})
		go w.run(w.stop, w.done)
	}
}

func (w *tokenWatch) remove(t *TokenWatch) {
	w.mu.Lock()
	delete(w.subs, t)
	if len(w.subs) > 0 || w.stop == nil {
		w.mu.Unlock()
		return
	}
	done := w.halt()
	w.mu.Unlock()
	<-done
}

// close stops the listener for good (Store.Close).
func (w *tokenWatch) close() {
	w.mu.Lock()
	w.closed = true
	clear(w.subs)
	done := w.halt()
	w.mu.Unlock()
	<-done
}

// halt tells the running listener, if any, to stop and returns what is
// closed once it has; w.mu is held.
func (w *tokenWatch) halt() <-chan struct{} {
	if w.stop == nil {
		done := make(chan struct{})
		close(done)
		return done
	}
	close(w.stop)
	done := w.done
	w.stop, w.done = nil, nil
	return done
}

// tell calls every registration's ended with ids.
func (w *tokenWatch) tell(stop <-chan struct{}, ids []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	select {
	case <-stop: // halted: its registrations are gone, or belong to the next listener
		return
	default:
	}
	for _, ended := range w.subs {
		ended(ids)
	}
}

// run listens on tokenChannel until stop is closed, reconnecting as
// needed, and tells the registrations what it hears.
func (w *tokenWatch) run(stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	defer w.live.Store(false)
	// A refused LISTEN returns at once: tokens are never cached (Listening
	// is false).
	_ = Listen(w.dsn, []string{tokenChannel}, ListenHandler{
		Lost: func() { w.live.Store(false) },
		Listening: func() { // tokens may have ended while it was not listening
			w.live.Store(true)
			w.tell(stop, nil)
		},
		Notify: func(_, payload string) {
			if payload == "*" {
				w.tell(stop, nil)
			} else {
				w.tell(stop, strings.Split(payload, ","))
			}
		},
	}, stop)
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
	return queryPage(ctx, s, UserResource, q, userColumns, "users u", (*userRow).detail)
}

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
	hash, err := hashPassword(n.Password)
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
	hash, err := hashPassword(password)
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
