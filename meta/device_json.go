package meta

// AppendJSON appends d as encoding/json.Marshal writes it (see query_json.go).
func (d *Device) AppendJSON(b []byte) []byte {
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
