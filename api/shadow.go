package api

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"

	"github.com/gofiber/fiber/v2"

	"devicehub/ingest/shadow"
	"devicehub/meta"
	"devicehub/schema"
)

// ShadowService is the devices' shadows (*shadow.Service): desired state
// set here, reported values, their delta and a version; a change is sent
// to the devices it reaches.
type ShadowService interface {
	View(ctx context.Context, ref meta.DeviceRef) (shadow.View, error)
	Set(ctx context.Context, refs []meta.DeviceRef, ch shadow.Change) ([]shadow.View, error)
	DeviceRefs(ctx context.Context, ids []string, productID string) ([]meta.DeviceRef, error)
	Settings(ctx context.Context, productID string) (shadow.Settings, error)
	SetSettings(ctx context.Context, productID string, st shadow.Settings) error
}

func (s *Server) shadows() (ShadowService, error) {
	if s.deps.Shadows == nil {
		return nil, fmt.Errorf("api: no shadow service")
	}
	return s.deps.Shadows, nil
}

// getShadow is GET /api/device/instance/{id}/shadow.
func (s *Server) getShadow(c *fiber.Ctx) error {
	ref, err := s.deviceRef(c.UserContext(), c.Params("id"))
	if err != nil {
		return err
	}
	svc, err := s.shadows()
	if err != nil {
		return err
	}
	v, err := svc.View(c.UserContext(), ref)
	if err != nil {
		return err
	}
	return ok(c, markShadow(v, ref.Metadata))
}

// shadowJSON is a shadow's view as the API answers it: shadow.View, with
// each reported value that does not fit the device's current thing model
// marked as endpoint 14 marks it (outsideModel: {text, value}; REFERENCE.md
// "Values outside the thing model"). Devices are sent the view unmarked.
type shadowJSON struct {
	DeviceID   string                     `json:"deviceId"`
	Version    int64                      `json:"version"`
	Desired    map[string]shadow.Field    `json:"desired"`
	Reported   map[string]reportedJSON    `json:"reported"`
	Delta      map[string]json.RawMessage `json:"delta"`
	UpdateTime int64                      `json:"updateTime,omitempty"`
}

// reportedJSON is a reported value with its mark, if it has one.
type reportedJSON struct {
	shadow.Reported
	OutsideModel *outsideModelJSON `json:"outsideModel,omitempty"`
}

// outsideModelJSON is the outsideModel mark: a label and
// schema.ThingModel.Outside's reason.
type outsideModelJSON struct {
	Text  string `json:"text"`
	Value string `json:"value"`
}

// markShadow marks v's reported values against metadata, the device's
// thing model in force: a property it does not declare (a desired one
// since taken out of the model), an enum value none of its elements has,
// a value of another type. A model that cannot be read marks nothing.
func markShadow(v shadow.View, metadata string) shadowJSON {
	out := shadowJSON{DeviceID: v.DeviceID, Version: v.Version, Desired: v.Desired, Delta: v.Delta,
		UpdateTime: v.UpdateTime, Reported: make(map[string]reportedJSON, len(v.Reported))}
	model, err := schema.ParseThingModelString(metadata)
	for id, r := range v.Reported {
		rj := reportedJSON{Reported: r}
		if err == nil {
			if reason := model.Outside(id, reportedValue(r.Value)); reason != "" {
				rj.OutsideModel = &outsideModelJSON{Text: schema.OutsideText(reason), Value: reason}
			}
		}
		out.Reported[id] = rj
	}
	return out
}

// reportedValue is a reported JSON value as schema's Outside takes it: a
// number (float64), a bool, a string, nil, or an object or array as it
// is (json.RawMessage).
func reportedValue(raw json.RawMessage) any {
	raw = bytes.TrimSpace(raw)
	if len(raw) > 0 && (raw[0] == '{' || raw[0] == '[') {
		return raw
	}
	var v any
	if json.Unmarshal(raw, &v) != nil {
		return raw
	}
	return v
}

// shadowBody is the body of PUT .../shadow and of the bulk change.
type shadowBody struct {
	Desired   map[string]json.RawMessage `json:"desired"`
	Version   *int64                     `json:"version"`
	ProductID *string                    `json:"productId"` // bulk only
	DeviceIDs []string                   `json:"deviceIds"` // bulk only
}

