package meta

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/lib/pq"
)

// Device states. A device is created notActive, deploy makes it offline
// (ready to connect), and ingest moves it between offline and online.
const (
	StateNotActive = "notActive"
	StateOffline   = "offline"
	StateOnline    = "online"
)

// Device is a device list item (spec: Device (list item), endpoint 7).
type Device struct {
	ID               string          `json:"id"`
	Name             string          `json:"name"`
	PhotoURL         string          `json:"photoUrl"`
	Description      string          `json:"description"`
	DeviceType       Enum            `json:"deviceType"`
	ProductID        string          `json:"productId"`
	ProductName      string          `json:"productName"`
	State            Enum            `json:"state"`
	Edge             bool            `json:"edge"`
	SuperDeviceType  Enum            `json:"superDeviceType"`
	CreatorID        string          `json:"creatorId"`
	CreatorName      string          `json:"creatorName"`
	CreateTime       Millis          `json:"createTime"`
	RegistryTime     Millis          `json:"registryTime"`
	ModifyTime       Millis          `json:"modifyTime"`
	ModifierID       string          `json:"modifierId"`
	ModifierName     string          `json:"modifierName"`
	Features         []DeviceFeature `json:"features"`
	VirtualType      Enum            `json:"virtualType"`
	Regulator        bool            `json:"regulator"`
	ComeFrom         Enum            `json:"comeFrom"`
	DeviceCreateType Enum            `json:"deviceCreateType"`
	PresetType       Enum            `json:"presetType"`
	CategoryType     Enum            `json:"categoryType"`
	MediaDevice      bool            `json:"mediaDevice"`
	// DeviceMetadata is the device's own thing model; absent while the
	// product's is in force.
	DeviceMetadata string       `json:"deviceMetadata,omitempty"`
	Configuration  DeviceConfig `json:"configuration"`
	OrgID          string       `json:"orgId"`
	StorePolicy    string       `json:"storePolicy"`
}

// DeviceDetail is a device with its product's fields (spec: Device
// (detail), endpoint 8).
type DeviceDetail struct {
	ID                  string            `json:"id"`
	Name                string            `json:"name"`
	Description         string            `json:"description"`
	ProductPhotoURL     string            `json:"productPhotoUrl"`
	DevicePhotoURL      string            `json:"devicePhotoUrl"`
	Protocol            string            `json:"protocol"`
	ProtocolName        string            `json:"protocolName"`
	Transport           string            `json:"transport"`
	ProductID           string            `json:"productId"`
	ProductName         string            `json:"productName"`
	DeviceType          Enum              `json:"deviceType"`
	State               Enum              `json:"state"`
	Address             string            `json:"address"`
	OnlineTime          Millis            `json:"onlineTime"`
	OfflineTime         Millis            `json:"offlineTime"`
	CreateTime          Millis            `json:"createTime"`
	RegisterTime        Millis            `json:"registerTime"`
	ModifyTime          Millis            `json:"modifyTime"`
	Metadata            string            `json:"metadata"` // the thing model in force
	IndependentMetadata bool              `json:"independentMetadata"`
	Configuration       DeviceConfig      `json:"configuration"`
	DeviceConfiguration json.RawMessage   `json:"deviceConfiguration"`
	CachedConfiguration json.RawMessage   `json:"cachedConfiguration"`
	AloneConfiguration  bool              `json:"aloneConfiguration"`
	ConnectServerID     string            `json:"connectServerId"`
	Edge                bool              `json:"edge"`
	Tags                []json.RawMessage `json:"tags"`
	Binds               []json.RawMessage `json:"binds"`
	Features            []DeviceFeature   `json:"features"`
	Relations           []DeviceRelation  `json:"relations"`
	AccessID            string            `json:"accessId"`
	AccessProvider      string            `json:"accessProvider"`
	AccessName          string            `json:"accessName"`
	ClassifiedID        string            `json:"classifiedId"`
	ClassifiedName      string            `json:"classifiedName"`
	PresetType          Enum              `json:"presetType"`
	SuperDeviceType     Enum              `json:"superDeviceType"`
	MediaDevice         bool              `json:"mediaDevice"`
	Regulator           bool              `json:"regulator"`
	CreatorID           string            `json:"creatorId"`
	CreatorName         string            `json:"creatorName"`
	ModifierID          string            `json:"modifierId"`
	ModifierName        string            `json:"modifierName"`
	OrgID               string            `json:"orgId"`
	StorePolicy         string            `json:"storePolicy"`
}

