package meta

import (
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/jmoiron/sqlx"
	"github.com/lib/pq"

	"devicehub/schema"
)

// Bulk device writes: many devices created, deployed, undeployed or
// deleted in one transaction. Each request is all or nothing: every row
// is checked first (in Go, then with one set query per kind of conflict)
// and a request with a bad row stores nothing and names each bad row
// (BulkError). Rows are written with one statement per chunk of
// bulkChunk rows (arrays unnested), not a round trip per device; the
// row triggers (broker notifications, login versions, product device
// counts, list announcements) fire as for single writes.

const (
	// MaxBulkDevices bounds one bulk request.
	MaxBulkDevices = 10_000
	// MaxBulkErrors bounds the bad rows a BulkError lists.
	MaxBulkErrors = 1_000
	// bulkChunk is the rows of one INSERT. 10,000 rows took as long in
	// chunks of 1,000 as in one statement (about 0.3 s here, most of it
	// PostgreSQL's index upkeep, the trigram indexes first); a chunk
	// bounds the arrays built and sent at once.
	bulkChunk = 2_500
)

// BulkRowError is one bad row of a bulk request. Row counts the request's
// rows from 1 (CSV: the data rows, the header is row 0).
type BulkRowError struct {
	Row    int
	ID     string
	Field  string
	Reason string
}

// BulkError refuses a whole bulk request: nothing was stored. Rows are
// the first MaxBulkErrors bad rows in row order; Bad counts them all.
// It is an input error (errors.Is(err, schema.ErrIllegalArgument)).
type BulkError struct {
	Rows []BulkRowError
	Bad  int // bad rows in all
	Of   int // rows in the request
}

// NewBulkError sorts rows by row and keeps the first MaxBulkErrors; of is
// the number of rows in the request.
func NewBulkError(rows []BulkRowError, of int) *BulkError {
	slices.SortStableFunc(rows, func(a, b BulkRowError) int { return a.Row - b.Row })
	e := &BulkError{Rows: rows, Bad: len(rows), Of: of}
	if len(e.Rows) > MaxBulkErrors {
		e.Rows = e.Rows[:MaxBulkErrors:MaxBulkErrors]
	}
	return e
}

func (e *BulkError) Error() string {
	var b strings.Builder
	verb := "are"
	if e.Bad == 1 {
		verb = "is"
	}
	if e.Of == 0 { // the CSV header (row 0)
		b.WriteString("the header is invalid; nothing was stored")
	} else {
		fmt.Fprintf(&b, "%d of %d rows %s invalid; nothing was stored", e.Bad, e.Of, verb)
	}
	if e.Bad > len(e.Rows) {
		fmt.Fprintf(&b, " (result lists the first %d)", len(e.Rows))
	}
	if len(e.Rows) > 0 {
		r := e.Rows[0]
		b.WriteString(": ")
		if e.Of > 0 {
			fmt.Fprintf(&b, "row %d", r.Row)
			if r.ID != "" {
				fmt.Fprintf(&b, " (id %q)", schema.Truncate(r.ID, 64))
			}
			b.WriteString(": ")
		}
		if r.Field != "" {
			b.WriteString(r.Field + ": ")
		}
		b.WriteString(r.Reason)
	}
	return b.String()
}

// Unwrap makes a BulkError an input error.
func (e *BulkError) Unwrap() error { return schema.ErrIllegalArgument }

// rowErrors collects at most one problem per row: the first found.
type rowErrors map[int]BulkRowError

func (m rowErrors) add(row int, id, field, reason string) {
	if _, ok := m[row]; !ok {
		m[row] = BulkRowError{Row: row, ID: schema.Truncate(id, 80), Field: field, Reason: reason}
	}
}

// addErr adds an input error (its field and message) or any other error.
func (m rowErrors) addErr(row int, id string, err error) {
	var ae *schema.ArgError
	if errors.As(err, &ae) {
		m.add(row, id, ae.Field, ae.Msg)
		return
	}
	m.add(row, id, "", err.Error())
}

func (m rowErrors) err(of int) error {
	if len(m) == 0 {
		return nil
	}
	rows := make([]BulkRowError, 0, len(m))
	for _, r := range m {
		rows = append(rows, r)
	}
	return NewBulkError(rows, of)
}

