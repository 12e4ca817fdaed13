package meta

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/lib/pq"

	"devicehub/schema"
)

// Device writes: create, update, delete, deploy, undeploy and the
// device's own thing model.

func userName(u User) string {
	if u.Name != "" {
		return u.Name
	}
	return u.Username
}

// newDeviceRow is a new device as it is stored: checked, with what the
// client may leave out filled in.
type newDeviceRow struct {
	NewDevice
	SecureID, SecureKey, ChannelID  string
	Features, Relations, Tags, Conf []byte // JSON
}

// checkNewDevice holds the rules of a new device, for CreateDevice and
// CreateDevices (device_bulk.go) alike: a rule added here, or in the
// device_input.go checks it calls, holds for a device created alone and
// for each row of a bulk create. It fills in a generated id, the id as
// secureId and a random key where the client gave none.
func (s *Store) checkNewDevice(n NewDevice) (newDeviceRow, error) {
	if n.ID != "" {
		if err := checkID("id", n.ID); err != nil {
			return newDeviceRow{}, err
		}
	}
	if err := checkTexts([]textCheck{
		{"name", n.Name, 128, true},
		{"productId", n.ProductID, 64, true},
		{"photoUrl", n.PhotoURL, 1024, false},
		{"description", n.Description, 2048, false},
		{"orgId", n.OrgID, 64, false},
		{"storePolicy", n.StorePolicy, 64, false},
	}); err != nil {
		return newDeviceRow{}, err
	}
	if err := checkFeatures(n.Features); err != nil {
		return newDeviceRow{}, err
	}
	if err := checkRelations(n.Relations); err != nil {
		return newDeviceRow{}, err
	}
	if err := s.checkConfig(n.Configuration, n.ID); err != nil {
		return newDeviceRow{}, err
	}
	conf, err := jsonObject("deviceConfiguration", n.DeviceConfiguration)
	if err != nil {
		return newDeviceRow{}, err
	}
	tags, err := jsonArray("tags", n.Tags, maxDeviceTags)
	if err != nil {
		return newDeviceRow{}, err
	}
	if n.ID == "" {
		n.ID = NewID()
	}
	r := newDeviceRow{NewDevice: n, SecureID: n.ID, SecureKey: n.Configuration.newKey(), Conf: conf, Tags: tags}
	if c := n.Configuration; c != nil {
		if c.SecureID != nil && *c.SecureID != "" {
			r.SecureID = *c.SecureID
		}
		if c.ChannelID != nil {
			r.ChannelID = *c.ChannelID
		}
	}
	if r.SecureKey == "" {
		r.SecureKey = newSecret()
	}
	r.Features, r.Relations = []byte("[]"), []byte("[]")
	if len(n.Features) > 0 {
		r.Features = mustJSON(n.Features)
	}
	if len(n.Relations) > 0 {
		r.Relations = mustJSON(n.Relations)
	}
	return r, nil
}

