package api

import (
	"context"
	"errors"

	"github.com/gofiber/fiber/v2"

	"devicehub/meta"
	"devicehub/schema"
)

// UserStore is what the user endpoints need; *meta.Store is one. The
// AuthStore of Deps serves them when it is one too.
type UserStore interface {
	QueryUsers(ctx context.Context, q *meta.Query) (meta.Page[meta.UserDetail], error)
	AddUser(ctx context.Context, n meta.NewUser) (meta.UserDetail, error)
	UpdateUser(ctx context.Context, id string, p meta.UserPatch) (meta.UserDetail, error)
	DeleteUser(ctx context.Context, id string) (meta.UserDetail, error)
	// ChangePassword checks old; the user's tokens but keepTokenID end,
	// and its API keys.
	ChangePassword(ctx context.Context, id, keepTokenID, old, password string) error
	// SetPassword ends every token and API key of the user.
	SetPassword(ctx context.Context, id, password string) error
}

func (s *Server) userStore() (UserStore, error) {
	u, ok := s.deps.Auth.(UserStore)
	if !ok {
		return nil, errors.New("api: the auth store has no user administration")
	}
	return u, nil
}

// queryUsers is POST /api/user/_query: a page of users (the common query
// body; terms on id, username, name, state, createTime). Passwords are
// never shown.
func (s *Server) queryUsers(c *fiber.Ctx) error {
	store, err := s.userStore()
	if err != nil {
		return err
	}
	q, err := queryBody(c)
	if err != nil {
		return err
	}
	page, err := store.QueryUsers(c.UserContext(), q)
	if err != nil {
		return err
	}
	return okPage(c, &page, appendUserDetail)
}

// createUser is POST /api/user: {username, name?, password, roles}.
// Not with an API key (403), as no user administration is (keyRefused).
func (s *Server) createUser(c *fiber.Ctx) error {
	if refused, err := keyRefused(c, "manage users"); refused {
		return err
	}
	store, err := s.userStore()
	if err != nil {
		return err
	}
	var n meta.NewUser
	if err := decodeJSON(c, &n); err != nil {
		return err
	}
	if n.Roles == nil {
		return schema.Invalid("roles", "is required (an empty list gives no permission)")
	}
	u, err := store.AddUser(c.UserContext(), n)
	if err != nil {
		return err
	}
	return okItem(c, &u, appendUserDetail)
}

// updateUser is PUT /api/user/{id}: {name?, roles?, state?}. Disabling a
// user ends its tokens and live streams on every instance; a change of
// its roles has its permissions read again there (within 1 s). No change
// may leave no enabled administrator (400).
func (s *Server) updateUser(c *fiber.Ctx) error {
	if refused, err := keyRefused(c, "manage users"); refused {
		return err
	}
	store, err := s.userStore()
	if err != nil {
		return err
	}
	var p meta.UserPatch
	if err := decodeJSON(c, &p); err != nil {
		return err
	}
	u, err := store.UpdateUser(c.UserContext(), c.Params("id"), p)
	if err != nil {
		return err
	}
	return okItem(c, &u, appendUserDetail)
}

// deleteUser is DELETE /api/user/{id}: its tokens and live streams end on
// every instance; the last administrator cannot be deleted (400).
func (s *Server) deleteUser(c *fiber.Ctx) error {
	if refused, err := keyRefused(c, "manage users"); refused {
		return err
	}
	store, err := s.userStore()
	if err != nil {
		return err
	}
	u, err := store.DeleteUser(c.UserContext(), c.Params("id"))
	if err != nil {
		return err
	}
	return okItem(c, &u, appendUserDetail)
}

type passwordChange struct {
	OldPassword string `json:"oldPassword"`
	NewPassword string `json:"newPassword"`
}

// changeOwnPassword is PUT /api/user/passwd: {oldPassword, newPassword},
// the caller's own; its other tokens and all its API keys end, this
// token stays. Not with an API key (403).
func (s *Server) changeOwnPassword(c *fiber.Ctx) error {
	if refused, err := keyRefused(c, "change a password"); refused {
		return err
	}
	store, err := s.userStore()
	if err != nil {
		return err
	}
	var p passwordChange
	if err := decodeJSON(c, &p); err != nil {
		return err
	}
	if err := store.ChangePassword(c.UserContext(), currentUser(c).ID, meta.TokenID(c.Get(tokenHeader)), p.OldPassword, p.NewPassword); err != nil {
		return err
	}
	return ok(c, true)
}

type passwordReset struct {
	Password string `json:"password"`
}

// resetPassword is PUT /api/user/{id}/password: {password}, set by an
// administrator; every token and API key of the user ends. Not with an
// API key (403).
func (s *Server) resetPassword(c *fiber.Ctx) error {
	if refused, err := keyRefused(c, "change a password"); refused {
		return err
	}
	store, err := s.userStore()
	if err != nil {
		return err
	}
	var p passwordReset
	if err := decodeJSON(c, &p); err != nil {
		return err
	}
	if err := store.SetPassword(c.UserContext(), c.Params("id"), p.Password); err != nil {
		return err
	}
	return ok(c, true)
}