// checkBulkSize refuses an empty request and one of more than
// MaxBulkDevices rows.
func checkBulkSize(n int) error {
	if n == 0 {
		return schema.Invalid("body", "names no device")
	}
	if n > MaxBulkDevices {
		return schema.Invalid("body", "has %d devices; at most %d per request", n, MaxBulkDevices)
	}
	return nil
}

// BulkCreate is a bulk create request (CreateDevices).
type BulkCreate struct {
	Devices []NewDevice
	// ProductID, when set, is the product of every device (an import into
	// one product): a device naming none gets it, one naming another is a
	// bad row, and an unknown ProductID is ErrNotFound.
	ProductID string
	// Deploy deploys the devices in the same transaction (state offline,
	// ready to connect): their products must be deployed.
	Deploy bool
	// Bad are rows the caller found bad while reading the request (CSV
	// text, field counts), by Row (1-based); Devices holds a placeholder
	// at their place. They are reported with the others.
	Bad []BulkRowError
}

// CreatedDevice is a created device's login: its key is shown here once.
type CreatedDevice struct {
	ID        string
	SecureID  string
	SecureKey string
}

// BulkCreated is the result of CreateDevices.
type BulkCreated struct {
	Total    int
	Deployed bool
	Devices  []CreatedDevice // in request order
	// Logins are the broker login changes made (deployed devices).
	Logins []LoginChange
}

// BulkChanged is the result of DeployDevices, UndeployDevices and
// DeleteDevices: Changed of Total devices changed state (or were
// deleted); the others were in that state already.
type BulkChanged struct {
	Total   int
	Changed int
	// Logins are the broker login changes made: one per device whose
	// state changed (deploy, undeploy).
	Logins []LoginChange
}

