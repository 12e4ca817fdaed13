package meta

import (
	"bytes"
	"context"
	"database/sql"
	"devicehub/schema"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
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

// Device is a device list item (spec: Device (list item), endpoint 7);
// api's appendDevice writes it.
type Device struct {
	ID               string
	Name             string
	PhotoURL         string
	Description      string
	DeviceType       Enum
	ProductID        string
	ProductName      string
	State            Enum
	Edge             bool
	SuperDeviceType  Enum
	CreatorID        string
	CreatorName      string
	CreateTime       Millis
	RegistryTime     Millis
	ModifyTime       Millis
	ModifierID       string
	ModifierName     string
	Features         []DeviceFeature
	VirtualType      Enum
	Regulator        bool
	ComeFrom         Enum
	DeviceCreateType Enum
	PresetType       Enum
	CategoryType     Enum
	MediaDevice      bool
	// DeviceMetadata is the device's own thing model; absent while the
	// product's is in force.
	DeviceMetadata string
	Configuration  DeviceConfig
	OrgID          string
	StorePolicy    string
}

// DeviceDetail is a device with its product's fields (spec: Device
// (detail), endpoint 8).
type DeviceDetail struct {
	ID                  string
	Name                string
	Description         string
	ProductPhotoURL     string
	DevicePhotoURL      string
	Protocol            string
	ProtocolName        string
	Transport           string
	ProductID           string
	ProductName         string
	DeviceType          Enum
	State               Enum
	Address             string
	OnlineTime          Millis
	OfflineTime         Millis
	CreateTime          Millis
	RegisterTime        Millis
	ModifyTime          Millis
	Metadata            string // the thing model in force
	IndependentMetadata bool
	Configuration       DeviceConfig
	DeviceConfiguration json.RawMessage
	CachedConfiguration json.RawMessage
	AloneConfiguration  bool
	ConnectServerID     string
	Edge                bool
	Tags                []json.RawMessage
	Binds               []json.RawMessage
	Features            []DeviceFeature
	Relations           []DeviceRelation
	AccessID            string
	AccessProvider      string
	AccessName          string
	ClassifiedID        string
	ClassifiedName      string
	PresetType          Enum
	SuperDeviceType     Enum
	MediaDevice         bool
	Regulator           bool
	CreatorID           string
	CreatorName         string
	ModifierID          string
	ModifierName        string
	OrgID               string
	StorePolicy         string

	// LoginVersion is the row's login_version (schema/postgres/00009):
	// it grows with every change of what the broker must hold for it.
	LoginVersion int64
	// Login is the change of the broker's login that the write returning
	// this detail made; zero when it made none (schema: a new
	// login_version).
	Login LoginChange
}

// DeviceConfig is a device's connection configuration. Unlike a product's
// Configuration, the spec always shows channelId for a device. The key is
// masked whenever it leaves the store.
type DeviceConfig struct {
	SecureID  string
	SecureKey string
	ChannelID string
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

// deviceRow is what the device queries select; the list scans a subset
// (deviceList.dests), leaving the other fields zero.
type deviceRow struct {
	ID               string     `db:"id"`
	Name             string     `db:"name"`
	PhotoURL         string     `db:"photo_url"`
	Description      string     `db:"description"`
	ProductID        string     `db:"product_id"`
	State            string     `db:"state"`
	SuperDeviceType  string     `db:"super_device_type"`
	Edge             bool       `db:"edge"`
	MediaDevice      bool       `db:"media_device"`
	Features         []byte     `db:"features"`
	VirtualType      string     `db:"virtual_type"`
	ComeFrom         string     `db:"come_from"`
	DeviceCreateType string     `db:"device_create_type"`
	PresetType       string     `db:"preset_type"`
	CategoryType     string     `db:"category_type"`
	OwnModel         bool       `db:"own_model"` // the device has its own thing model
	SecureID         string     `db:"secure_id"`
	SecureKey        string     `db:"secure_key"`
	ChannelID        string     `db:"channel_id"`
	OrgID            string     `db:"org_id"`
	StorePolicy      string     `db:"store_policy"`
	CreatorID        string     `db:"creator_id"`
	CreatorName      string     `db:"creator_name"`
	ModifierID       string     `db:"modifier_id"`
	ModifierName     string     `db:"modifier_name"`
	CreatedAt        time.Time  `db:"create_time"`
	ModifiedAt       time.Time  `db:"modify_time"`
	RegistryTime     *time.Time `db:"registry_time"`
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
	LoginVersion    int64      `db:"login_version"`
}

const deviceListColumns = `d.id, d.name, d.photo_url, d.description, d.product_id, d.state, d.super_device_type,
	d.edge, d.media_device, d.features, d.virtual_type, d.come_from, d.device_create_type, d.preset_type,
	d.category_type, d.metadata IS NOT NULL AS own_model, d.secure_id, d.secure_key, d.channel_id, d.org_id,
	d.store_policy, d.creator_id, d.creator_name, d.modifier_id, d.modifier_name, d.create_time,
	d.modify_time, d.registry_time, p.name AS product_name, p.device_type, p.regulator`

const deviceDetailColumns = deviceListColumns + `,
	COALESCE(d.metadata, p.metadata) AS metadata, d.configuration, d.tags, d.binds, d.relations, d.address,
	d.connect_server_id, d.online_time, d.offline_time, p.photo_url AS product_photo_url,
	p.message_protocol, p.protocol_name, p.transport_protocol, p.access_id, p.access_provider,
	p.access_name, p.classified_id, p.classified_name, d.login_version`

// The FK guarantees the product row; a LEFT JOIN lets PostgreSQL drop the
// join from the count when no product column is filtered on.
const (
	deviceJoins = " LEFT JOIN products p ON p.id = d.product_id"
	deviceFrom  = "devices d" + deviceJoins
)

// deviceList is endpoint 7's statement, kept in the page cache; its
// total by state and product is read from the product counts
// (deviceTotal); dests follows deviceListColumns.
var deviceList = &List[deviceRow, Device]{
	res: DeviceResource,
	sql: ListSQL{
		Select: deviceListColumns,
		From:   "devices d",
		Joins:  deviceJoins,
		Where:  []string{"d.product_id = ANY(@products)"},
		Key:    "d.id",
	},
	cached: true,
	total:  deviceTotal,
	dests: func(r *deviceRow) []any {
		return []any{&r.ID, &r.Name, &r.PhotoURL, &r.Description, &r.ProductID, &r.State, &r.SuperDeviceType,
			&r.Edge, &r.MediaDevice, &r.Features, &r.VirtualType, &r.ComeFrom, &r.DeviceCreateType, &r.PresetType,
			&r.CategoryType, &r.OwnModel, &r.SecureID, &r.SecureKey, &r.ChannelID, &r.OrgID,
			&r.StorePolicy, &r.CreatorID, &r.CreatorName, &r.ModifierID, &r.ModifierName, &r.CreatedAt,
			&r.ModifiedAt, &r.RegistryTime, &r.ProductName, &r.DeviceType, &r.Regulator}
	},
	conv: (*deviceRow).device,
	bytes: func(d *Device) int {
		n := 800 + len(d.ID) + len(d.Name) + len(d.PhotoURL) + len(d.Description) + len(d.ProductID) + len(d.ProductName) +
			len(d.CreatorID) + len(d.CreatorName) + len(d.ModifierID) + len(d.ModifierName) + len(d.DeviceMetadata) +
			len(d.OrgID) + len(d.StorePolicy) + len(d.Configuration.SecureID) + len(d.Configuration.ChannelID)
		for _, f := range d.Features {
			n += 60 + len(f.ID) + len(f.Name) + len(f.Type)
		}
		return n * 3 / 2 // the item, and what a caller keeps with its page (api: its JSON, about n bytes)
	},
}

// deviceCountColumns are the columns of product_device_counts (schema
// 00007, 00015) that count the devices of each state.
var deviceCountColumns = map[string]string{
	StateOnline:    "online",
	StateOffline:   "offline",
	StateNotActive: "not_active",
}

// deviceTotal answers the number of devices matching terms from the
// product counts, exactly and without counting devices, when the counts
// answer them (deviceCountTerms); ok is false for other terms, which the
// list counts (or estimates).
func deviceTotal(ctx context.Context, s *Store, terms *Compiled) (n int, ok bool, err error) {
	state, product, ok := deviceCountTerms(terms)
	if !ok {
		return 0, false, nil
	}
	col := "devices"
	if state != nil {
		st, _ := state.(string)
		if col, ok = deviceCountColumns[st]; !ok {
			return 0, false, nil // a state no device is given: the list finds whether one has it
		}
	}
	ctx, cancel := s.timeout(ctx)
	defer cancel()
	q := "SELECT COALESCE(sum(" + col + "), 0) FROM product_device_counts"
	var args []any
	if product != nil {
		q += " WHERE product_id = $1"
		args = append(args, product)
	}
	if err := s.db.QueryRowContext(ctx, q, args...).Scan(&n); err != nil {
		return 0, false, fmt.Errorf("meta: count devices: %w", err)
	}
	return n, true, nil
}

// deviceCountTerms says whether the product counts answer terms: none,
// eq on state, eq on productId, or both, joined by and (in either order,
// in groups or not); state and product are the values of those present.
func deviceCountTerms(terms *Compiled) (state, product any, ok bool) {
	if !terms.Conjunctive {
		return nil, nil, false
	}
	for _, c := range terms.Conj {
		if c.TermType != "eq" || len(c.Args) != 1 {
			return nil, nil, false
		}
		v := terms.Args[c.Args[0]]
		switch {
		case c.Column == "state" && state == nil:
			state = v
		case c.Column == "productId" && product == nil:
			product = v
		default:
			return nil, nil, false
		}
	}
	return state, product, true
}

// jsonList decodes a JSONB array, giving [] rather than nil.
func jsonList[T any](raw []byte) []T {
	if string(raw) == "[]" {
		return []T{}
	}
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
		IndependentMetadata: r.OwnModel,
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
		LoginVersion:        r.LoginVersion,
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
		"id":         Natural("d.id"),
		"name":       Natural("d.name"),
		"state":      "d.state",
		"createTime": "d.create_time",
		"productId":  "d.product_id",
	},
	DefaultSort: "d.create_time DESC, d.id",
	TieBreak:    Natural("d.id"),
}

// QueryDevices answers endpoint 7 (see List.Query for its total). Its
// items carry no DeviceMetadata: a device's own thing model (up to
// schema.MaxThingModelBytes) is read for a page only when asked for,
// QueryDevicesWithModels, so that neither a page nor the page cache
// holds the models of every device listed.
func (s *Store) QueryDevices(ctx context.Context, q *Query) (Page[Device], error) {
	return deviceList.Query(ctx, s, q, nil)
}

// QueryDevicesWithModels is QueryDevices with each device's own thing
// model (DeviceMetadata), read for the page's devices after it. The page
// is a copy: the page cache's stays without models.
func (s *Store) QueryDevicesWithModels(ctx context.Context, q *Query) (Page[Device], error) {
	page, err := s.QueryDevices(ctx, q)
	if err != nil || len(page.Data) == 0 {
		return page, err
	}
	ids := make([]string, len(page.Data))
	for i := range page.Data {
		ids[i] = page.Data[i].ID
	}
	ctx, cancel := s.timeout(ctx)
	defer cancel()
	var rows []struct {
		ID       string `db:"id"`
		Metadata string `db:"metadata"`
	}
	if err := s.db.SelectContext(ctx, &rows, `SELECT id, metadata FROM devices WHERE id = ANY($1) AND metadata IS NOT NULL`,
		pq.StringArray(ids)); err != nil {
		return Page[Device]{}, fmt.Errorf("meta: device models: %w", err)
	}
	models := make(map[string]string, len(rows))
	for _, r := range rows {
		models[r.ID] = r.Metadata
	}
	out := Page[Device]{PageIndex: page.PageIndex, PageSize: page.PageSize, Total: page.Total, TotalExact: page.TotalExact,
		Data: slices.Clone(page.Data)}
	for i := range out.Data {
		out.Data[i].DeviceMetadata = models[out.Data[i].ID]
	}
	return out, nil
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
	if errors.Is(err, sql.ErrNoRows) || err == nil && !ProductAllowed(ctx, r.ProductID) {
		return DeviceDetail{}, fmt.Errorf("device %q: %w", schema.Truncate(id, 80), ErrNotFound)
	}
	if err != nil {
		return DeviceDetail{}, fmt.Errorf("meta: get device: %w", err)
	}
	return r.detail(), nil
}
