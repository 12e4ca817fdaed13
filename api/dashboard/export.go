package dashboard

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"mime"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

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
// sent (400 in the envelope): the format (ParseExportFormat), the query,
// the device and the thing model (PlanExport), and, once the export holds
// its slot of the gate, the first ClickHouse query (Export.Start). Then
// rows are written as they come from ClickHouse (tsdb/export.go) through
// a buffered writer, never gathered (Export.Write): an export costs the
// same memory whatever its size. api streams it, and ends it with its
// caller's token.

// Export formats.
const (
	exportCSV    = "csv"
	exportNDJSON = "ndjson"

	mimeCSV    = "text/csv"
	mimeNDJSON = "application/x-ndjson"
)

const (
	// exportTimeout bounds a whole export (10M values took 16 s here);
	// each ClickHouse query has its own timeout (tsdb QueryTimeout).
	exportTimeout = time.Hour
	// exportDeadlineEvery is how many rows are written between calls of
	// Write's tick (api moves the connection's write deadline: fasthttp
	// sets it once).
	exportDeadlineEvery = 1024
)

// Timeout bounds what precedes an export's rows (api: its lookups, the
// token check, the wait for a slot, the first query), as Run bounds
// endpoint 14's requests.
const Timeout = dashboardTimeout

// isoMillis is the time column: ISO 8601 with milliseconds and the
// platform zone's offset.
const isoMillis = "2006-01-02T15:04:05.000Z07:00"

// ExportFormat is what an export writes: CSV or JSON lines, with or
// without a formatValue column.
type ExportFormat struct {
	NDJSON      bool
	FormatValue bool
}

// ParseExportFormat reads an export's query parameters format (csv,
// ndjson) and formatValue (true, false) and its Accept header: without a
// format, the first of text/csv and application/x-ndjson that accept
// names, else CSV.
func ParseExportFormat(format, accept, formatValue string) (ExportFormat, error) {
	var f ExportFormat
	switch strings.ToLower(format) {
	case exportCSV:
	case exportNDJSON, "jsonl", "json-lines":
		f.NDJSON = true
	case "":
		f.NDJSON = acceptsNDJSON(accept)
	default:
		return f, schema.Invalid("format", "must be csv or ndjson")
	}
	if formatValue != "" {
		var err error
		if f.FormatValue, err = strconv.ParseBool(formatValue); err != nil {
			return f, schema.Invalid("formatValue", "must be true or false")
		}
	}
	return f, nil
}

// acceptsNDJSON reports whether the first of text/csv and JSON lines the
// Accept header names is JSON lines.
func acceptsNDJSON(accept string) bool {
	for _, part := range strings.Split(accept, ",") {
		mt, _, _ := strings.Cut(strings.TrimSpace(part), ";")
		switch strings.ToLower(strings.TrimSpace(mt)) {
		case mimeCSV:
			return false
		case mimeNDJSON, "application/jsonl", "application/x-jsonlines":
			return true
		}
	}
	return false
}

// Export is a checked and resolved export: the plan of its query (as
// endpoint 14 plans one), the file's name and columns, and a history
// query's stream, prepared once it holds its slot (Start).
type Export struct {
	s           *Service
	query       *queryPlan
	ndjson      bool
	name        string   // of the file offered (Content-Disposition)
	columns     []string // the header row; the keys of a JSON line
	formatValue bool     // a formatValue column
	loc         *time.Location
	stream      *tsdb.Export // history: set by Start
	slot        bool         // holds a slot of the gate's exports
}

// PlanExport checks an export's body, checked JSON text of one query,
// and looks its device or product up within the caller's products (ctx),
// as Run does endpoint 14's queries.
func (s *Service) PlanExport(ctx context.Context, f ExportFormat, body []byte) (*Export, error) {
	var q Query
	if err := json.Unmarshal(body, &q); err != nil {
		return nil, s.deps.JSONError(err)
	}
	if s.deps.Store == nil {
		return nil, errors.New("dashboard: export: no time-series store")
	}
	loc := s.deps.Store.Location()
	p, err := s.planQuery("body", &q, s.now(), loc, true)
	if err != nil {
		return nil, err
	}
	if err := s.resolve(ctx, p); err != nil {
		return nil, err
	}
	e := &Export{s: s, query: p, ndjson: f.NDJSON, formatValue: f.FormatValue && p.counts == nil, loc: loc}
	switch {
	case p.counts != nil:
		e.name = exportName("messages", p.counts.ProductID, p.counts.Range.Interval())
		e.columns = []string{"timestamp", "time", "timeString", "value"}
	case p.agg != nil:
		e.name = exportName(p.agg.ProductID, p.agg.DeviceID, p.agg.Agg, p.agg.Range.Interval())
		e.columns = []string{"timestamp", "time", "timeString", "property", "agg", "value"}
	default:
		e.name = exportName(p.history.ProductID, p.history.DeviceID, "history")
		e.columns = []string{"timestamp", "time", "deviceId", "property", "type", "value"}
	}
	if e.formatValue {
		e.columns = append(e.columns, "formatValue")
	}
	if p.history != nil {
		// Last, after the columns clients already read by position.
		e.columns = append(e.columns, "outsideModel")
	}
	return e, nil
}