// CreateDevices creates b.Devices in one transaction, each checked as
// CreateDevice checks one (checkNewDevice), in state notActive or, with
// b.Deploy, offline. Any bad row, one that CreateDevice would refuse (an
// invalid field, a taken id or secureId, an unknown product), an id or
// secureId twice in the request, or with b.Deploy a product not deployed,
// refuses them all with a BulkError naming each.
func (s *Store) CreateDevices(ctx context.Context, b BulkCreate, creator User) (BulkCreated, error) {
	defer s.pages.changed("devices", "product_device_counts") // once committed: the next page read sees it
	if err := checkBulkSize(len(b.Devices)); err != nil {
		return BulkCreated{}, err
	}
	bad := rowErrors{}
	for _, e := range b.Bad {
		bad.add(e.Row, e.ID, e.Field, e.Reason)
	}
	rows := make([]newDeviceRow, len(b.Devices))
	ids := make(map[string]int, len(b.Devices))       // id -> row
	secureIDs := make(map[string]int, len(b.Devices)) // secureId -> row
	products := map[string]bool{}
	for i, n := range b.Devices {
		row := i + 1
		if _, ok := bad[row]; ok {
			continue
		}
		if b.ProductID != "" {
			if n.ProductID == "" {
				n.ProductID = b.ProductID
			} else if n.ProductID != b.ProductID {
				bad.add(row, n.ID, "productId", fmt.Sprintf("must be %q, the product imported into, or empty", schema.Truncate(b.ProductID, 64)))
				continue
			}
		}
		r, err := s.checkNewDevice(n)
		if err != nil {
			bad.addErr(row, n.ID, err)
			continue
		}
		if other, ok := ids[r.ID]; ok {
			bad.add(row, r.ID, "id", fmt.Sprintf("is also row %d's id", other))
			continue
		}
		if other, ok := secureIDs[r.SecureID]; ok {
			bad.add(row, r.ID, "configuration.secureId", fmt.Sprintf("%q is also row %d's secureId", schema.Truncate(r.SecureID, 64), other))
			continue
		}
		ids[r.ID], secureIDs[r.SecureID] = row, row
		rows[i] = r
		products[r.ProductID] = true
	}

	ctx, cancel := s.bulkTimeout(ctx, len(rows))
	defer cancel()
	tx, err := s.db.BeginTxx(ctx, nil)
	if err != nil {
		return BulkCreated{}, fmt.Errorf("meta: create devices: %w", err)
	}
	defer tx.Rollback()
	// The products, locked until commit: KEY SHARE keeps them from being
	// deleted (as the foreign key would), SHARE also from being
	// undeployed while their devices are deployed here.
	lock := "FOR KEY SHARE"
	if b.Deploy {
		lock = "FOR SHARE"
	}
	if b.ProductID != "" {
		products[b.ProductID] = true
	}
	var prods []struct {
		ID    string `db:"id"`
		State int    `db:"state"`
	}
	if err := tx.SelectContext(ctx, &prods, `SELECT id, state FROM products WHERE id = ANY($1) ORDER BY id `+lock,
		pq.StringArray(keys(products))); err != nil {
		return BulkCreated{}, fmt.Errorf("meta: create devices: %w", err)
	}
	productState := make(map[string]int, len(prods))
	for _, p := range prods {
		if ProductAllowed(ctx, p.ID) { // a product outside the request's limit does not exist for it
			productState[p.ID] = p.State
		}
	}
	if _, ok := productState[b.ProductID]; b.ProductID != "" && !ok {
		return BulkCreated{}, fmt.Errorf("product %q: %w", schema.Truncate(b.ProductID, 80), ErrNotFound)
	}
	// Each taken value with the product of the device holding it: a
	// device the caller cannot see is not named (hiddenConflict).
	taken, err := s.takenBy(ctx, tx, `SELECT id, product_id FROM devices JOIN (SELECT DISTINCT unnest($1::text[]) AS id) u USING (id)`, keys(ids))
	if err != nil {
		return BulkCreated{}, err
	}
	// The predicate lets PostgreSQL use the partial unique index.
	takenSecure, err := s.takenBy(ctx, tx, `SELECT secure_id, product_id FROM devices WHERE secure_id = ANY($1) AND secure_id <> ''`, keys(secureIDs))
	if err != nil {
		return BulkCreated{}, err
	}
	for i := range rows {
		r, row := &rows[i], i+1
		if _, ok := bad[row]; ok {
			continue
		}
		state, ok := productState[r.ProductID]
		switch {
		case !ok:
			bad.add(row, r.ID, "productId", fmt.Sprintf("product %q does not exist", schema.Truncate(r.ProductID, 64)))
		case b.Deploy && state != 1:
			bad.add(row, r.ID, "productId", fmt.Sprintf("product %q is not deployed; deploy it first", schema.Truncate(r.ProductID, 64)))
		}
		if _, ok := bad[row]; ok {
			continue
		}
		if p, ok := taken[r.ID]; ok {
			if ProductAllowed(ctx, p) {
				bad.add(row, r.ID, "id", fmt.Sprintf("device %q already exists", schema.Truncate(r.ID, 64)))
			} else {
				bad.add(row, r.ID, "id", unavailableReason(r.ID))
			}
		} else if p, ok := takenSecure[r.SecureID]; ok {
			if ProductAllowed(ctx, p) {
				bad.add(row, r.ID, "configuration.secureId", fmt.Sprintf("%q is another device's secureId", schema.Truncate(r.SecureID, 64)))
			} else {
				bad.add(row, r.ID, "configuration.secureId", unavailableReason(r.SecureID))
			}
		}
	}
	if err := bad.err(len(b.Devices)); err != nil {
		return BulkCreated{}, err
	}

	state, registered := StateNotActive, false
	if b.Deploy {
		state, registered = StateOffline, true
	}
	out := BulkCreated{Total: len(rows), Deployed: b.Deploy, Devices: make([]CreatedDevice, len(rows))}
	for start := 0; start < len(rows); start += bulkChunk {
		chunk := rows[start:min(start+bulkChunk, len(rows))]
		var cols struct {
			id, name, product, photo, desc, features, relations, tags, conf,
			secureID, secureKey, channel, org, store pq.StringArray
			edge, media pq.BoolArray
		}
		for _, r := range chunk {
			cols.id = append(cols.id, r.ID)
			cols.name = append(cols.name, r.Name)
			cols.product = append(cols.product, r.ProductID)
			cols.photo = append(cols.photo, r.PhotoURL)
			cols.desc = append(cols.desc, r.Description)
			cols.features = append(cols.features, string(r.Features))
			cols.relations = append(cols.relations, string(r.Relations))
			cols.tags = append(cols.tags, string(r.Tags))
			cols.conf = append(cols.conf, string(r.Conf))
			cols.secureID = append(cols.secureID, r.SecureID)
			cols.secureKey = append(cols.secureKey, r.SecureKey)
			cols.channel = append(cols.channel, r.ChannelID)
			cols.org = append(cols.org, r.OrgID)
			cols.store = append(cols.store, r.StorePolicy)
			cols.edge = append(cols.edge, r.Edge)
			cols.media = append(cols.media, r.MediaDevice)
		}
		var inserted []struct {
			ID           string `db:"id"`
			LoginVersion int64  `db:"login_version"`
		}
		// login_version comes from its default (00009); the row triggers
		// tell the broker's syncer of deployed ones (00004).
		err := tx.SelectContext(ctx, &inserted, `INSERT INTO devices (id, name, product_id, photo_url, description,
			features, relations, tags, configuration, secure_id, secure_key, channel_id, org_id, store_policy,
			edge, media_device, state, registry_time, creator_id, creator_name, modifier_id, modifier_name)
			SELECT r.id, r.name, r.product_id, r.photo_url, r.description, r.features::jsonb, r.relations::jsonb,
				r.tags::jsonb, r.conf::jsonb, r.secure_id, r.secure_key, r.channel_id, r.org_id, r.store_policy,
				r.edge, r.media_device, $17, CASE WHEN $18 THEN now() END, $19, $20, $19, $20
			FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[],
				$8::text[], $9::text[], $10::text[], $11::text[], $12::text[], $13::text[], $14::text[],
				$15::boolean[], $16::boolean[])
				AS r(id, name, product_id, photo_url, description, features, relations, tags, conf,
					secure_id, secure_key, channel_id, org_id, store_policy, edge, media_device)
			RETURNING id, login_version`,
			cols.id, cols.name, cols.product, cols.photo, cols.desc, cols.features, cols.relations, cols.tags,
			cols.conf, cols.secureID, cols.secureKey, cols.channel, cols.org, cols.store, cols.edge, cols.media,
			state, registered, creator.ID, userName(creator))
		switch {
		case isUniqueViolation(err): // written meanwhile, since the checks above
			return BulkCreated{}, fmt.Errorf("a device id or secureId of the request was taken meanwhile: %w", ErrDuplicateKey)
		case err != nil:
			return BulkCreated{}, fmt.Errorf("meta: create devices: %w", err)
		}
		if b.Deploy {
			for _, d := range inserted {
				out.Logins = append(out.Logins, LoginChange{ID: d.ID, Version: d.LoginVersion})
			}
		}
		for i, r := range chunk {
			out.Devices[start+i] = CreatedDevice{ID: r.ID, SecureID: r.SecureID, SecureKey: r.SecureKey}
		}
	}
	if err := tx.Commit(); err != nil {
		return BulkCreated{}, fmt.Errorf("meta: create devices: %w", err)
	}
	return out, nil
}

