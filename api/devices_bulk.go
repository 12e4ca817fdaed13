package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"strconv"
	"strings"

	"github.com/gofiber/fiber/v2"
	"github.com/valyala/fasthttp"

	"devicehub/meta"
	"devicehub/schema"
)

// Bulk device provisioning: many devices created (from JSON or CSV),
// deployed, undeployed or deleted in one call and one transaction (the
// store's CreateDevices and friends, meta/device_bulk.go). A request with
// a bad row stores nothing and answers 400 illegal_argument listing the
// bad rows ({row, id, field, reason}, errors.go).

// BulkDeviceStore is what the bulk device endpoints need. Deps.Devices
// provides it when it can (meta.Store does); without it these routes
// answer server_error.
type BulkDeviceStore interface {
	CreateDevices(ctx context.Context, b meta.BulkCreate, creator meta.User) (meta.BulkCreated, error)
	DeployDevices(ctx context.Context, ids []string, modifier meta.User) (meta.BulkChanged, error)
	UndeployDevices(ctx context.Context, ids []string, modifier meta.User) (meta.BulkChanged, error)
	DeleteDevices(ctx context.Context, ids []string) (meta.BulkChanged, error)
}

// bulkBodyLimit is the body limit of the bulk routes: 10,000 devices of
// about 1.5 KB each (every other route keeps Options.BodyLimit).
const bulkBodyLimit = 16 << 20

// bulkRoute reports whether a request goes to a bulk device route, which
// reads its body itself (jsonBodies lets it pass) and may send up to
// bulkBodyLimit. path is as requested; routes ignore letter case and a
// trailing slash.
func bulkRoute(method, path string) bool {
	if method != fiber.MethodPost {
		return false
	}
	rest, ok := strings.CutPrefix(strings.ToLower(strings.TrimSuffix(path, "/")), "/api/device/instance/")
	if !ok {
		return false
	}
	switch rest {
	case "batch/_create", "batch/_deploy", "batch/_undeploy", "batch/_delete":
		return true
	}
	product, ok := strings.CutSuffix(rest, "/import")
	return ok && product != "" && !strings.Contains(product, "/")
}

// bulkBodyLimits is the server's HeaderReceived hook: the bulk routes may
// send bodies of up to bulkBodyLimit (or limit, if larger); every other
// request keeps the server's limit, refused from its Content-Length
// before its body is read, as before.
func bulkBodyLimits(limit int) func(*fasthttp.RequestHeader) fasthttp.RequestConfig {
	return func(h *fasthttp.RequestHeader) fasthttp.RequestConfig {
		if bulkRoute(string(h.Method()), requestPath(h)) {
			return fasthttp.RequestConfig{MaxRequestBodySize: max(limit, bulkBodyLimit)}
		}
		return fasthttp.RequestConfig{}
	}
}

// requestPath is a request header's path, without its query, also of an
// absolute-form request line.
func requestPath(h *fasthttp.RequestHeader) string {
	uri := string(h.RequestURI())
	if i := strings.IndexByte(uri, '?'); i >= 0 {
		uri = uri[:i]
	}
	if rest, ok := strings.CutPrefix(uri, "http://"); ok { // absolute form
		uri = rest[strings.IndexByte(rest+"/", '/'):]
	} else if rest, ok := strings.CutPrefix(uri, "https://"); ok {
		uri = rest[strings.IndexByte(rest+"/", '/'):]
	}
	return uri
}

func (s *Server) bulkStore() (BulkDeviceStore, error) {
	b, ok := s.deps.Devices.(BulkDeviceStore)
	if !ok {
		return nil, errors.New("api: the device store has no bulk writes")
	}
	return b, nil
}

// createDevices is POST /api/device/instance/batch/_create[?deploy=true]:
// a JSON array of devices, each as POST /api/device/instance takes one.
func (s *Server) createDevices(c *fiber.Ctx) error {
	deploy, err := deployParam(c, "")
	if err != nil {
		return err
	}
	if err := checkBulkJSON(c); err != nil {
		return err
	}
	rows, bad, err := decodeDevices(c.Body())
	if err != nil {
		return err
	}
	return s.createBulk(c, meta.BulkCreate{Devices: rows, Bad: bad, Deploy: deploy})
}

// importDevices is POST /api/device/instance/{productId}/import
// [?deploy=true]: devices of one product, as CSV (text/csv, a header row
// then one device per row), as a JSON array, or as either uploaded in a
// multipart/form-data field "file" (with an optional field "deploy").
func (s *Server) importDevices(c *fiber.Ctx) error {
	body, isCSV, form, err := importBody(c)
	if err != nil {
		return err
	}
	deploy, err := deployParam(c, form)
	if err != nil {
		return err
	}
	var rows []meta.NewDevice
	var bad []meta.BulkRowError
	if isCSV {
		rows, bad, err = meta.DecodeDevicesCSV(bytes.NewReader(body))
	} else {
		rows, bad, err = decodeDevices(body)
	}
	if err != nil {
		return err
	}
	return s.createBulk(c, meta.BulkCreate{Devices: rows, Bad: bad, ProductID: c.Params("productId"), Deploy: deploy})
}