// DeviceConfig is a device's connection configuration. Unlike a product's
// Configuration, the spec always shows channelId for a device. The key is
// masked whenever it leaves the store.
type DeviceConfig struct {
	SecureID  string `json:"secureId"`
	SecureKey string `json:"secureKey"`
	ChannelID string `json:"channelId"`
}

// DeviceFeature is one device feature. A bare string in a request is taken
// as its id and name.
type DeviceFeature struct {
	ID         string `json:"id"`
	Name       string `json:"name"`
	Deprecated bool   `json:"deprecated"`
	Type       string `json:"type"`
}

// UnmarshalJSON accepts "id" or {id, name, deprecated, type}.
func (f *DeviceFeature) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		*f = DeviceFeature{ID: s, Name: s}
		return nil
	}
	type plain DeviceFeature
	var p plain
	if err := json.Unmarshal(b, &p); err != nil {
		return err
	}
	*f = DeviceFeature(p)
	return nil
}

// DeviceRelation is one relation of a device to another object.
type DeviceRelation struct {
	ObjectID     string `json:"objectId"`
	Relation     string `json:"relation"`
	RelationName string `json:"relationName"`
}

// deviceRow is what the device queries select; the list selects a subset
// (sqlx leaves the other fields zero).
type deviceRow struct {
	ID               string         `db:"id"`
	Name             string         `db:"name"`
	PhotoURL         string         `db:"photo_url"`
	Description      string         `db:"description"`
	ProductID        string         `db:"product_id"`
	State            string         `db:"state"`
	SuperDeviceType  string         `db:"super_device_type"`
	Edge             bool           `db:"edge"`
	MediaDevice      bool           `db:"media_device"`
	Features         []byte         `db:"features"`
	VirtualType      string         `db:"virtual_type"`
	ComeFrom         string         `db:"come_from"`
	DeviceCreateType string         `db:"device_create_type"`
	PresetType       string         `db:"preset_type"`
	CategoryType     string         `db:"category_type"`
	OwnMetadata      sql.NullString `db:"own_metadata"`
	SecureID         string         `db:"secure_id"`
	SecureKey        string         `db:"secure_key"`
	ChannelID        string         `db:"channel_id"`
	OrgID            string         `db:"org_id"`
	StorePolicy      string         `db:"store_policy"`
	CreatorID        string         `db:"creator_id"`
	CreatorName      string         `db:"creator_name"`
	ModifierID       string         `db:"modifier_id"`
	ModifierName     string         `db:"modifier_name"`
	CreatedAt        time.Time      `db:"create_time"`
	ModifiedAt       time.Time      `db:"modify_time"`
	RegistryTime     *time.Time     `db:"registry_time"`
	// Product fields.
	ProductName string `db:"product_name"`
	DeviceType  string `db:"device_type"`
	Regulator   bool   `db:"regulator"`
	// Detail only.
	Metadata        string     `db:"metadata"`
	Configuration   []byte     `db:"configuration"`
	Tags            []byte     `db:"tags"`
	Binds           []byte     `db:"binds"`
	Relations       []byte     `db:"relations"`
	Address         string     `db:"address"`
	ConnectServerID string     `db:"connect_server_id"`
	OnlineTime      *time.Time `db:"online_time"`
	OfflineTime     *time.Time `db:"offline_time"`
	ProductPhotoURL string     `db:"product_photo_url"`
	Protocol        string     `db:"message_protocol"`
	ProtocolName    string     `db:"protocol_name"`
	Transport       string     `db:"transport_protocol"`
	AccessID        string     `db:"access_id"`
	AccessProvider  string     `db:"access_provider"`
	AccessName      string     `db:"access_name"`
	ClassifiedID    string     `db:"classified_id"`
	ClassifiedName  string     `db:"classified_name"`
}

const deviceListColumns = `d.id, d.name, d.photo_url, d.description, d.product_id, d.state, d.super_device_type,
	d.edge, d.media_device, d.features, d.virtual_type, d.come_from, d.device_create_type, d.preset_type,
	d.category_type, d.metadata AS own_metadata, d.secure_id, d.secure_key, d.channel_id, d.org_id,
	d.store_policy, d.creator_id, d.creator_name, d.modifier_id, d.modifier_name, d.create_time,
	d.modify_time, d.registry_time, p.name AS product_name, p.device_type, p.regulator`

const deviceDetailColumns = deviceListColumns + `,
	COALESCE(d.metadata, p.metadata) AS metadata, d.configuration, d.tags, d.binds, d.relations, d.address,
	d.connect_server_id, d.online_time, d.offline_time, p.photo_url AS product_photo_url,
	p.message_protocol, p.protocol_name, p.transport_protocol, p.access_id, p.access_provider,
	p.access_name, p.classified_id, p.classified_name`

