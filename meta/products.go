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

// DefaultProductPhoto is the platform's built-in product icon.
const DefaultProductPhoto = "/images/device-product.png"

// Product is a device template (spec: Product); api's appendProduct
// writes it.
type Product struct {
	ID                  string        `db:"id"`
	Name                string        `db:"name"`
	PhotoURL            string        `db:"photo_url"`
	ClassifiedID        string        `db:"classified_id"`
	ClassifiedName      string        `db:"classified_name"`
	MessageProtocol     string        `db:"message_protocol"`
	ProtocolName        string        `db:"protocol_name"`
	Metadata            string        `db:"metadata"`
	TransportProtocol   string        `db:"transport_protocol"`
	DeviceType          Enum          `db:"device_type"`
	Configuration       Configuration `db:"-"`
	State               int           `db:"state"`
	CreatorID           string        `db:"creator_id"`
	ModifierID          string        `db:"modifier_id"`
	CreateTime          Millis        `db:"-"`
	ModifyTime          Millis        `db:"-"`
	Regulator           bool          `db:"regulator"`
	AccessID            string        `db:"access_id"`
	AccessProvider      string        `db:"access_provider"`
	AccessName          string        `db:"access_name"`
	StorePolicy         string        `db:"store_policy"`
	OrgID               string        `db:"org_id"`
	SuperProductType    Enum          `db:"super_product_type"`
	VirtualType         Enum          `db:"virtual_type"`
	ProductCreateType   Enum          `db:"product_create_type"`
	PresetType          Enum          `db:"preset_type"`
	ThreeDimensionalURL string        `db:"three_dimensional_url"`
	ModelFrom           string        `db:"model_from"`
	DeviceNum           int           `db:"device_num"`
	Manufacturer        string        `db:"manufacturer"`
	Describe            string        `db:"describe"`
	Model               string        `db:"model"`
	// OutsideModelPolicy is what ingest does with a reported value
	// outside the thing model: OutsideKeep or OutsideDrop.
	OutsideModelPolicy Enum `db:"outside_model_policy"`
}

// Configuration is a product's protocol configuration. The key is masked
// whenever it leaves the store.
type Configuration struct {
	SecureID  string
	SecureKey string
	ChannelID string
}

// productRow adds the columns Product shows in another form.
type productRow struct {
	Product
	SecureID   string    `db:"secure_id"`
	SecureKey  string    `db:"secure_key"`
	CreatedAt  time.Time `db:"create_time"`
	ModifiedAt time.Time `db:"modify_time"`
}

func (r *productRow) product() Product {
	p := r.Product
	p.Configuration = Configuration{SecureID: r.SecureID, SecureKey: MaskSecret(r.SecureKey)}
	p.CreateTime = Millis(r.CreatedAt)
	p.ModifyTime = Millis(r.ModifiedAt)
	return p
}

const productColumns = `p.id, p.name, p.photo_url, p.classified_id, p.classified_name, p.message_protocol,
	p.protocol_name, p.metadata, p.transport_protocol, p.device_type, p.secure_id, p.secure_key, p.state,
	p.creator_id, p.modifier_id, p.create_time, p.modify_time, p.regulator, p.access_id, p.access_provider,
	p.access_name, p.store_policy, p.org_id, p.super_product_type, p.virtual_type, p.product_create_type,
	p.preset_type, p.three_dimensional_url, p.model_from, p.manufacturer, p.describe, p.model, p.outside_model_policy,
	COALESCE((SELECT pc.devices FROM product_device_counts pc WHERE pc.product_id = p.id), 0) AS device_num`

