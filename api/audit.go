package api

import (
	"context"
	"errors"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/gofiber/fiber/v2"

	"devicehub/meta"
)

// The audit trail: every write through the API and every login attempt
// is recorded (who, when, from where, which route and object, with what
// outcome) and stored in PostgreSQL by a batching writer (auditlog.go),
// off the request's path. Administrators read it with POST
// /api/audit/_query.
//
// A request is a write unless its method is GET, HEAD or OPTIONS, or its
// route (the pattern, decided after routing, never the path a client
// chose) ends in one of the read actions of readActions: the list,
// count, dashboard and export queries and the property reads
// (properties/_read, a command that changes nothing). So product and
// device writes, bulk calls, imports, secret rotations, function
// invokes, user administration, password changes, logout and login are
// recorded; lists, counts, dashboards, GET routes and live streams are
// not. Failed logins are counted rather than stored one by one: one entry
// per client address, name tried, outcome and minute, with how many and
// the first and last one's times (meta.AuditEntry.Repeat). Requests refused before their route's permission check (a missing
// or expired token, 401) are not recorded; those refused by it (403)
// are.

// AuditStore stores and lists the audit trail; *meta.Store is one.
type AuditStore interface {
	InsertAudit(ctx context.Context, entries []meta.AuditEntry) error
	QueryAudit(ctx context.Context, q *meta.Query) (meta.Page[meta.AuditEntry], error)
}

// readActions are the last segments of the routes that read with POST.
var readActions = map[string]bool{"_query": true, "_count": true, "_multi": true, "_export": true, "_read": true}

// isWrite reports whether a request of method to route (its pattern) is
// audited.
func isWrite(method, route string) bool {
	switch method {
	case fiber.MethodGet, fiber.MethodHead, fiber.MethodOptions:
		return false
	}
	return !readActions[route[strings.LastIndexByte(route, '/')+1:]]
}

const (
	auditWhoKey  = "devicehub.audit.who" // who a login is for (login sets it)
	replyCodeKey = "devicehub.code"      // the envelope code answered (reply sets it)
)

// loginRoute is the login's route, whose failures are audited as repeats.
const loginRoute = "/api/authorize/login"

// auditObjectParams are the path parameters naming the object a route
// writes, in the order they are looked for.
var auditObjectParams = []string{"id", "deviceId", "productId"}

// maxAuditText bounds text a client chose (a failed login's username, a
// path parameter) in an entry.
const maxAuditText = 256

// audited records the request once it is answered, if it is a write (see
// isWrite). A handler's error is turned into its envelope here first, so
// that the status recorded is the one sent. It runs after the token
// check: the user is the token's (currentUser), or, on the login route,
// the one login names (auditWhoKey).
func (s *Server) audited(c *fiber.Ctx) error {
	if s.audit == nil {
		return c.Next()
	}
	if err := c.Next(); err != nil {
		if herr := c.App().ErrorHandler(c, err); herr != nil {
			return herr
		}
	}
	r := c.Route()
	if r == nil || r.Path == "" || r.Path == "/" || !isWrite(c.Method(), r.Path) {
		return nil
	}
	e := meta.AuditEntry{
		Time:    meta.Millis(time.Now().Truncate(time.Millisecond)), // the API speaks milliseconds
		Address: strings.Clone(c.IP()),
		Method:  strings.Clone(c.Method()), // fasthttp reuses the request's buffers
		Route:   r.Path,
		Status:  c.Response().StatusCode(),
		Count:   1,
	}
	// Failed logins are counted, a row per address, name, outcome and
	// minute (meta.AuditRepeatWindow), not stored one by one: a locked
	// out name costs an attacker no bcrypt, and would cost a row each.
	e.Repeat = r.Path == loginRoute && e.Status != fiber.StatusOK
	if u, ok := c.Locals(userKey).(*meta.User); ok && u != nil {
		e.UserID, e.Username, e.KeyID = u.ID, u.Username, u.KeyID
	} else if who, ok := c.Locals(auditWhoKey).(meta.User); ok {
		e.UserID, e.Username = who.ID, clip(who.Username)
	}
	for _, p := range auditObjectParams {
		if v := c.Params(p); v != "" {
			e.ObjectID = clip(strings.Clone(v))
			break
		}
	}
	e.Code, _ = c.Locals(replyCodeKey).(string)
	s.audit.record(e)
	return nil
}

// clip cuts text a client chose to maxAuditText bytes, at a character's
// start.
func clip(s string) string {
	if len(s) <= maxAuditText {
		return s
	}
	n := maxAuditText
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// queryAudit is POST /api/audit/_query: a page of the audit trail, newest
// first (the common query body; terms on time, userId, username, address,
// method, route, objectId, status and code).
func (s *Server) queryAudit(c *fiber.Ctx) error {
	if s.deps.Audit == nil {
		return errors.New("api: no audit store")
	}
	q, err := queryBody(c)
	if err != nil {
		return err
	}
	page, err := s.deps.Audit.QueryAudit(c.UserContext(), q)
	if err != nil {
		return err
	}
	return okPage(c, &page, appendAuditEntry)
}
