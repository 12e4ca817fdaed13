package api

import (
	"encoding/json"
	"slices"
	"strconv"
	"time"

	"devicehub/meta"
	"devicehub/schema/jsonw"
)

// The encoders of meta's rows. Each appends to b the bytes encoding/json
// writes for the row's fields under the spec's names (TestEncoders and
// TestRowEncoders compare them), without reflection. appendPage writes
// every page of a list endpoint.

// appendPage appends p as encoding/json writes it, each item by item.
func appendPage[T any](b []byte, p *meta.Page[T], item func(*T, []byte) []byte) []byte {
	b = append(b, `{"pageIndex":`...)
	b = strconv.AppendInt(b, int64(p.PageIndex), 10)
	b = append(b, `,"pageSize":`...)
	b = strconv.AppendInt(b, int64(p.PageSize), 10)
	b = append(b, `,"total":`...)
	b = strconv.AppendInt(b, int64(p.Total), 10)
	b = append(b, `,"totalExact":`...)
	b = strconv.AppendBool(b, p.TotalExact)
	b = append(b, `,"data":`...)
	b = jsonw.List(b, p.Data, item)
	return append(b, '}')
}

// appendField appends ,"name": (no comma before the first field: first).
func appendField(b []byte, name string, first bool) []byte {
	if !first {
		b = append(b, ',')
	}
	b = append(b, '"')
	b = append(b, name...)
	return append(b, '"', ':')
}

func appendStringField(b []byte, name, v string) []byte {
	return jsonw.String(appendField(b, name, false), v)
}

func appendBoolField(b []byte, name string, v bool) []byte {
	return strconv.AppendBool(appendField(b, name, false), v)
}

func appendEnumField(b []byte, name string, v meta.Enum) []byte {
	return appendEnum(appendField(b, name, false), v)
}

func appendMillisField(b []byte, name string, v meta.Millis) []byte {
	return appendMillis(appendField(b, name, false), v)
}

// appendEnum appends e as the spec's EnumObject {"text": ..., "value": ...}.
func appendEnum(b []byte, e meta.Enum) []byte {
	b = append(b, `{"text":`...)
	b = jsonw.String(b, e.Text())
	b = append(b, `,"value":`...)
	b = jsonw.String(b, string(e))
	return append(b, '}')
}

// appendMillis appends m as epoch milliseconds (0 for none).
func appendMillis(b []byte, m meta.Millis) []byte {
	t := time.Time(m)
	if t.IsZero() {
		return append(b, '0')
	}
	return strconv.AppendInt(b, t.UnixMilli(), 10)
}

// appendDevice appends a device list item (endpoint 7).
func appendDevice(d *meta.Device, b []byte) []byte {
	b = append(b, '{')
	b = jsonw.String(appendField(b, "id", true), d.ID)
	b = appendStringField(b, "name", d.Name)
	b = appendStringField(b, "photoUrl", d.PhotoURL)
	b = appendStringField(b, "description", d.Description)
	b = appendEnumField(b, "deviceType", d.DeviceType)
	b = appendStringField(b, "productId", d.ProductID)
	b = appendStringField(b, "productName", d.ProductName)
	b = appendEnumField(b, "state", d.State)
	b = appendBoolField(b, "edge", d.Edge)
	b = appendEnumField(b, "superDeviceType", d.SuperDeviceType)
	b = appendStringField(b, "creatorId", d.CreatorID)
	b = appendStringField(b, "creatorName", d.CreatorName)
	b = appendMillisField(b, "createTime", d.CreateTime)
	b = appendMillisField(b, "registryTime", d.RegistryTime)
	b = appendMillisField(b, "modifyTime", d.ModifyTime)
	b = appendStringField(b, "modifierId", d.ModifierID)
	b = appendStringField(b, "modifierName", d.ModifierName)
	b = jsonw.List(appendField(b, "features", false), d.Features, appendFeature)
	b = appendEnumField(b, "virtualType", d.VirtualType)
	b = appendBoolField(b, "regulator", d.Regulator)
	b = appendEnumField(b, "comeFrom", d.ComeFrom)
	b = appendEnumField(b, "deviceCreateType", d.DeviceCreateType)
	b = appendEnumField(b, "presetType", d.PresetType)
	b = appendEnumField(b, "categoryType", d.CategoryType)
	b = appendBoolField(b, "mediaDevice", d.MediaDevice)
	if d.DeviceMetadata != "" {
		b = appendStringField(b, "deviceMetadata", d.DeviceMetadata)
	}
	b = appendDeviceConfig(&d.Configuration, appendField(b, "configuration", false))
	b = appendStringField(b, "orgId", d.OrgID)
	b = appendStringField(b, "storePolicy", d.StorePolicy)
	return append(b, '}')
}

