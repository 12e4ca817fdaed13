package api

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"strconv"
	"strings"

	"github.com/gofiber/fiber/v2"
	"time"

	"devicehub/ingest/firmware"
	"devicehub/meta"
	"devicehub/schema"
)

// FirmwareService is firmware updates (*firmware.Service): packages,
// rollouts, the devices' jobs, and download links (REFERENCE.md
// "Firmware updates").
type FirmwareService interface {
	Store() *firmware.Store
	Files() *firmware.Files
	Signer() *firmware.Signer
	Upload(ctx context.Context, p firmware.Package, body io.Reader) (firmware.Package, error)
	UploadStaged(ctx context.Context, p firmware.Package, st *firmware.Staged) (firmware.Package, error)
	DeletePackage(ctx context.Context, id string) (firmware.Package, error)
	CreateRollout(ctx context.Context, pkg firmware.Package, sp firmware.Spec, creatorID string) (firmware.Rollout, error)
	Pause(ctx context.Context, id string) (firmware.Rollout, error)
	Resume(ctx context.Context, id string) (firmware.Rollout, error)
	Cancel(ctx context.Context, id string) (firmware.Rollout, error)
	Downloaded(code int, n int64)
	PackageFile(ctx context.Context, packageID string) (firmware.PackageFile, error)
	SecureIDOwner(ctx context.Context, secureID string) (id, key string, err error)
}

func (s *Server) firmware() (FirmwareService, error) {
	if s.deps.Firmware == nil {
		return nil, errors.New("api: no firmware service")
	}
	return s.deps.Firmware, nil
}

// firmwareUploadRoute reports whether a request is a package upload,
// whose body is the file (not JSON) and may be up to the largest package
// size (requestLimits).
func firmwareUploadRoute(method, path string) bool {
	return method == fiber.MethodPost && strings.EqualFold(strings.TrimSuffix(path, "/"), "/api/firmware/package")
}

// firmwarePage is a page of a firmware list.
type firmwarePage[T any] struct {
	PageIndex int `json:"pageIndex"`
	PageSize  int `json:"pageSize"`
	Total     int `json:"total"`
	Data      []T `json:"data"`
}

// pageArgs reads pageIndex (from 0) and pageSize (1-1000, default 25).
func pageArgs(c *fiber.Ctx) (index, size int, err error) {
	index, size = 0, 25
	if v := c.Query("pageIndex"); v != "" {
		if index, err = strconv.Atoi(v); err != nil || index < 0 || index > 1_000_000 {
			return 0, 0, schema.Invalid("pageIndex", "must be a number from 0")
		}
	}
	if v := c.Query("pageSize"); v != "" {
		if size, err = strconv.Atoi(v); err != nil || size < 1 || size > 1000 {
			return 0, 0, schema.Invalid("pageSize", "must be a number from 1 to 1000")
		}
	}
	return index, size, nil
}

// uploadFirmware is POST /api/firmware/package: the file as the raw body
// (any Content-Type but multipart) with productId, version, name?,
// releaseNotes?, signature? as query parameters; or multipart/form-data
// with those as fields and the file as part "file".
//
// The body is read here as it arrives (the server streams request bodies:
// readBodies), straight into a temporary file of the package directory
// (firmware.Files.Stage), so an upload costs a copy buffer of memory, not
// its size. Its Content-Length is held to firmwareBodyLimit, as
// requestLimits promised; a chunked body is cut at the largest package.
func (s *Server) uploadFirmware(c *fiber.Ctx) (err error) {
	fw, err := s.firmware()
	if err != nil {
		return err
	}
	req := c.Request()
	limit := s.firmwareBodyLimit()
	if req.Header.ContentLength() > limit {
		c.Context().SetConnectionClose()
		return fiber.ErrRequestEntityTooLarge
	}
	stream := &bodyReader{r: requestBody(c)}
	defer func() { stream.finish(c, err) }()
	body := io.LimitReader(stream, int64(limit)+1)
	p := firmware.Package{CreatorID: currentUser(c).ID}
	if ct := c.Get(fiber.HeaderContentType); strings.HasPrefix(strings.ToLower(ct), fiber.MIMEMultipartForm) {
		return s.uploadFirmwareForm(c, fw, p, body)
	}
	p.ProductID, p.Version, p.Name = c.Query("productId"), c.Query("version"), c.Query("name")
	p.ReleaseNotes, p.Signature = c.Query("releaseNotes"), c.Query("signature")
	var file io.Reader = body
	if enc := c.Get(fiber.HeaderContentEncoding); enc != "" && !strings.EqualFold(enc, "identity") {
		// A compressed body is decoded by Fiber, as before streaming: in
		// memory, from the (limited) body read whole.
		raw, err := io.ReadAll(body)
		if err != nil {
			return schema.Invalid("body", "cannot be read: %v", err)
		}
		if len(raw) > limit {
			return fiber.ErrRequestEntityTooLarge
		}
		req.SetBodyRaw(raw)
		file = bytes.NewReader(c.Body())
	}
	if p.ProductID == "" {
		return schema.Invalid("productId", "is required")
	}
	if err := productVisible(c.UserContext(), p.ProductID); err != nil {
		return err
	}
	out, err := fw.Upload(c.UserContext(), p, file)
	if err != nil {
		return err
	}
	return ok(c, out)
}

