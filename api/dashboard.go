package api

import (
	"bufio"
	"context"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"github.com/gofiber/fiber/v2"

	"devicehub/api/dashboard"
	"devicehub/ingest/alarm"
	"devicehub/meta"
)

// The dashboard routes: endpoint 14 and its exports. What they answer is
// api/dashboard's (decode, plan, resolve, run, encode, and the admission
// of both); here are only the HTTP and the caller: the body's checks, the
// caller's scope (the lookups of scope.go), an export's stream and its
// end with the caller's token.

// DashboardStore answers endpoint 14 and exports from ClickHouse
// (*tsdb.DB).
type DashboardStore = dashboard.Store

// DeviceModels resolves a device's product and the thing model in force.
type DeviceModels interface {
	GetDeviceRef(ctx context.Context, id string) (meta.DeviceRef, error)
}

// newDashboard is the server's dashboard service.
func (s *Server) newDashboard() *dashboard.Service {
	opts := dashboard.Options{Concurrency: s.opts.DashboardConcurrency, Wait: s.opts.DashboardWait, Clock: s.opts.dashboardClock}
	return dashboard.New(opts, dashboard.Deps{Store: s.deps.Dashboard, Scope: dashboardScope{s}, Alarms: dashboardAlarms{s},
		AlarmSeverities: alarm.Severities(), AlarmStates: []string{alarm.StateActive, alarm.StateCleared}, JSONError: jsonError})
}

// dashboardScope is the dashboard's lookups: the server's, within the
// caller's products (scope.go).
type dashboardScope struct{ s *Server }

func (d dashboardScope) DeviceRef(ctx context.Context, id string) (meta.DeviceRef, error) {
	return d.s.deviceRef(ctx, id)
}

func (d dashboardScope) ProductModel(ctx context.Context, id string) (string, error) {
	return d.s.productModel(ctx, id)
}

func (d dashboardScope) ProductVisible(ctx context.Context, id string) error {
	return productVisible(ctx, id)
}

// dashboardAlarms counts alarms in the alarm store (Deps.Alarms).
type dashboardAlarms struct{ s *Server }

func (d dashboardAlarms) AlarmCounts(ctx context.Context, q dashboard.AlarmCountQuery) ([]uint64, error) {
	store, err := d.s.alarms()
	if err != nil {
		return nil, err
	}
	return store.Counts(ctx, alarm.CountQuery{Starts: q.Range.Starts(), End: q.Range.End(),
		ProductID: q.ProductID, DeviceID: q.DeviceID, Severity: q.Severity, State: q.State})
}

// dashboardMulti is endpoint 14: POST /api/dashboard/_multi.
func (s *Server) dashboardMulti(c *fiber.Ctx) error {
	body, err := checkedBody(c)
	if err != nil {
		return err
	}
	answer, err := s.dash.Run(c.UserContext(), body)
	if err != nil {
		return err
	}
	defer answer.Release()
	return okWith(c, answer.Append)
}

// dashboardExport is POST /api/dashboard/_export?format=csv|ndjson&formatValue=true.
func (s *Server) dashboardExport(c *fiber.Ctx) error {
	format, err := dashboard.ParseExportFormat(c.Query("format"), c.Get(fiber.HeaderAccept), c.Query("formatValue"))
	if err != nil {
		return err
	}
	body, err := checkedBody(c)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(c.UserContext(), dashboard.Timeout)
	defer cancel()
	exp, err := s.dash.PlanExport(ctx, format, body)
	if err != nil {
		return err
	}
	// The export counts against its user's limit (UserLimits) and ends
	// with its token, as a live stream does (live.go; auth.go
	// tokensEnded): registered before the token is read again here, so
	// that an end committed after that read finds it, and one committed
	// before is seen by the read.
	token := strings.Clone(c.Get(tokenHeader))
	st, err := s.streams.add(token, currentUser(c).ID, kindExport)
	if err != nil {
		return userStreamsReply(c, err)
	}
	streaming := false
	defer func() {
		if !streaming {
			s.streams.remove(st)
		}
	}()
	expires, err := s.deps.Auth.TokenExpiry(ctx, token)
	if err != nil {
		return err
	}
	if err := exp.Start(ctx); err != nil { // its slot, and its first query
		return err
	}
	c.Set(fiber.HeaderContentType, exp.ContentType())
	c.Set(fiber.HeaderContentDisposition, exp.ContentDisposition())
	c.Set(fiber.HeaderCacheControl, "no-store")
	c.Set("X-Accel-Buffering", "no")
	// The Ctx is reused once the handler returns: the stream keeps only
	// what it needs of the request.
	rc := c.Context()
	conn, shutdown, log := rc.Conn(), rc.Done(), s.log
	timeout := s.opts.WriteTimeout
	allProducts, products := meta.ProductsOf(c.UserContext())
	check := func() (time.Time, error) {
		ctx, cancel := context.WithTimeout(context.Background(), liveLookup)
		defer cancel()
		return s.deps.Auth.TokenExpiry(ctx, token)
	}
	streaming = true
	rc.SetBodyStreamWriter(func(w *bufio.Writer) {
		defer exp.Close()
		defer s.streams.remove(st)
		// The stream outlives the request's context; it keeps the
		// caller's products (every product of theirs, for message counts).
		ctx, cancel := context.WithCancel(meta.LimitProducts(context.Background(), allProducts, products))
		defer cancel()
		var tokenEnded atomic.Bool
		go func() {
			// The server's shutdown ends the export; so does its token's
			// end (logout, user disabled or deleted, key revoked, roles
			// changed: announced, st.end; expiry, or a read again that
			// fails), which also cuts the connection at once: a write
			// blocked on a slow reader returns, and what the socket still
			// holds is dropped (linger 0), not delivered.
			expiry := time.NewTimer(untilRecheck(expires))
			defer expiry.Stop()
			for {
				var err error
				select {
				case <-shutdown:
					cancel()
					return
				case <-ctx.Done():
					return
				case <-st.end:
				case <-st.recheck:
					expires, err = check()
				case <-expiry.C:
					expires, err = check()
				}
				if ctx.Err() != nil {
					return // the export ended first: its connection may serve another request
				}
				if err == nil && !isClosed(st.end) {
					expiry.Reset(untilRecheck(expires))
					continue
				}
				tokenEnded.Store(true)
				cancel()
				cutConn(conn)
				return
			}
		}()
		// The connection's write deadline moves as rows go out (see
		// live.go: fasthttp sets it once).
		tick := func() {
			if conn != nil && timeout > 0 {
				_ = conn.SetWriteDeadline(time.Now().Add(timeout))
			}
		}
		rows, err := exp.Write(ctx, w, tick)
		if err != nil {
			// The status is sent: cut the connection before the body's
			// last chunk, so that the client sees a broken transfer, not
			// a short file.
			if tokenEnded.Load() {
				log.Info("export ended with its token", "file", exp.Name(), "rows", rows)
			} else {
				log.Warn("export ended early", "file", exp.Name(), "rows", rows, "err", err)
			}
			if conn != nil {
				_ = conn.Close()
			}
		}
	})
	return nil
}

// isClosed reports whether ch is closed (it is never sent on).
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// cutConn closes conn at once, dropping what its send buffer still holds
// (SO_LINGER 0: the peer gets a reset, not the rest of the data).
func cutConn(conn net.Conn) {
	if conn == nil {
		return
	}
	if tc, ok := conn.(interface{ SetLinger(int) error }); ok {
		_ = tc.SetLinger(0)
	}
	_ = conn.Close()
}
