package api

import (
	"context"
	"sync"
	"time"

	"github.com/gofiber/fiber/v2"
)

// readyTimeout bounds each readiness check.
const readyTimeout = 2 * time.Second

// healthz is GET /healthz, liveness: 200 while the process serves HTTP. It
// checks no dependency, so a restart is never asked for because a database
// or the broker is away.
func (s *Server) healthz(c *fiber.Ctx) error {
	return ok(c, map[string]string{"status": "up"})
}

// readyz is GET /readyz, readiness: every check of Deps.Health, run
// concurrently, each within readyTimeout. 200 when all pass, else 503;
// result names each check "up" or "down" either way.
func (s *Server) readyz(c *fiber.Ctx) error {
	ctx, cancel := context.WithTimeout(c.UserContext(), readyTimeout)
	defer cancel()
	result := make(map[string]string, len(s.deps.Health))
	var mu sync.Mutex
	var wg sync.WaitGroup
	ready := true
	for name, check := range s.deps.Health {
		wg.Add(1)
		go func() {
			defer wg.Done()
			state := "up"
			if err := check(ctx); err != nil {
				state = "down"
				s.log.Debug("readiness check failed", "check", name, "err", err)
			}
			mu.Lock()
			defer mu.Unlock()
			result[name] = state
			ready = ready && state == "up"
		}()
	}
	wg.Wait()
	if !ready {
		return notReadyError(result)
	}
	return ok(c, result)
}