// uploadFirmwareForm reads a multipart upload part by part: the fields
// (each kept up to formFieldMax bytes, enough for CheckPackage to refuse
// a longer one) and the file, streamed to a temporary file; other parts
// are skipped.
func (s *Server) uploadFirmwareForm(c *fiber.Ctx, fw FirmwareService, p firmware.Package, body io.Reader) error {
	boundary := string(c.Request().Header.MultipartFormBoundary())
	if boundary == "" {
		return schema.Invalid("body", "not a multipart form: no boundary")
	}
	if enc := c.Get(fiber.HeaderContentEncoding); enc != "" && !strings.EqualFold(enc, "identity") {
		if !strings.EqualFold(enc, "gzip") {
			return schema.Invalid("body", "not a multipart form: unsupported Content-Encoding %q", safeText(enc))
		}
		zr, err := gzip.NewReader(body)
		if err != nil {
			return schema.Invalid("body", "not a multipart form: %v", err)
		}
		body = zr
	}
	fields := map[string]*string{"productId": &p.ProductID, "version": &p.Version, "name": &p.Name,
		"releaseNotes": &p.ReleaseNotes, "signature": &p.Signature}
	seen := map[string]bool{}
	var staged *firmware.Staged
	defer func() {
		if staged != nil {
			staged.Discard()
		}
	}()
	mr := multipart.NewReader(body, boundary)
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return schema.Invalid("body", "not a multipart form: %v", err)
		}
		name := part.FormName()
		switch {
		case name == "file" && part.FileName() != "":
			if staged != nil {
				return schema.Invalid("file", "send the package as one part named file")
			}
			staged, err = fw.Files().Stage(part)
			if errors.Is(err, firmware.ErrTooLarge) {
				return schema.Invalid("file", "larger than the largest package, %d bytes", fw.Files().Max())
			}
			if err != nil {
				return err
			}
		case part.FileName() == "" && fields[name] != nil && !seen[name]:
			v, err := io.ReadAll(io.LimitReader(part, formFieldMax+1))
			if err != nil {
				return schema.Invalid("body", "not a multipart form: %v", err)
			}
			*fields[name], seen[name] = string(v), true
		}
		if _, err := io.Copy(io.Discard, part); err != nil {
			return schema.Invalid("body", "not a multipart form: %v", err)
		}
	}
	if staged == nil {
		return schema.Invalid("file", "send the package as one part named file")
	}
	if p.ProductID == "" {
		return schema.Invalid("productId", "is required")
	}
	if err := productVisible(c.UserContext(), p.ProductID); err != nil {
		return err
	}
	out, err := fw.UploadStaged(c.UserContext(), p, staged)
	if err != nil {
		return err
	}
	return ok(c, out)
}

// formFieldMax is how much of a multipart upload's field is kept: more
// than the longest field CheckPackage allows.
const formFieldMax = firmware.MaxReleaseNotesLen + 1