// CreateDevice creates a device of an existing product, in state notActive,
// with a generated secure key unless one is given. An unknown product is
// ErrNotFound; a taken id is ErrDuplicateKey.
func (s *Store) CreateDevice(ctx context.Context, n NewDevice, creator User) (DeviceDetail, error) {
	defer s.pages.changed("devices", "product_device_counts") // once committed: the next page read sees it
	r, err := s.checkNewDevice(n)
	if err != nil {
		return DeviceDetail{}, err
	}
	if !ProductAllowed(ctx, r.ProductID) {
		return DeviceDetail{}, fmt.Errorf("product %q: %w", schema.Truncate(r.ProductID, 80), ErrNotFound)
	}
	ctx, cancel := s.timeout(ctx)
	defer cancel()
	// INSERT ... SELECT FROM products: no row means no such product, in
	// the same statement that inserts.
	res, err := s.db.ExecContext(ctx, `INSERT INTO devices (id, name, product_id, photo_url, description,
		features, relations, tags, configuration, secure_id, secure_key, channel_id, org_id, store_policy,
		edge, media_device, state, creator_id, creator_name, modifier_id, modifier_name)
		SELECT $1, $2, p.id, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $17, $18
		FROM products p WHERE p.id = $19`,
		r.ID, r.Name, r.PhotoURL, r.Description, r.Features, r.Relations, r.Tags, r.Conf,
		r.SecureID, r.SecureKey, r.ChannelID, r.OrgID, r.StorePolicy, r.Edge, r.MediaDevice, StateNotActive,
		creator.ID, userName(creator), r.ProductID)
	switch {
	case isSecureIDTaken(err):
		if err := s.hiddenConflict(ctx, "configuration.secureId", "secure_id", r.SecureID); err != nil {
			return DeviceDetail{}, err
		}
		return DeviceDetail{}, fmt.Errorf("configuration.secureId %q is another device's: %w", schema.Truncate(r.SecureID, 80), ErrDuplicateKey)
	case isUniqueViolation(err):
		if err := s.hiddenConflict(ctx, "id", "id", r.ID); err != nil {
			return DeviceDetail{}, err
		}
		return DeviceDetail{}, fmt.Errorf("device %q: %w", r.ID, ErrDuplicateKey)
	case isForeignKeyViolation(err): // the product was deleted meanwhile
		return DeviceDetail{}, fmt.Errorf("product %q: %w", schema.Truncate(r.ProductID, 80), ErrNotFound)
	case err != nil:
		return DeviceDetail{}, fmt.Errorf("meta: create device: %w", err)
	}
	if k, _ := res.RowsAffected(); k == 0 {
		return DeviceDetail{}, fmt.Errorf("product %q: %w", schema.Truncate(r.ProductID, 80), ErrNotFound)
	}
	d, err := s.getDeviceDetail(ctx, s.db, r.ID, false)
	if err != nil {
		return DeviceDetail{}, err
	}
	d.Configuration.SecureKey = r.SecureKey // shown once, to its creator
	return d, nil
}

// hiddenConflict is the refusal of a value of field (an id or a
// secureId, column of devices) that a device the caller cannot see holds
// (one of a product outside ctx's limit), or that none holds any more: it
// names neither that device nor its product, and says no more than that
// the value is not available, the same for an id and a secureId (an
// unlimited caller, or one who sees the device, gets nil: the precise
// refusal). Ids and secureIds are unique across products, so that a value
// is taken cannot be hidden; by whom, and whether as an id or a secureId,
// is. It reads the device outside any transaction (the caller's failed).
func (s *Store) hiddenConflict(ctx context.Context, field, column, value string) error {
	if all, _ := ProductsOf(ctx); all {
		return nil
	}
	var product string
	err := s.db.GetContext(ctx, &product, `SELECT product_id FROM devices WHERE `+column+` = $1`, value)
	switch {
	case err == nil && ProductAllowed(ctx, product):
		return nil
	case err != nil && !errors.Is(err, sql.ErrNoRows):
		return fmt.Errorf("meta: device conflict: %w", err)
	}
	return schema.Invalid(field, "%s", unavailableReason(value))
}

// unavailableReason is what a caller is told of a value a device it
// cannot see holds (hiddenConflict).
func unavailableReason(value string) string {
	return fmt.Sprintf("%q is not available: choose another", schema.Truncate(value, 64))
}

// isSecureIDTaken reports a second device with the same secureId (its
// broker username).
func isSecureIDTaken(err error) bool {
	var pe *pq.Error
	return errors.As(err, &pe) && pe.Code == "23505" && pe.Constraint == "devices_secure_id"
}

// isForeignKeyViolation reports a PostgreSQL foreign_key_violation (23503).
func isForeignKeyViolation(err error) bool {
	var pe *pq.Error
	return errors.As(err, &pe) && pe.Code == "23503"
}