// appendProduct appends a product (endpoints 1, 2, 3 and the product
// deletion).
func appendProduct(p *meta.Product, b []byte) []byte {
	b = append(b, '{')
	b = jsonw.String(appendField(b, "id", true), p.ID)
	b = appendStringField(b, "name", p.Name)
	b = appendStringField(b, "photoUrl", p.PhotoURL)
	b = appendStringField(b, "classifiedId", p.ClassifiedID)
	b = appendStringField(b, "classifiedName", p.ClassifiedName)
	b = appendStringField(b, "messageProtocol", p.MessageProtocol)
	b = appendStringField(b, "protocolName", p.ProtocolName)
	b = appendStringField(b, "metadata", p.Metadata)
	b = appendStringField(b, "transportProtocol", p.TransportProtocol)
	b = appendEnumField(b, "deviceType", p.DeviceType)
	b = appendField(b, "configuration", false)
	b = append(b, '{')
	b = jsonw.String(appendField(b, "secureId", true), p.Configuration.SecureID)
	b = appendStringField(b, "secureKey", p.Configuration.SecureKey)
	if p.Configuration.ChannelID != "" {
		b = appendStringField(b, "channelId", p.Configuration.ChannelID)
	}
	b = append(b, '}')
	b = strconv.AppendInt(appendField(b, "state", false), int64(p.State), 10)
	b = appendStringField(b, "creatorId", p.CreatorID)
	b = appendStringField(b, "modifierId", p.ModifierID)
	b = appendMillisField(b, "createTime", p.CreateTime)
	b = appendMillisField(b, "modifyTime", p.ModifyTime)
	b = appendBoolField(b, "regulator", p.Regulator)
	b = appendStringField(b, "accessId", p.AccessID)
	b = appendStringField(b, "accessProvider", p.AccessProvider)
	b = appendStringField(b, "accessName", p.AccessName)
	b = appendStringField(b, "storePolicy", p.StorePolicy)
	b = appendStringField(b, "orgId", p.OrgID)
	b = appendEnumField(b, "superProductType", p.SuperProductType)
	b = appendEnumField(b, "virtualType", p.VirtualType)
	b = appendEnumField(b, "productCreateType", p.ProductCreateType)
	b = appendEnumField(b, "presetType", p.PresetType)
	b = appendStringField(b, "threeDimensionalUrl", p.ThreeDimensionalURL)
	b = appendStringField(b, "modelFrom", p.ModelFrom)
	b = strconv.AppendInt(appendField(b, "deviceNum", false), int64(p.DeviceNum), 10)
	b = appendStringField(b, "manufacturer", p.Manufacturer)
	b = appendStringField(b, "describe", p.Describe)
	b = appendStringField(b, "model", p.Model)
	b = appendEnumField(b, "outsideModelPolicy", p.OutsideModelPolicy)
	return append(b, '}')
}

func appendString(s *string, b []byte) []byte { return jsonw.String(b, *s) }

func appendRaw(raw *json.RawMessage, b []byte) []byte { return jsonw.Raw(b, *raw) }

// appendPermission appends p as the spec's EnumObject {text, value}.
func appendPermission(p *meta.Permission, b []byte) []byte {
	b = append(b, `{"text":`...)
	b = jsonw.String(b, p.Text())
	b = append(b, `,"value":`...)
	b = jsonw.String(b, string(*p))
	return append(b, '}')
}

func appendIntField(b []byte, name string, v int64) []byte {
	return strconv.AppendInt(appendField(b, name, false), v, 10)
}

// appendDeviceConfig appends a device's configuration (its login), in a
// list item and in a detail alike.
func appendDeviceConfig(c *meta.DeviceConfig, b []byte) []byte {
	b = append(b, '{')
	b = jsonw.String(appendField(b, "secureId", true), c.SecureID)
	b = appendStringField(b, "secureKey", c.SecureKey)
	b = appendStringField(b, "channelId", c.ChannelID)
	return append(b, '}')
}

func appendFeature(f *meta.DeviceFeature, b []byte) []byte {
	b = append(b, '{')
	b = jsonw.String(appendField(b, "id", true), f.ID)
	b = appendStringField(b, "name", f.Name)
	b = appendBoolField(b, "deprecated", f.Deprecated)
	b = appendStringField(b, "type", f.Type)
	return append(b, '}')
}

func appendRelation(r *meta.DeviceRelation, b []byte) []byte {
	b = append(b, '{')
	b = jsonw.String(appendField(b, "objectId", true), r.ObjectID)
	b = appendStringField(b, "relation", r.Relation)
	b = appendStringField(b, "relationName", r.RelationName)
	return append(b, '}')
}

