package api

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"testing"
	"time"

	"devicehub/meta"
)

// trickyTexts are strings whose JSON encoding has escapes or replacements.
var trickyTexts = []string{
	"", "plain", `quote " and \ backslash`, "<script>&amp;</script>", "\x00\x01\x1f\x7f", "\b\f\n\r\t",
	"\xff\xfe invalid", "cut \xe2\x82", "\u2028\u2029", "Żółw 电表 🚀", "{\"properties\":[]}", "%_like_%",
}

// randomText mixes the pieces of trickyTexts.
func randomText(r *rand.Rand) string {
	var b []byte
	for range r.IntN(6) {
		t := trickyTexts[r.IntN(len(trickyTexts))]
		if len(t) > 0 {
			i := r.IntN(len(t))
			b = append(b, t[i:min(len(t), i+r.IntN(8)+1)]...)
		}
	}
	return string(b)
}

func randomMillis(r *rand.Rand) meta.Millis {
	switch r.IntN(4) {
	case 0:
		return meta.Millis{}
	case 1:
		return meta.Millis(time.UnixMilli(-r.Int64N(1e12)))
	}
	return meta.Millis(time.Unix(r.Int64N(4e9), r.Int64N(1e9)))
}

func randomEnum(r *rand.Rand) meta.Enum {
	known := []meta.Enum{"offline", "online", "notActive", "device", "gateway", "none", "real", "cloud"}
	if r.IntN(3) == 0 {
		return meta.Enum(randomText(r))
	}
	return known[r.IntN(len(known))]
}

func randomDevice(r *rand.Rand) meta.Device {
	d := meta.Device{
		ID: randomText(r), Name: randomText(r), PhotoURL: randomText(r), Description: randomText(r),
		DeviceType: randomEnum(r), ProductID: randomText(r), ProductName: randomText(r), State: randomEnum(r),
		Edge: r.IntN(2) == 0, SuperDeviceType: randomEnum(r), CreatorID: randomText(r), CreatorName: randomText(r),
		CreateTime: randomMillis(r), RegistryTime: randomMillis(r), ModifyTime: randomMillis(r),
		ModifierID: randomText(r), ModifierName: randomText(r), VirtualType: randomEnum(r), Regulator: r.IntN(2) == 0,
		ComeFrom: randomEnum(r), DeviceCreateType: randomEnum(r), PresetType: randomEnum(r), CategoryType: randomEnum(r),
		MediaDevice: r.IntN(2) == 0, OrgID: randomText(r), StorePolicy: randomText(r),
		Configuration: meta.DeviceConfig{SecureID: randomText(r), SecureKey: randomText(r), ChannelID: randomText(r)},
	}
	if r.IntN(2) == 0 {
		d.DeviceMetadata = randomText(r)
	}
	switch r.IntN(3) {
	case 0: // nil: null
	case 1:
		d.Features = []meta.DeviceFeature{}
	default:
		for range r.IntN(3) + 1 {
			d.Features = append(d.Features, meta.DeviceFeature{ID: randomText(r), Name: randomText(r), Deprecated: r.IntN(2) == 0, Type: randomText(r)})
		}
	}
	return d
}

func randomProduct(r *rand.Rand) meta.Product {
	p := meta.Product{
		ID: randomText(r), Name: randomText(r), PhotoURL: randomText(r), ClassifiedID: randomText(r),
		ClassifiedName: randomText(r), MessageProtocol: randomText(r), ProtocolName: randomText(r), Metadata: randomText(r),
		TransportProtocol: randomText(r), DeviceType: randomEnum(r), State: r.IntN(3) - 1, CreatorID: randomText(r),
		ModifierID: randomText(r), CreateTime: randomMillis(r), ModifyTime: randomMillis(r), Regulator: r.IntN(2) == 0,
		AccessID: randomText(r), AccessProvider: randomText(r), AccessName: randomText(r), StorePolicy: randomText(r),
		OrgID: randomText(r), SuperProductType: randomEnum(r), VirtualType: randomEnum(r), ProductCreateType: randomEnum(r),
		PresetType: randomEnum(r), ThreeDimensionalURL: randomText(r), ModelFrom: randomText(r), DeviceNum: r.IntN(1e6),
		Manufacturer: randomText(r), Describe: randomText(r), Model: randomText(r),
		Configuration: meta.Configuration{SecureID: randomText(r), SecureKey: randomText(r)},
	}
	if r.IntN(2) == 0 {
		p.Configuration.ChannelID = randomText(r)
	}
	return p
}

