package api

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gofiber/fiber/v2"

	"devicehub/meta"
	"devicehub/schema/jsonw"
)

// The references of the encoders: meta's rows as they were written by
// encoding/json, from their json tags, and meta.Enum, meta.Millis and
// meta.Permission by their MarshalJSON, copied here.

// enumJSON is meta.Enum as encoding/json wrote it: {"text", "value"}.
type enumJSON meta.Enum

func (e enumJSON) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		Text  string `json:"text"`
		Value string `json:"value"`
	}{meta.Enum(e).Text(), string(e)})
}

// millisJSON is meta.Millis as encoding/json wrote it: epoch ms, 0 for none.
type millisJSON meta.Millis

func (m millisJSON) MarshalJSON() ([]byte, error) {
	t := time.Time(m)
	if t.IsZero() {
		return []byte{'0'}, nil
	}
	return strconv.AppendInt(make([]byte, 0, 16), t.UnixMilli(), 10), nil
}

// permissionJSON is meta.Permission as encoding/json wrote it.
type permissionJSON meta.Permission

func (p permissionJSON) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		Text  string `json:"text"`
		Value string `json:"value"`
	}{meta.Permission(p).Text(), string(p)})
}

func permissionsOf(ps []meta.Permission) []permissionJSON {
	if ps == nil {
		return nil
	}
	out := make([]permissionJSON, len(ps))
	for i, p := range ps {
		out[i] = permissionJSON(p)
	}
	return out
}

type detailJSON struct {
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
	DeviceType          enumJSON          `json:"deviceType"`
	State               enumJSON          `json:"state"`
	Address             string            `json:"address"`
	OnlineTime          millisJSON        `json:"onlineTime"`
	OfflineTime         millisJSON        `json:"offlineTime"`
	CreateTime          millisJSON        `json:"createTime"`
	RegisterTime        millisJSON        `json:"registerTime"`
	ModifyTime          millisJSON        `json:"modifyTime"`
	Metadata            string            `json:"metadata"`
	IndependentMetadata bool              `json:"independentMetadata"`
	Configuration       deviceConfigJSON  `json:"configuration"`
	DeviceConfiguration json.RawMessage   `json:"deviceConfiguration"`
	CachedConfiguration json.RawMessage   `json:"cachedConfiguration"`
	AloneConfiguration  bool              `json:"aloneConfiguration"`
	ConnectServerID     string            `json:"connectServerId"`
	Edge                bool              `json:"edge"`
	Tags                []json.RawMessage `json:"tags"`
	Binds               []json.RawMessage `json:"binds"`
	Features            []featureJSON     `json:"features"`
	Relations           []relationJSON    `json:"relations"`
	AccessID            string            `json:"accessId"`
	AccessProvider      string            `json:"accessProvider"`
	AccessName          string            `json:"accessName"`
	ClassifiedID        string            `json:"classifiedId"`
	ClassifiedName      string            `json:"classifiedName"`
	PresetType          enumJSON          `json:"presetType"`
	SuperDeviceType     enumJSON          `json:"superDeviceType"`
	MediaDevice         bool              `json:"mediaDevice"`
	Regulator           bool              `json:"regulator"`
	CreatorID           string            `json:"creatorId"`
	CreatorName         string            `json:"creatorName"`
	ModifierID          string            `json:"modifierId"`
	ModifierName        string            `json:"modifierName"`
	OrgID               string            `json:"orgId"`
	StorePolicy         string            `json:"storePolicy"`
}
type relationJSON struct {
	ObjectID     string `json:"objectId"`
	Relation     string `json:"relation"`
	RelationName string `json:"relationName"`
}

