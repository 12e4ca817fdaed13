package api

import (
	"encoding/json"
	"strconv"
	"time"
	"unicode/utf8"

	"devicehub/meta"
)

// The encoders of meta's rows. Each appends to b the bytes encoding/json
// writes for the row's fields under the spec's names (TestEncoders compares
// them), without reflection. appendPage writes every page of a list
// endpoint; an item type without an encoder here is written by
// encoding/json (appendMarshal).

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
	if p.Data == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '[')
		for i := range p.Data {
			if i > 0 {
				b = append(b, ',')
			}
			b = item(&p.Data[i], b)
		}
		b = append(b, ']')
	}
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
	return appendJSONString(appendField(b, name, false), v)
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
	b = appendJSONString(b, e.Text())
	b = append(b, `,"value":`...)
	b = appendJSONString(b, string(e))
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

const hexDigits = "0123456789abcdef"

// appendJSONString appends s quoted as encoding/json.Marshal does: HTML
// characters, control characters, U+2028 and U+2029 escaped, invalid UTF-8
// replaced by U+FFFD.
func appendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '\\', '"':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// appendDevice appends a device list item (endpoint 7).
func appendDevice(d *meta.Device, b []byte) []byte {
	b = append(b, '{')
	b = appendJSONString(appendField(b, "id", true), d.ID)
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
	b = appendField(b, "features", false)
	if d.Features == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '[')
		for i := range d.Features {
			if i > 0 {
				b = append(b, ',')
			}
			f := &d.Features[i]
			b = append(b, '{')
			b = appendJSONString(appendField(b, "id", true), f.ID)
			b = appendStringField(b, "name", f.Name)
			b = appendBoolField(b, "deprecated", f.Deprecated)
			b = appendStringField(b, "type", f.Type)
			b = append(b, '}')
		}
		b = append(b, ']')
	}
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
	b = appendField(b, "configuration", false)
	b = append(b, '{')
	b = appendJSONString(appendField(b, "secureId", true), d.Configuration.SecureID)
	b = appendStringField(b, "secureKey", d.Configuration.SecureKey)
	b = appendStringField(b, "channelId", d.Configuration.ChannelID)
	b = append(b, '}')
	b = appendStringField(b, "orgId", d.OrgID)
	b = appendStringField(b, "storePolicy", d.StorePolicy)
	return append(b, '}')
}

// appendProduct appends a product (endpoints 1, 2, 3 and the product
// deletion).
func appendProduct(p *meta.Product, b []byte) []byte {
	b = append(b, '{')
	b = appendJSONString(appendField(b, "id", true), p.ID)
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
	b = appendJSONString(appendField(b, "secureId", true), p.Configuration.SecureID)
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
	return append(b, '}')
}

// appendMarshal appends what encoding/json writes for x: the items of the
// pages of roles, users, keys and audit entries, whose json tags give their
// fields' names. (They hold no value encoding/json refuses; were one
// there, the item is written as null.)
func appendMarshal[T any](x *T, b []byte) []byte {
	j, err := json.Marshal(x)
	if err != nil {
		return append(b, "null"...)
	}
	return append(b, j...)
}