// The FK guarantees the product row; a LEFT JOIN lets PostgreSQL drop the
// join from the count when no product column is filtered on.
const deviceFrom = "devices d LEFT JOIN products p ON p.id = d.product_id"

// jsonList decodes a JSONB array, giving [] rather than nil.
func jsonList[T any](raw []byte) []T {
	var out []T
	if len(raw) > 0 {
		_ = json.Unmarshal(raw, &out) // the column only ever holds arrays written by this package
	}
	if out == nil {
		out = []T{}
	}
	return out
}

func (r *deviceRow) config() DeviceConfig {
	return DeviceConfig{SecureID: r.SecureID, SecureKey: MaskSecret(r.SecureKey), ChannelID: r.ChannelID}
}

func (r *deviceRow) device() Device {
	return Device{
		ID:               r.ID,
		Name:             r.Name,
		PhotoURL:         r.PhotoURL,
		Description:      r.Description,
		DeviceType:       Enum(r.DeviceType),
		ProductID:        r.ProductID,
		ProductName:      r.ProductName,
		State:            Enum(r.State),
		Edge:             r.Edge,
		SuperDeviceType:  Enum(r.SuperDeviceType),
		CreatorID:        r.CreatorID,
		CreatorName:      r.CreatorName,
		CreateTime:       Millis(r.CreatedAt),
		RegistryTime:     NullMillis(r.RegistryTime),
		ModifyTime:       Millis(r.ModifiedAt),
		ModifierID:       r.ModifierID,
		ModifierName:     r.ModifierName,
		Features:         jsonList[DeviceFeature](r.Features),
		VirtualType:      Enum(r.VirtualType),
		Regulator:        r.Regulator,
		ComeFrom:         Enum(r.ComeFrom),
		DeviceCreateType: Enum(r.DeviceCreateType),
		PresetType:       Enum(r.PresetType),
		CategoryType:     Enum(r.CategoryType),
		MediaDevice:      r.MediaDevice,
		DeviceMetadata:   r.OwnMetadata.String,
		Configuration:    r.config(),
		OrgID:            r.OrgID,
		StorePolicy:      r.StorePolicy,
	}
}

func (r *deviceRow) detail() DeviceDetail {
	conf := json.RawMessage(r.Configuration)
	if len(bytes.TrimSpace(conf)) == 0 {
		conf = json.RawMessage("{}")
	}
	return DeviceDetail{
		ID:                  r.ID,
		Name:                r.Name,
		Description:         r.Description,
		ProductPhotoURL:     r.ProductPhotoURL,
		DevicePhotoURL:      r.PhotoURL,
		Protocol:            r.Protocol,
		ProtocolName:        r.ProtocolName,
		Transport:           r.Transport,
		ProductID:           r.ProductID,
		ProductName:         r.ProductName,
		DeviceType:          Enum(r.DeviceType),
		State:               Enum(r.State),
		Address:             r.Address,
		OnlineTime:          NullMillis(r.OnlineTime),
		OfflineTime:         NullMillis(r.OfflineTime),
		CreateTime:          Millis(r.CreatedAt),
		RegisterTime:        NullMillis(r.RegistryTime),
		ModifyTime:          Millis(r.ModifiedAt),
		Metadata:            r.Metadata,
		IndependentMetadata: r.OwnMetadata.Valid,
		Configuration:       r.config(),
		DeviceConfiguration: conf,
		// No session cache exists apart from the stored map: what is
		// configured is what is in effect.
		CachedConfiguration: conf,
		AloneConfiguration:  string(bytes.TrimSpace(conf)) != "{}",
		ConnectServerID:     r.ConnectServerID,
		Edge:                r.Edge,
		Tags:                jsonList[json.RawMessage](r.Tags),
		Binds:               jsonList[json.RawMessage](r.Binds),
		Features:            jsonList[DeviceFeature](r.Features),
		Relations:           jsonList[DeviceRelation](r.Relations),
		AccessID:            r.AccessID,
		AccessProvider:      r.AccessProvider,
		AccessName:          r.AccessName,
		ClassifiedID:        r.ClassifiedID,
		ClassifiedName:      r.ClassifiedName,
		PresetType:          Enum(r.PresetType),
		SuperDeviceType:     Enum(r.SuperDeviceType),
		MediaDevice:         r.MediaDevice,
		Regulator:           r.Regulator,
		CreatorID:           r.CreatorID,
		CreatorName:         r.CreatorName,
		ModifierID:          r.ModifierID,
		ModifierName:        r.ModifierName,
		OrgID:               r.OrgID,
		StorePolicy:         r.StorePolicy,
	}
}

