package api

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"mime"
	"net"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/gofiber/fiber/v2"

	"devicehub/meta"
	"devicehub/schema"
	"devicehub/schema/jsonw"
	"devicehub/tsdb"
)

// POST /api/dashboard/_export (REFERENCE.md "Dashboard", Export): one query of
// endpoint 14's kinds (message counts, property aggregates, property
// history) as CSV or JSON lines, streamed. Endpoint 14 answers an array
// of queries in one envelope, built in memory and bounded (32 MiB, 1,000
// values per property); an export is one query of any size, a file:
// what the platforms devicehub follows do with a separate _export route
// (JetLinks' `.../_export` of device data, with the format chosen by the
// request), not an Accept header on the JSON endpoint, whose items and
// limits it would have to change.
//
// Everything that can be refused is checked before the first byte is
// sent (400 in the envelope): the query, the format, the device and the
// thing model, and the first ClickHouse query. Then rows are written as
// they come from ClickHouse (tsdb/export.go) through a buffered writer,
// never gathered: an export costs the same memory whatever its size.

// Export formats.
const (
	exportCSV    = "csv"
	exportNDJSON = "ndjson"

	mimeCSV    = "text/csv"
	mimeNDJSON = "application/x-ndjson"
)

const (
	// maxExports bounds the exports running at once in the process; one
	// more waits up to exportWait for a slot, then gets 503. An export
	// takes a core's worth of formatting while it runs (a few seconds per
	// million values), so two cores serve a few at a time; dashboard
	// requests have their own slots (DashboardConcurrency).
	maxExports = 4
	exportWait = 2 * time.Second
	// exportTimeout bounds a whole export (10M values took 16 s here);
	// each ClickHouse query has its own timeout (tsdb QueryTimeout).
	exportTimeout = time.Hour
	// exportDeadlineEvery is how many rows are written between moves of
	// the connection's write deadline (see live.go: fasthttp sets it once).
	exportDeadlineEvery = 1024
)

// isoMillis is the time column: ISO 8601 with milliseconds and the
// platform zone's offset.
const isoMillis = "2006-01-02T15:04:05.000Z07:00"

// exportPlan is a checked and resolved export: the plan of its query (as
// endpoint 14 plans one), the file's name and columns, and a history
// query's stream, prepared before the answer starts.
type exportPlan struct {
	query       *dashboardPlan
	name        string   // of the file offered (Content-Disposition)
	columns     []string // the header row; the keys of a JSON line
	formatValue bool     // a formatValue column
	loc         *time.Location
	stream      *tsdb.Export // history: set by prepareExport
}