// Start takes the export's slot of the gate (a *BusyError when none comes
// free in time) and runs what it can still be refused for, so that it is
// answered in the envelope: a history query's first ClickHouse query
// (PrepareExport). After a nil error, Close gives the slot back.
func (e *Export) Start(ctx context.Context) error {
	g := e.s.gate
	if err := g.admit(ctx, &g.exports); err != nil {
		return err
	}
	e.slot = true
	if err := e.prepare(ctx); err != nil {
		e.Close()
		return err
	}
	return nil
}

// Close gives the export's slot back (once).
func (e *Export) Close() {
	if e.slot {
		e.slot = false
		e.s.gate.release(&e.s.gate.exports)
	}
}

// prepare runs a history query's first ClickHouse query (PrepareExport,
// of history.exportQuery).
func (e *Export) prepare(ctx context.Context) error {
	if e.query.history == nil {
		return nil
	}
	exporter, ok := e.s.deps.Store.(exportHistoryExporter)
	if !ok {
		return errors.New("dashboard: export: the time-series store cannot stream values")
	}
	var err error
	e.stream, err = exporter.PrepareExport(ctx, e.query.resolved.exportQuery())
	return err
}

// Name is the file's name without extension (logs).
func (e *Export) Name() string { return e.name }

// ContentType is the file's media type.
func (e *Export) ContentType() string {
	if e.ndjson {
		return mimeNDJSON
	}
	return mimeCSV + "; charset=utf-8; header=present"
}

// ContentDisposition offers the file as an attachment by its name.
func (e *Export) ContentDisposition() string {
	ext := "csv"
	if e.ndjson {
		ext = "ndjson"
	}
	return mime.FormatMediaType("attachment", map[string]string{"filename": e.name + "." + ext})
}

// Write writes the export's rows to w, its header first, and flushes w,
// within exportTimeout; tick is called before the first row and every
// exportDeadlineEvery rows (api moves the connection's write deadline).
// It returns how many rows it wrote.
func (e *Export) Write(ctx context.Context, w *bufio.Writer, tick func()) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, exportTimeout)
	defer cancel()
	enc := &exportEncoder{w: w, ndjson: e.ndjson, columns: e.columns, tick: tick}
	enc.moveDeadline()
	err := enc.header()
	if err == nil {
		err = e.write(ctx, enc)
	}
	if err == nil {
		err = w.Flush()
	}
	return enc.rows, err
}

// write writes an export's rows: its query run as endpoint 14 runs it
// (message counts; property aggregates, a property at a time) or its
// stream (history).
func (e *Export) write(ctx context.Context, enc *exportEncoder) error {
	switch {
	case e.query.counts != nil:
		return e.writeCounts(ctx, enc)
	case e.query.agg != nil:
		return e.writeAggregates(ctx, enc)
	}
	return e.writeHistory(ctx, enc)
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
func (e *Export) writeCounts(ctx context.Context, enc *exportEncoder) error {
	buckets, err := e.s.messageCounts(ctx, *e.query.counts)
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
func (e *Export) writeAggregates(ctx context.Context, enc *exportEncoder) error {
	q := *e.query.agg
	for _, prop := range e.query.agg.Properties {
		q.Properties = []string{prop}
		series, err := e.s.deps.Store.PropertyAggregates(ctx, q)
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
func (e *Export) writeHistory(ctx context.Context, enc *exportEncoder) error {
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
	tick    func() // called as rows go out (Export.Write)
}

func (e *exportEncoder) moveDeadline() {
	if e.tick != nil {
		e.tick()
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
		e.buf = jsonw.Float(e.buf, v)
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