// UpdateDevice applies a DevicePatch and returns the updated device.
func (s *Store) UpdateDevice(ctx context.Context, id string, p DevicePatch, modifier User) (DeviceDetail, error) {
	defer s.pages.changed("devices", "product_device_counts") // once committed: the next page read sees it
	if p.ID != nil && *p.ID != "" && *p.ID != id {
		return DeviceDetail{}, schema.Invalid("id", "does not match the path (%q)", schema.Truncate(id, 80))
	}
	sets := []string{"modify_time = " + nextModifyTime, "modifier_id = $2", "modifier_name = $3"}
	args := []any{id, modifier.ID, userName(modifier)}
	add := func(col string, v any) {
		args = append(args, v)
		sets = append(sets, fmt.Sprintf("%s = $%d", col, len(args)))
	}
	if p.PhotoURL == nil {
		p.PhotoURL = p.DevicePhotoURL // the detail's name for it
	}
	if p.Name != nil && *p.Name == "" {
		return DeviceDetail{}, schema.Invalid("name", "must not be empty")
	}
	for _, t := range []struct {
		col, field string
		v          *string
		max        int
	}{
		{"name", "name", p.Name, 128},
		{"photo_url", "photoUrl", p.PhotoURL, 1024},
		{"description", "description", p.Description, 2048},
		{"org_id", "orgId", p.OrgID, 64},
		{"store_policy", "storePolicy", p.StorePolicy, 64},
	} {
		if t.v == nil {
			continue
		}
		if err := checkText(t.field, *t.v, t.max, false); err != nil {
			return DeviceDetail{}, err
		}
		add(t.col, *t.v)
	}
	if p.Features != nil {
		if err := checkFeatures(*p.Features); err != nil {
			return DeviceDetail{}, err
		}
		add("features", mustJSON(orEmpty(*p.Features)))
	}
	if p.Relations != nil {
		if err := checkRelations(*p.Relations); err != nil {
			return DeviceDetail{}, err
		}
		add("relations", mustJSON(orEmpty(*p.Relations)))
	}
	if len(p.DeviceConfiguration) > 0 {
		conf, err := jsonObject("deviceConfiguration", p.DeviceConfiguration)
		if err != nil {
			return DeviceDetail{}, err
		}
		add("configuration", conf)
	}
	if len(p.Tags) > 0 {
		tags, err := jsonArray("tags", p.Tags, maxDeviceTags)
		if err != nil {
			return DeviceDetail{}, err
		}
		add("tags", tags)
	}
	if c := p.Configuration; c != nil {
		if err := s.checkConfig(c, ""); err != nil {
			return DeviceDetail{}, err
		}
		if c.SecureID != nil && *c.SecureID != "" {
			add("secure_id", *c.SecureID)
		}
		if k := c.newKey(); k != "" {
			add("secure_key", k)
		}
		if c.ChannelID != nil {
			add("channel_id", *c.ChannelID)
		}
	}
	if p.Edge != nil {
		add("edge", *p.Edge)
	}
	if p.MediaDevice != nil {
		add("media_device", *p.MediaDevice)
	}
	ctx, cancel := s.timeout(ctx)
	defer cancel()
	tx, err := s.db.BeginTxx(ctx, nil)
	if err != nil {
		return DeviceDetail{}, fmt.Errorf("meta: update device: %w", err)
	}
	defer tx.Rollback()
	cur, err := s.getDeviceDetail(ctx, tx, id, true)
	if err != nil {
		return DeviceDetail{}, err
	}
	if have := time.Time(cur.ModifyTime).UnixMilli(); p.ModifyTime != nil && *p.ModifyTime > 0 && *p.ModifyTime != have {
		return DeviceDetail{}, fmt.Errorf("device %q was changed by another request (modifyTime is now %d); read it again and apply the change to that: %w",
			schema.Truncate(id, 80), have, ErrConflict)
	}
	if p.ProductID != nil && *p.ProductID != "" && *p.ProductID != cur.ProductID {
		return DeviceDetail{}, schema.Invalid("productId", "cannot be changed (device %q belongs to product %q)", schema.Truncate(id, 80), cur.ProductID)
	}
	if _, err := tx.ExecContext(ctx, "UPDATE devices SET "+strings.Join(sets, ", ")+" WHERE id = $1", args...); err != nil {
		if isSecureIDTaken(err) {
			if err := s.hiddenConflict(ctx, "configuration.secureId", "secure_id", *p.Configuration.SecureID); err != nil {
				return DeviceDetail{}, err
			}
			return DeviceDetail{}, fmt.Errorf("configuration.secureId %q is another device's: %w", schema.Truncate(*p.Configuration.SecureID, 80), ErrDuplicateKey)
		}
		return DeviceDetail{}, fmt.Errorf("meta: update device: %w", err)
	}
	d, err := s.getDeviceDetail(ctx, tx, id, false)
	if err != nil {
		return DeviceDetail{}, err
	}
	d.Login = loginChange(cur.LoginVersion, d)
	return d, tx.Commit()
}

