package meta

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"time"

	"github.com/jmoiron/sqlx"
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

	// Repeat marks an entry that is counted rather than stored alone (a
	// failed login): repeats of it (RepeatKey) are one row, Count of
	// them from FirstTime to Time.
	Repeat    bool   `db:"-"`
	Count     int    `db:"count"` // the requests the entry stands for: 1 unless it is repeats
	FirstTime Millis `db:"-"`     // the first one's time; Time is the last one's
}

// AuditRepeatWindow is how long repeats of an entry share one row: those
// within one window of it (the minute of their time) do.
const AuditRepeatWindow = time.Minute

// AuditRepeatKey is what repeats of an entry share: the window of their
// time and everything but who the user was (a failed login has none)
// and the object.
type AuditRepeatKey struct {
	Window                                 int64 // the window's start, epoch ms
	Address, Username, Method, Route, Code string
	Status                                 int
}

// RepeatKey is e's AuditRepeatKey.
func (e *AuditEntry) RepeatKey() AuditRepeatKey {
	return AuditRepeatKey{Window: time.Time(e.Time).Truncate(AuditRepeatWindow).UnixMilli(),
		Address: e.Address, Username: e.Username, Method: e.Method, Route: e.Route, Code: e.Code, Status: e.Status}
}

// AddRepeat counts o, a repeat of e (the same RepeatKey), in e.
func (e *AuditEntry) AddRepeat(o AuditEntry) {
	e.Count = max(e.Count, 1) + max(o.Count, 1)
	if time.Time(o.Time).After(time.Time(e.Time)) {
		e.Time = o.Time
	}
	if first := o.firstTime(); time.Time(first).Before(time.Time(e.firstTime())) {
		e.FirstTime = first
	}
}

func (e *AuditEntry) firstTime() Millis {
	if time.Time(e.FirstTime).IsZero() {
		return e.Time
	}
	return e.FirstTime
}

type auditRow struct {
	AuditEntry
	At    time.Time    `db:"time"`
	First sql.NullTime `db:"first_time"`
}

func (r *auditRow) entry() AuditEntry {
	e := r.AuditEntry
	e.Time = Millis(r.At)
	e.FirstTime = e.Time
	if r.First.Valid {
		e.FirstTime = Millis(r.First.Time)
	}
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
		"count":    {Expr: "a.count", Kind: KindInt},
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
	return auditList.Query(ctx, s, q, nil)
}

// auditList is POST /api/audit/_query's statement.
var auditList = NewList(AuditResource, ListSQL{
	Select: "a.id, a.time, a.user_id, a.username, a.address, a.method, a.route, a.object_id, a.status, a.code, a.key_id, a.count, a.first_time",
	From:   "audit a",
}, (*auditRow).entry)

// InsertAudit stores entries, in one transaction. Their times are theirs
// (when the request was answered), not the insert's. Repeats (Repeat)
// are merged by RepeatKey, here and with the row their window already
// has, if any (00017): a flood of failed logins updates one row a
// minute per address, name and outcome rather than adding a row each.
func (s *Store) InsertAudit(ctx context.Context, entries []AuditEntry) error {
	var plain, repeats []AuditEntry
	at := map[AuditRepeatKey]int{}
	for _, e := range entries {
		if !e.Repeat {
			plain = append(plain, e)
			continue
		}
		k := e.RepeatKey()
		if i, ok := at[k]; ok {
			repeats[i].AddRepeat(e)
			continue
		}
		at[k] = len(repeats)
		repeats = append(repeats, e)
	}
	if len(plain) == 0 && len(repeats) == 0 {
		return nil
	}
	ctx, cancel := s.timeout(ctx)
	defer cancel()
	return s.inTx(ctx, func(tx *sqlx.Tx) error {
		if err := insertAudit(ctx, tx, plain, false); err != nil {
			return err
		}
		return insertAudit(ctx, tx, repeats, true)
	})
}

// insertAudit stores entries in one statement; repeats (each of its own
// RepeatKey) are added to the row of their window if it has one.
func insertAudit(ctx context.Context, tx *sqlx.Tx, entries []AuditEntry, repeats bool) error {
	if len(entries) == 0 {
		return nil
	}
	n := len(entries)
	times := make([]time.Time, n)
	users, names, addrs, methods, routes, objects, codes, keys := make([]string, n), make([]string, n), make([]string, n),
		make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	statuses, counts := make([]int64, n), make([]int64, n)
	firsts, windows := make([]*time.Time, n), make([]*time.Time, n) // NULL but for repeats
	for i, e := range entries {
		times[i] = time.Time(e.Time)
		users[i], names[i], addrs[i], methods[i], routes[i], objects[i], codes[i], keys[i] =
			e.UserID, e.Username, e.Address, e.Method, e.Route, e.ObjectID, e.Code, e.KeyID
		statuses[i], counts[i] = int64(e.Status), int64(max(e.Count, 1))
		if repeats {
			first, window := time.Time(e.firstTime()), time.UnixMilli(e.RepeatKey().Window)
			firsts[i], windows[i] = &first, &window
		}
	}
	q := `INSERT INTO audit (time, user_id, username, address, method, route, object_id, status, code, key_id, count, first_time, window_start)
		SELECT * FROM unnest($1::timestamptz[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::int[], $9::text[], $10::text[],
			$11::int[], $12::timestamptz[], $13::timestamptz[])`
	if repeats {
		q += ` ON CONFLICT (window_start, address, username, method, route, status, code) WHERE window_start IS NOT NULL
			DO UPDATE SET count = audit.count + EXCLUDED.count, time = GREATEST(audit.time, EXCLUDED.time),
				first_time = LEAST(audit.first_time, EXCLUDED.first_time)`
	}
	_, err := tx.ExecContext(ctx, q,
		pq.Array(times), pq.Array(users), pq.Array(names), pq.Array(addrs), pq.Array(methods), pq.Array(routes),
		pq.Array(objects), pq.Array(statuses), pq.Array(codes), pq.Array(keys), pq.Array(counts), pq.Array(firsts), pq.Array(windows))
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