// createBulk stores b and answers with each device's login. Their keys
// are shown in this answer only: should the broker not confirm the
// deployed ones in time (503 broker_timeout), the answer still carries
// them, as the devices are stored.
func (s *Server) createBulk(c *fiber.Ctx, b meta.BulkCreate) error {
	store, err := s.bulkStore()
	if err != nil {
		return err
	}
	// device:secret on each device's product: choosing a device's key is
	// knowing it, and the generated keys are shown to its holders only.
	secrets := make([]bool, len(b.Devices))
	for i, d := range b.Devices {
		product := d.ProductID
		if product == "" {
			product = b.ProductID
		}
		secrets[i] = currentUser(c).CanProduct(permDeviceSecret, product)
		if d.Configuration != nil && d.Configuration.SecureKey != nil && !secrets[i] {
			return accessDenied(c, permDeviceSecret)
		}
	}
	res, err := store.CreateDevices(c.UserContext(), b, currentUser(c))
	if err != nil {
		return err
	}
	for i := range res.Devices { // in request order
		if i >= len(secrets) || !secrets[i] {
			res.Devices[i].SecureKey = meta.MaskSecret(res.Devices[i].SecureKey)
		}
	}
	if err := s.awaitLogins(c.UserContext(), res.Logins...); err != nil {
		if errors.Is(err, errBrokerTimeout) {
			return bulkTimeoutError{err: err, created: json.RawMessage(appendBulkCreated(&res, nil))}
		}
		return err
	}
	return okItem(c, &res, appendBulkCreated)
}

// deployDevices is POST /api/device/instance/batch/_deploy: a JSON array
// of device ids.
func (s *Server) deployDevices(c *fiber.Ctx) error {
	return s.changeDevices(c, BulkDeviceStore.DeployDevices)
}

// undeployDevices is POST /api/device/instance/batch/_undeploy.
func (s *Server) undeployDevices(c *fiber.Ctx) error {
	return s.changeDevices(c, BulkDeviceStore.UndeployDevices)
}

// deleteDevices is POST /api/device/instance/batch/_delete; only
// undeployed devices may be deleted.
func (s *Server) deleteDevices(c *fiber.Ctx) error {
	return s.changeDevices(c, func(b BulkDeviceStore, ctx context.Context, ids []string, _ meta.User) (meta.BulkChanged, error) {
		return b.DeleteDevices(ctx, ids)
	})
}

func (s *Server) changeDevices(c *fiber.Ctx, change func(BulkDeviceStore, context.Context, []string, meta.User) (meta.BulkChanged, error)) error {
	store, err := s.bulkStore()
	if err != nil {
		return err
	}
	if err := checkBulkJSON(c); err != nil {
		return err
	}
	ids, err := decodeIDs(c.Body())
	if err != nil {
		return err
	}
	res, err := change(store, c.UserContext(), ids, currentUser(c))
	if err != nil {
		return err
	}
	if err := s.awaitLogins(c.UserContext(), res.Logins...); err != nil {
		return err
	}
	return okItem(c, &res, appendBulkChanged)
}

// deployParam reads ?deploy= (or, when the query has none, the form
// field's value): true or false, default false.
func deployParam(c *fiber.Ctx, form string) (bool, error) {
	v := c.Query("deploy", form)
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, schema.Invalid("deploy", "must be true or false (got %q)", safeText(v))
	}
	return b, nil
}

// checkBulkJSON checks what jsonBodies checks of other routes'
// bodies (which it lets these pass): a JSON Content-Type, no
// Content-Encoding. The text of each row is checked as it is decoded.
func checkBulkJSON(c *fiber.Ctx) error {
	if err := checkContentType(c.Get(fiber.HeaderContentType)); err != nil {
		return err
	}
	return checkIdentity(c)
}