// loginChange is the login change of a write that moved a device's
// login_version from before to d's.
func loginChange(before int64, d DeviceDetail) LoginChange {
	if d.LoginVersion == before {
		return LoginChange{}
	}
	return LoginChange{ID: d.ID, Version: d.LoginVersion}
}

// ErrDeviceDeployed refuses deleting a device that is not notActive.
var ErrDeviceDeployed = &schema.ArgError{Field: "id", Msg: "device is deployed; undeploy it first"}

// DeleteDevice deletes an undeployed (notActive) device and returns what was
// deleted; a deployed one is refused and nothing is deleted.
func (s *Store) DeleteDevice(ctx context.Context, id string) (DeviceDetail, error) {
	defer s.pages.changed("devices", "product_device_counts") // once committed: the next page read sees it
	ctx, cancel := s.timeout(ctx)
	defer cancel()
	tx, err := s.db.BeginTxx(ctx, nil)
	if err != nil {
		return DeviceDetail{}, fmt.Errorf("meta: delete device: %w", err)
	}
	defer tx.Rollback()
	d, err := s.getDeviceDetail(ctx, tx, id, true)
	if err != nil {
		return DeviceDetail{}, err
	}
	if d.State != StateNotActive {
		return DeviceDetail{}, ErrDeviceDeployed
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM devices WHERE id = $1`, id); err != nil {
		return DeviceDetail{}, fmt.Errorf("meta: delete device: %w", err)
	}
	return d, tx.Commit()
}

// ErrProductNotDeployed refuses deploying a device of a disabled product.
var ErrProductNotDeployed = &schema.ArgError{Field: "productId", Msg: "the device's product is not deployed; deploy the product first"}

// DeployDevice moves a notActive device to offline, ready to connect, and
// sets its registry time. A device already deployed is left as it is. The
// product must be deployed (state 1).
func (s *Store) DeployDevice(ctx context.Context, id string, modifier User) (DeviceDetail, error) {
	defer s.pages.changed("devices", "product_device_counts") // once committed: the next page read sees it
	ctx, cancel := s.timeout(ctx)
	defer cancel()
	tx, err := s.db.BeginTxx(ctx, nil)
	if err != nil {
		return DeviceDetail{}, fmt.Errorf("meta: deploy device: %w", err)
	}
	defer tx.Rollback()
	var cur struct {
		State        string `db:"state"`
		ProductState int    `db:"product_state"`
		LoginVersion int64  `db:"login_version"`
	}
	// FOR SHARE OF p keeps the product from being undeployed meanwhile.
	limit, limitArg := limitCond(ctx, "d.product_id", 2)
	err = tx.GetContext(ctx, &cur, `SELECT d.state, p.state AS product_state, d.login_version FROM devices d
		JOIN products p ON p.id = d.product_id WHERE d.id = $1 AND `+limit+` FOR UPDATE OF d FOR SHARE OF p`, id, limitArg)
	if errors.Is(err, sql.ErrNoRows) {
		return DeviceDetail{}, fmt.Errorf("device %q: %w", schema.Truncate(id, 80), ErrNotFound)
	}
	if err != nil {
		return DeviceDetail{}, fmt.Errorf("meta: deploy device: %w", err)
	}
	if cur.ProductState != 1 {
		return DeviceDetail{}, ErrProductNotDeployed
	}
	if cur.State == StateNotActive {
		if _, err := tx.ExecContext(ctx, `UPDATE devices SET state = $2, registry_time = now(), modify_time = `+nextModifyTime+`,
			modifier_id = $3, modifier_name = $4 WHERE id = $1`, id, StateOffline, modifier.ID, userName(modifier)); err != nil {
			return DeviceDetail{}, fmt.Errorf("meta: deploy device: %w", err)
		}
	}
	d, err := s.getDeviceDetail(ctx, tx, id, false)
	if err != nil {
		return DeviceDetail{}, err
	}
	d.Login = loginChange(cur.LoginVersion, d)
	return d, tx.Commit()
}

// UndeployDevice moves a device of any state back to notActive; ingest then
// ignores its state messages until it is deployed again.
func (s *Store) UndeployDevice(ctx context.Context, id string, modifier User) (DeviceDetail, error) {
	defer s.pages.changed("devices", "product_device_counts") // once committed: the next page read sees it
	ctx, cancel := s.timeout(ctx)
	defer cancel()
	// The subquery locks the row and reads the version the update
	// replaces: whether this write changed the broker's login.
	var before int64
	limit, limitArg := limitCond(ctx, "product_id", 5)
	err := s.db.GetContext(ctx, &before, `UPDATE devices d SET state = $2, registry_time = NULL, modify_time = `+nextModifyTime+`,
		modifier_id = $3, modifier_name = $4 FROM (SELECT id, login_version FROM devices WHERE id = $1 AND `+limit+` FOR UPDATE) o
		WHERE d.id = o.id RETURNING o.login_version`, id, StateNotActive, modifier.ID, userName(modifier), limitArg)
	if errors.Is(err, sql.ErrNoRows) {
		return DeviceDetail{}, fmt.Errorf("device %q: %w", schema.Truncate(id, 80), ErrNotFound)
	}
	if err != nil {
		return DeviceDetail{}, fmt.Errorf("meta: undeploy device: %w", err)
	}
	d, err := s.getDeviceDetail(ctx, s.db, id, false)
	if err != nil {
		return DeviceDetail{}, err
	}
	d.Login = loginChange(before, d)
	return d, nil
}

// SetDeviceMetadata gives a device its own thing model (independentMetadata),
// validated and normalised as a product's is (normalModel).
func (s *Store) SetDeviceMetadata(ctx context.Context, id, metadata string, modifier User) error {
	if strings.TrimSpace(metadata) == "" {
		return schema.Invalid("metadata", "is required")
	}
	norm, err := normalModel(metadata)
	if err != nil {
		return err
	}
	return s.setDeviceMetadata(ctx, id, &norm, modifier)
}

// ResetDeviceMetadata drops a device's own thing model; its product's is in
// force again.
func (s *Store) ResetDeviceMetadata(ctx context.Context, id string, modifier User) error {
	return s.setDeviceMetadata(ctx, id, nil, modifier)
}

func (s *Store) setDeviceMetadata(ctx context.Context, id string, metadata *string, modifier User) error {
	defer s.pages.changed("devices", "product_device_counts") // once committed: the next page read sees it
	ctx, cancel := s.timeout(ctx)
	defer cancel()
	limit, limitArg := limitCond(ctx, "product_id", 5)
	res, err := s.db.ExecContext(ctx, `UPDATE devices SET metadata = $2, modify_time = `+nextModifyTime+`, modifier_id = $3,
		modifier_name = $4 WHERE id = $1 AND `+limit, id, metadata, modifier.ID, userName(modifier), limitArg)
	if err != nil {
		return fmt.Errorf("meta: device metadata: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("device %q: %w", schema.Truncate(id, 80), ErrNotFound)
	}
	return nil
}