// productList is endpoint 1's statement, kept in the page cache; dests
// follows productColumns.
var productList = &List[productRow, Product]{
	res: ProductResource,
	sql: ListSQL{
		Select: productColumns,
		From:   "products p",
		Where:  []string{"p.id = ANY(@products)"},
		Key:    "p.id",
	},
	cached: true,
	dests: func(r *productRow) []any {
		return []any{&r.ID, &r.Name, &r.PhotoURL, &r.ClassifiedID, &r.ClassifiedName, &r.MessageProtocol,
			&r.ProtocolName, &r.Metadata, &r.TransportProtocol, (*string)(&r.DeviceType), &r.SecureID, &r.SecureKey, &r.State,
			&r.CreatorID, &r.ModifierID, &r.CreatedAt, &r.ModifiedAt, &r.Regulator, &r.AccessID, &r.AccessProvider,
			&r.AccessName, &r.StorePolicy, &r.OrgID, (*string)(&r.SuperProductType), (*string)(&r.VirtualType), (*string)(&r.ProductCreateType),
			(*string)(&r.PresetType), &r.ThreeDimensionalURL, &r.ModelFrom, &r.Manufacturer, &r.Describe, &r.Model,
			(*string)(&r.OutsideModelPolicy), &r.DeviceNum}
	},
	conv: (*productRow).product,
	bytes: func(p *Product) int {
		n := 750 + len(p.ID) + len(p.Name) + len(p.PhotoURL) + len(p.ClassifiedID) + len(p.ClassifiedName) +
			len(p.MessageProtocol) + len(p.ProtocolName) + len(p.Metadata) + len(p.TransportProtocol) +
			len(p.CreatorID) + len(p.ModifierID) + len(p.AccessID) + len(p.AccessProvider) + len(p.AccessName) +
			len(p.StorePolicy) + len(p.OrgID) + len(p.ThreeDimensionalURL) + len(p.ModelFrom) + len(p.Manufacturer) +
			len(p.Describe) + len(p.Model) + len(p.Configuration.SecureID)
		return n * 3 / 2 // the item, and what a caller keeps with its page (api: its JSON, about n bytes)
	},
}

// ProductResource is the whitelist of product query columns and sorts.
var ProductResource = &Resource{
	Name: "product",
	Columns: map[string]Column{
		"id":                {Expr: "p.id", Kind: KindText},
		"name":              {Expr: "p.name", Kind: KindText},
		"classifiedId":      {Expr: "p.classified_id", Kind: KindText},
		"classifiedName":    {Expr: "p.classified_name", Kind: KindText},
		"messageProtocol":   {Expr: "p.message_protocol", Kind: KindText},
		"transportProtocol": {Expr: "p.transport_protocol", Kind: KindText},
		"deviceType":        {Expr: "p.device_type", Kind: KindText},
		"state":             {Expr: "p.state", Kind: KindInt},
		"creatorId":         {Expr: "p.creator_id", Kind: KindText},
		"createTime":        {Expr: "p.create_time", Kind: KindTime},
		"modifyTime":        {Expr: "p.modify_time", Kind: KindTime},
		"accessId":          {Expr: "p.access_id", Kind: KindText},
		"accessProvider":    {Expr: "p.access_provider", Kind: KindText},
		"orgId":             {Expr: "p.org_id", Kind: KindText},
		"superProductType":  {Expr: "p.super_product_type", Kind: KindText},
		"virtualType":       {Expr: "p.virtual_type", Kind: KindText},
		"productCreateType": {Expr: "p.product_create_type", Kind: KindText},
		"presetType":        {Expr: "p.preset_type", Kind: KindText},
		"regulator":         {Expr: "p.regulator", Kind: KindBool},
		"manufacturer":      {Expr: "p.manufacturer", Kind: KindText},
		"modelFrom":         {Expr: "p.model_from", Kind: KindText},

		// What ingest does with values outside the thing model.
		"outsideModelPolicy": {Expr: "p.outside_model_policy", Kind: KindText},
	},
	Sorts: map[string]string{
		"id":         Natural("p.id"),
		"name":       Natural("p.name"),
		"state":      "p.state",
		"createTime": "p.create_time",
		"modifyTime": "p.modify_time",
	},
	DefaultSort: "p.create_time DESC, p.id",
	TieBreak:    Natural("p.id"),
}