// importBody returns the import's body and whether it is CSV: by its
// Content-Type (text/csv; JSON otherwise), or for a multipart upload the
// file field's content (JSON if it starts with "[", else CSV: browsers
// name CSV files with several types) and the form's deploy field.
func importBody(c *fiber.Ctx) (body []byte, isCSV bool, deploy string, err error) {
	if err := checkIdentity(c); err != nil {
		return nil, false, "", err
	}
	ct := c.Get(fiber.HeaderContentType)
	mt, params, _ := mime.ParseMediaType(ct)
	switch mt {
	case fiber.MIMEMultipartForm:
		fh, err := c.FormFile("file")
		if err != nil {
			return nil, false, "", schema.Invalid("file", "a multipart/form-data upload must have a file field named file")
		}
		f, err := fh.Open()
		if err != nil {
			return nil, false, "", fmt.Errorf("api: open upload: %w", err)
		}
		defer f.Close()
		body, err := io.ReadAll(io.LimitReader(f, bulkBodyLimit+1))
		if err != nil {
			return nil, false, "", fmt.Errorf("api: read upload: %w", err)
		}
		if len(body) > bulkBodyLimit {
			return nil, false, "", fiber.ErrRequestEntityTooLarge
		}
		// A file saved with a byte order mark (Windows editors, Excel's
		// "CSV UTF-8") is read without it: JSON allows none (RFC 8259).
		body = bytes.TrimPrefix(body, []byte("\ufeff"))
		return body, !looksLikeJSONArray(body), c.FormValue("deploy"), nil
	case "text/csv", "application/csv":
		if cs, ok := params["charset"]; ok && !strings.EqualFold(cs, "utf-8") && !strings.EqualFold(cs, "utf8") {
			return nil, false, "", unsupportedTypeError(fmt.Sprintf("CSV must be UTF-8 (got charset %q)", safeText(cs)))
		}
		return c.Body(), true, "", nil
	}
	if err := checkContentType(ct); err != nil {
		return nil, false, "", unsupportedTypeError(fmt.Sprintf("Content-Type must be text/csv, application/json or multipart/form-data (got %q)", safeText(ct)))
	}
	return c.Body(), false, "", nil
}

// looksLikeJSONArray: after a byte order mark and white space, "[" (CSV
// starts with its header).
func looksLikeJSONArray(body []byte) bool {
	body = bytes.TrimLeft(bytes.TrimPrefix(body, []byte("\ufeff")), " \t\r\n")
	return len(body) > 0 && body[0] == '['
}

// bulkArray splits a JSON array body into its elements; more than
// meta.MaxBulkDevices is an input error.
func bulkArray(body []byte, what string) ([]json.RawMessage, error) {
	if len(bytes.TrimSpace(body)) == 0 {
		return nil, schema.Invalid("body", "a JSON array of %s is required", what)
	}
	var raw []json.RawMessage
	if err := json.Unmarshal(body, &raw); err != nil {
		return nil, jsonError(err)
	}
	if len(raw) > meta.MaxBulkDevices {
		return nil, schema.Invalid("body", "has %d devices; at most %d per request", len(raw), meta.MaxBulkDevices)
	}
	return raw, nil
}

// decodeDevices reads a JSON array of devices. An element that is not a
// device object (a wrong type, text with NUL or bytes that are not
// UTF-8) is a bad row, reported with the others; rows holds a
// placeholder at its place.
func decodeDevices(body []byte) ([]meta.NewDevice, []meta.BulkRowError, error) {
	raw, err := bulkArray(body, "devices")
	if err != nil {
		return nil, nil, err
	}
	rows := make([]meta.NewDevice, len(raw))
	var bad []meta.BulkRowError
	for i, r := range raw {
		err := checkJSONText(r)
		if err == nil {
			err = jsonError(json.Unmarshal(r, &rows[i]))
		}
		if err == nil {
			continue
		}
		rows[i] = meta.NewDevice{}
		row := meta.BulkRowError{Row: i + 1, Reason: err.Error()}
		var ae *schema.ArgError
		if errors.As(err, &ae) {
			row.Field, row.Reason = ae.Field, ae.Msg
			if row.Field == "body" {
				row.Field = ""
			}
		}
		var id struct {
			ID string `json:"id"`
		}
		if json.Unmarshal(r, &id) == nil && checkJSONText(r) == nil {
			row.ID = id.ID
		}
		bad = append(bad, row)
	}
	return rows, bad, nil
}

// decodeIDs reads a JSON array of device ids; an element that is not a
// string of text refuses the request, naming each such row.
func decodeIDs(body []byte) ([]string, error) {
	raw, err := bulkArray(body, "device ids")
	if err != nil {
		return nil, err
	}
	ids := make([]string, len(raw))
	var bad []meta.BulkRowError
	for i, r := range raw {
		if err := checkJSONText(r); err != nil {
			var ae *schema.ArgError
			reason := err.Error()
			if errors.As(err, &ae) {
				reason = ae.Msg
			}
			bad = append(bad, meta.BulkRowError{Row: i + 1, Field: "id", Reason: reason})
			continue
		}
		if err := json.Unmarshal(r, &ids[i]); err != nil {
			bad = append(bad, meta.BulkRowError{Row: i + 1, Field: "id", Reason: "must be a string"})
		}
	}
	if len(bad) > 0 {
		return nil, meta.NewBulkError(bad, len(raw))
	}
	return ids, nil
}