// decodeShadowBody reads a shadow change: desired is an object of at most
// maxWriteProperties properties (null: leave desired).
func decodeShadowBody(c *fiber.Ctx) (shadowBody, error) {
	var b shadowBody
	if err := decodeJSON(c, &b); err != nil {
		return b, err
	}
	if b.Desired == nil {
		return b, schema.Invalid("desired", "is required: an object of property ids to values (null leaves desired)")
	}
	if len(b.Desired) == 0 {
		return b, schema.Invalid("desired", "name at least one property")
	}
	if len(b.Desired) > maxWriteProperties {
		return b, schema.Invalid("desired", "at most %d properties at once", maxWriteProperties)
	}
	if b.Version != nil && *b.Version < 0 {
		return b, schema.Invalid("version", "must be a version the shadow had (0 or more)")
	}
	return b, nil
}

// shadowChange checks desired against model (each property writable, each
// value of its type, as writes are checked) and makes the change.
func shadowChange(model string, desired map[string]json.RawMessage, by string, ifVersion *int64) (shadow.Change, error) {
	m, err := schema.ParseThingModelString(model)
	if err != nil {
		return shadow.Change{}, schema.Invalid("deviceId", "the device's thing model cannot be read: %v", err)
	}
	values, err := checkValues(m, desired, true, false)
	if err != nil {
		return shadow.Change{}, err
	}
	ch := shadow.Change{Set: map[string]json.RawMessage{}, By: by, IfVersion: ifVersion}
	for id, v := range values {
		if v == nil {
			ch.Remove = append(ch.Remove, id)
			continue
		}
		ch.Set[id] = json.RawMessage(bytes.TrimSpace(desired[id]))
	}
	return ch, nil
}

// putShadow is PUT /api/device/instance/{id}/shadow: desired merged in
// ({"desired": {...}, "version"?: n}); with a version, only if the shadow
// is still at it (409 version_conflict, nothing changed, otherwise).
func (s *Server) putShadow(c *fiber.Ctx) error {
	// The device first: one outside the caller's products is not_found,
	// whatever the body.
	ref, err := s.deviceRef(c.UserContext(), c.Params("id"))
	if err != nil {
		return err
	}
	b, err := decodeShadowBody(c)
	if err != nil {
		return err
	}
	if b.ProductID != nil || b.DeviceIDs != nil {
		return schema.Invalid("body", "productId and deviceIds belong to the bulk change (POST /api/device/instance/batch/_shadow)")
	}
	svc, err := s.shadows()
	if err != nil {
		return err
	}
	ch, err := shadowChange(ref.Metadata, b.Desired, currentUser(c).ID, b.Version)
	if err != nil {
		return err
	}
	if _, err := svc.Set(c.UserContext(), []meta.DeviceRef{ref}, ch); err != nil {
		return err
	}
	v, err := svc.View(c.UserContext(), ref)
	if err != nil {
		return err
	}
	return ok(c, markShadow(v, ref.Metadata))
}

// shadowBulkResult is the bulk change's answer.
type shadowBulkResult struct {
	Total   int `json:"total"`
	Changed int `json:"changed"`
}