// firmwareBodyLimit is the largest body of a package upload: the largest
// package and a multipart's framing.
func (s *Server) firmwareBodyLimit() int {
	if s.deps.FirmwareMaxSize <= 0 {
		return s.app.Server().MaxRequestBodySize
	}
	return s.deps.FirmwareMaxSize + 64<<10
}

// ofReachableProduct is what get read for id when the caller may reach
// its product (product); another product's is not_found, named kind.
func ofReachableProduct[T any](ctx context.Context, kind, id string, get func(context.Context, string) (T, error), product func(T) string) (T, error) {
	v, err := get(ctx, id)
	if err != nil {
		return v, err
	}
	if !meta.ProductAllowed(ctx, product(v)) {
		var zero T
		return zero, fmt.Errorf("%s %q: %w", kind, schema.Truncate(id, 80), meta.ErrNotFound)
	}
	return v, nil
}

// packageOf reads a package the caller may reach (another product's is
// not_found).
func (s *Server) packageOf(ctx context.Context, fw FirmwareService, id string) (firmware.Package, error) {
	return ofReachableProduct(ctx, "package", id, fw.Store().GetPackage, func(p firmware.Package) string { return p.ProductID })
}

// packageParam is the firmware service and the package of the route's
// {id} (packageOf).
func (s *Server) packageParam(c *fiber.Ctx) (FirmwareService, firmware.Package, error) {
	fw, err := s.firmware()
	if err != nil {
		return nil, firmware.Package{}, err
	}
	p, err := s.packageOf(c.UserContext(), fw, c.Params("id"))
	return fw, p, err
}

// firmwareList is what a firmware list's query asks: its page (pageArgs),
// productId ("": any; else one the caller may reach) and the products
// the caller reaches (nil: all).
type firmwareList struct {
	index, size int
	productID   string
	products    []string
}

// listArgs is the firmware service and what a list's query asks.
func (s *Server) listArgs(c *fiber.Ctx) (FirmwareService, firmwareList, error) {
	var l firmwareList
	fw, err := s.firmware()
	if err != nil {
		return nil, l, err
	}
	if l.index, l.size, err = pageArgs(c); err != nil {
		return nil, l, err
	}
	ctx := c.UserContext()
	if l.productID = c.Query("productId"); l.productID != "" {
		if err := productVisible(ctx, l.productID); err != nil {
			return nil, l, err
		}
	}
	if all, ids := meta.ProductsOf(ctx); !all {
		l.products = append([]string{}, ids...)
	}
	return fw, l, nil
}

// okFirmwarePage answers a page of a firmware list (page index of size
// rows each: data of total), or the error of its read.
func okFirmwarePage[T any](c *fiber.Ctx, index, size int, data []T, total int, err error) error {
	if err != nil {
		return err
	}
	return ok(c, firmwarePage[T]{PageIndex: index, PageSize: size, Total: total, Data: data})
}

// listFirmware is GET /api/firmware/package?productId&pageIndex&pageSize.
func (s *Server) listFirmware(c *fiber.Ctx) error {
	fw, l, err := s.listArgs(c)
	if err != nil {
		return err
	}
	data, total, err := fw.Store().ListPackages(c.UserContext(), l.productID, l.products, l.index*l.size, l.size)
	return okFirmwarePage(c, l.index, l.size, data, total, err)
}

// getFirmware is GET /api/firmware/package/{id}.
func (s *Server) getFirmware(c *fiber.Ctx) error {
	_, p, err := s.packageParam(c)
	if err != nil {
		return err
	}
	return ok(c, p)
}

// deleteFirmware is DELETE /api/firmware/package/{id}: refused (400,
// field id) while a rollout refers to it.
func (s *Server) deleteFirmware(c *fiber.Ctx) error {
	fw, _, err := s.packageParam(c)
	if err != nil {
		return err
	}
	p, err := fw.DeletePackage(c.UserContext(), c.Params("id"))
	if errors.Is(err, firmware.ErrInUse) {
		return schema.Invalid("id", "a rollout uses package %q: it can be deleted once no rollout refers to it", schema.Truncate(c.Params("id"), 80))
	}
	if err != nil {
		return err
	}
	return ok(c, p)
}

