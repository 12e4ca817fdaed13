package api

import (
	"context"
	"crypto/sha256"
	"net/netip"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"

	"devicehub/meta"
	"devicehub/schema"
)

// AuthStore issues and checks tokens; *meta.Store is one.
type AuthStore interface {
	// Login limits failed attempts per client address (see clientAddress).
	Login(ctx context.Context, address, username, password string, lifetime time.Duration) (meta.Session, error)
	// Authenticate gives the token's user with its roles and permissions
	// (the union of its enabled roles'), which the token cache keeps.
	Authenticate(ctx context.Context, token string) (meta.User, time.Time, error)
	Logout(ctx context.Context, token string) error
	// TokenExpiry is Authenticate's expiry without sliding it: a live
	// stream checks its token again with it (live.go).
	TokenExpiry(ctx context.Context, token string) (time.Time, error)
	// WatchTokens announces the tokens that end through any instance
	// (logout, user disabled or deleted), or whose permissions change
	// (their user's roles, or those roles' permissions), by their
	// meta.TokenID; nil: any may have. The cache forgets them, and the
	// next request checks them again. The token cache is used only while
	// it listens.
	WatchTokens(ended func(ids []string)) *meta.TokenWatch
}

const (
	tokenHeader = "X-Access-Token"
	userKey     = "devicehub.user"
	tokenKey    = "devicehub.token" // the live stream's token (requireTokenOrQuery)
)

type loginRequest struct {
	Username string `json:"username"`
	Password string `json:"password"`
	// Expires is the token's sliding lifetime in milliseconds (optional).
	Expires *int64 `json:"expires"`
}

type loginResult struct {
	Token     string `json:"token"`
	UserID    string `json:"userId"`
	Username  string `json:"username"`
	Expires   int64  `json:"expires"`   // lifetime in ms
	ExpiresAt int64  `json:"expiresAt"` // epoch ms
}

// login is POST /api/authorize/login. Its body must be declared JSON:
// where other endpoints take a body without Content-Type (jsonBodies),
// login does not, since it needs no token. A browser sends a cross-site
// request without a CORS preflight only with a form or text Content-Type
// or none at all (a fetch of a Blob, mode no-cors): each is refused here
// before the attempt is counted, so that another site cannot make its
// visitors' browsers guess passwords and lock users out of their own
// address (LoginMaxFailures).
func (s *Server) login(c *fiber.Ctx) error {
	if ct := c.Get(fiber.HeaderContentType); ct == "" {
		return unsupportedTypeError("Content-Type must be application/json (got none)")
	} else if err := checkContentType(ct); err != nil {
		return err
	}
	var req loginRequest
	if err := decodeJSON(c, &req); err != nil {
		return err
	}
	c.Locals(auditWhoKey, meta.User{Username: req.Username}) // the audit trail's, whatever the outcome
	if req.Username == "" {
		return schema.Invalid("username", "is required")
	}
	if req.Password == "" {
		return schema.Invalid("password", "is required")
	}
	if len(req.Username) > 64 || len(req.Password) > 72 {
		return meta.ErrBadCredentials
	}
	lifetime := s.opts.TokenLifetime
	if req.Expires != nil {
		lifetime = time.Duration(*req.Expires) * time.Millisecond
		if lifetime < time.Minute || lifetime > s.opts.MaxTokenLifetime {
			return schema.Invalid("expires", "must be a lifetime in ms from 60000 to %d", s.opts.MaxTokenLifetime.Milliseconds())
		}
	}
	sess, err := s.deps.Auth.Login(c.UserContext(), clientAddress(c), req.Username, req.Password, lifetime)
	if err != nil {
		return err
	}
	c.Locals(auditWhoKey, sess.User)
	return ok(c, loginResult{
		Token:     sess.Token,
		UserID:    sess.User.ID,
		Username:  sess.User.Username,
		Expires:   lifetime.Milliseconds(),
		ExpiresAt: sess.Expires.UnixMilli(),
	})
}