// QueryProducts answers endpoint 1 (see List.Query for its total).
func (s *Store) QueryProducts(ctx context.Context, q *Query) (Page[Product], error) {
	return productList.Query(ctx, s, q, nil)
}

// CountProducts answers endpoint 6.
func (s *Store) CountProducts(ctx context.Context, q *Query) (int, error) {
	return productList.Count(ctx, s, q, nil)
}

// GetProduct answers endpoint 2.
func (s *Store) GetProduct(ctx context.Context, id string) (Product, error) {
	ctx, cancel := s.timeout(ctx)
	defer cancel()
	return s.getProduct(ctx, s.db, id, false)
}

type queryer interface {
	GetContext(ctx context.Context, dest any, query string, args ...any) error
}

func (s *Store) getProduct(ctx context.Context, q queryer, id string, forUpdate bool) (Product, error) {
	var r productRow
	lock := ""
	if forUpdate {
		lock = " FOR UPDATE OF p"
	}
	err := q.GetContext(ctx, &r, "SELECT "+productColumns+" FROM products p WHERE p.id = $1"+lock, id)
	if errors.Is(err, sql.ErrNoRows) || err == nil && !ProductAllowed(ctx, r.ID) {
		return Product{}, fmt.Errorf("product %q: %w", id, ErrNotFound)
	}
	if err != nil {
		return Product{}, fmt.Errorf("meta: get product: %w", err)
	}
	return r.product(), nil
}

// NewProduct is the body of endpoint 3.
type NewProduct struct {
	ID                  string   `json:"id"`
	Name                string   `json:"name"`
	PhotoURL            string   `json:"photoUrl"`
	ClassifiedID        string   `json:"classifiedId"`
	ClassifiedIDArr     []string `json:"classifiedIdArr"`
	ClassifiedName      string   `json:"classifiedName"`
	ModelFrom           string   `json:"modelFrom"`
	AccessID            string   `json:"accessId"`
	AccessName          string   `json:"accessName"`
	AccessProvider      string   `json:"accessProvider"`
	DeviceType          Enum     `json:"deviceType"`
	SuperProductType    Enum     `json:"superProductType"`
	ThreeDimensionalURL string   `json:"threeDimensionalUrl"`
	Describe            string   `json:"describe"`
	Manufacturer        string   `json:"manufacturer"`
	Model               string   `json:"model"`
	// Optional fields a client may set at creation as on update.
	MessageProtocol   string `json:"messageProtocol"`
	ProtocolName      string `json:"protocolName"`
	TransportProtocol string `json:"transportProtocol"`
	Regulator         bool   `json:"regulator"`
	// Metadata is the thing model (a JSON document as a string, as
	// endpoint 4 takes it); validated and normalised; empty: none yet.
	Metadata string `json:"metadata"`
	// OutsideModelPolicy: OutsideKeep (empty: the default) or OutsideDrop.
	OutsideModelPolicy Enum `json:"outsideModelPolicy"`
}

// What ingest does with a reported value outside the device's thing model
// (schema.ThingModel.Outside), a product's OutsideModelPolicy.
const (
	OutsideKeep = "keep" // stored; the API marks it when read
	OutsideDrop = "drop" // not stored
)

var (
	deviceTypes = []string{"gateway", "childrenDevice", "device"}
	modelFroms  = []string{"custom", "standard"}
)

var outsidePolicies = []string{OutsideKeep, OutsideDrop}

func oneOf(field, v string, allowed []string) error {
	for _, a := range allowed {
		if v == a {
			return nil
		}
	}
	return schema.Invalid(field, "must be one of %s (got %q)", strings.Join(allowed, ", "), schema.Truncate(v, 40))
}

