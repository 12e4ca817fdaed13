package meta

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/lib/pq"
)

// The audit trail (schema/postgres/00013_audit.sql): what was written
// through the API, by whom, and every login attempt. api records the
// entries (api/audit.go) and writes them here in batches; administrators
// read them with the common query body.

// AuditEntry is one audited request.
type AuditEntry struct {
	ID       int64  `db:"id"`
	Time     Millis `db:"-"`
	UserID   string `db:"user_id"`   // "" when no user was known (a failed login)
	Username string `db:"username"`  // at the time; for a failed login, the name tried
	Address  string `db:"address"`   // the client's address
	Method   string `db:"method"`    // HTTP method
	Route    string `db:"route"`     // the route's pattern, e.g. /api/device/instance/:id
	ObjectID string `db:"object_id"` // the route's path parameter, "" if it has none
	Status   int    `db:"status"`    // the HTTP status of the answer
	Code     string `db:"code"`      // the envelope's code; "" on success
	KeyID    string `db:"key_id"`    // the API key the request came with; "" for a login's token
}

type auditRow struct {
	AuditEntry
	At time.Time `db:"time"`
}

func (r *auditRow) entry() AuditEntry {
	e := r.AuditEntry
	e.Time = Millis(r.At)
	return e
}

// AuditResource allows terms on time, userId, username, address, method,
// route, objectId, status and code; sorts on time, username, route and
// status. Newest first by default.
var AuditResource = &Resource{
	Name: "audit",
	Columns: map[string]Column{
		"id":       {Expr: "a.id", Kind: KindInt},
		"time":     {Expr: "a.time", Kind: KindTime},
		"userId":   {Expr: "a.user_id", Kind: KindText},
		"username": {Expr: "a.username", Kind: KindText},
		"address":  {Expr: "a.address", Kind: KindText},
		"method":   {Expr: "a.method", Kind: KindText},
		"route":    {Expr: "a.route", Kind: KindText},
		"objectId": {Expr: "a.object_id", Kind: KindText},
		"status":   {Expr: "a.status", Kind: KindInt},
		"code":     {Expr: "a.code", Kind: KindText},
		"keyId":    {Expr: "a.key_id", Kind: KindText},
	},
	Sorts: map[string]string{
		"time":     "a.time",
		"username": "a.username",
		"route":    "a.route",
		"status":   "a.status",
	},
	DefaultSort: "a.time DESC, a.id DESC",
	TieBreak:    "a.id",
}

// QueryAudit answers POST /api/audit/_query.
func (s *Store) QueryAudit(ctx context.Context, q *Query) (Page[AuditEntry], error) {
	return queryPage(ctx, s, AuditResource, q,
		"a.id, a.time, a.user_id, a.username, a.address, a.method, a.route, a.object_id, a.status, a.code, a.key_id",
		"audit a", (*auditRow).entry)
}

// InsertAudit stores entries in one statement. Their times are theirs
// (when the request was answered), not the insert's.
func (s *Store) InsertAudit(ctx context.Context, entries []AuditEntry) error {
	if len(entries) == 0 {
		return nil
	}
	n := len(entries)
	times := make([]time.Time, n)
	users, names, addrs, methods, routes, objects, codes, keys := make([]string, n), make([]string, n), make([]string, n),
		make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	statuses := make([]int64, n)
	for i, e := range entries {
		times[i] = time.Time(e.Time)
		users[i], names[i], addrs[i], methods[i], routes[i], objects[i], codes[i], keys[i] =
			e.UserID, e.Username, e.Address, e.Method, e.Route, e.ObjectID, e.Code, e.KeyID
		statuses[i] = int64(e.Status)
	}
	ctx, cancel := s.timeout(ctx)
	defer cancel()
	_, err := s.db.ExecContext(ctx, `INSERT INTO audit (time, user_id, username, address, method, route, object_id, status, code, key_id)
		SELECT * FROM unnest($1::timestamptz[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::int[], $9::text[], $10::text[])`,
		pq.Array(times), pq.Array(users), pq.Array(names), pq.Array(addrs), pq.Array(methods), pq.Array(routes),
		pq.Array(objects), pq.Array(statuses), pq.Array(codes), pq.Array(keys))
	if err != nil {
		return fmt.Errorf("meta: insert audit: %w", err)
	}
	return nil
}

// auditSweepBatch is how many rows one statement of SweepAudit deletes:
// a first sweep over a long history does not hold one huge transaction.
const auditSweepBatch = 10_000

// SweepAudit deletes the audit entries older than before, in batches, and
// returns how many it deleted.
func (s *Store) SweepAudit(ctx context.Context, before time.Time) (int64, error) {
	var total int64
	for {
		dctx, cancel := s.timeout(ctx)
		res, err := s.db.ExecContext(dctx, `DELETE FROM audit WHERE id IN (SELECT id FROM audit WHERE time < $1 LIMIT $2)`,
			before, auditSweepBatch)
		cancel()
		if err != nil {
			return total, fmt.Errorf("meta: sweep audit: %w", err)
		}
		n, _ := res.RowsAffected()
		total += n
		if n < auditSweepBatch {
			return total, nil
		}
	}
}

// RunAuditRetention deletes the audit entries older than keep at once and
// then every interval, until ctx ends. Failures are logged and retried at
// the next tick. Every API instance may run it: the deletions do not
// conflict.
func (s *Store) RunAuditRetention(ctx context.Context, keep, every time.Duration, log *slog.Logger) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		before := time.Now().Add(-keep)
		if n, err := s.SweepAudit(ctx, before); err != nil {
			log.Error("audit retention: sweep", "before", before, "err", err)
		} else if n > 0 {
			log.Info("audit retention: deleted old entries", "before", before, "entries", n)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