// createRollout is POST /api/firmware/rollout with a firmware.Spec.
func (s *Server) createRollout(c *fiber.Ctx) error {
	fw, err := s.firmware()
	if err != nil {
		return err
	}
	var sp firmware.Spec
	if err := decodeJSON(c, &sp); err != nil {
		return err
	}
	if err := sp.Check(); err != nil {
		return err
	}
	pkg, err := s.packageOf(c.UserContext(), fw, sp.PackageID)
	if errors.Is(err, meta.ErrNotFound) {
		return schema.Invalid("packageId", "no package %q", schema.Truncate(sp.PackageID, 80))
	}
	if err != nil {
		return err
	}
	r, err := fw.CreateRollout(c.UserContext(), pkg, sp, currentUser(c).ID)
	if err != nil {
		return err
	}
	return ok(c, r)
}

// rolloutOf reads a rollout the caller may reach.
func (s *Server) rolloutOf(ctx context.Context, fw FirmwareService, id string) (firmware.Rollout, error) {
	return ofReachableProduct(ctx, "rollout", id, fw.Store().GetRollout, func(r firmware.Rollout) string { return r.ProductID })
}

// rolloutParam is the firmware service and the rollout of the route's
// {id} (rolloutOf).
func (s *Server) rolloutParam(c *fiber.Ctx) (FirmwareService, firmware.Rollout, error) {
	fw, err := s.firmware()
	if err != nil {
		return nil, firmware.Rollout{}, err
	}
	r, err := s.rolloutOf(c.UserContext(), fw, c.Params("id"))
	return fw, r, err
}

// listRollouts is GET /api/firmware/rollout?productId&state&pageIndex&pageSize.
func (s *Server) listRollouts(c *fiber.Ctx) error {
	fw, l, err := s.listArgs(c)
	if err != nil {
		return err
	}
	state := c.Query("state")
	switch state {
	case "", firmware.RolloutRunning, firmware.RolloutPaused, firmware.RolloutCanceled, firmware.RolloutAborted, firmware.RolloutCompleted:
	default:
		return schema.InvalidChoice("state", []string{firmware.RolloutRunning, firmware.RolloutPaused, firmware.RolloutCanceled,
			firmware.RolloutAborted, firmware.RolloutCompleted}, "unknown rollout state %q", schema.Truncate(state, 80))
	}
	data, total, err := fw.Store().ListRollouts(c.UserContext(), l.productID, state, l.products, l.index*l.size, l.size)
	return okFirmwarePage(c, l.index, l.size, data, total, err)
}

// getRollout is GET /api/firmware/rollout/{id}, with its counts by state.
func (s *Server) getRollout(c *fiber.Ctx) error {
	_, r, err := s.rolloutParam(c)
	if err != nil {
		return err
	}
	return ok(c, r)
}

// rolloutCounts is GET /api/firmware/rollout/{id}/counts: devices by state.
func (s *Server) rolloutCounts(c *fiber.Ctx) error {
	_, r, err := s.rolloutParam(c)
	if err != nil {
		return err
	}
	return ok(c, r.Counts)
}

// rolloutAction is POST /api/firmware/rollout/{id}/_pause, _resume, _cancel.
func (s *Server) rolloutAction(act func(FirmwareService, context.Context, string) (firmware.Rollout, error)) fiber.Handler {
	return func(c *fiber.Ctx) error {
		fw, _, err := s.rolloutParam(c)
		if err != nil {
			return err
		}
		r, err := act(fw, c.UserContext(), c.Params("id"))
		if err != nil {
			return err
		}
		return ok(c, r)
	}
}

// rolloutDevices is GET /api/firmware/rollout/{id}/devices?state=A,B&pageIndex&pageSize:
// the devices' jobs, by device id.
func (s *Server) rolloutDevices(c *fiber.Ctx) error {
	return s.jobsPage(c, nil)
}

// rolloutFailed is GET /api/firmware/rollout/{id}/failed: the devices
// FAILED or TIMED_OUT, with their reasons.
func (s *Server) rolloutFailed(c *fiber.Ctx) error {
	return s.jobsPage(c, []string{firmware.StateFailed, firmware.StateTimedOut})
}