func (n *NewProduct) validate() error {
	if n.ID != "" {
		if err := checkID("id", n.ID); err != nil {
			return err
		}
	}
	for _, c := range []struct {
		field, v string
		max      int
		required bool
	}{
		{"name", n.Name, 128, true},
		{"classifiedId", n.ClassifiedID, 64, true},
		{"accessId", n.AccessID, 64, true},
		{"photoUrl", n.PhotoURL, 1024, false},
		{"classifiedName", n.ClassifiedName, 128, false},
		{"accessName", n.AccessName, 128, false},
		{"accessProvider", n.AccessProvider, 64, false},
		{"threeDimensionalUrl", n.ThreeDimensionalURL, 1024, false},
		{"describe", n.Describe, 2048, false},
		{"manufacturer", n.Manufacturer, 128, false},
		{"model", n.Model, 128, false},
		{"messageProtocol", n.MessageProtocol, 64, false},
		{"protocolName", n.ProtocolName, 128, false},
		{"transportProtocol", n.TransportProtocol, 64, false},
	} {
		if err := checkText(c.field, c.v, c.max, c.required); err != nil {
			return err
		}
	}
	if n.ModelFrom == "" {
		return schema.Invalid("modelFrom", "is required (custom or standard)")
	}
	if err := oneOf("modelFrom", n.ModelFrom, modelFroms); err != nil {
		return err
	}
	if n.DeviceType == "" {
		return schema.Invalid("deviceType", "is required (gateway, childrenDevice or device)")
	}
	if err := oneOf("deviceType", string(n.DeviceType), deviceTypes); err != nil {
		return err
	}
	if n.SuperProductType != "" && n.SuperProductType != "commonProduct" {
		return schema.Invalid("superProductType", "must be commonProduct")
	}
	if len(n.ClassifiedIDArr) > 16 {
		return schema.Invalid("classifiedIdArr", "must have at most 16 items")
	}
	if n.OutsideModelPolicy != "" {
		return oneOf("outsideModelPolicy", string(n.OutsideModelPolicy), outsidePolicies)
	}
	return nil
}

// CreateProduct answers endpoint 3. New products start disabled (state 0)
// until deployed.
func (s *Store) CreateProduct(ctx context.Context, n NewProduct, creatorID string) (Product, error) {
	defer s.pages.changed() // once committed: the next page read sees it
	if err := n.validate(); err != nil {
		return Product{}, err
	}
	if n.ID == "" {
		n.ID = NewID()
	}
	if n.PhotoURL == "" {
		n.PhotoURL = DefaultProductPhoto
	}
	if n.ClassifiedIDArr == nil {
		n.ClassifiedIDArr = []string{}
	}
	if n.OutsideModelPolicy == "" {
		n.OutsideModelPolicy = OutsideKeep
	}
	model := `{"properties":[],"events":[],"functions":[],"tags":[]}`
	if strings.TrimSpace(n.Metadata) != "" {
		norm, err := normalModel(n.Metadata)
		if err != nil {
			return Product{}, err
		}
		model = norm
	}
	ctx, cancel := s.timeout(ctx)
	defer cancel()
	_, err := s.db.ExecContext(ctx, `INSERT INTO products (id, name, photo_url, classified_id, classified_id_arr,
		classified_name, model_from, access_id, access_name, access_provider, device_type, three_dimensional_url,
		describe, manufacturer, model, message_protocol, protocol_name, transport_protocol, regulator,
		secure_id, secure_key, creator_id, modifier_id, metadata, outside_model_policy)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $1, $20, $21, $21, $22, $23)`,
		n.ID, n.Name, n.PhotoURL, n.ClassifiedID, pq.Array(n.ClassifiedIDArr), n.ClassifiedName, n.ModelFrom,
		n.AccessID, n.AccessName, n.AccessProvider, string(n.DeviceType), n.ThreeDimensionalURL, n.Describe,
		n.Manufacturer, n.Model, n.MessageProtocol, n.ProtocolName, n.TransportProtocol, n.Regulator,
		newSecret(), creatorID, model, string(n.OutsideModelPolicy))
	if isUniqueViolation(err) {
		return Product{}, fmt.Errorf("product %q: %w", n.ID, ErrDuplicateKey)
	}
	if err != nil {
		return Product{}, fmt.Errorf("meta: create product: %w", err)
	}
	return s.getProduct(ctx, s.db, n.ID, false)
}