// appendDeviceDetail appends a device's detail (endpoint 8, and the
// device writes that answer one).
func appendDeviceDetail(d *meta.DeviceDetail, b []byte) []byte {
	b = append(b, '{')
	b = jsonw.String(appendField(b, "id", true), d.ID)
	b = appendStringField(b, "name", d.Name)
	b = appendStringField(b, "description", d.Description)
	b = appendStringField(b, "productPhotoUrl", d.ProductPhotoURL)
	b = appendStringField(b, "devicePhotoUrl", d.DevicePhotoURL)
	b = appendStringField(b, "protocol", d.Protocol)
	b = appendStringField(b, "protocolName", d.ProtocolName)
	b = appendStringField(b, "transport", d.Transport)
	b = appendStringField(b, "productId", d.ProductID)
	b = appendStringField(b, "productName", d.ProductName)
	b = appendEnumField(b, "deviceType", d.DeviceType)
	b = appendEnumField(b, "state", d.State)
	b = appendStringField(b, "address", d.Address)
	b = appendMillisField(b, "onlineTime", d.OnlineTime)
	b = appendMillisField(b, "offlineTime", d.OfflineTime)
	b = appendMillisField(b, "createTime", d.CreateTime)
	b = appendMillisField(b, "registerTime", d.RegisterTime)
	b = appendMillisField(b, "modifyTime", d.ModifyTime)
	b = appendStringField(b, "metadata", d.Metadata)
	b = appendBoolField(b, "independentMetadata", d.IndependentMetadata)
	b = appendDeviceConfig(&d.Configuration, appendField(b, "configuration", false))
	b = jsonw.Raw(appendField(b, "deviceConfiguration", false), d.DeviceConfiguration)
	b = jsonw.Raw(appendField(b, "cachedConfiguration", false), d.CachedConfiguration)
	b = appendBoolField(b, "aloneConfiguration", d.AloneConfiguration)
	b = appendStringField(b, "connectServerId", d.ConnectServerID)
	b = appendBoolField(b, "edge", d.Edge)
	b = jsonw.List(appendField(b, "tags", false), d.Tags, appendRaw)
	b = jsonw.List(appendField(b, "binds", false), d.Binds, appendRaw)
	b = jsonw.List(appendField(b, "features", false), d.Features, appendFeature)
	b = jsonw.List(appendField(b, "relations", false), d.Relations, appendRelation)
	b = appendStringField(b, "accessId", d.AccessID)
	b = appendStringField(b, "accessProvider", d.AccessProvider)
	b = appendStringField(b, "accessName", d.AccessName)
	b = appendStringField(b, "classifiedId", d.ClassifiedID)
	b = appendStringField(b, "classifiedName", d.ClassifiedName)
	b = appendEnumField(b, "presetType", d.PresetType)
	b = appendEnumField(b, "superDeviceType", d.SuperDeviceType)
	b = appendBoolField(b, "mediaDevice", d.MediaDevice)
	b = appendBoolField(b, "regulator", d.Regulator)
	b = appendStringField(b, "creatorId", d.CreatorID)
	b = appendStringField(b, "creatorName", d.CreatorName)
	b = appendStringField(b, "modifierId", d.ModifierID)
	b = appendStringField(b, "modifierName", d.ModifierName)
	b = appendStringField(b, "orgId", d.OrgID)
	b = appendStringField(b, "storePolicy", d.StorePolicy)
	return append(b, '}')
}

// appendRole appends a role (endpoint 13 and the role writes).
func appendRole(r *meta.Role, b []byte) []byte {
	b = append(b, '{')
	b = jsonw.String(appendField(b, "id", true), r.ID)
	b = appendStringField(b, "name", r.Name)
	b = appendStringField(b, "description", r.Description)
	b = appendEnumField(b, "state", r.State)
	b = appendStringField(b, "creatorId", r.CreatorID)
	b = appendMillisField(b, "createTime", r.CreateTime)
	b = jsonw.List(appendField(b, "permissions", false), r.Permissions, appendPermission)
	b = jsonw.List(appendField(b, "products", false), r.Products, appendString)
	return append(b, '}')
}

// appendUser appends the signed-in user (GET /api/authorize/me): products
// only when a permission is held on listed products (by permission, in
// byte order), keyId only for a request made with an API key.
func appendUser(u *meta.User, b []byte) []byte {
	b = append(b, '{')
	b = jsonw.String(appendField(b, "id", true), u.ID)
	b = appendStringField(b, "username", u.Username)
	b = appendStringField(b, "name", u.Name)
	b = jsonw.List(appendField(b, "roles", false), u.Roles, appendString)
	b = jsonw.List(appendField(b, "permissions", false), u.Permissions, appendString)
	if len(u.Products) > 0 {
		perms := make([]meta.Permission, 0, len(u.Products))
		for p := range u.Products {
			perms = append(perms, p)
		}
		slices.Sort(perms)
		b = appendField(b, "products", false)
		for i, p := range perms {
			if i > 0 {
				b = append(b, ',')
			} else {
				b = append(b, '{')
			}
			b = append(jsonw.String(b, string(p)), ':')
			b = jsonw.List(b, u.Products[p], appendString)
		}
		b = append(b, '}')
	}
	if u.KeyID != "" {
		b = appendStringField(b, "keyId", u.KeyID)
	}
	return append(b, '}')
}