func detailOf(x *meta.DeviceDetail) detailJSON {
	var rels []relationJSON
	if x.Relations != nil {
		rels = make([]relationJSON, len(x.Relations))
		for i, r := range x.Relations {
			rels[i] = relationJSON(r)
		}
	}
	return detailJSON{ID: x.ID, Name: x.Name, Description: x.Description, ProductPhotoURL: x.ProductPhotoURL,
		DevicePhotoURL: x.DevicePhotoURL, Protocol: x.Protocol, ProtocolName: x.ProtocolName, Transport: x.Transport,
		ProductID: x.ProductID, ProductName: x.ProductName, DeviceType: enumJSON(x.DeviceType), State: enumJSON(x.State),
		Address: x.Address, OnlineTime: millisJSON(x.OnlineTime), OfflineTime: millisJSON(x.OfflineTime),
		CreateTime: millisJSON(x.CreateTime), RegisterTime: millisJSON(x.RegisterTime), ModifyTime: millisJSON(x.ModifyTime),
		Metadata: x.Metadata, IndependentMetadata: x.IndependentMetadata, Configuration: deviceConfigJSON(x.Configuration),
		DeviceConfiguration: x.DeviceConfiguration, CachedConfiguration: x.CachedConfiguration,
		AloneConfiguration: x.AloneConfiguration, ConnectServerID: x.ConnectServerID, Edge: x.Edge, Tags: x.Tags,
		Binds: x.Binds, Features: featuresOf(x.Features), Relations: rels, AccessID: x.AccessID,
		AccessProvider: x.AccessProvider, AccessName: x.AccessName, ClassifiedID: x.ClassifiedID,
		ClassifiedName: x.ClassifiedName, PresetType: enumJSON(x.PresetType), SuperDeviceType: enumJSON(x.SuperDeviceType),
		MediaDevice: x.MediaDevice, Regulator: x.Regulator, CreatorID: x.CreatorID, CreatorName: x.CreatorName,
		ModifierID: x.ModifierID, ModifierName: x.ModifierName, OrgID: x.OrgID, StorePolicy: x.StorePolicy}
}

type roleJSON struct {
	ID          string           `json:"id"`
	Name        string           `json:"name"`
	Description string           `json:"description"`
	State       enumJSON         `json:"state"`
	CreatorID   string           `json:"creatorId"`
	CreateTime  millisJSON       `json:"createTime"`
	Permissions []permissionJSON `json:"permissions"`
	Products    []string         `json:"products"`
}

func roleOf(x *meta.Role) roleJSON {
	return roleJSON{x.ID, x.Name, x.Description, enumJSON(x.State), x.CreatorID, millisJSON(x.CreateTime),
		permissionsOf(x.Permissions), x.Products}
}

type userJSON struct {
	ID          string                       `json:"id"`
	Username    string                       `json:"username"`
	Name        string                       `json:"name"`
	Roles       []string                     `json:"roles"`
	Permissions []string                     `json:"permissions"`
	Products    map[meta.Permission][]string `json:"products,omitempty"`
	KeyID       string                       `json:"keyId,omitempty"`
}

func userOf(x *meta.User) userJSON {
	return userJSON{x.ID, x.Username, x.Name, x.Roles, x.Permissions, x.Products, x.KeyID}
}

type userDetailJSON struct {
	ID         string     `json:"id"`
	Username   string     `json:"username"`
	Name       string     `json:"name"`
	State      enumJSON   `json:"state"`
	Roles      []string   `json:"roles"`
	CreateTime millisJSON `json:"createTime"`
}

func userDetailOf(x *meta.UserDetail) userDetailJSON {
	return userDetailJSON{x.ID, x.Username, x.Name, enumJSON(x.State), x.Roles, millisJSON(x.CreateTime)}
}

type keyJSON struct {
	ID          string           `json:"id"`
	Name        string           `json:"name"`
	UserID      string           `json:"userId"`
	Username    string           `json:"username"`
	Permissions []permissionJSON `json:"permissions"`
	Products    []string         `json:"products"`
	CreateTime  millisJSON       `json:"createTime"`
	ExpiresAt   millisJSON       `json:"expiresAt"`
	LastUsed    millisJSON       `json:"lastUsed"`
}
type createdKeyJSON struct {
	keyJSON
	Secret string `json:"key"`
}

func keyOf(x *meta.Key) keyJSON {
	return keyJSON{x.ID, x.Name, x.UserID, x.Username, permissionsOf(x.Permissions), x.Products,
		millisJSON(x.CreateTime), millisJSON(x.ExpiresAt), millisJSON(x.LastUsed)}
}