// existing returns which of values the query (one parameter: the array)
// finds.
// takenBy runs query, which selects (value, product_id) pairs of the
// devices holding any of values, and maps each value found to its
// device's product.
func (s *Store) takenBy(ctx context.Context, q *sqlx.Tx, query string, values []string) (map[string]string, error) {
	rows, err := q.QueryContext(ctx, query, pq.StringArray(values))
	if err != nil {
		return nil, fmt.Errorf("meta: bulk check: %w", err)
	}
	defer rows.Close()
	m := make(map[string]string)
	for rows.Next() {
		var v, p string
		if err := rows.Scan(&v, &p); err != nil {
			return nil, fmt.Errorf("meta: bulk check: %w", err)
		}
		m[v] = p
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("meta: bulk check: %w", err)
	}
	return m, nil
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// bulkTarget is a device a bulk deploy, undeploy or delete names, locked.
type bulkTarget struct {
	ID           string `db:"id"`
	State        string `db:"state"`
	ProductID    string `db:"product_id"`
	ProductState int    `db:"product_state"`
}

// lockBulkTargets checks ids (each once, none empty), then locks the
// devices of ids in id order (concurrent bulk writes lock alike: no
// deadlock) and their products FOR SHARE, and checks each with ok.
// Unknown ids are bad rows.
func (s *Store) lockBulkTargets(ctx context.Context, q *sqlx.Tx, ids []string, ok func(bulkTarget) (field, reason string)) error {
	if err := checkBulkSize(len(ids)); err != nil {
		return err
	}
	bad := rowErrors{}
	seen := make(map[string]int, len(ids))
	for i, id := range ids {
		switch other, dup := seen[id]; {
		case id == "":
			bad.add(i+1, id, "id", "is required")
		case dup:
			bad.add(i+1, id, "id", fmt.Sprintf("is also row %d's", other))
		default:
			seen[id] = i + 1
		}
	}
	var found []bulkTarget
	if err := q.SelectContext(ctx, &found, `SELECT d.id, d.state, d.product_id, p.state AS product_state
		FROM devices d JOIN (SELECT DISTINCT unnest($1::text[]) AS id) u ON u.id = d.id
		JOIN products p ON p.id = d.product_id ORDER BY d.id FOR UPDATE OF d FOR SHARE OF p`, pq.StringArray(ids)); err != nil {
		return fmt.Errorf("meta: bulk lock devices: %w", err)
	}
	byID := make(map[string]bulkTarget, len(found))
	for _, d := range found {
		byID[d.ID] = d
	}
	for i, id := range ids {
		if _, ok := bad[i+1]; ok {
			continue
		}
		d, exists := byID[id]
		if !exists || !ProductAllowed(ctx, d.ProductID) { // outside the request's products: as if it did not exist
			bad.add(i+1, id, "id", fmt.Sprintf("device %q does not exist", schema.Truncate(id, 64)))
			continue
		}
		if field, reason := ok(d); reason != "" {
			bad.add(i+1, id, field, reason)
		}
	}
	return bad.err(len(ids))
}

// changeDevices runs a bulk deploy, undeploy or delete: lock and check
// the devices, then write those whose state is to change (write, which
// returns their id and login_version). Deploys and undeploys change the
// broker's logins (logins true); a delete of undeployed devices does not.
func (s *Store) changeDevices(ctx context.Context, what string, ids []string, ok func(bulkTarget) (string, string),
	logins bool, write string, args ...any) (BulkChanged, error) {
	defer s.pages.changed("devices", "product_device_counts") // once committed: the next page read sees it
	ctx, cancel := s.bulkTimeout(ctx, len(ids))
	defer cancel()
	tx, err := s.db.BeginTxx(ctx, nil)
	if err != nil {
		return BulkChanged{}, fmt.Errorf("meta: %s devices: %w", what, err)
	}
	defer tx.Rollback()
	if err := s.lockBulkTargets(ctx, tx, ids, ok); err != nil {
		return BulkChanged{}, err
	}
	var changed []struct {
		ID           string `db:"id"`
		LoginVersion int64  `db:"login_version"`
	}
	// The BEFORE UPDATE trigger of 00009 gives each changed row its new
	// login_version: RETURNING reads it.
	if err := tx.SelectContext(ctx, &changed, write, append([]any{pq.StringArray(ids)}, args...)...); err != nil {
		return BulkChanged{}, fmt.Errorf("meta: %s devices: %w", what, err)
	}
	if err := tx.Commit(); err != nil {
		return BulkChanged{}, fmt.Errorf("meta: %s devices: %w", what, err)
	}
	out := BulkChanged{Total: len(ids), Changed: len(changed)}
	if logins {
		out.Logins = make([]LoginChange, len(changed))
		for i, c := range changed {
			out.Logins[i] = LoginChange{ID: c.ID, Version: c.LoginVersion}
		}
	}
	return out, nil
}

// DeployDevices deploys the devices of ids (notActive to offline) in one
// transaction, as DeployDevice deploys one; those deployed already are
// left as they are. An unknown id, one named twice, or a device of a
// product not deployed refuses them all (BulkError).
func (s *Store) DeployDevices(ctx context.Context, ids []string, modifier User) (BulkChanged, error) {
	return s.changeDevices(ctx, "deploy", ids, func(d bulkTarget) (string, string) {
		if d.ProductState != 1 {
			return ErrProductNotDeployed.Field, ErrProductNotDeployed.Msg
		}
		return "", ""
	}, true, `UPDATE devices SET state = $2, registry_time = now(), modify_time = `+nextModifyTime+`,
		modifier_id = $3, modifier_name = $4 FROM (SELECT DISTINCT unnest($1::text[]) AS id) u
		WHERE devices.id = u.id AND state = $5 RETURNING devices.id, login_version`,
		StateOffline, modifier.ID, userName(modifier), StateNotActive)
}

// UndeployDevices moves the devices of ids back to notActive in one
// transaction, as UndeployDevice moves one; those notActive already are
// left as they are. An unknown id or one named twice refuses them all
// (BulkError).
func (s *Store) UndeployDevices(ctx context.Context, ids []string, modifier User) (BulkChanged, error) {
	return s.changeDevices(ctx, "undeploy", ids, func(bulkTarget) (string, string) { return "", "" }, true,
		`UPDATE devices SET state = $2, registry_time = NULL, modify_time = `+nextModifyTime+`,
		modifier_id = $3, modifier_name = $4 FROM (SELECT DISTINCT unnest($1::text[]) AS id) u
		WHERE devices.id = u.id AND state <> $2 RETURNING devices.id, login_version`,
		StateNotActive, modifier.ID, userName(modifier))
}

// DeleteDevices deletes the devices of ids in one transaction. As
// DeleteDevice, only undeployed (notActive) devices may be deleted: a
// deployed one, an unknown id or one named twice refuses them all
// (BulkError).
func (s *Store) DeleteDevices(ctx context.Context, ids []string) (BulkChanged, error) {
	return s.changeDevices(ctx, "delete", ids, func(d bulkTarget) (string, string) {
		if d.State != StateNotActive {
			return ErrDeviceDeployed.Field, ErrDeviceDeployed.Msg
		}
		return "", ""
	}, false, `DELETE FROM devices USING (SELECT DISTINCT unnest($1::text[]) AS id) u WHERE devices.id = u.id RETURNING devices.id, login_version`)
}

// deviceCSVColumns are the columns a device CSV may have
// (DecodeDevicesCSV): the NewDevice JSON name of each lower-case header.
var deviceCSVColumns = map[string]string{
	"id": "id", "name": "name", "productid": "productId", "secureid": "secureId", "securekey": "secureKey",
	"channelid": "channelId", "description": "description", "photourl": "photoUrl", "orgid": "orgId",
	"storepolicy": "storePolicy", "edge": "edge", "mediadevice": "mediaDevice",
}

// deviceCSVHeader lists the columns in the order a template has them.
const deviceCSVHeader = "id, name, productId, secureId, secureKey, channelId, description, photoUrl, orgId, storePolicy, edge, mediaDevice"

// setCSVField sets the field of column (a JSON name) from a cell's text.
// An empty secureId, secureKey or channelId cell leaves it unset (a
// secureId defaults to the id, a key is generated).
func setCSVField(n *NewDevice, column, v string) (err error) {
	config := func(set func(*DeviceConfigInput)) {
		if v == "" {
			return
		}
		if n.Configuration == nil {
			n.Configuration = &DeviceConfigInput{}
		}
		set(n.Configuration)
	}
	switch column {
	case "id":
		n.ID = v
	case "name":
		n.Name = v
	case "productId":
		n.ProductID = v
	case "secureId":
		config(func(c *DeviceConfigInput) { c.SecureID = &v })
	case "secureKey":
		config(func(c *DeviceConfigInput) { c.SecureKey = &v })
	case "channelId":
		config(func(c *DeviceConfigInput) { c.ChannelID = &v })
	case "description":
		n.Description = v
	case "photoUrl":
		n.PhotoURL = v
	case "orgId":
		n.OrgID = v
	case "storePolicy":
		n.StorePolicy = v
	case "edge":
		n.Edge, err = csvBool(v)
	case "mediaDevice":
		n.MediaDevice, err = csvBool(v)
	}
	return err
}

func csvBool(v string) (bool, error) {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "", "false", "0", "no":
		return false, nil
	case "true", "1", "yes":
		return true, nil
	}
	return false, errors.New("must be true or false")
}

