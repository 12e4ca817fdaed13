package meta

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"

	"devicehub/schema"
)

// Device request bodies (create, update) and their checks.

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
		return schema.Invalid("features", "must have at most %d items", maxDeviceFeatures)
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
		return schema.Invalid("relations", "must have at most %d items", maxDeviceRelations)
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
		return nil, schema.Invalid(field, "must be at most %d bytes", maxDeviceConfigLen)
	}
	var m map[string]json.RawMessage
	if raw[0] != '{' || json.Unmarshal(raw, &m) != nil {
		return nil, schema.Invalid(field, "must be an object")
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
		return nil, schema.Invalid(field, "must be an array")
	}
	if len(a) > max {
		return nil, schema.Invalid(field, "must have at most %d items", max)
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

// Lengths of a secureKey a client chooses, in bytes: the password of the
// device's broker login. A key left out is generated: 128 random bits
// (newSecret, 32 hex digits).
const (
	minSecureKey = 16
	maxSecureKey = 128
)

// checkConfig checks the configuration of a device being created (id is
// its id, "" if generated) or updated (id ""): its texts, a key the client
// chose (minSecureKey to maxSecureKey bytes; empty or masked keeps the
// stored one), and its secureId, or on create the id that stands for a
// secureId left out, which must not name a reserved login
// (reservedLogin). Every device write checks its configuration here, one
// device at a time, whatever path it takes (create, update, bulk).
func (s *Store) checkConfig(c *DeviceConfigInput, id string) error {
	secureID := id
	if c != nil {
		if k := c.newKey(); k != "" && (len(k) < minSecureKey || len(k) > maxSecureKey) {
			return schema.Invalid("configuration.secureKey", "must be %d to %d bytes (the device's broker password), or left out for a random one",
				minSecureKey, maxSecureKey)
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
		if c.SecureID != nil && *c.SecureID != "" {
			secureID = *c.SecureID
		}
	}
	if secureID == "" || !s.reservedLogin(secureID) {
		return nil
	}
	if c == nil || c.SecureID == nil || *c.SecureID == "" {
		return schema.Invalid("configuration.secureId", "%q, the device id that is its secureId by default, is reserved for a service or operator login of the broker: give another secureId",
			schema.Truncate(secureID, 80))
	}
	return schema.Invalid("configuration.secureId", "%q is reserved for a service or operator login of the broker", schema.Truncate(secureID, 80))
}

// reservedLogin reports whether name is, in any case, a broker login a
// device must never hold: devicehub's own and operators'
// (Options.ReservedLogins), "admin", or a name starting with "$" (the
// broker's own namespace: $SYS, $share, $CONTROL). A device holding one
// would log in as that service, with its rights.
func (s *Store) reservedLogin(name string) bool {
	if strings.HasPrefix(name, "$") || strings.EqualFold(name, "admin") {
		return true
	}
	for _, r := range s.opts.ReservedLogins {
		if r != "" && strings.EqualFold(name, r) {
			return true
		}
	}
	return false
}

// newKey reports the secure key to store from a request: "" keeps the
// stored one (or generates one on creation).
func (c *DeviceConfigInput) newKey() string {
	if c == nil || c.SecureKey == nil || *c.SecureKey == MaskSecret(*c.SecureKey) {
		return ""
	}
	return *c.SecureKey
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