// DeviceResource is the whitelist of device query columns (the spec's
// id, name, productId, state, superDeviceType, deviceType, classifiedId,
// plus createTime) and sorts.
var DeviceResource = &Resource{
	Name: "device",
	Columns: map[string]Column{
		"id":              {Expr: "d.id", Kind: KindText},
		"name":            {Expr: "d.name", Kind: KindText},
		"productId":       {Expr: "d.product_id", Kind: KindText},
		"state":           {Expr: "d.state", Kind: KindText},
		"superDeviceType": {Expr: "d.super_device_type", Kind: KindText},
		"deviceType":      {Expr: "p.device_type", Kind: KindText},
		"classifiedId":    {Expr: "p.classified_id", Kind: KindText},
		"createTime":      {Expr: "d.create_time", Kind: KindTime},
	},
	Sorts: map[string]string{
		"id":         "d.id",
		"name":       "d.name",
		"state":      "d.state",
		"createTime": "d.create_time",
		"productId":  "d.product_id",
	},
	DefaultSort: "d.create_time DESC, d.id",
	TieBreak:    "d.id",
}

// QueryDevices answers endpoint 7.
func (s *Store) QueryDevices(ctx context.Context, q *Query) (Page[Device], error) {
	return queryPage(ctx, s, DeviceResource, q, deviceListColumns, deviceFrom, (*deviceRow).device)
}

// GetDeviceDetail answers endpoint 8.
func (s *Store) GetDeviceDetail(ctx context.Context, id string) (DeviceDetail, error) {
	ctx, cancel := s.timeout(ctx)
	defer cancel()
	return s.getDeviceDetail(ctx, s.db, id, false)
}

func (s *Store) getDeviceDetail(ctx context.Context, q queryer, id string, forUpdate bool) (DeviceDetail, error) {
	var r deviceRow
	lock := ""
	if forUpdate {
		lock = " FOR UPDATE OF d"
	}
	err := q.GetContext(ctx, &r, "SELECT "+deviceDetailColumns+" FROM "+deviceFrom+" WHERE d.id = $1"+lock, id)
	if errors.Is(err, sql.ErrNoRows) {
		return DeviceDetail{}, fmt.Errorf("device %q: %w", truncate(id, 80), ErrNotFound)
	}
	if err != nil {
		return DeviceDetail{}, fmt.Errorf("meta: get device: %w", err)
	}
	return r.detail(), nil
}

// DeviceConfigInput is the configuration a client may send. An empty or
// masked secureKey keeps the stored key (clients echo the masked detail).
type DeviceConfigInput struct {
	SecureID  *string `json:"secureId"`
	SecureKey *string `json:"secureKey"`
	ChannelID *string `json:"channelId"`
}

// NewDevice is the body of POST /api/device/instance.
type NewDevice struct {
	ID                  string             `json:"id"`
	Name                string             `json:"name"`
	ProductID           string             `json:"productId"`
	PhotoURL            string             `json:"photoUrl"`
	Description         string             `json:"description"`
	Features            []DeviceFeature    `json:"features"`
	Configuration       *DeviceConfigInput `json:"configuration"`
	DeviceConfiguration json.RawMessage    `json:"deviceConfiguration"`
	Tags                json.RawMessage    `json:"tags"`
	Relations           []DeviceRelation   `json:"relations"`
	OrgID               string             `json:"orgId"`
	StorePolicy         string             `json:"storePolicy"`
	Edge                bool               `json:"edge"`
	MediaDevice         bool               `json:"mediaDevice"`
}

// Field limits of devices.
const (
	maxDeviceFeatures  = 64
	maxDeviceRelations = 256
	maxDeviceTags      = 256
	maxDeviceConfigLen = 64 << 10
)

type textCheck struct {
	field, v string
	max      int
	required bool
}

func checkTexts(cs []textCheck) error {
	for _, c := range cs {
		if err := checkText(c.field, c.v, c.max, c.required); err != nil {
			return err
		}
	}
	return nil
}

func checkFeatures(fs []DeviceFeature) error {
	if len(fs) > maxDeviceFeatures {
		return Invalid("features", "must have at most %d items", maxDeviceFeatures)
	}
	for i, f := range fs {
		p := "features[" + strconv.Itoa(i) + "]"
		if err := checkTexts([]textCheck{
			{p + ".id", f.ID, 64, true}, {p + ".name", f.Name, 128, false}, {p + ".type", f.Type, 64, false},
		}); err != nil {
			return err
		}
	}
	return nil
}