// clientAddress is the address failed logins are counted by: the peer's
// IP (c.IP(); no forwarding header is trusted, as the server sets no
// ProxyHeader), an IPv6 one as its /64, the block a single host usually
// has to pick addresses from.
func clientAddress(c *fiber.Ctx) string {
	ip, err := netip.ParseAddr(c.IP())
	if err != nil {
		return c.IP()
	}
	ip = ip.Unmap()
	if ip.Is4() {
		return ip.String()
	}
	p, _ := ip.WithZone("").Prefix(64)
	return p.String()
}

// logout is POST /api/authorize/logout. The token's end is announced to
// every instance (meta WatchTokens), this one included; its cache entry
// and live streams here go at once. An API key is not logged out but
// revoked (403).
func (s *Server) logout(c *fiber.Ctx) error {
	if refused, err := keyRefused(c, "log out (revoke it with DELETE /api/user/key/{id})"); refused {
		return err
	}
	token := c.Get(tokenHeader)
	id := meta.TokenID(token)
	s.tokens.evict(meta.TokenDigest(token))
	if err := s.deps.Auth.Logout(c.UserContext(), token); err != nil {
		return err
	}
	s.tokensEnded([]string{id})
	return ok(c, true)
}

// tokensEnded forgets tokens that ended (by meta.TokenID) and ends the
// live streams opened with them; nil: any token may have ended, every
// stream checks its own again.
func (s *Server) tokensEnded(ids []string) {
	if ids == nil {
		s.tokens.clear()
		s.streams.recheckAll()
		return
	}
	for _, id := range ids {
		if d, ok := meta.ParseTokenID(id); ok {
			s.tokens.evict(d)
		}
		s.streams.end(id)
	}
}

// me is GET /api/authorize/me: the user behind the token, with its roles
// and permissions (the console hides what it may not use).
func (s *Server) me(c *fiber.Ctx) error {
	u := currentUser(c)
	return okItem(c, &u, appendUser)
}

// requireToken lets a request through only with a live token, and slides
// the token's expiry.
func (s *Server) requireToken(c *fiber.Ctx) error {
	return s.checkToken(c, c.Get(tokenHeader))
}

// requireTokenOrQuery is requireToken for GET /api/live only: browsers
// open it with EventSource, which cannot set headers, so without the
// header the token may come as the query parameter token (the access log
// writes no query string).
func (s *Server) requireTokenOrQuery(c *fiber.Ctx) error {
	token := c.Get(tokenHeader)
	if token == "" {
		token = c.Query("token")
	}
	c.Locals(tokenKey, strings.Clone(token)) // the stream checks it again, after this request's buffers are reused
	return s.checkToken(c, token)
}

func (s *Server) checkToken(c *fiber.Ctx, token string) error {
	user, err := s.authenticate(c.UserContext(), token)
	if err != nil {
		return err
	}
	c.Locals(userKey, user)
	return c.Next()
}

// authenticate resolves a token to its user, through the token cache
// (keyed by meta.TokenDigest: the token is found by its SHA-256, never by
// comparing secrets, and an announcement of ended tokens names them by
// its hex, meta.TokenID) while the store's announcements are heard;
// without them a logout through another instance could go unseen, so
// every check asks the store. The user is shared with the cache: nobody
// changes it.
func (s *Server) authenticate(ctx context.Context, token string) (*meta.User, error) {
	// The header's bytes are fasthttp's, reused after the request: the
	// store, and a lookup that may run after it (a refresh in the
	// background), get a copy made before, but only when they are asked.
	if !s.tokenWatch.Listening() {
		u, _, err := s.deps.Auth.Authenticate(ctx, strings.Clone(token))
		if err != nil {
			return nil, err
		}
		return &u, nil
	}
	d := meta.TokenDigest(token)
	if u, ok := s.tokens.peek(d); ok { // a hit copies nothing
		return u, nil
	}
	token = strings.Clone(token)
	return s.tokens.get(ctx, d, func(ctx context.Context, _ [sha256.Size]byte) (*meta.User, time.Time, error) {
		u, until, err := s.deps.Auth.Authenticate(ctx, token)
		if err != nil {
			return nil, until, err
		}
		return &u, until, nil
	})
}

// currentUser is the user whose token the request came with (none: the
// zero User).
func currentUser(c *fiber.Ctx) meta.User {
	if u, _ := c.Locals(userKey).(*meta.User); u != nil {
		return *u
	}
	return meta.User{}
}
