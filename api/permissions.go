package api

import (
	"fmt"
	"sort"
	"sync"

	"github.com/gofiber/fiber/v2"

	"devicehub/meta"
)

// Access control: every route of routes.go declares, beside it, what it
// needs: a permission (s.need(permX)), only a live token (s.signedIn()),
// or nothing (registered before the token check, and listed as public in
// permissions_test.go). A request whose user lacks the permission is 403
// access_denied; the user's permissions are the union of its roles'
// (meta.User.Permissions), read with the token and cached with it.
const (
	permProductRead   = meta.PermProductRead
	permProductWrite  = meta.PermProductWrite
	permDeviceRead    = meta.PermDeviceRead
	permDeviceWrite   = meta.PermDeviceWrite
	permDeviceCommand = meta.PermDeviceCommand
	permDeviceSecret  = meta.PermDeviceSecret
	permDashboardRead = meta.PermDashboardRead
	permUserAdmin     = meta.PermUserAdmin
	permAlarmRead     = meta.PermAlarmRead  // alarm rules and records (alarms.go)
	permAlarmWrite    = meta.PermAlarmWrite // acknowledge, clear by hand
	permRuleWrite     = meta.PermRuleWrite  // alarm rules: write
	permNotifyAdmin   = meta.PermNotifyAdmin
	permFirmwareWrite = meta.PermFirmwareWrite // firmware packages and rollouts (firmware.go)
)

// NeedSignedIn is what RouteAccess.Need says of a route that needs a live
// token and no permission (logout, me, one's own password).
const NeedSignedIn = "signed-in"

// RouteAccess is what one registered route needs: a permission
// (meta.Permission's text), NeedSignedIn, or "" (nothing declared: a
// public route, or a mistake).
type RouteAccess struct {
	Method, Path, Need string
}

// access records each route's declaration as it is registered: need and
// signedIn leave theirs pending, and the route registered next (Fiber's
// OnRoute hook, once per method: a GET is HEAD and GET) takes it.
type access struct {
	mu      sync.Mutex
	pending string
	routes  map[string]string // needs by "METHOD path"
}

func (a *access) declare(need string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.pending != "" {
		panic(fmt.Sprintf("api: access %q declared twice before a route took it", a.pending))
	}
	a.pending = need
}

// onRoute is the OnRoute hook. A HEAD route leaves the declaration for
// its GET (Fiber registers a GET as HEAD, then GET). Middleware (Use) is
// registered here too, for every method, and is left out of RouteAccess
// (GetRoutes(true)); it must not erase a declared route's entry.
func (a *access) onRoute(r fiber.Route) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.routes == nil {
		a.routes = map[string]string{}
	}
	key := r.Method + " " + r.Path
	if _, seen := a.routes[key]; !seen || a.pending != "" {
		a.routes[key] = a.pending
	}
	if r.Method != fiber.MethodHead {
		a.pending = ""
	}
	return nil
}

// need declares that the route registered with it needs permission p, and
// checks it: 403 access_denied without it. A user holding p on listed
// products only has the request limited to them (meta.LimitProducts,
// scope.go): the rest is not_found.
func (s *Server) need(p meta.Permission) fiber.Handler {
	s.access.declare(string(p))
	return func(c *fiber.Ctx) error {
		u := currentUser(c)
		if !u.Can(p) {
			return accessDenied(c, p)
		}
		if all, products := u.Scope(p); !all {
			c.SetUserContext(meta.LimitProducts(c.UserContext(), false, products))
		}
		return c.Next()
	}
}

// signedIn declares that the route registered with it needs a live token
// only (checked by the /api group).
func (s *Server) signedIn() fiber.Handler {
	s.access.declare(NeedSignedIn)
	return func(c *fiber.Ctx) error { return c.Next() }
}

// accessDenied refuses a request whose user lacks permission p
// (accessDeniedError), naming p.
func accessDenied(c *fiber.Ctx, p meta.Permission) error {
	return accessDeniedError("access denied: this needs permission " + string(p))
}

// RouteAccess lists every registered route (not middleware) with what it
// needs, sorted by path and method (permissions_test.go walks it).
func (s *Server) RouteAccess() []RouteAccess {
	s.access.mu.Lock()
	defer s.access.mu.Unlock()
	var out []RouteAccess
	for _, r := range s.app.GetRoutes(true) {
		out = append(out, RouteAccess{Method: r.Method, Path: r.Path, Need: s.access.routes[r.Method+" "+r.Path]})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Path != out[j].Path {
			return out[i].Path < out[j].Path
		}
		return out[i].Method < out[j].Method
	})
	return out
}