// bulkShadow is POST /api/device/instance/batch/_shadow: desired merged
// into the shadow of every listed device (deviceIds) or of every device
// of a product (productId), one versioned change per device, in one
// statement; each device is sent its delta. As the other bulk routes: an
// unknown id (or one outside the caller's products) or an id twice
// changes nothing and answers 400 listing each; a value a device's thing
// model refuses changes nothing either.
func (s *Server) bulkShadow(c *fiber.Ctx) error {
	svc, err := s.shadows()
	if err != nil {
		return err
	}
	b, err := decodeShadowBody(c)
	if err != nil {
		return err
	}
	if b.Version != nil {
		return schema.Invalid("version", "a bulk change is not conditional: each device's version grows by one")
	}
	ctx := c.UserContext()
	var refs []meta.DeviceRef
	switch {
	case (b.ProductID == nil) == (b.DeviceIDs == nil):
		return schema.Invalid("body", "name either productId or deviceIds")
	case b.ProductID != nil:
		if err := productVisible(ctx, *b.ProductID); err != nil {
			return err
		}
		if _, err := s.deps.Products.GetProduct(ctx, *b.ProductID); err != nil {
			return err // not_found
		}
		if refs, err = svc.DeviceRefs(ctx, nil, *b.ProductID); err != nil {
			return err
		}
	default:
		if len(b.DeviceIDs) == 0 {
			return schema.Invalid("deviceIds", "name at least one device")
		}
		if refs, err = s.bulkShadowRefs(ctx, svc, b.DeviceIDs); err != nil {
			return err
		}
	}
	if len(refs) > shadow.MaxBulk {
		return schema.Invalid("body", "at most %d devices in one change", shadow.MaxBulk)
	}
	// One change per thing model: most devices share their product's.
	byModel := map[string][]meta.DeviceRef{}
	for _, r := range refs {
		byModel[r.Metadata] = append(byModel[r.Metadata], r)
	}
	var changes []shadow.Change
	var groups [][]meta.DeviceRef
	for model, rs := range byModel {
		ch, err := shadowChange(model, b.Desired, currentUser(c).ID, nil)
		if err != nil {
			return fmt.Errorf("device %q: %w", rs[0].ID, err)
		}
		changes, groups = append(changes, ch), append(groups, rs)
	}
	res := shadowBulkResult{Total: len(refs)}
	for i, ch := range changes {
		views, err := svc.Set(ctx, groups[i], ch)
		if err != nil {
			return err
		}
		res.Changed += len(views)
	}
	return ok(c, res)
}

// bulkShadowRefs resolves listed devices, refusing (meta.BulkError) ids
// that are empty, twice, unknown or outside the caller's products.
func (s *Server) bulkShadowRefs(ctx context.Context, svc ShadowService, ids []string) ([]meta.DeviceRef, error) {
	if len(ids) > shadow.MaxBulk {
		return nil, schema.Invalid("deviceIds", "at most %d devices in one change", shadow.MaxBulk)
	}
	refs, err := svc.DeviceRefs(ctx, ids, "")
	if err != nil {
		return nil, err
	}
	found := make(map[string]meta.DeviceRef, len(refs))
	for _, r := range refs {
		if meta.ProductAllowed(ctx, r.ProductID) {
			found[r.ID] = r
		}
	}
	var bad []meta.BulkRowError
	seen := make(map[string]bool, len(ids))
	out := make([]meta.DeviceRef, 0, len(ids))
	for i, id := range ids {
		r, known := found[id]
		switch {
		case seen[id]:
			bad = append(bad, meta.BulkRowError{Row: i + 1, ID: id, Field: "id", Reason: "listed twice"})
		case !known:
			bad = append(bad, meta.BulkRowError{Row: i + 1, ID: id, Field: "id", Reason: "no such device"})
		default:
			out = append(out, r)
		}
		seen[id] = true
	}
	if len(bad) > 0 {
		return nil, meta.NewBulkError(bad, len(ids))
	}
	return out, nil
}

// getShadowSettings is GET /api/device-product/{id}/shadow: what the
// product's shadows do with a desired value once reported.
func (s *Server) getShadowSettings(c *fiber.Ctx) error {
	id := c.Params("id")
	if err := productVisible(c.UserContext(), id); err != nil {
		return err
	}
	if _, err := s.deps.Products.GetProduct(c.UserContext(), id); err != nil {
		return err
	}
	svc, err := s.shadows()
	if err != nil {
		return err
	}
	st, err := svc.Settings(c.UserContext(), id)
	if err != nil {
		return err
	}
	return ok(c, st)
}

// putShadowSettings is PUT /api/device-product/{id}/shadow
// {"clearReached": bool}.
func (s *Server) putShadowSettings(c *fiber.Ctx) error {
	id := c.Params("id")
	if err := productVisible(c.UserContext(), id); err != nil {
		return err
	}
	var b struct {
		ClearReached *bool `json:"clearReached"`
	}
	if err := decodeJSON(c, &b); err != nil {
		return err
	}
	if b.ClearReached == nil {
		return schema.Invalid("clearReached", "is required: true (a reported desired value leaves desired) or false (it stays as the target)")
	}
	svc, err := s.shadows()
	if err != nil {
		return err
	}
	st := shadow.Settings{ClearReached: *b.ClearReached}
	if err := svc.SetSettings(c.UserContext(), id, st); err != nil {
		return err
	}
	return ok(c, st)
}