// ProductPatch is the body of endpoint 4: the whole product as returned by
// endpoint 2, edited. Pointer fields left out keep their stored value.
type ProductPatch struct {
	ID                  string  `json:"id"`
	Name                *string `json:"name"`
	ClassifiedID        *string `json:"classifiedId"`
	Metadata            *string `json:"metadata"`
	DeviceType          *Enum   `json:"deviceType"`
	AccessID            *string `json:"accessId"`
	PhotoURL            *string `json:"photoUrl"`
	ClassifiedName      *string `json:"classifiedName"`
	MessageProtocol     *string `json:"messageProtocol"`
	ProtocolName        *string `json:"protocolName"`
	TransportProtocol   *string `json:"transportProtocol"`
	AccessProvider      *string `json:"accessProvider"`
	AccessName          *string `json:"accessName"`
	ThreeDimensionalURL *string `json:"threeDimensionalUrl"`
	ModelFrom           *string `json:"modelFrom"`
	Regulator           *bool   `json:"regulator"`
	SuperProductType    *Enum   `json:"superProductType"`
	VirtualType         *Enum   `json:"virtualType"`
	ProductCreateType   *Enum   `json:"productCreateType"`
	PresetType          *Enum   `json:"presetType"`
	Manufacturer        *string `json:"manufacturer"`
	Describe            *string `json:"describe"`
	Model               *string `json:"model"`
	StorePolicy         *string `json:"storePolicy"`
	OrgID               *string `json:"orgId"`
	// OutsideModelPolicy: left out keeps the stored one.
	OutsideModelPolicy *Enum `json:"outsideModelPolicy"`
	// ModifyTime, when given (the detail's, as the spec's usage rule sends
	// it back), makes the write conditional: ErrConflict if the product
	// changed since.
	ModifyTime *int64 `json:"modifyTime"`
}

// normalModel parses, validates and normalises a serialised thing model
// for storage: the one path of product and device models alike (bounded:
// schema.NormalizeThingModelInput).
func normalModel(metadata string) (string, error) {
	return schema.NormalizeThingModelInput(metadata)
}

// storedModel reports whether metadata, parsed as stored models are
// read (ParseThingModelString, without normalModel's bounds), is product
// id's stored model, and returns that.
func (s *Store) storedModel(ctx context.Context, id, metadata string) (string, bool) {
	m, err := schema.ParseThingModelString(metadata)
	if err != nil {
		return "", false
	}
	ctx, cancel := s.timeout(ctx)
	defer cancel()
	var stored string
	if err := s.db.GetContext(ctx, &stored, `SELECT metadata FROM products WHERE id = $1`, id); err != nil {
		return "", false
	}
	norm := m.String()
	return norm, norm == stored
}

