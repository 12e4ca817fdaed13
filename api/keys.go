package api

import (
	"context"
	"errors"

	"github.com/gofiber/fiber/v2"

	"devicehub/meta"
)

// API keys for programs (meta/keys.go): a signed-in user makes them,
// lists and revokes its own; an administrator (user:admin) lists and
// revokes anyone's. A key is sent in X-Access-Token like a login's token
// and does at most what its user may do at each request. A request made
// with a key cannot make keys, manage users or roles, change or reset a
// password or log out (keyRefused, loginOnly): a leaked key cannot breed
// others or new administrators, lock its user or anyone out, or outlive
// its revocation.

// KeyStore is what the key endpoints need; *meta.Store is one. The
// AuthStore of Deps serves them when it is one too.
type KeyStore interface {
	CreateKey(ctx context.Context, user meta.User, n meta.NewKey) (meta.CreatedKey, error)
	// QueryKeys lists the keys of userID, or everyone's for "".
	QueryKeys(ctx context.Context, q *meta.Query, userID string) (meta.Page[meta.Key], error)
	// DeleteKey revokes key id of userID (anyone's for ""), on every
	// instance at once.
	DeleteKey(ctx context.Context, id, userID string) (meta.Key, error)
}

func (s *Server) keyStore() (KeyStore, error) {
	k, ok := s.deps.Auth.(KeyStore)
	if !ok {
		return nil, errors.New("api: the auth store has no API keys")
	}
	return k, nil
}

// keyRefused refuses (accessDeniedError) a request made with an API key
// for what only a login may do (what names it).
func keyRefused(c *fiber.Ctx, what string) (bool, error) {
	if currentUser(c).KeyID == "" {
		return false, nil
	}
	return true, accessDeniedError("access denied: an API key cannot " + what + "; sign in")
}

// loginOnly refuses a request made with an API key (keyRefused), for
// routes whose handlers are not this file's (the role writes).
func loginOnly(what string) fiber.Handler {
	return func(c *fiber.Ctx) error {
		if refused, err := keyRefused(c, what); refused {
			return err
		}
		return c.Next()
	}
}

// keyOwner is whose keys the caller may list and revoke: its own, or
// anyone's ("") with user:admin.
func keyOwner(c *fiber.Ctx) string {
	u := currentUser(c)
	if u.Can(permUserAdmin) {
		return ""
	}
	return u.ID
}

// createKey is POST /api/user/key: {name, permissions, products?,
// expiresAt?}, a key of the caller holding at most what the caller holds
// (400 naming a permission it does not). The answer holds the secret
// (key), shown this once.
func (s *Server) createKey(c *fiber.Ctx) error {
	if refused, err := keyRefused(c, "create API keys"); refused {
		return err
	}
	store, err := s.keyStore()
	if err != nil {
		return err
	}
	var n meta.NewKey
	if err := decodeJSON(c, &n); err != nil {
		return err
	}
	k, err := store.CreateKey(c.UserContext(), currentUser(c), n)
	if err != nil {
		return err
	}
	return okItem(c, &k, appendCreatedKey)
}

// queryKeys is POST /api/user/key/_query: a page of the caller's keys
// (everyone's with user:admin), the common query body; never a secret.
func (s *Server) queryKeys(c *fiber.Ctx) error {
	store, err := s.keyStore()
	if err != nil {
		return err
	}
	q, err := queryBody(c)
	if err != nil {
		return err
	}
	page, err := store.QueryKeys(c.UserContext(), q, keyOwner(c))
	if err != nil {
		return err
	}
	return okPage(c, &page, appendKey)
}

// deleteKey is DELETE /api/user/key/{id}: revokes one of the caller's
// keys (anyone's with user:admin); another's is 404, as a key that does
// not exist.
func (s *Server) deleteKey(c *fiber.Ctx) error {
	store, err := s.keyStore()
	if err != nil {
		return err
	}
	k, err := store.DeleteKey(c.UserContext(), c.Params("id"), keyOwner(c))
	if err != nil {
		return err
	}
	return okItem(c, &k, appendKey)
}