// pageJSON is a page under the spec's names, for encoding/json: what
// appendPage must write.
type pageJSON[T any] struct {
	PageIndex  int  `json:"pageIndex"`
	PageSize   int  `json:"pageSize"`
	Total      int  `json:"total"`
	TotalExact bool `json:"totalExact"`
	Data       []T  `json:"data"`
}

// TestEncoders checks that the encoders of list pages write the bytes
// encoding/json writes, for pages of random devices and products made of
// texts that need escapes, and for a page of roles.
func TestEncoders(t *testing.T) {
	r := rand.New(rand.NewPCG(20, 24))
	for i := range 300 {
		devices := meta.Page[meta.Device]{PageIndex: r.IntN(100), PageSize: r.IntN(1000), Total: r.IntN(1e6), TotalExact: r.IntN(2) == 0}
		products := meta.Page[meta.Product]{PageIndex: devices.PageIndex, PageSize: devices.PageSize, Total: devices.Total, TotalExact: devices.TotalExact}
		if i%10 != 0 { // every tenth page has null data
			devices.Data, products.Data = []meta.Device{}, []meta.Product{}
			for range r.IntN(4) {
				devices.Data = append(devices.Data, randomDevice(r))
				products.Data = append(products.Data, randomProduct(r))
			}
		}
		compareJSON(t, mapPage(&devices, deviceOf), appendPage([]byte("prefix"), &devices, appendDevice))
		compareJSON(t, mapPage(&products, productOf), appendPage([]byte("prefix"), &products, appendProduct))
		if len(products.Data) > 0 {
			compareJSON(t, productOf(&products.Data[0]), appendProduct(&products.Data[0], []byte("prefix")))
		}
	}
	for _, s := range trickyTexts { // each text whole, in an Enum too
		d := meta.Device{Name: s, State: meta.Enum(s), DeviceMetadata: s}
		compareJSON(t, deviceOf(&d), appendDevice(&d, []byte("prefix")))
		want, _ := json.Marshal(struct {
			Text  string `json:"text"`
			Value string `json:"value"`
		}{meta.Enum(s).Text(), s})
		if e := appendEnum(nil, meta.Enum(s)); !bytes.Equal(e, want) {
			t.Fatalf("appendEnum(%q) = %s; want %s", s, e, want)
		}
		if e, err := enumJSON(s).MarshalJSON(); err != nil || !bytes.Equal(e, want) {
			t.Fatalf("enumJSON(%q).MarshalJSON = %s, %v; want %s", s, e, err, want)
		}
		roles := meta.Page[meta.Role]{Data: []meta.Role{{ID: s, Name: s, Permissions: []meta.Permission{meta.Permission(s)}}, {}}}
		compareJSON(t, mapPage(&roles, roleOf), appendPage([]byte("prefix"), &roles, appendRole))
	}
	for _, ms := range []int64{0, 1, -1, 1700000000123, -62135596800000} {
		m := meta.Millis(time.UnixMilli(ms))
		if ms == 0 {
			m = meta.Millis{}
		}
		want, err := millisJSON(m).MarshalJSON()
		if got := appendMillis(nil, m); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("appendMillis(%d) = %s; MarshalJSON %s, %v", ms, got, want, err)
		}
	}
}