// dashboardExport is POST /api/dashboard/_export?format=csv|ndjson&formatValue=true.
func (s *Server) dashboardExport(c *fiber.Ctx) error {
	format, err := exportFormat(c)
	if err != nil {
		return err
	}
	formatValue := false
	if v := c.Query("formatValue"); v != "" {
		if formatValue, err = strconv.ParseBool(v); err != nil {
			return schema.Invalid("formatValue", "must be true or false")
		}
	}
	var q dashboardQuery
	if err := decodeJSON(c, &q); err != nil {
		return err
	}
	if s.deps.Dashboard == nil {
		return errors.New("api: export: no time-series store")
	}
	ctx, cancel := context.WithTimeout(c.UserContext(), dashboardTimeout)
	defer cancel()
	plan, err := s.planExport(ctx, &q, s.dashboardNow(), s.deps.Dashboard.Location(), formatValue)
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
	if !s.exports.acquire(ctx) {
		c.Set(fiber.HeaderRetryAfter, strconv.Itoa(dashboardRetryAfterS))
		return reply(c, fiber.StatusServiceUnavailable, codeTooManyRequests, "too many exports in progress; retry later", nil)
	}
	if err := s.prepareExport(ctx, plan); err != nil {
		s.exports.release()
		return err
	}
	ext, ctype := "csv", mimeCSV+"; charset=utf-8; header=present"
	if format == exportNDJSON {
		ext, ctype = "ndjson", mimeNDJSON
	}
	c.Set(fiber.HeaderContentType, ctype)
	c.Set(fiber.HeaderContentDisposition, mime.FormatMediaType("attachment", map[string]string{"filename": plan.name + "." + ext}))
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
		defer s.exports.release()
		defer s.streams.remove(st)
		// The stream outlives the request's context; it keeps the
		// caller's products (every product of theirs, for message counts).
		ctx, cancel := context.WithTimeout(meta.LimitProducts(context.Background(), allProducts, products), exportTimeout)
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
		enc := &exportEncoder{w: w, ndjson: format == exportNDJSON, columns: plan.columns, conn: conn, timeout: timeout}
		enc.moveDeadline()
		err := enc.header()
		if err == nil {
			err = s.writeExport(ctx, plan, enc)
		}
		if err == nil {
			err = w.Flush()
		}
		if err != nil {
			// The status is sent: cut the connection before the body's
			// last chunk, so that the client sees a broken transfer, not
			// a short file.
			if tokenEnded.Load() {
				log.Info("export ended with its token", "file", plan.name, "rows", enc.rows)
			} else {
				log.Warn("export ended early", "file", plan.name, "rows", enc.rows, "err", err)
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

// exportFormat is the format parameter (csv, ndjson), else the first of
// text/csv and application/x-ndjson the Accept header names, else CSV.
func exportFormat(c *fiber.Ctx) (string, error) {
	switch f := strings.ToLower(c.Query("format")); f {
	case exportCSV, exportNDJSON:
		return f, nil
	case "jsonl", "json-lines":
		return exportNDJSON, nil
	case "":
	default:
		return "", schema.Invalid("format", "must be csv or ndjson")
	}
	for _, part := range strings.Split(c.Get(fiber.HeaderAccept), ",") {
		mt, _, _ := strings.Cut(strings.TrimSpace(part), ";")
		switch strings.ToLower(strings.TrimSpace(mt)) {
		case mimeCSV:
			return exportCSV, nil
		case mimeNDJSON, "application/jsonl", "application/x-jsonlines":
			return exportNDJSON, nil
		}
	}
	return exportCSV, nil
}

// planExport checks an export's query and looks its device or product
// up, as endpoint 14 does its queries (planQuery, resolveDashboard).
func (s *Server) planExport(ctx context.Context, q *dashboardQuery, now time.Time, loc *time.Location, formatValue bool) (*exportPlan, error) {
	plan, err := planQuery("body", q, now, loc, true)
	if err != nil {
		return nil, err
	}
	if err := s.resolveDashboard(ctx, plan); err != nil {
		return nil, err
	}
	e := &exportPlan{query: plan, formatValue: formatValue && plan.counts == nil, loc: loc}
	switch {
	case plan.counts != nil:
		e.name = exportName("messages", plan.counts.ProductID, plan.counts.Range.Interval())
		e.columns = []string{"timestamp", "time", "timeString", "value"}
	case plan.agg != nil:
		e.name = exportName(plan.agg.ProductID, plan.agg.DeviceID, plan.agg.Agg, plan.agg.Range.Interval())
		e.columns = []string{"timestamp", "time", "timeString", "property", "agg", "value"}
	default:
		e.name = exportName(plan.history.ProductID, plan.history.DeviceID, "history")
		e.columns = []string{"timestamp", "time", "deviceId", "property", "type", "value"}
	}
	if e.formatValue {
		e.columns = append(e.columns, "formatValue")
	}
	if plan.history != nil {
		// Last, after the columns clients already read by position.
		e.columns = append(e.columns, "outsideModel")
	}
	return e, nil
}

// prepareExport runs what an export can be refused for once it holds its
// slot, so that it is answered in the envelope: a history query's first
// ClickHouse query (PrepareExport, of History.ExportQuery).
func (s *Server) prepareExport(ctx context.Context, e *exportPlan) error {
	if e.query.history == nil {
		return nil
	}
	exporter, ok := s.deps.Dashboard.(exportHistoryExporter)
	if !ok {
		return errors.New("api: export: the time-series store cannot stream values")
	}
	var err error
	e.stream, err = exporter.PrepareExport(ctx, e.query.resolved.ExportQuery())
	return err
}

// writeExport writes an export's rows: its query run as endpoint 14 runs
// it (message counts; property aggregates, a property at a time) or its
// stream (history).
func (s *Server) writeExport(ctx context.Context, e *exportPlan, enc *exportEncoder) error {
	switch {
	case e.query.counts != nil:
		return s.writeCounts(ctx, e, enc)
	case e.query.agg != nil:
		return s.writeAggregates(ctx, e, enc)
	}
	return writeHistory(ctx, e, enc)
}

// fileNameChars are kept in a file name; others become '_'.
var fileNameChars = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

// exportName is the file name (without extension) of an export: its
// non-empty parts, joined by '-'.
func exportName(parts ...string) string {
	var kept []string
	for _, p := range parts {
		if p = strings.Trim(fileNameChars.ReplaceAllString(p, "_"), "_.-"); p != "" {
			kept = append(kept, p)
		}
	}
	if len(kept) == 0 {
		return "export"
	}
	return strings.Join(kept, "-")
}

// writeCounts: one row per bucket, newest first (as endpoint 14's items).
func (s *Server) writeCounts(ctx context.Context, e *exportPlan, enc *exportEncoder) error {
	buckets, err := s.messageCounts(ctx, *e.query.counts)
	if err != nil {
		return err
	}
	for _, bk := range buckets {
		start := bk.Start.In(e.loc)
		enc.int(start.UnixMilli())
		enc.time(start)
		enc.str(e.query.layout.format(start))
		enc.uint(bk.Count)
		if err := enc.end(); err != nil {
			return err
		}
	}
	return nil
}

// writeAggregates: one row per property and bucket, the properties in
// request order, each newest bucket first (as endpoint 14's items). One
// property's buckets are read at a time.
func (s *Server) writeAggregates(ctx context.Context, e *exportPlan, enc *exportEncoder) error {
	q := *e.query.agg
	for _, prop := range e.query.agg.Properties {
		q.Properties = []string{prop}
		series, err := s.deps.Dashboard.PropertyAggregates(ctx, q)
		if err != nil {
			return err
		}
		var def *schema.Property
		if e.formatValue && q.Agg != tsdb.AggCount {
			def, _ = e.query.model.Property(prop)
		}
		for _, sr := range series {
			for _, bk := range sr.Buckets {
				start := bk.Start.In(e.loc)
				v := aggValue(q.Agg, bk)
				enc.int(start.UnixMilli())
				enc.time(start)
				enc.str(e.query.layout.format(start))
				enc.str(sr.Property)
				enc.str(q.Agg)
				enc.value(v)
				if e.formatValue {
					switch {
					case v == nil:
						enc.null()
					case def != nil:
						enc.str(def.ValueType.FormatValue(v))
					default:
						enc.str(plainText(v))
					}
				}
				if err := enc.end(); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// exportHistoryExporter is the part of the time-series store that streams
// stored values (*tsdb.DB).
type exportHistoryExporter interface {
	PrepareExport(ctx context.Context, q tsdb.ExportQuery) (*tsdb.Export, error)
}

// writeHistory: every value of the device's properties in [from, to)
// (all of its history without them), or with `history` the newest that
// many of each; property by property, oldest first.
func writeHistory(ctx context.Context, e *exportPlan, enc *exportEncoder) error {
	model := e.query.resolved.Model
	var (
		defProp string
		def     *schema.Property
		known   bool
	)
	return e.stream.Each(ctx, func(v *tsdb.PropertyValue) error {
		if v.Property != defProp || defProp == "" {
			defProp = v.Property
			def, known = model.Property(v.Property)
		}
		value := storedValue(v)
		typ := v.ValueType
		if known {
			typ = def.ValueType.Type
		}
		enc.int(v.Time.UnixMilli())
		enc.time(v.Time.In(e.loc))
		enc.str(v.DeviceID)
		enc.str(v.Property)
		enc.str(typ)
		enc.value(value)
		if e.formatValue {
			if known {
				enc.str(def.ValueType.FormatValue(value))
			} else {
				enc.str(plainText(value))
			}
		}
		// As endpoint 14 marks it: against the model in force now.
		reason := schema.OutsideUndeclared
		if known {
			reason = def.ValueType.Outside(value)
		}
		enc.outsideModel(reason)
		return enc.end()
	})
}

// storedValue is a stored value as endpoint 14's history items carry it
// (appendHistoryItem).
func storedValue(v *tsdb.PropertyValue) any {
	switch v.ValueType {
	case "number":
		return v.Num
	case "bool":
		return v.Num != 0
	case "json":
		return json.RawMessage(v.Str)
	}
	return v.Str
}

// plainText is a value's text where the thing model does not format it.
func plainText(v any) string {
	switch v := v.(type) {
	case json.RawMessage:
		return string(v)
	case string:
		return v
	case float64:
		return string(appendJSONFloat(nil, v))
	}
	return fmt.Sprint(v)
}

// exportEncoder writes rows as CSV (RFC 4180: a header row, fields
// quoted when they hold a comma, quote or line break, quotes doubled,
// CRLF line ends) or as JSON lines (one object per row, keyed by the
// columns). A row is built in buf and written whole.
type exportEncoder struct {
	w       *bufio.Writer
	ndjson  bool
	columns []string
	buf     []byte
	col     int
	rows    int64
	conn    net.Conn      // its write deadline is moved as rows go out
	timeout time.Duration // WriteTimeout
}

func (e *exportEncoder) moveDeadline() {
	if e.conn != nil && e.timeout > 0 {
		_ = e.conn.SetWriteDeadline(time.Now().Add(e.timeout))
	}
}

// header writes the CSV header row (JSON lines have none).
func (e *exportEncoder) header() error {
	if e.ndjson {
		return nil
	}
	for _, c := range e.columns {
		e.str(c)
	}
	e.rows-- // the header is not a row
	return e.end()
}

// field starts the next field.
func (e *exportEncoder) field() {
	if e.ndjson {
		if e.col == 0 {
			e.buf = append(e.buf, '{')
		} else {
			e.buf = append(e.buf, ',')
		}
		e.buf = jsonw.StringNoHTML(e.buf, e.columns[e.col])
		e.buf = append(e.buf, ':')
	} else if e.col > 0 {
		e.buf = append(e.buf, ',')
	}
	e.col++
}

func (e *exportEncoder) str(s string) {
	e.field()
	if e.ndjson {
		e.buf = jsonw.StringNoHTML(e.buf, s)
		return
	}
	e.buf = appendCSVField(e.buf, s)
}

func (e *exportEncoder) int(i int64) {
	e.field()
	e.buf = strconv.AppendInt(e.buf, i, 10)
}

func (e *exportEncoder) uint(u uint64) {
	e.field()
	e.buf = strconv.AppendUint(e.buf, u, 10)
}

// time writes t as ISO 8601 with milliseconds.
func (e *exportEncoder) time(t time.Time) {
	e.field()
	if e.ndjson {
		e.buf = append(e.buf, '"')
	}
	e.buf = t.AppendFormat(e.buf, isoMillis)
	if e.ndjson {
		e.buf = append(e.buf, '"')
	}
}

// null is an empty CSV field, a JSON null.
func (e *exportEncoder) null() {
	e.field()
	if e.ndjson {
		e.buf = append(e.buf, "null"...)
	}
}

// outsideModel writes the mark of a value outside the thing model
// (schema.ThingModel.Outside's reason; "" for a value that fits): in CSV
// the reason (undeclared, not_in_enum, wrong_type) or nothing, in JSON
// lines endpoint 14's {text, value} or null.
func (e *exportEncoder) outsideModel(reason string) {
	switch {
	case reason == "":
		e.null()
	case e.ndjson:
		e.field()
		e.buf = appendOutsideModelObject(e.buf, reason)
	default:
		e.str(reason)
	}
}

// value writes a value as endpoint 14 carries it: a number, a boolean,
// a string, JSON (an object or array a device sent), or nothing.
func (e *exportEncoder) value(v any) {
	switch v := v.(type) {
	case nil:
		e.null()
	case float64:
		if math.IsNaN(v) || math.IsInf(v, 0) {
			e.null()
			return
		}
		e.field()
		e.buf = appendJSONFloat(e.buf, v)
	case uint64:
		e.uint(v)
	case bool:
		e.field()
		e.buf = strconv.AppendBool(e.buf, v)
	case json.RawMessage:
		if !e.ndjson {
			e.str(string(v))
			return
		}
		if !json.Valid(v) {
			e.str(string(v))
			return
		}
		e.field()
		e.buf = append(e.buf, v...)
	case string:
		e.str(v)
	default:
		e.str(fmt.Sprint(v))
	}
}

// end ends the row and writes it.
func (e *exportEncoder) end() error {
	if e.ndjson {
		e.buf = append(e.buf, "}\n"...)
	} else {
		e.buf = append(e.buf, "\r\n"...)
	}
	_, err := e.w.Write(e.buf)
	e.buf, e.col = e.buf[:0], 0
	e.rows++
	if e.rows%exportDeadlineEvery == 0 {
		e.moveDeadline()
	}
	return err
}

// appendCSVField appends s, quoted if it holds a comma, a quote or a
// line break (RFC 4180), or starts or ends with a space (which readers
// may trim). A text a spreadsheet would run as a formula (formulaLike)
// gets a leading ' that makes it text (OWASP's CSV injection guidance).
func appendCSVField(b []byte, s string) []byte {
	if formulaLike(s) {
		s = "'" + s
	}
	if !strings.ContainsAny(s, ",\"\r\n") && (s == "" || (s[0] != ' ' && s[len(s)-1] != ' ')) {
		return append(b, s...)
	}
	b = append(b, '"')
	for {
		i := strings.IndexByte(s, '"')
		if i < 0 {
			break
		}
		b = append(b, s[:i+1]...)
		b = append(b, '"')
		s = s[i+1:]
	}
	b = append(b, s...)
	return append(b, '"')
}

// formulaLike reports whether a spreadsheet opening the field s would
// take it for a formula: it begins with =, +, -, @, a tab or a carriage
// return (OWASP's list), or with =, +, - or @ after leading white space
// or invisible characters (a space, no-break space, ideographic space,
// zero-width space, byte order mark: readers trim them, or show nothing),
// or with the fullwidth ＝ ＋ － ＠, which Excel with an East Asian input
// method reads as = + - @. A number as it stands (-3.5, +1e3) is no
// formula: a spreadsheet reads it as that number, and runs nothing.
// The console's device-logins.csv has the same guard (console/static/app.js
// csvCell).
func formulaLike(s string) bool {
	if s == "" {
		return false
	}
	if s[0] == '\t' || s[0] == '\r' {
		return true
	}
	t := strings.TrimLeftFunc(s, invisibleLead)
	r, _ := utf8.DecodeRuneInString(t)
	switch r {
	case '＝', '＋', '－', '＠':
		return true
	case '=', '+', '-', '@':
		if len(t) != len(s) {
			return true
		}
		f, err := strconv.ParseFloat(s, 64)
		return err != nil || math.IsInf(f, 0) || math.IsNaN(f) || strings.ContainsAny(s, "xXpP_")
	}
	return false
}

// invisibleLead is what formulaLike looks past at the start of a field:
// white space (unicode.IsSpace: ASCII, no-break and ideographic spaces)
// and format characters (unicode.Cf: zero-width space and joiners, the
// byte order mark).
func invisibleLead(r rune) bool { return unicode.IsSpace(r) || unicode.Is(unicode.Cf, r) }

// appendJSONFloat appends f as encoding/json writes a float64: the
// shortest text that reads back as f, exponent form outside 1e-6..1e21.
func appendJSONFloat(b []byte, f float64) []byte {
	abs := math.Abs(f)
	format := byte('f')
	if abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	b = strconv.AppendFloat(b, f, format, -1, 64)
	if format == 'e' {
		// clean up e-09 to e-9, as encoding/json does
		if n := len(b); n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
	}
	return b
}