// appendUserDetail appends a user as the user list and writes show it.
func appendUserDetail(u *meta.UserDetail, b []byte) []byte {
	b = append(b, '{')
	b = jsonw.String(appendField(b, "id", true), u.ID)
	b = appendStringField(b, "username", u.Username)
	b = appendStringField(b, "name", u.Name)
	b = appendEnumField(b, "state", u.State)
	b = jsonw.List(appendField(b, "roles", false), u.Roles, appendString)
	b = appendMillisField(b, "createTime", u.CreateTime)
	return append(b, '}')
}

// appendKeyFields appends an API key's fields, without its braces.
func appendKeyFields(k *meta.Key, b []byte) []byte {
	b = jsonw.String(appendField(b, "id", true), k.ID)
	b = appendStringField(b, "name", k.Name)
	b = appendStringField(b, "userId", k.UserID)
	b = appendStringField(b, "username", k.Username)
	b = jsonw.List(appendField(b, "permissions", false), k.Permissions, appendPermission)
	b = jsonw.List(appendField(b, "products", false), k.Products, appendString)
	b = appendMillisField(b, "createTime", k.CreateTime)
	b = appendMillisField(b, "expiresAt", k.ExpiresAt)
	return appendMillisField(b, "lastUsed", k.LastUsed)
}

// appendKey appends an API key as lists show it (never its secret).
func appendKey(k *meta.Key, b []byte) []byte {
	return append(appendKeyFields(k, append(b, '{')), '}')
}

// appendCreatedKey appends a new key with its secret (key), shown once.
func appendCreatedKey(k *meta.CreatedKey, b []byte) []byte {
	b = appendKeyFields(&k.Key, append(b, '{'))
	b = appendStringField(b, "key", k.Secret)
	return append(b, '}')
}

// appendAuditEntry appends an entry of the audit trail.
func appendAuditEntry(e *meta.AuditEntry, b []byte) []byte {
	b = append(b, '{')
	b = strconv.AppendInt(appendField(b, "id", true), e.ID, 10)
	b = appendMillisField(b, "time", e.Time)
	b = appendStringField(b, "userId", e.UserID)
	b = appendStringField(b, "username", e.Username)
	b = appendStringField(b, "address", e.Address)
	b = appendStringField(b, "method", e.Method)
	b = appendStringField(b, "route", e.Route)
	b = appendStringField(b, "objectId", e.ObjectID)
	b = appendIntField(b, "status", int64(e.Status))
	b = appendStringField(b, "code", e.Code)
	b = appendStringField(b, "keyId", e.KeyID)
	b = appendIntField(b, "count", int64(e.Count))
	b = appendMillisField(b, "firstTime", e.FirstTime)
	return append(b, '}')
}

// appendBulkRowError appends one bad row of a refused bulk request.
func appendBulkRowError(e *meta.BulkRowError, b []byte) []byte {
	b = append(b, '{')
	b = strconv.AppendInt(appendField(b, "row", true), int64(e.Row), 10)
	b = appendStringField(b, "id", e.ID)
	b = appendStringField(b, "field", e.Field)
	b = appendStringField(b, "reason", e.Reason)
	return append(b, '}')
}

func appendCreatedDevice(d *meta.CreatedDevice, b []byte) []byte {
	b = append(b, '{')
	b = jsonw.String(appendField(b, "id", true), d.ID)
	b = appendStringField(b, "secureId", d.SecureID)
	b = appendStringField(b, "secureKey", d.SecureKey)
	return append(b, '}')
}

// appendBulkCreated appends the result of a bulk creation.
func appendBulkCreated(r *meta.BulkCreated, b []byte) []byte {
	b = append(b, '{')
	b = strconv.AppendInt(appendField(b, "total", true), int64(r.Total), 10)
	b = appendBoolField(b, "deployed", r.Deployed)
	b = jsonw.List(appendField(b, "devices", false), r.Devices, appendCreatedDevice)
	return append(b, '}')
}

// appendBulkChanged appends the result of a bulk deploy, undeploy or
// deletion.
func appendBulkChanged(r *meta.BulkChanged, b []byte) []byte {
	b = append(b, '{')
	b = strconv.AppendInt(appendField(b, "total", true), int64(r.Total), 10)
	b = appendIntField(b, "changed", int64(r.Changed))
	return append(b, '}')
}