type auditJSON struct {
	ID       int64      `json:"id"`
	Time     millisJSON `json:"time"`
	UserID   string     `json:"userId"`
	Username string     `json:"username"`
	Address  string     `json:"address"`
	Method   string     `json:"method"`
	Route    string     `json:"route"`
	ObjectID string     `json:"objectId"`
	Status   int        `json:"status"`
	Code     string     `json:"code"`
	KeyID    string     `json:"keyId"`
	Count    int        `json:"count"`
	First    millisJSON `json:"firstTime"`
}

func auditOf(x *meta.AuditEntry) auditJSON {
	return auditJSON{x.ID, millisJSON(x.Time), x.UserID, x.Username, x.Address, x.Method, x.Route, x.ObjectID,
		x.Status, x.Code, x.KeyID, x.Count, millisJSON(x.FirstTime)}
}

type bulkRowJSON struct {
	Row    int    `json:"row"`
	ID     string `json:"id"`
	Field  string `json:"field"`
	Reason string `json:"reason"`
}
type createdDeviceJSON struct {
	ID        string `json:"id"`
	SecureID  string `json:"secureId"`
	SecureKey string `json:"secureKey"`
}
type bulkCreatedJSON struct {
	Total    int                 `json:"total"`
	Deployed bool                `json:"deployed"`
	Devices  []createdDeviceJSON `json:"devices"`
}
type bulkChangedJSON struct {
	Total   int `json:"total"`
	Changed int `json:"changed"`
}

// rawTexts are JSON values as a jsonb column or a request gives them:
// whitespace inside and around, HTML characters, U+2028 and U+2029,
// escapes, invalid UTF-8 in a string, nulls, empty ones.
var rawTexts = []string{
	`{}`, `[]`, `""`, `null`, "{\"a\": 1, \"b\" : [1, 2 ,3]}", " \n\t{ \"k\" :\t\"v w\" }\r\n ",
	`{"html": "<b>&amp;</b>", "<k>": "a > b & c"}`, "{\"ls\": \"line\u2028para\u2029end\", \"e2\": \"\u20ac\u2027\u202a\"}",
	`{"esc": "quote \" back \\ slash \\\" <", "u": "\u003c\u2028 \ud83d\ude80", "bs": "\\<"}`,
	`[null, true, false, 1.5e3, -0, {"x": null}]`, `{"nested": {"deep": [{"x": "y  z"}, {}, []], "n": null}}`,
	`"a string with  spaces"`, "{\"bad utf8\": \"\xff\xfe\", \"cut\": \"\xe2\x80\"}", `{"key with space": " v "}`,
	`  12.5e-3  `, "{\"tab\\tin\": \"x\\ny\"}", "{\"end\u2028\": \"\u2028\"}",
}