// PatchProduct answers endpoint 4: it validates the thing model
// (normalModel) and stores the product's new fields in one statement.
func (s *Store) PatchProduct(ctx context.Context, p ProductPatch, modifierID string) error {
	defer s.pages.changed() // once committed: the next page read sees it
	if p.ID == "" {
		return schema.Invalid("id", "is required")
	}
	if !ProductAllowed(ctx, p.ID) {
		return fmt.Errorf("product %q: %w", schema.Truncate(p.ID, 80), ErrNotFound)
	}
	required := []struct {
		field string
		set   bool
	}{
		{"name", p.Name != nil && *p.Name != ""},
		{"classifiedId", p.ClassifiedID != nil && *p.ClassifiedID != ""},
		{"metadata", p.Metadata != nil},
		{"deviceType", p.DeviceType != nil && *p.DeviceType != ""},
		{"accessId", p.AccessID != nil && *p.AccessID != ""},
	}
	for _, r := range required {
		if !r.set {
			return schema.Invalid(r.field, "is required")
		}
	}
	if err := oneOf("deviceType.value", string(*p.DeviceType), deviceTypes); err != nil {
		return err
	}
	if p.ModelFrom != nil && *p.ModelFrom != "" {
		if err := oneOf("modelFrom", *p.ModelFrom, modelFroms); err != nil {
			return err
		}
	}
	sets := []string{"modify_time = " + nextModifyTime, "modifier_id = $2"}
	args := []any{p.ID, modifierID}
	add := func(col string, v any) {
		args = append(args, v)
		sets = append(sets, fmt.Sprintf("%s = $%d", col, len(args)))
	}
	meta := strings.TrimSpace(*p.Metadata)
	if meta == "" {
		custom := p.ModelFrom == nil || *p.ModelFrom == "" || *p.ModelFrom == "custom"
		if !custom {
			return schema.Invalid("metadata", "must not be empty for a %s thing model", *p.ModelFrom)
		}
		meta = `{"properties":[],"events":[],"functions":[],"tags":[]}`
	}
	norm, err := normalModel(meta)
	if err != nil {
		// A model stored before the bounds of normalModel (a top-level
		// key of its own, over 256 KiB) may be sent back unchanged, as
		// the spec's usage rule of endpoint 4 does with every field.
		stored, same := s.storedModel(ctx, p.ID, meta)
		if !same {
			return err
		}
		norm = stored
	}
	add("metadata", norm)
	add("device_type", string(*p.DeviceType))
	texts := []struct {
		col, field string
		v          *string
		max        int
	}{
		{"name", "name", p.Name, 128},
		{"classified_id", "classifiedId", p.ClassifiedID, 64},
		{"access_id", "accessId", p.AccessID, 64},
		{"photo_url", "photoUrl", p.PhotoURL, 1024},
		{"classified_name", "classifiedName", p.ClassifiedName, 128},
		{"message_protocol", "messageProtocol", p.MessageProtocol, 64},
		{"protocol_name", "protocolName", p.ProtocolName, 128},
		{"transport_protocol", "transportProtocol", p.TransportProtocol, 64},
		{"access_provider", "accessProvider", p.AccessProvider, 64},
		{"access_name", "accessName", p.AccessName, 128},
		{"three_dimensional_url", "threeDimensionalUrl", p.ThreeDimensionalURL, 1024},
		{"model_from", "modelFrom", p.ModelFrom, 16},
		{"manufacturer", "manufacturer", p.Manufacturer, 128},
		{"describe", "describe", p.Describe, 2048},
		{"model", "model", p.Model, 128},
		{"store_policy", "storePolicy", p.StorePolicy, 64},
		{"org_id", "orgId", p.OrgID, 64},
	}
	for _, t := range texts {
		if t.v == nil {
			continue
		}
		if err := checkText(t.field, *t.v, t.max, false); err != nil {
			return err
		}
		add(t.col, *t.v)
	}
	enums := []struct {
		col, field string
		v          *Enum
	}{
		{"super_product_type", "superProductType", p.SuperProductType},
		{"virtual_type", "virtualType", p.VirtualType},
		{"product_create_type", "productCreateType", p.ProductCreateType},
		{"preset_type", "presetType", p.PresetType},
	}
	for _, e := range enums {
		if e.v == nil {
			continue
		}
		if err := checkText(e.field+".value", string(*e.v), 32, true); err != nil {
			return err
		}
		add(e.col, string(*e.v))
	}
	if p.Regulator != nil {
		add("regulator", *p.Regulator)
	}
	if p.OutsideModelPolicy != nil {
		if err := oneOf("outsideModelPolicy", string(*p.OutsideModelPolicy), outsidePolicies); err != nil {
			return err
		}
		add("outside_model_policy", string(*p.OutsideModelPolicy))
	}
	where := "id = $1"
	if p.ModifyTime != nil && *p.ModifyTime > 0 {
		args = append(args, *p.ModifyTime)
		where += fmt.Sprintf(" AND %s = $%d", modifyTimeMillis, len(args))
	}
	ctx, cancel := s.timeout(ctx)
	defer cancel()
	res, err := s.db.ExecContext(ctx, "UPDATE products SET "+strings.Join(sets, ", ")+" WHERE "+where, args...)
	if err != nil {
		return fmt.Errorf("meta: patch product: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return s.missingOrChanged(ctx, "products", "product", p.ID)
	}
	return nil
}

// Versions of rows, for conditional writes: a row's modifyTime in epoch ms,
// and what a write sets it to, at least 1 ms later than it was, so that
// each write gives a new version even within one millisecond.
const (
	modifyTimeMillis = "(extract(epoch FROM date_trunc('milliseconds', modify_time)) * 1000)::bigint"
	nextModifyTime   = "greatest(now(), modify_time + interval '1 millisecond')"
)

// missingOrChanged tells why a conditional write to table changed no row.
func (s *Store) missingOrChanged(ctx context.Context, table, what, id string) error {
	var ms int64
	err := s.db.GetContext(ctx, &ms, "SELECT "+modifyTimeMillis+" FROM "+table+" WHERE id = $1", id)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return fmt.Errorf("%s %q: %w", what, schema.Truncate(id, 80), ErrNotFound)
	case err != nil:
		return fmt.Errorf("meta: %s %q: %w", what, schema.Truncate(id, 80), err)
	}
	return fmt.Errorf("%s %q was changed by another request (modifyTime is now %d); read it again and apply the change to that: %w",
		what, schema.Truncate(id, 80), ms, ErrConflict)
}