func (s *Server) jobsPage(c *fiber.Ctx, states []string) error {
	fw, err := s.firmware()
	if err != nil {
		return err
	}
	index, size, err := pageArgs(c)
	if err != nil {
		return err
	}
	if v := c.Query("state"); v != "" && states == nil {
		for _, st := range strings.Split(v, ",") {
			known := false
			for _, k := range firmware.DeviceStates {
				known = known || k == st
			}
			if !known {
				return schema.InvalidChoice("state", firmware.DeviceStates, "unknown device state %q", schema.Truncate(st, 80))
			}
			states = append(states, st)
		}
	}
	r, err := s.rolloutOf(c.UserContext(), fw, c.Params("id"))
	if err != nil {
		return err
	}
	data, total, err := fw.Store().Jobs(c.UserContext(), r.ID, states, index*size, size)
	return okFirmwarePage(c, index, size, data, total, err)
}

// deviceFirmware is GET /api/device/instance/{id}/firmware: the version
// the device last reported.
func (s *Server) deviceFirmware(c *fiber.Ctx) error {
	ref, err := s.deviceRef(c.UserContext(), c.Params("id"))
	if err != nil {
		return err
	}
	fw, err := s.firmware()
	if err != nil {
		return err
	}
	v, err := fw.Store().DeviceVersion(c.UserContext(), ref.ID)
	if err != nil {
		return err
	}
	return ok(c, map[string]string{"deviceId": ref.ID, "version": v})
}

// downloadFirmware is GET /firmware/download/{token}, outside /api's
// token check: the device's own secureId and secureKey as HTTP Basic
// auth, the token bound to that device (and a digest of its credentials
// when signed), one package and an expiry.
// 200 the whole file, 206 a Range (bytes=N-, N-M, -N), 416 a range past
// the end; 401 bad or missing credentials, 403 another device's or an
// expired link, 404 an unknown token or package, 503 with Retry-After
// the database busy, 500 anything else (the refusals' statuses and codes
// are errors.go's). The file is streamed from disk: a download holds a
// buffer, never the package.
func (s *Server) downloadFirmware(c *fiber.Ctx) error {
	n, err := s.download(c)
	if err != nil {
		// The refusal's envelope is written now (errors.go chooses its
		// status), so that the status counted is the one sent.
		if herr := c.App().ErrorHandler(c, err); herr != nil {
			return herr
		}
		n = 0
	}
	if fw := s.deps.Firmware; fw != nil {
		fw.Downloaded(c.Response().StatusCode(), n)
	}
	return nil
}

// errDeviceCredentials refuses a download without its device's
// credentials.
var errDeviceCredentials = basicAuthError{realm: "devicehub firmware",
	msg: "the device's secureId and secureKey as HTTP Basic auth are required"}