func compareJSON(t *testing.T, v any, got []byte) {
	t.Helper()
	want, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(got, []byte("prefix")) {
		t.Fatalf("the encoder dropped what it appended to: %.40s", got)
	}
	if got = got[len("prefix"):]; !bytes.Equal(got, want) {
		t.Fatalf("encoded\n got %s\nwant %s", got, want)
	}
}

// The rows as encoding/json writes them under the spec's names: what the
// encoders must write (they are meta's rows with json tags).
type productJSON struct {
	ID                  string            `json:"id"`
	Name                string            `json:"name"`
	PhotoURL            string            `json:"photoUrl"`
	ClassifiedID        string            `json:"classifiedId"`
	ClassifiedName      string            `json:"classifiedName"`
	MessageProtocol     string            `json:"messageProtocol"`
	ProtocolName        string            `json:"protocolName"`
	Metadata            string            `json:"metadata"`
	TransportProtocol   string            `json:"transportProtocol"`
	DeviceType          enumJSON          `json:"deviceType"`
	Configuration       configurationJSON `json:"configuration"`
	State               int               `json:"state"`
	CreatorID           string            `json:"creatorId"`
	ModifierID          string            `json:"modifierId"`
	CreateTime          millisJSON        `json:"createTime"`
	ModifyTime          millisJSON        `json:"modifyTime"`
	Regulator           bool              `json:"regulator"`
	AccessID            string            `json:"accessId"`
	AccessProvider      string            `json:"accessProvider"`
	AccessName          string            `json:"accessName"`
	StorePolicy         string            `json:"storePolicy"`
	OrgID               string            `json:"orgId"`
	SuperProductType    enumJSON          `json:"superProductType"`
	VirtualType         enumJSON          `json:"virtualType"`
	ProductCreateType   enumJSON          `json:"productCreateType"`
	PresetType          enumJSON          `json:"presetType"`
	ThreeDimensionalURL string            `json:"threeDimensionalUrl"`
	ModelFrom           string            `json:"modelFrom"`
	DeviceNum           int               `json:"deviceNum"`
	Manufacturer        string            `json:"manufacturer"`
	Describe            string            `json:"describe"`
	Model               string            `json:"model"`
	OutsideModelPolicy  enumJSON          `json:"outsideModelPolicy"`
}
type configurationJSON struct {
	SecureID  string `json:"secureId"`
	SecureKey string `json:"secureKey"`
	ChannelID string `json:"channelId,omitempty"`
}
type deviceJSON struct {
	ID               string           `json:"id"`
	Name             string           `json:"name"`
	PhotoURL         string           `json:"photoUrl"`
	Description      string           `json:"description"`
	DeviceType       enumJSON         `json:"deviceType"`
	ProductID        string           `json:"productId"`
	ProductName      string           `json:"productName"`
	State            enumJSON         `json:"state"`
	Edge             bool             `json:"edge"`
	SuperDeviceType  enumJSON         `json:"superDeviceType"`
	CreatorID        string           `json:"creatorId"`
	CreatorName      string           `json:"creatorName"`
	CreateTime       millisJSON       `json:"createTime"`
	RegistryTime     millisJSON       `json:"registryTime"`
	ModifyTime       millisJSON       `json:"modifyTime"`
	ModifierID       string           `json:"modifierId"`
	ModifierName     string           `json:"modifierName"`
	Features         []featureJSON    `json:"features"`
	VirtualType      enumJSON         `json:"virtualType"`
	Regulator        bool             `json:"regulator"`
	ComeFrom         enumJSON         `json:"comeFrom"`
	DeviceCreateType enumJSON         `json:"deviceCreateType"`
	PresetType       enumJSON         `json:"presetType"`
	CategoryType     enumJSON         `json:"categoryType"`
	MediaDevice      bool             `json:"mediaDevice"`
	DeviceMetadata   string           `json:"deviceMetadata,omitempty"`
	Configuration    deviceConfigJSON `json:"configuration"`
	OrgID            string           `json:"orgId"`
	StorePolicy      string           `json:"storePolicy"`
}
type deviceConfigJSON struct {
	SecureID  string `json:"secureId"`
	SecureKey string `json:"secureKey"`
	ChannelID string `json:"channelId"`
}
type featureJSON struct {
	ID         string `json:"id"`
	Name       string `json:"name"`
	Deprecated bool   `json:"deprecated"`
	Type       string `json:"type"`
}