func checkRelations(rs []DeviceRelation) error {
	if len(rs) > maxDeviceRelations {
		return Invalid("relations", "must have at most %d items", maxDeviceRelations)
	}
	for i, r := range rs {
		p := "relations[" + strconv.Itoa(i) + "]"
		if err := checkTexts([]textCheck{
			{p + ".objectId", r.ObjectID, 64, true}, {p + ".relation", r.Relation, 64, true},
			{p + ".relationName", r.RelationName, 128, false},
		}); err != nil {
			return err
		}
	}
	return nil
}

// jsonObject checks that raw is a JSON object (null or absent gives {}).
func jsonObject(field string, raw json.RawMessage) ([]byte, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return []byte("{}"), nil
	}
	if len(raw) > maxDeviceConfigLen {
		return nil, Invalid(field, "must be at most %d bytes", maxDeviceConfigLen)
	}
	var m map[string]json.RawMessage
	if raw[0] != '{' || json.Unmarshal(raw, &m) != nil {
		return nil, Invalid(field, "must be an object")
	}
	return raw, nil
}

// jsonArray checks that raw is a JSON array of at most max items (null or
// absent gives []).
func jsonArray(field string, raw json.RawMessage, max int) ([]byte, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return []byte("[]"), nil
	}
	var a []json.RawMessage
	if raw[0] != '[' || json.Unmarshal(raw, &a) != nil {
		return nil, Invalid(field, "must be an array")
	}
	if len(a) > max {
		return nil, Invalid(field, "must have at most %d items", max)
	}
	return raw, nil
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // only plain structs and slices are marshalled here
	}
	return b
}

func (c *DeviceConfigInput) check() error {
	if c == nil {
		return nil
	}
	for _, t := range []struct {
		field string
		v     *string
	}{{"configuration.secureId", c.SecureID}, {"configuration.secureKey", c.SecureKey}, {"configuration.channelId", c.ChannelID}} {
		if t.v != nil {
			if err := checkText(t.field, *t.v, 128, false); err != nil {
				return err
			}
		}
	}
	return nil
}

// newKey reports the secure key to store from a request: "" keeps the
// stored one (or generates one on creation).
func (c *DeviceConfigInput) newKey() string {
	if c == nil || c.SecureKey == nil || *c.SecureKey == MaskSecret(*c.SecureKey) {
		return ""
	}
	return *c.SecureKey
}

func userName(u User) string {
	if u.Name != "" {
		return u.Name
	}
	return u.Username
}