// download answers a download, or returns its refusal; n is the length
// of the body it sends.
func (s *Server) download(c *fiber.Ctx) (n int64, err error) {
	fw, err := s.firmware()
	if err != nil {
		return 0, err
	}
	ctx := c.UserContext()
	g, terr := fw.Signer().Check(c.Params("token"), time.Now())
	if errors.Is(terr, firmware.ErrBadToken) {
		return 0, notFoundError("unknown download link")
	}
	user, pass, okAuth := basicAuth(c.Get(fiber.HeaderAuthorization))
	if !okAuth {
		return 0, errDeviceCredentials
	}
	// The link carries a digest of its device's credentials as signed:
	// the device's own are checked against it, without the database.
	// Credentials that are not those (another device's, wrong ones, the
	// device's key rotated since the link was signed, or a link of the
	// earlier format, with no digest) are looked up, bounded: 401, 403,
	// or the device's current credentials.
	if !fw.Signer().SameCred(g, user, pass) {
		id, key, err := fw.SecureIDOwner(ctx, user)
		if err != nil {
			return 0, busyOr(err)
		}
		if id == "" || subtle.ConstantTimeCompare([]byte(key), []byte(pass)) != 1 {
			return 0, errDeviceCredentials
		}
		if id != g.DeviceID {
			return 0, accessDeniedError("access denied: this download link is another device's")
		}
	}
	if errors.Is(terr, firmware.ErrExpired) {
		return 0, accessDeniedError("access denied: this download link has expired")
	}
	// The package's file, size and SHA-256: cached a moment (one read per
	// package and 2 s, whatever the fleet downloading at once).
	ref, err := fw.PackageFile(ctx, g.PackageID)
	if err != nil {
		return 0, busyOr(err)
	}
	if !ref.Found {
		return 0, notFoundError("the package of this link is gone")
	}
	f, err := fw.Files().Open(ref.FileName)
	if err != nil {
		return 0, notFoundError("the package's file is gone")
	}
	size := ref.Size
	c.Set(fiber.HeaderAcceptRanges, "bytes")
	c.Set(fiber.HeaderETag, `"`+ref.SHA256+`"`)
	c.Set(fiber.HeaderContentType, "application/octet-stream")
	start, end, partial, satisfiable := parseRange(c.Get(fiber.HeaderRange), size)
	if !satisfiable {
		f.Close()
		return 0, rangeError{size: size}
	}
	if start > 0 {
		if _, err := f.Seek(start, io.SeekStart); err != nil {
			f.Close()
			return 0, err
		}
	}
	n = end - start + 1
	status := fiber.StatusOK
	if partial {
		status = fiber.StatusPartialContent
		c.Set(fiber.HeaderContentRange, fmt.Sprintf("bytes %d-%d/%d", start, end, size))
	}
	c.Status(status)
	if c.Method() == fiber.MethodHead {
		f.Close()
		c.Response().Header.SetContentLength(int(n))
		c.Response().SkipBody = true
		return 0, nil
	}
	// fasthttp copies the stream to the connection with a small buffer
	// and closes it (io.Closer) once sent.
	c.Response().SetBodyStream(limitedFile{Reader: io.LimitReader(f, n), c: f}, int(n))
	return n, nil
}

// busyOr refuses a download whose lookup found the database busy
// (firmware.IsBusy: the lookups allowed at once taken, PostgreSQL
// refusing connections or timing out) as busy, which a device asks again
// after; anything else is err, the error handler's 500.
func busyOr(err error) error {
	if firmware.IsBusy(err) {
		return busyError{msg: "busy: ask again in a second", retryAfter: 1}
	}
	return err
}

type limitedFile struct {
	io.Reader
	c io.Closer
}

func (l limitedFile) Close() error { return l.c.Close() }

// basicAuth reads an Authorization: Basic header.
func basicAuth(h string) (user, pass string, ok bool) {
	enc, found := strings.CutPrefix(h, "Basic ")
	if !found {
		return "", "", false
	}
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(enc))
	if err != nil {
		return "", "", false
	}
	user, pass, ok = strings.Cut(string(b), ":")
	return user, pass, ok && user != ""
}

// parseRange reads a Range header of one range over size bytes: its first
// and last byte, whether it asks for a part, and whether it can be
// answered. No header, or one this does not read (several ranges, other
// units), is the whole file.
func parseRange(h string, size int64) (start, end int64, partial, ok bool) {
	spec, found := strings.CutPrefix(strings.TrimSpace(h), "bytes=")
	if !found || strings.Contains(spec, ",") {
		return 0, size - 1, false, true
	}
	a, b, found := strings.Cut(strings.TrimSpace(spec), "-")
	if !found {
		return 0, size - 1, false, true
	}
	if a == "" { // the last b bytes
		n, err := strconv.ParseInt(b, 10, 64)
		if err != nil || n <= 0 {
			return 0, 0, false, false
		}
		return max(0, size-n), size - 1, true, size > 0
	}
	first, err := strconv.ParseInt(a, 10, 64)
	if err != nil || first < 0 {
		return 0, size - 1, false, true
	}
	last := size - 1
	if b != "" {
		if last, err = strconv.ParseInt(b, 10, 64); err != nil || last < first {
			return 0, size - 1, false, true
		}
		last = min(last, size-1)
	}
	if first >= size {
		return 0, 0, false, false
	}
	return first, last, true, true
}