func productOf(x *meta.Product) productJSON {
	return productJSON{ID: x.ID, Name: x.Name, PhotoURL: x.PhotoURL, ClassifiedID: x.ClassifiedID, ClassifiedName: x.ClassifiedName, MessageProtocol: x.MessageProtocol, ProtocolName: x.ProtocolName, Metadata: x.Metadata, TransportProtocol: x.TransportProtocol, DeviceType: enumJSON(x.DeviceType), Configuration: configurationJSON(x.Configuration), State: x.State, CreatorID: x.CreatorID, ModifierID: x.ModifierID, CreateTime: millisJSON(x.CreateTime), ModifyTime: millisJSON(x.ModifyTime), Regulator: x.Regulator, AccessID: x.AccessID, AccessProvider: x.AccessProvider, AccessName: x.AccessName, StorePolicy: x.StorePolicy, OrgID: x.OrgID, SuperProductType: enumJSON(x.SuperProductType), VirtualType: enumJSON(x.VirtualType), ProductCreateType: enumJSON(x.ProductCreateType), PresetType: enumJSON(x.PresetType), ThreeDimensionalURL: x.ThreeDimensionalURL, ModelFrom: x.ModelFrom, DeviceNum: x.DeviceNum, Manufacturer: x.Manufacturer, Describe: x.Describe, Model: x.Model, OutsideModelPolicy: enumJSON(x.OutsideModelPolicy)}
}

func deviceOf(x *meta.Device) deviceJSON {
	return deviceJSON{ID: x.ID, Name: x.Name, PhotoURL: x.PhotoURL, Description: x.Description, DeviceType: enumJSON(x.DeviceType), ProductID: x.ProductID, ProductName: x.ProductName, State: enumJSON(x.State), Edge: x.Edge, SuperDeviceType: enumJSON(x.SuperDeviceType), CreatorID: x.CreatorID, CreatorName: x.CreatorName, CreateTime: millisJSON(x.CreateTime), RegistryTime: millisJSON(x.RegistryTime), ModifyTime: millisJSON(x.ModifyTime), ModifierID: x.ModifierID, ModifierName: x.ModifierName, Features: featuresOf(x.Features), VirtualType: enumJSON(x.VirtualType), Regulator: x.Regulator, ComeFrom: enumJSON(x.ComeFrom), DeviceCreateType: enumJSON(x.DeviceCreateType), PresetType: enumJSON(x.PresetType), CategoryType: enumJSON(x.CategoryType), MediaDevice: x.MediaDevice, DeviceMetadata: x.DeviceMetadata, Configuration: deviceConfigJSON(x.Configuration), OrgID: x.OrgID, StorePolicy: x.StorePolicy}
}

func featuresOf(fs []meta.DeviceFeature) []featureJSON {
	if fs == nil {
		return nil
	}
	out := make([]featureJSON, len(fs))
	for i, f := range fs {
		out[i] = featureJSON(f)
	}
	return out
}

func mapPage[T, U any](p *meta.Page[T], f func(*T) U) pageJSON[U] {
	out := pageJSON[U]{p.PageIndex, p.PageSize, p.Total, p.TotalExact, nil}
	if p.Data != nil {
		out.Data = make([]U, len(p.Data))
		for i := range p.Data {
			out.Data[i] = f(&p.Data[i])
		}
	}
	return out
}