// CreateDevice creates a device of an existing product, in state notActive,
// with a generated secure key unless one is given. An unknown product is
// ErrNotFound; a taken id is ErrDuplicateKey.
func (s *Store) CreateDevice(ctx context.Context, n NewDevice, creator User) (DeviceDetail, error) {
	if n.ID != "" {
		if err := checkID("id", n.ID); err != nil {
			return DeviceDetail{}, err
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
		return DeviceDetail{}, err
	}
	if err := checkFeatures(n.Features); err != nil {
		return DeviceDetail{}, err
	}
	if err := checkRelations(n.Relations); err != nil {
		return DeviceDetail{}, err
	}
	if err := n.Configuration.check(); err != nil {
		return DeviceDetail{}, err
	}
	conf, err := jsonObject("deviceConfiguration", n.DeviceConfiguration)
	if err != nil {
		return DeviceDetail{}, err
	}
	tags, err := jsonArray("tags", n.Tags, maxDeviceTags)
	if err != nil {
		return DeviceDetail{}, err
	}
	if n.ID == "" {
		n.ID = NewID()
	}
	secureID, channelID, secureKey := n.ID, "", n.Configuration.newKey()
	if c := n.Configuration; c != nil {
		if c.SecureID != nil && *c.SecureID != "" {
			secureID = *c.SecureID
		}
		if c.ChannelID != nil {
			channelID = *c.ChannelID
		}
	}
	if secureKey == "" {
		secureKey = newSecret()
	}
	if n.Features == nil {
		n.Features = []DeviceFeature{}
	}
	if n.Relations == nil {
		n.Relations = []DeviceRelation{}
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
		n.ID, n.Name, n.PhotoURL, n.Description, mustJSON(n.Features), mustJSON(n.Relations), tags, conf,
		secureID, secureKey, channelID, n.OrgID, n.StorePolicy, n.Edge, n.MediaDevice, StateNotActive,
		creator.ID, userName(creator), n.ProductID)
	switch {
	case isSecureIDTaken(err):
		return DeviceDetail{}, fmt.Errorf("configuration.secureId %q is another device's: %w", truncate(secureID, 80), ErrDuplicateKey)
	case isUniqueViolation(err):
		return DeviceDetail{}, fmt.Errorf("device %q: %w", n.ID, ErrDuplicateKey)
	case isForeignKeyViolation(err): // the product was deleted meanwhile
		return DeviceDetail{}, fmt.Errorf("product %q: %w", truncate(n.ProductID, 80), ErrNotFound)
	case err != nil:
		return DeviceDetail{}, fmt.Errorf("meta: create device: %w", err)
	}
	if k, _ := res.RowsAffected(); k == 0 {
		return DeviceDetail{}, fmt.Errorf("product %q: %w", truncate(n.ProductID, 80), ErrNotFound)
	}
	d, err := s.getDeviceDetail(ctx, s.db, n.ID, false)
	if err != nil {
		return DeviceDetail{}, err
	}
	d.Configuration.SecureKey = secureKey // shown once, to its creator
	return d, nil
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

// DevicePatch is the body of PUT /api/device/instance/{id}. Fields left out
// keep their stored value. A client may send the whole detail back: id and
// productId are accepted when they match, since a device cannot move to
// another product.
type DevicePatch struct {
	ID                  *string            `json:"id"`
	ProductID           *string            `json:"productId"`
	Name                *string            `json:"name"`
	PhotoURL            *string            `json:"photoUrl"`
	DevicePhotoURL      *string            `json:"devicePhotoUrl"`
	Description         *string            `json:"description"`
	Features            *[]DeviceFeature   `json:"features"`
	Configuration       *DeviceConfigInput `json:"configuration"`
	DeviceConfiguration json.RawMessage    `json:"deviceConfiguration"`
	Tags                json.RawMessage    `json:"tags"`
	Relations           *[]DeviceRelation  `json:"relations"`
	OrgID               *string            `json:"orgId"`
	StorePolicy         *string            `json:"storePolicy"`
	Edge                *bool              `json:"edge"`
	MediaDevice         *bool              `json:"mediaDevice"`
	// ModifyTime, when given (the detail's, sent back), makes the update
	// conditional: ErrConflict if the device changed since.
	ModifyTime *int64 `json:"modifyTime"`
}

// UpdateDevice applies a DevicePatch and returns the updated device.
func (s *Store) UpdateDevice(ctx context.Context, id string, p DevicePatch, modifier User) (DeviceDetail, error) {
	if p.ID != nil && *p.ID != "" && *p.ID != id {
		return DeviceDetail{}, Invalid("id", "does not match the path (%q)", truncate(id, 80))
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
		return DeviceDetail{}, Invalid("name", "must not be empty")
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
		if err := c.check(); err != nil {
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
			truncate(id, 80), have, ErrConflict)
	}
	if p.ProductID != nil && *p.ProductID != "" && *p.ProductID != cur.ProductID {
		return DeviceDetail{}, Invalid("productId", "cannot be changed (device %q belongs to product %q)", truncate(id, 80), cur.ProductID)
	}
	if _, err := tx.ExecContext(ctx, "UPDATE devices SET "+strings.Join(sets, ", ")+" WHERE id = $1", args...); err != nil {
		if isSecureIDTaken(err) {
			return DeviceDetail{}, fmt.Errorf("configuration.secureId %q is another device's: %w", truncate(*p.Configuration.SecureID, 80), ErrDuplicateKey)
		}
		return DeviceDetail{}, fmt.Errorf("meta: update device: %w", err)
	}
	d, err := s.getDeviceDetail(ctx, tx, id, false)
	if err != nil {
		return DeviceDetail{}, err
	}
	return d, tx.Commit()
}

// ErrDeviceDeployed refuses deleting a device that is not notActive.
var ErrDeviceDeployed = &ArgError{Field: "id", Msg: "device is deployed; undeploy it first"}

// DeleteDevice deletes an undeployed (notActive) device and returns what was
// deleted; a deployed one is refused and nothing is deleted.
func (s *Store) DeleteDevice(ctx context.Context, id string) (DeviceDetail, error) {
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
var ErrProductNotDeployed = &ArgError{Field: "productId", Msg: "the device's product is not deployed; deploy the product first"}

// DeployDevice moves a notActive device to offline, ready to connect, and
// sets its registry time. A device already deployed is left as it is. The
// product must be deployed (state 1).
func (s *Store) DeployDevice(ctx context.Context, id string, modifier User) (DeviceDetail, error) {
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
	}
	// FOR SHARE OF p keeps the product from being undeployed meanwhile.
	err = tx.GetContext(ctx, &cur, `SELECT d.state, p.state AS product_state FROM devices d
		JOIN products p ON p.id = d.product_id WHERE d.id = $1 FOR UPDATE OF d FOR SHARE OF p`, id)
	if errors.Is(err, sql.ErrNoRows) {
		return DeviceDetail{}, fmt.Errorf("device %q: %w", truncate(id, 80), ErrNotFound)
	}
	if err != nil {
		return DeviceDetail{}, fmt.Errorf("meta: deploy device: %w", err)
	}
	if cur.ProductState != 1 {
		return DeviceDetail{}, ErrProductNotDeployed
	}
	if cur.State == StateNotActive {
		if _, err := tx.ExecContext(ctx, `UPDATE devices SET state = $2, registry_time = now(), modify_time = now(),
			modifier_id = $3, modifier_name = $4 WHERE id = $1`, id, StateOffline, modifier.ID, userName(modifier)); err != nil {
			return DeviceDetail{}, fmt.Errorf("meta: deploy device: %w", err)
		}
	}
	d, err := s.getDeviceDetail(ctx, tx, id, false)
	if err != nil {
		return DeviceDetail{}, err
	}
	return d, tx.Commit()
}

// UndeployDevice moves a device of any state back to notActive; ingest then
// ignores its state messages until it is deployed again.
func (s *Store) UndeployDevice(ctx context.Context, id string, modifier User) (DeviceDetail, error) {
	ctx, cancel := s.timeout(ctx)
	defer cancel()
	res, err := s.db.ExecContext(ctx, `UPDATE devices SET state = $2, registry_time = NULL, modify_time = now(),
		modifier_id = $3, modifier_name = $4 WHERE id = $1`, id, StateNotActive, modifier.ID, userName(modifier))
	if err != nil {
		return DeviceDetail{}, fmt.Errorf("meta: undeploy device: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return DeviceDetail{}, fmt.Errorf("device %q: %w", truncate(id, 80), ErrNotFound)
	}
	return s.getDeviceDetail(ctx, s.db, id, false)
}

// SetDeviceMetadata gives a device its own thing model (independentMetadata).
// metadata must already be validated and normalised (schema package).
func (s *Store) SetDeviceMetadata(ctx context.Context, id, metadata string, modifier User) error {
	if strings.TrimSpace(metadata) == "" {
		return Invalid("metadata", "is required")
	}
	return s.setDeviceMetadata(ctx, id, &metadata, modifier)
}

// ResetDeviceMetadata drops a device's own thing model; its product's is in
// force again.
func (s *Store) ResetDeviceMetadata(ctx context.Context, id string, modifier User) error {
	return s.setDeviceMetadata(ctx, id, nil, modifier)
}

func (s *Store) setDeviceMetadata(ctx context.Context, id string, metadata *string, modifier User) error {
	ctx, cancel := s.timeout(ctx)
	defer cancel()
	res, err := s.db.ExecContext(ctx, `UPDATE devices SET metadata = $2, modify_time = now(), modifier_id = $3,
		modifier_name = $4 WHERE id = $1`, id, metadata, modifier.ID, userName(modifier))
	if err != nil {
		return fmt.Errorf("meta: device metadata: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("device %q: %w", truncate(id, 80), ErrNotFound)
	}
	return nil
}

// DeviceStatus is what ingest checks on every message of a device.
type DeviceStatus struct {
	ProductID, State string
}

// DeviceStatuses returns, in one query, the status of each of ids that
// exists; ids that do not are absent from the map.
func (s *Store) DeviceStatuses(ctx context.Context, ids []string) (map[string]DeviceStatus, error) {
	ctx, cancel := s.timeout(ctx)
	defer cancel()
	rows, err := s.db.QueryContext(ctx, `SELECT id, product_id, state FROM devices WHERE id = ANY($1)`, pq.StringArray(ids))
	if err != nil {
		return nil, fmt.Errorf("meta: device statuses: %w", err)
	}
	defer rows.Close()
	out := make(map[string]DeviceStatus, len(ids))
	for rows.Next() {
		var id string
		var st DeviceStatus
		if err := rows.Scan(&id, &st.ProductID, &st.State); err != nil {
			return nil, fmt.Errorf("meta: device statuses: %w", err)
		}
		out[id] = st
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("meta: device statuses: %w", err)
	}
	return out, nil
}

// DeviceRef is what ingest and commands need to know about a device.
type DeviceRef struct {
	ID, ProductID, State string
	Regulator            bool   // the product is a controller
	Metadata             string // the thing model in force
	Name, ProductName    string
	CreatorID            string
}

// GetDeviceRef returns a device's reference, or ErrNotFound.
func (s *Store) GetDeviceRef(ctx context.Context, id string) (DeviceRef, error) {
	ctx, cancel := s.timeout(ctx)
	defer cancel()
	var r struct {
		ID          string `db:"id"`
		ProductID   string `db:"product_id"`
		State       string `db:"state"`
		Regulator   bool   `db:"regulator"`
		Metadata    string `db:"metadata"`
		Name        string `db:"name"`
		ProductName string `db:"product_name"`
		CreatorID   string `db:"creator_id"`
	}
	err := s.db.GetContext(ctx, &r, `SELECT d.id, d.product_id, d.state, p.regulator,
		COALESCE(d.metadata, p.metadata) AS metadata, d.name, p.name AS product_name, d.creator_id
		FROM devices d JOIN products p ON p.id = d.product_id WHERE d.id = $1`, id)
	if errors.Is(err, sql.ErrNoRows) {
		return DeviceRef{}, fmt.Errorf("device %q: %w", truncate(id, 80), ErrNotFound)
	}
	if err != nil {
		return DeviceRef{}, fmt.Errorf("meta: device ref: %w", err)
	}
	return DeviceRef(r), nil
}

// StateChange is one connection event of a device, from ingest.
type StateChange struct {
	DeviceID string
	Online   bool
	At       time.Time
	Address  string // remote address, for online changes; "" keeps the stored one
}

// ApplyStateChanges writes a batch of state changes in one transaction: online
// sets state online and online_time (and address), offline sets state
// offline and offline_time. Devices in state notActive are left alone, and
// so is a change older than the device's last online or offline time
// (out-of-order delivery). Of several changes of one device in the batch
// the latest wins (the later in the slice on equal times). It returns the
// number of devices changed.
func (s *Store) ApplyStateChanges(ctx context.Context, changes []StateChange) (int, error) {
	if len(changes) == 0 {
		return 0, nil
	}
	ids := make([]string, len(changes))
	online := make([]bool, len(changes))
	at := make([]string, len(changes))
	addr := make([]string, len(changes))
	for i, c := range changes {
		ids[i], online[i], addr[i] = c.DeviceID, c.Online, c.Address
		at[i] = c.At.UTC().Format(time.RFC3339Nano)
	}
	ctx, cancel := s.timeout(ctx)
	defer cancel()
	tx, err := s.db.BeginTxx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("meta: apply state changes: %w", err)
	}
	defer tx.Rollback()
	// Lock the rows in id order first: the UPDATE's join visits them in no
	// set order, and two ingest instances updating overlapping batches
	// would otherwise deadlock.
	if _, err := tx.ExecContext(ctx, `SELECT 1 FROM devices WHERE id = ANY($1) ORDER BY id FOR NO KEY UPDATE`,
		pq.StringArray(ids)); err != nil {
		return 0, fmt.Errorf("meta: apply state changes: %w", err)
	}
	res, err := tx.ExecContext(ctx, `UPDATE devices d SET
			state = CASE WHEN c.online THEN 'online' ELSE 'offline' END,
			online_time = CASE WHEN c.online THEN c.at ELSE d.online_time END,
			offline_time = CASE WHEN c.online THEN d.offline_time ELSE c.at END,
			address = CASE WHEN c.online AND c.address <> '' THEN c.address ELSE d.address END
		FROM (SELECT DISTINCT ON (id) id, online, at, address
			FROM unnest($1::text[], $2::bool[], $3::timestamptz[], $4::text[]) WITH ORDINALITY AS u(id, online, at, address, n)
			ORDER BY id, at DESC, n DESC) c
		WHERE d.id = c.id AND d.state <> 'notActive'
			AND c.at >= COALESCE(GREATEST(d.online_time, d.offline_time), '-infinity'::timestamptz)`,
		pq.StringArray(ids), pq.BoolArray(online), pq.StringArray(at), pq.StringArray(addr))
	if err != nil {
		return 0, fmt.Errorf("meta: apply state changes: %w", err)
	}
	n, _ := res.RowsAffected()
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("meta: apply state changes: %w", err)
	}
	return int(n), nil
}