// DecodeDevicesCSV reads devices from CSV text: a header row naming the
// columns (deviceCSVHeader, in any order and letter case; name is
// required, the others optional), then one device per row. A UTF-8 byte
// order mark is skipped. A row with a cell that is not UTF-8 or holds
// NUL, with another number of cells than the header, or with a bad
// boolean is a bad row (rows holds a placeholder at its place); a bad
// header (an unknown, repeated or missing column) or text that is not CSV
// is a *BulkError of its own. More than MaxBulkDevices rows is an input
// error.
func DecodeDevicesCSV(r io.Reader) (rows []NewDevice, bad []BulkRowError, err error) {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = -1 // checked below, per row
	cr.ReuseRecord = true
	header, err := cr.Read()
	if err == io.EOF {
		return nil, nil, schema.Invalid("body", "is empty: want a header row (%s), then one device per row", deviceCSVHeader)
	}
	if err != nil {
		return nil, nil, NewBulkError([]BulkRowError{{Row: 0, Reason: csvReason(err)}}, 0)
	}
	cols := make([]string, len(header)) // JSON names
	idCol := -1
	var headerBad []BulkRowError
	seen := map[string]bool{}
	for i, h := range header {
		if i == 0 {
			h = strings.TrimPrefix(h, "\ufeff")
		}
		key := strings.ToLower(strings.TrimSpace(h))
		name, ok := deviceCSVColumns[key]
		switch {
		case textProblem(h) != "":
			headerBad = append(headerBad, BulkRowError{Field: strconv.QuoteToASCII(h), Reason: "column name " + textProblem(h)})
		case !ok:
			headerBad = append(headerBad, BulkRowError{Field: h, Reason: "unknown column; the columns are " + deviceCSVHeader})
		case seen[key]:
			headerBad = append(headerBad, BulkRowError{Field: h, Reason: "column appears twice"})
		}
		seen[key] = true
		cols[i] = name
		if key == "id" {
			idCol = i
		}
	}
	if !seen["name"] {
		headerBad = append(headerBad, BulkRowError{Field: "name", Reason: "the header has no name column"})
	}
	if len(headerBad) > 0 {
		return nil, nil, NewBulkError(headerBad, 0)
	}
	for {
		rec, err := cr.Read()
		if err == io.EOF {
			return rows, bad, nil
		}
		row := len(rows) + 1
		if row > MaxBulkDevices {
			return nil, nil, checkBulkSize(row)
		}
		if err != nil { // not CSV: what follows cannot be told apart
			bad = append(bad, BulkRowError{Row: row, Reason: csvReason(err)})
			return nil, nil, NewBulkError(bad, row)
		}
		rows = append(rows, NewDevice{})
		id := ""
		if idCol >= 0 && idCol < len(rec) && textProblem(rec[idCol]) == "" {
			id = rec[idCol]
		}
		if len(rec) != len(cols) {
			bad = append(bad, BulkRowError{Row: row, ID: id, Reason: fmt.Sprintf("has %d fields, the header %d", len(rec), len(cols))})
			continue
		}
		var n NewDevice
		var problem *BulkRowError
		for i, v := range rec {
			if p := textProblem(v); p != "" {
				problem = &BulkRowError{Row: row, ID: id, Field: cols[i], Reason: p}
				break
			}
			if err := setCSVField(&n, cols[i], v); err != nil {
				problem = &BulkRowError{Row: row, ID: id, Field: cols[i], Reason: err.Error()}
				break
			}
		}
		if problem != nil {
			bad = append(bad, *problem)
			continue
		}
		rows[row-1] = n
	}
}

// textProblem says why PostgreSQL could not store s as text: bytes that
// are not UTF-8, or NUL; "" when it can.
func textProblem(s string) string {
	switch {
	case !utf8.ValidString(s):
		return "must be valid UTF-8 (save the file as UTF-8)"
	case strings.IndexByte(s, 0) >= 0:
		return "must not contain NUL"
	}
	return ""
}

func csvReason(err error) string {
	var pe *csv.ParseError
	if errors.As(err, &pe) {
		return fmt.Sprintf("not CSV at line %d, column %d: %v", pe.Line, pe.Column, pe.Err)
	}
	return "not CSV: " + err.Error()
}