// SetProductState deploys (1) or undeploys (0) a product.
func (s *Store) SetProductState(ctx context.Context, id string, state int, modifierID string) error {
	defer s.pages.changed() // once committed: the next page read sees it
	if !ProductAllowed(ctx, id) {
		return fmt.Errorf("product %q: %w", schema.Truncate(id, 80), ErrNotFound)
	}
	ctx, cancel := s.timeout(ctx)
	defer cancel()
	res, err := s.db.ExecContext(ctx, `UPDATE products SET state = $2, modify_time = `+nextModifyTime+`, modifier_id = $3 WHERE id = $1`, id, state, modifierID)
	if err != nil {
		return fmt.Errorf("meta: product state: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("product %q: %w", id, ErrNotFound)
	}
	return nil
}

// ErrProductHasDevices refuses deleting a product that still has devices.
var ErrProductHasDevices = &schema.ArgError{Field: "id", Msg: "product still has devices; delete them first"}

// DeleteProduct answers endpoint 5 and returns what was deleted. A product
// with devices is refused and nothing is deleted.
func (s *Store) DeleteProduct(ctx context.Context, id string) (Product, error) {
	defer s.pages.changed() // once committed: the next page read sees it
	ctx, cancel := s.timeout(ctx)
	defer cancel()
	tx, err := s.db.BeginTxx(ctx, nil)
	if err != nil {
		return Product{}, fmt.Errorf("meta: delete product: %w", err)
	}
	defer tx.Rollback()
	p, err := s.getProduct(ctx, tx, id, true)
	if err != nil {
		return Product{}, err
	}
	if p.DeviceNum > 0 {
		return Product{}, ErrProductHasDevices
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM products WHERE id = $1`, id); err != nil {
		return Product{}, fmt.Errorf("meta: delete product: %w", err)
	}
	return p, tx.Commit()
}