// randomRaw is a random JSON value with random whitespace and HTML
// characters left as they are.
func randomRaw(r *rand.Rand) json.RawMessage {
	if r.IntN(3) == 0 {
		if r.IntN(8) == 0 {
			return nil
		}
		return json.RawMessage(rawTexts[r.IntN(len(rawTexts))])
	}
	var value func(depth int) any
	value = func(depth int) any {
		switch k := r.IntN(6); {
		case k == 0 || depth > 2:
			return strings.ToValidUTF8(randomText(r), "?") + "<&>"
		case k == 1:
			return r.Float64() * 1e6
		case k == 2:
			return nil
		case k == 3:
			var a []any
			for range r.IntN(4) {
				a = append(a, value(depth+1))
			}
			return a
		default:
			m := map[string]any{}
			for range r.IntN(4) {
				m[strings.ToValidUTF8(randomText(r), "?")] = value(depth + 1)
			}
			return m
		}
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent(strings.Repeat(" ", r.IntN(3)), strings.Repeat("\t", r.IntN(2)))
	if err := enc.Encode(value(0)); err != nil {
		panic(err)
	}
	return buf.Bytes()
}

func randomRaws(r *rand.Rand) []json.RawMessage {
	switch r.IntN(3) {
	case 0:
		return nil
	case 1:
		return []json.RawMessage{}
	}
	var out []json.RawMessage
	for range r.IntN(4) + 1 {
		out = append(out, randomRaw(r))
	}
	return out
}

func randomStrings(r *rand.Rand) []string {
	if r.IntN(3) == 0 {
		return nil
	}
	out := []string{}
	for range r.IntN(3) {
		out = append(out, randomText(r))
	}
	return out
}

func randomPermissions(r *rand.Rand) []meta.Permission {
	if r.IntN(4) == 0 {
		return nil
	}
	out := []meta.Permission{}
	for range r.IntN(4) {
		if r.IntN(2) == 0 {
			out = append(out, meta.Permissions[r.IntN(len(meta.Permissions))])
		} else {
			out = append(out, meta.Permission(randomText(r)))
		}
	}
	return out
}

func randomDetail(r *rand.Rand) meta.DeviceDetail {
	d := meta.DeviceDetail{
		ID: randomText(r), Name: randomText(r), Description: randomText(r), ProductPhotoURL: randomText(r),
		DevicePhotoURL: randomText(r), Protocol: randomText(r), ProtocolName: randomText(r), Transport: randomText(r),
		ProductID: randomText(r), ProductName: randomText(r), DeviceType: randomEnum(r), State: randomEnum(r),
		Address: randomText(r), OnlineTime: randomMillis(r), OfflineTime: randomMillis(r), CreateTime: randomMillis(r),
		RegisterTime: randomMillis(r), ModifyTime: randomMillis(r), Metadata: randomText(r),
		IndependentMetadata: r.IntN(2) == 0,
		Configuration:       meta.DeviceConfig{SecureID: randomText(r), SecureKey: randomText(r), ChannelID: randomText(r)},
		DeviceConfiguration: randomRaw(r), CachedConfiguration: randomRaw(r), AloneConfiguration: r.IntN(2) == 0,
		ConnectServerID: randomText(r), Edge: r.IntN(2) == 0, Tags: randomRaws(r), Binds: randomRaws(r),
		AccessID: randomText(r), AccessProvider: randomText(r), AccessName: randomText(r), ClassifiedID: randomText(r),
		ClassifiedName: randomText(r), PresetType: randomEnum(r), SuperDeviceType: randomEnum(r),
		MediaDevice: r.IntN(2) == 0, Regulator: r.IntN(2) == 0, CreatorID: randomText(r), CreatorName: randomText(r),
		ModifierID: randomText(r), ModifierName: randomText(r), OrgID: randomText(r), StorePolicy: randomText(r),
		Features: randomDevice(r).Features,
	}
	if r.IntN(3) > 0 {
		d.Relations = []meta.DeviceRelation{}
		for range r.IntN(3) {
			d.Relations = append(d.Relations, meta.DeviceRelation{ObjectID: randomText(r), Relation: randomText(r), RelationName: randomText(r)})
		}
	}
	return d
}

// TestRowEncoders checks that the encoders of device details, roles,
// users, keys, audit entries and bulk results write the bytes
// encoding/json wrote for them, for random rows made of texts that need
// escapes and of raw JSON with whitespace, HTML characters and U+2028.
func TestRowEncoders(t *testing.T) {
	r := rand.New(rand.NewPCG(35, 2))
	for range 500 {
		d := randomDetail(r)
		compareJSON(t, detailOf(&d), appendDeviceDetail(&d, []byte("prefix")))

		role := meta.Role{ID: randomText(r), Name: randomText(r), Description: randomText(r), State: randomEnum(r),
			CreatorID: randomText(r), CreateTime: randomMillis(r), Permissions: randomPermissions(r), Products: randomStrings(r)}
		compareJSON(t, roleOf(&role), appendRole(&role, []byte("prefix")))

		u := meta.User{ID: randomText(r), Username: randomText(r), Name: randomText(r), Roles: randomStrings(r),
			Permissions: randomStrings(r)}
		if r.IntN(2) == 0 {
			u.KeyID = randomText(r)
		}
		if k := r.IntN(3); k > 0 {
			u.Products = map[meta.Permission][]string{}
			for range k - 1 + r.IntN(3) {
				u.Products[meta.Permission(randomText(r))] = randomStrings(r)
			}
		}
		compareJSON(t, userOf(&u), appendUser(&u, []byte("prefix")))

		ud := meta.UserDetail{ID: randomText(r), Username: randomText(r), Name: randomText(r), State: randomEnum(r),
			Roles: randomStrings(r), CreateTime: randomMillis(r)}
		compareJSON(t, userDetailOf(&ud), appendUserDetail(&ud, []byte("prefix")))

		k := meta.CreatedKey{Key: meta.Key{ID: randomText(r), Name: randomText(r), UserID: randomText(r),
			Username: randomText(r), Permissions: randomPermissions(r), Products: randomStrings(r),
			CreateTime: randomMillis(r), ExpiresAt: randomMillis(r), LastUsed: randomMillis(r)}, Secret: randomText(r)}
		compareJSON(t, keyOf(&k.Key), appendKey(&k.Key, []byte("prefix")))
		compareJSON(t, createdKeyJSON{keyOf(&k.Key), k.Secret}, appendCreatedKey(&k, []byte("prefix")))

		e := meta.AuditEntry{ID: r.Int64N(1e12) - 5, Time: randomMillis(r), UserID: randomText(r), Username: randomText(r),
			Address: randomText(r), Method: randomText(r), Route: randomText(r), ObjectID: randomText(r),
			Status: r.IntN(600), Code: randomText(r), KeyID: randomText(r), Count: r.IntN(1000), FirstTime: randomMillis(r)}
		compareJSON(t, auditOf(&e), appendAuditEntry(&e, []byte("prefix")))

		var rows []meta.BulkRowError
		var rowsJSON []bulkRowJSON
		for range r.IntN(3) {
			rows = append(rows, meta.BulkRowError{Row: r.IntN(1e5), ID: randomText(r), Field: randomText(r), Reason: randomText(r)})
			rowsJSON = append(rowsJSON, bulkRowJSON(rows[len(rows)-1]))
		}
		compareJSON(t, rowsJSON, jsonw.List([]byte("prefix"), rows, appendBulkRowError))

		created := meta.BulkCreated{Total: r.IntN(1e4), Deployed: r.IntN(2) == 0}
		var createdJSON bulkCreatedJSON
		if r.IntN(4) > 0 {
			created.Devices, createdJSON.Devices = []meta.CreatedDevice{}, []createdDeviceJSON{}
			for range r.IntN(3) {
				created.Devices = append(created.Devices, meta.CreatedDevice{ID: randomText(r), SecureID: randomText(r), SecureKey: randomText(r)})
				createdJSON.Devices = append(createdJSON.Devices, createdDeviceJSON(created.Devices[len(created.Devices)-1]))
			}
		}
		createdJSON.Total, createdJSON.Deployed = created.Total, created.Deployed
		compareJSON(t, createdJSON, appendBulkCreated(&created, []byte("prefix")))
		changed := meta.BulkChanged{Total: r.IntN(1e4), Changed: r.IntN(1e4)}
		compareJSON(t, bulkChangedJSON{changed.Total, changed.Changed}, appendBulkChanged(&changed, []byte("prefix")))
	}
}

// TestOKDeviceDetail checks a whole answer of endpoint 8: okItem with
// appendDeviceDetail answers the bytes and headers ok (encoding/json
// through Fiber) answered for the detail, for each of rawTexts as its
// configuration, a tag and a bind.
func TestOKDeviceDetail(t *testing.T) {
	var details []meta.DeviceDetail
	for i, raw := range rawTexts {
		details = append(details, meta.DeviceDetail{ID: "d<" + raw + ">", Name: "Kitchen \u2028 \"meter\"", State: "online",
			CreateTime: meta.Millis(time.UnixMilli(1700000000123 + int64(i))), Metadata: `{"properties":[<&>]}`,
			DeviceConfiguration: json.RawMessage(raw), CachedConfiguration: json.RawMessage(raw),
			Tags: []json.RawMessage{json.RawMessage(raw), nil}, Binds: []json.RawMessage{}, Features: []meta.DeviceFeature{},
			Relations: []meta.DeviceRelation{{ObjectID: "o&", Relation: "r"}}})
	}
	details = append(details, meta.DeviceDetail{}) // every list and raw value nil
	app := fiber.New()
	app.Get("/ok/:i", func(c *fiber.Ctx) error {
		i, _ := c.ParamsInt("i")
		return ok(c, detailOf(&details[i]))
	})
	app.Get("/item/:i", func(c *fiber.Ctx) error {
		i, _ := c.ParamsInt("i")
		return okItem(c, &details[i], appendDeviceDetail)
	})
	get := func(path string) (string, []byte) { t.Helper(); return getStamped(t, app, path) }
	for i := range details {
		wantType, want := get("/ok/" + strconv.Itoa(i))
		gotType, got := get("/item/" + strconv.Itoa(i))
		if gotType != wantType || !bytes.Equal(got, want) {
			t.Errorf("detail %d:\n got %s %s\nwant %s %s", i, gotType, got, wantType, want)
		}
	}
}

// BenchmarkDeviceDetailJSON writes the body of endpoint 8 for a device
// with a thing model of 8 properties, a configuration and tags: as ok did
// (encoding/json of the envelope, the detail from its json tags) and as
// okItem does (appendDeviceDetail into a pooled buffer).
func BenchmarkDeviceDetailJSON(b *testing.B) {
	var model strings.Builder
	model.WriteString(`{"properties":[`)
	for i := range 8 {
		if i > 0 {
			model.WriteByte(',')
		}
		model.WriteString(`{"id":"temperature` + strconv.Itoa(i) + `","name":"Temperature <inside>","valueType":{"type":"float","unit":"celsiusDegrees","scale":2},"expands":{"readOnly":"true"}}`)
	}
	model.WriteString(`],"events":[],"functions":[],"tags":[]}`)
	d := meta.DeviceDetail{ID: "meter-000123", Name: "Kitchen meter", ProductID: "meters", ProductName: "Meters",
		DeviceType: "device", State: "online", Address: "10.1.2.3", OnlineTime: meta.Millis(time.UnixMilli(1700000000123)),
		CreateTime: meta.Millis(time.UnixMilli(1690000000000)), ModifyTime: meta.Millis(time.UnixMilli(1700000000000)),
		Metadata: model.String(), Configuration: meta.DeviceConfig{SecureID: "meter-000123", SecureKey: "******"},
		DeviceConfiguration: json.RawMessage(`{"interval": 30, "mode": "eco", "limits": {"min": -10, "max": 45}}`),
		CachedConfiguration: json.RawMessage(`{"interval": 30, "mode": "eco", "limits": {"min": -10, "max": 45}}`),
		AloneConfiguration:  true, Tags: []json.RawMessage{json.RawMessage(`{"key": "floor", "value": "2"}`), json.RawMessage(`{"key": "room", "value": "kitchen"}`)},
		Binds: []json.RawMessage{}, Features: []meta.DeviceFeature{{ID: "f1", Name: "Feature 1"}}, Relations: []meta.DeviceRelation{},
		CreatorID: "admin", CreatorName: "Administrator", ModifierID: "admin", ModifierName: "Administrator"}
	b.Run("encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			body, err := json.Marshal(envelope{Message: "success", Result: detailOf(&d), Status: 200, Timestamp: time.Now().UnixMilli()})
			if err != nil || len(body) < 1000 {
				b.Fatal(err)
			}
		}
	})
	b.Run("append", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			buf := bodyBuffers.Get().(*[]byte)
			body := append((*buf)[:0], `{"message":"success","result":`...)
			body = appendDeviceDetail(&d, body)
			body = append(body, `,"status":200,"timestamp":`...)
			body = strconv.AppendInt(body, time.Now().UnixMilli(), 10)
			body = append(body, '}')
			if len(body) < 1000 {
				b.Fatal(len(body))
			}
			*buf = body
			bodyBuffers.Put(buf)
		}
	})
}
