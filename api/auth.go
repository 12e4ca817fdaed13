package api

import (
	"context"
	"net/netip"
	"time"

	"github.com/gofiber/fiber/v2"

	"devicehub/meta"
	"devicehub/schema"
)

// AuthStore issues and checks tokens.
type AuthStore interface {
	// Login limits failed attempts per client address (see clientAddress).
	Login(ctx context.Context, address, username, password string, lifetime time.Duration) (meta.Session, error)
	Authenticate(ctx context.Context, token string) (meta.User, time.Time, error)
	Logout(ctx context.Context, token string) error
}

const (
	tokenHeader = "X-Access-Token"
	userKey     = "devicehub.user"
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

// login is POST /api/authorize/login.
func (s *Server) login(c *fiber.Ctx) error {
	var req loginRequest
	if err := decodeJSON(c, &req); err != nil {
		return err
	}
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

// logout is POST /api/authorize/logout.
func (s *Server) logout(c *fiber.Ctx) error {
	token := c.Get(tokenHeader)
	s.tokens.evict(token)
	if err := s.deps.Auth.Logout(c.UserContext(), token); err != nil {
		return err
	}
	return ok(c, true)
}

// me is GET /api/authorize/me: the user behind the token.
func (s *Server) me(c *fiber.Ctx) error { return ok(c, currentUser(c)) }

// requireToken lets a request through only with a live token, and slides
// the token's expiry.
func (s *Server) requireToken(c *fiber.Ctx) error {
	// The header's bytes are fasthttp's, reused after the request; the
	// cache keeps a copy of its keys.
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
	return s.checkToken(c, token)
}

func (s *Server) checkToken(c *fiber.Ctx, token string) error {
	user, err := s.tokens.get(c.UserContext(), token, time.Now(), s.deps.Auth.Authenticate)
	if err != nil {
		return err
	}
	c.Locals(userKey, user)
	return c.Next()
}

func currentUser(c *fiber.Ctx) meta.User {
	u, _ := c.Locals(userKey).(meta.User)
	return u
}
