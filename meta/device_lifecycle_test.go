package meta_test

import (
	"context"
	"errors"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"devicehub/meta"
	"devicehub/meta/metatest"
	"devicehub/schema"
)

// Device lifecycle (device_writes.go) and device state (device_state.go)
// against a real PostgreSQL database of the test's own.

// lcAdmin is the creator and modifier of the writes below.
var lcAdmin = meta.User{ID: "admin", Username: "admin", Name: "Administrator"}

// createTestProduct creates product id, deployed (state 1) or not.
func createTestProduct(t *testing.T, s *meta.Store, id string, deployed bool) meta.Product {
	t.Helper()
	ctx := context.Background()
	p, err := s.CreateProduct(ctx, meta.NewProduct{ID: id, Name: "Product " + id, ClassifiedID: "c",
		AccessID: "mqtt", ModelFrom: "custom", DeviceType: "device"}, lcAdmin.ID)
	if err != nil {
		t.Fatalf("create product %s: %v", id, err)
	}
	if deployed {
		if err := s.SetProductState(ctx, id, 1, lcAdmin.ID); err != nil {
			t.Fatalf("deploy product %s: %v", id, err)
		}
	}
	return p
}

// createTestDevice creates device id of product, in state notActive.
func createTestDevice(t *testing.T, s *meta.Store, id, product string) meta.DeviceDetail {
	t.Helper()
	d, err := s.CreateDevice(context.Background(), meta.NewDevice{ID: id, Name: "Device " + id, ProductID: product}, lcAdmin)
	if err != nil {
		t.Fatalf("create device %s: %v", id, err)
	}
	return d
}

// deployTestDevice deploys device id.
func deployTestDevice(t *testing.T, s *meta.Store, id string) meta.DeviceDetail {
	t.Helper()
	d, err := s.DeployDevice(context.Background(), id, lcAdmin)
	if err != nil {
		t.Fatalf("deploy device %s: %v", id, err)
	}
	return d
}

// deviceDetail reads device id, which must exist.
func deviceDetail(t *testing.T, s *meta.Store, id string) meta.DeviceDetail {
	t.Helper()
	d, err := s.GetDeviceDetail(context.Background(), id)
	if err != nil {
		t.Fatalf("device %s: %v", id, err)
	}
	return d
}

// wantArgField fails unless err is an input error naming field.
func wantArgField(t *testing.T, err error, field string) {
	t.Helper()
	var ae *schema.ArgError
	if !errors.As(err, &ae) || !errors.Is(err, schema.ErrIllegalArgument) {
		t.Fatalf("error %v, want an input error on %q", err, field)
	}
	if ae.Field != field {
		t.Fatalf("error %v names field %q, want %q", err, ae.Field, field)
	}
}

func countRows(t *testing.T, s *meta.Store, table string) int {
	t.Helper()
	var n int
	if err := s.DB().Get(&n, "SELECT count(*) FROM "+table); err != nil {
		t.Fatal(err)
	}
	return n
}

func millis(m meta.Millis) int64 {
	if time.Time(m).IsZero() {
		return 0
	}
	return time.Time(m).UnixMilli()
}

func ptr[T any](v T) *T { return &v }

var hex32 = regexp.MustCompile(`^[0-9a-f]{32}$`)

func TestCreateDevice(t *testing.T) {
	t.Parallel()
	s := metatest.NewStore(t)
	ctx := context.Background()
	createTestProduct(t, s, "p", false)
	creator := meta.User{ID: "u1", Username: "alice"}

	// Defaults: state notActive, secureId = id, a generated key shown once.
	d, err := s.CreateDevice(ctx, meta.NewDevice{ID: "d1", Name: "One", ProductID: "p"}, creator)
	if err != nil {
		t.Fatal(err)
	}
	if d.State != meta.StateNotActive || d.ProductID != "p" || d.ProductName != "Product p" || d.Name != "One" {
		t.Fatalf("created %+v", d)
	}
	if millis(d.RegisterTime) != 0 || d.IndependentMetadata {
		t.Fatalf("registerTime %d, independentMetadata %v", millis(d.RegisterTime), d.IndependentMetadata)
	}
	if d.CreatorID != "u1" || d.CreatorName != "alice" || d.ModifierID != "u1" || d.ModifierName != "alice" {
		t.Fatalf("creator %q %q, modifier %q %q", d.CreatorID, d.CreatorName, d.ModifierID, d.ModifierName)
	}
	if d.Configuration.SecureID != "d1" || !hex32.MatchString(d.Configuration.SecureKey) {
		t.Fatalf("configuration %+v, want secureId d1 and a fresh 32-hex key", d.Configuration)
	}
	// The key leaves the store masked afterwards; the broker's view holds it.
	if got := deviceDetail(t, s, "d1").Configuration.SecureKey; got != meta.MaskSecret("x") {
		t.Fatalf("detail shows key %q, want it masked", got)
	}
	logins, err := s.DeviceLogins(ctx, []string{"d1"})
	if err != nil || len(logins) != 1 || logins[0].SecureKey != d.Configuration.SecureKey {
		t.Fatalf("logins %+v %v, want the key returned at creation", logins, err)
	}

	// A given secureId and key are kept; no id gives a generated one.
	d2, err := s.CreateDevice(ctx, meta.NewDevice{Name: "Two", ProductID: "p",
		Configuration: &meta.DeviceConfigInput{SecureID: ptr("sid-2"), SecureKey: ptr("key-2-0123456789ab"), ChannelID: ptr("ch")}}, creator)
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^[0-9a-f]{16}$`).MatchString(d2.ID) {
		t.Fatalf("generated id %q", d2.ID)
	}
	if c := d2.Configuration; c != (meta.DeviceConfig{SecureID: "sid-2", SecureKey: "key-2-0123456789ab", ChannelID: "ch"}) {
		t.Fatalf("configuration %+v", c)
	}

	// A masked key, as a client echoes the detail, is no key: one is generated.
	d3, err := s.CreateDevice(ctx, meta.NewDevice{ID: "d3", Name: "Three", ProductID: "p",
		Configuration: &meta.DeviceConfigInput{SecureKey: ptr("******")}}, creator)
	if err != nil || !hex32.MatchString(d3.Configuration.SecureKey) {
		t.Fatalf("masked key: %+v %v, want a generated key", d3.Configuration, err)
	}
}

func TestCreateDeviceRefused(t *testing.T) {
	t.Parallel()
	s := metatest.NewStore(t)
	ctx := context.Background()
	createTestProduct(t, s, "p", false)
	createTestDevice(t, s, "taken", "p")
	if _, err := s.CreateDevice(ctx, meta.NewDevice{ID: "other", Name: "O", ProductID: "p",
		Configuration: &meta.DeviceConfigInput{SecureID: ptr("sid-other")}}, lcAdmin); err != nil {
		t.Fatal(err)
	}

	long := func(n int) string { return strings.Repeat("x", n) }
	for _, c := range []struct {
		name  string
		n     meta.NewDevice
		field string // an input error on this field, or
		is    error  // this sentinel
		msg   string // and this in the message
	}{
		{name: "bad id", n: meta.NewDevice{ID: "a b", Name: "n", ProductID: "p"}, field: "id"},
		{name: "id too long", n: meta.NewDevice{ID: long(65), Name: "n", ProductID: "p"}, field: "id"},
		{name: "no name", n: meta.NewDevice{ID: "n1", ProductID: "p"}, field: "name"},
		{name: "name too long", n: meta.NewDevice{ID: "n1", Name: long(129), ProductID: "p"}, field: "name"},
		{name: "no product", n: meta.NewDevice{ID: "n1", Name: "n"}, field: "productId"},
		{name: "description too long", n: meta.NewDevice{ID: "n1", Name: "n", ProductID: "p", Description: long(2049)}, field: "description"},
		{name: "feature without id", n: meta.NewDevice{ID: "n1", Name: "n", ProductID: "p", Features: []meta.DeviceFeature{{Name: "f"}}}, field: "features[0].id"},
		{name: "relation without objectId", n: meta.NewDevice{ID: "n1", Name: "n", ProductID: "p", Relations: []meta.DeviceRelation{{Relation: "r"}}}, field: "relations[0].objectId"},
		{name: "secureId too long", n: meta.NewDevice{ID: "n1", Name: "n", ProductID: "p", Configuration: &meta.DeviceConfigInput{SecureID: ptr(long(129))}}, field: "configuration.secureId"},
		{name: "deviceConfiguration not an object", n: meta.NewDevice{ID: "n1", Name: "n", ProductID: "p", DeviceConfiguration: []byte(`[1]`)}, field: "deviceConfiguration"},
		{name: "tags not an array", n: meta.NewDevice{ID: "n1", Name: "n", ProductID: "p", Tags: []byte(`{"a":1}`)}, field: "tags"},
		{name: "too many tags", n: meta.NewDevice{ID: "n1", Name: "n", ProductID: "p", Tags: []byte("[" + strings.Repeat("1,", 256) + "1]")}, field: "tags"},
		{name: "unknown product", n: meta.NewDevice{ID: "n1", Name: "n", ProductID: "nope"}, is: meta.ErrNotFound, msg: `product "nope"`},
		{name: "id taken", n: meta.NewDevice{ID: "taken", Name: "n", ProductID: "p"}, is: meta.ErrDuplicateKey, msg: `device "taken"`},
		{name: "secureId taken", n: meta.NewDevice{ID: "n1", Name: "n", ProductID: "p", Configuration: &meta.DeviceConfigInput{SecureID: ptr("sid-other")}}, is: meta.ErrDuplicateKey, msg: "configuration.secureId"},
		// secureId defaults to the id: another device may not take it.
		{name: "secureId of a default", n: meta.NewDevice{ID: "n1", Name: "n", ProductID: "p", Configuration: &meta.DeviceConfigInput{SecureID: ptr("taken")}}, is: meta.ErrDuplicateKey, msg: "configuration.secureId"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := s.CreateDevice(ctx, c.n, lcAdmin)
			if c.field != "" {
				wantArgField(t, err, c.field)
			} else {
				if !errors.Is(err, c.is) || errors.Is(err, schema.ErrIllegalArgument) {
					t.Fatalf("error %v, want %v", err, c.is)
				}
				if !strings.Contains(err.Error(), c.msg) {
					t.Fatalf("error %q does not name %q", err, c.msg)
				}
			}
			if n := countRows(t, s, "devices"); n != 2 {
				t.Fatalf("%d devices after a refused create, want 2", n)
			}
		})
	}
}

func TestUpdateDevice(t *testing.T) {
	t.Parallel()
	s := metatest.NewStore(t)
	ctx := context.Background()
	createTestProduct(t, s, "p", false)
	d0 := createTestDevice(t, s, "d", "p")
	createTestDevice(t, s, "other", "p")
	bob := meta.User{ID: "u2", Username: "bob", Name: "Bob"}

	// A write based on the current version applies, and makes a new version.
	v0 := millis(d0.ModifyTime)
	d1, err := s.UpdateDevice(ctx, "d", meta.DevicePatch{Name: ptr("renamed"), ModifyTime: &v0,
		Configuration: &meta.DeviceConfigInput{SecureKey: ptr("******")}}, bob)
	if err != nil {
		t.Fatal(err)
	}
	if d1.Name != "renamed" || millis(d1.ModifyTime) <= v0 || d1.ModifierID != "u2" || d1.ModifierName != "Bob" {
		t.Fatalf("updated %q, modifyTime %d (was %d), modifier %q %q", d1.Name, millis(d1.ModifyTime), v0, d1.ModifierID, d1.ModifierName)
	}
	// The masked key echoed back kept the stored one.
	if l, _ := s.DeviceLogins(ctx, []string{"d"}); len(l) != 1 || l[0].SecureKey != d0.Configuration.SecureKey {
		t.Fatalf("key after a masked echo: %+v, want %q", l, d0.Configuration.SecureKey)
	}

	// A write based on the old version is refused and changes nothing.
	_, err = s.UpdateDevice(ctx, "d", meta.DevicePatch{Name: ptr("lost"), ModifyTime: &v0}, bob)
	if !errors.Is(err, meta.ErrConflict) {
		t.Fatalf("stale modifyTime: %v, want ErrConflict", err)
	}
	if got := deviceDetail(t, s, "d"); got.Name != "renamed" || millis(got.ModifyTime) != millis(d1.ModifyTime) {
		t.Fatalf("after a refused write: %q %d", got.Name, millis(got.ModifyTime))
	}

	// Without modifyTime (or with 0) the write applies unconditionally.
	for _, mt := range []*int64{nil, ptr(int64(0))} {
		if _, err := s.UpdateDevice(ctx, "d", meta.DevicePatch{Description: ptr("free"), ModifyTime: mt}, bob); err != nil {
			t.Fatalf("unconditional write (modifyTime %v): %v", mt, err)
		}
	}

	// Every write makes a new version, even one within the same
	// millisecond as the last: here the stored version is ahead of the clock.
	if _, err := s.DB().Exec(`UPDATE devices SET modify_time = now() + interval '1 hour' WHERE id = 'd'`); err != nil {
		t.Fatal(err)
	}
	ahead := millis(deviceDetail(t, s, "d").ModifyTime)
	d2, err := s.UpdateDevice(ctx, "d", meta.DevicePatch{Description: ptr("next"), ModifyTime: &ahead}, bob)
	if err != nil {
		t.Fatal(err)
	}
	if got := millis(d2.ModifyTime); got != ahead+1 {
		t.Fatalf("modifyTime %d after a write on version %d, want %d", got, ahead, ahead+1)
	}

	// Fields: a new key replaces the stored one, secureId and channel too;
	// id and productId are accepted when they match.
	d3, err := s.UpdateDevice(ctx, "d", meta.DevicePatch{ID: ptr("d"), ProductID: ptr("p"),
		DevicePhotoURL: ptr("/img.png"), Edge: ptr(true), Tags: []byte(`[{"k":"v"}]`),
		DeviceConfiguration: []byte(`{"a":1}`), Features: &[]meta.DeviceFeature{{ID: "ota"}},
		Configuration: &meta.DeviceConfigInput{SecureID: ptr("sid-d"), SecureKey: ptr("new-key-0123456789"), ChannelID: ptr("c2")}}, bob)
	if err != nil {
		t.Fatal(err)
	}
	if d3.DevicePhotoURL != "/img.png" || !d3.Edge || len(d3.Tags) != 1 || !d3.AloneConfiguration ||
		len(d3.Features) != 1 || d3.Configuration.SecureID != "sid-d" || d3.Configuration.ChannelID != "c2" {
		t.Fatalf("updated %+v", d3)
	}
	if l, _ := s.DeviceLogins(ctx, []string{"d"}); len(l) != 1 || l[0].SecureKey != "new-key-0123456789" || l[0].SecureID != "sid-d" {
		t.Fatalf("login after update %+v", l)
	}

	// Refusals change nothing.
	before := deviceDetail(t, s, "d")
	for _, c := range []struct {
		name  string
		id    string
		p     meta.DevicePatch
		field string
		is    error
	}{
		{name: "id mismatch", id: "d", p: meta.DevicePatch{ID: ptr("other"), Name: ptr("x")}, field: "id"},
		{name: "empty name", id: "d", p: meta.DevicePatch{Name: ptr("")}, field: "name"},
		{name: "name too long", id: "d", p: meta.DevicePatch{Name: ptr(strings.Repeat("n", 129))}, field: "name"},
		{name: "other product", id: "d", p: meta.DevicePatch{ProductID: ptr("q"), Name: ptr("x")}, field: "productId"},
		{name: "bad feature", id: "d", p: meta.DevicePatch{Features: &[]meta.DeviceFeature{{}}}, field: "features[0].id"},
		{name: "bad relation", id: "d", p: meta.DevicePatch{Relations: &[]meta.DeviceRelation{{ObjectID: "o"}}}, field: "relations[0].relation"},
		{name: "bad tags", id: "d", p: meta.DevicePatch{Tags: []byte(`"t"`)}, field: "tags"},
		{name: "bad deviceConfiguration", id: "d", p: meta.DevicePatch{DeviceConfiguration: []byte(`"c"`)}, field: "deviceConfiguration"},
		{name: "secureId taken", id: "d", p: meta.DevicePatch{Configuration: &meta.DeviceConfigInput{SecureID: ptr("other")}}, is: meta.ErrDuplicateKey},
		{name: "unknown device", id: "nope", p: meta.DevicePatch{Name: ptr("x")}, is: meta.ErrNotFound},
		{name: "unknown device, conditional", id: "nope", p: meta.DevicePatch{Name: ptr("x"), ModifyTime: ptr(int64(1))}, is: meta.ErrNotFound},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := s.UpdateDevice(ctx, c.id, c.p, bob)
			if c.field != "" {
				wantArgField(t, err, c.field)
			} else if !errors.Is(err, c.is) {
				t.Fatalf("error %v, want %v", err, c.is)
			}
			if after := deviceDetail(t, s, "d"); millis(after.ModifyTime) != millis(before.ModifyTime) || after.Name != before.Name {
				t.Fatalf("a refused update changed the device: %+v", after)
			}
		})
	}
}

// TestUpdateDeviceConcurrentConditional: of writes sent together on one
// version, exactly one applies; the others are told of the conflict.
func TestUpdateDeviceConcurrentConditional(t *testing.T) {
	t.Parallel()
	s := metatest.NewStore(t)
	createTestProduct(t, s, "p", false)
	v := millis(createTestDevice(t, s, "d", "p").ModifyTime)
	const writers = 6
	var wg sync.WaitGroup
	errs := make([]error, writers)
	for i := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = s.UpdateDevice(context.Background(), "d", meta.DevicePatch{Name: ptr("w"), ModifyTime: &v}, lcAdmin)
		}()
	}
	wg.Wait()
	applied := 0
	for _, err := range errs {
		switch {
		case err == nil:
			applied++
		case !errors.Is(err, meta.ErrConflict):
			t.Fatalf("unexpected error %v", err)
		}
	}
	if applied != 1 {
		t.Fatalf("%d of %d writes on one version applied, want 1", applied, writers)
	}
}

func TestDeployUndeployDeleteDevice(t *testing.T) {
	t.Parallel()
	s := metatest.NewStore(t)
	ctx := context.Background()
	createTestProduct(t, s, "off", false)
	createTestProduct(t, s, "on", true)
	createTestDevice(t, s, "a", "off")
	createTestDevice(t, s, "b", "on")

	// The product must be deployed first; nothing changes meanwhile.
	if _, err := s.DeployDevice(ctx, "a", lcAdmin); !errors.Is(err, meta.ErrProductNotDeployed) || !errors.Is(err, schema.ErrIllegalArgument) {
		t.Fatalf("deploy under an undeployed product: %v", err)
	}
	if d := deviceDetail(t, s, "a"); d.State != meta.StateNotActive {
		t.Fatalf("state %s after a refused deploy", d.State)
	}
	if _, err := s.DeployDevice(ctx, "nope", lcAdmin); !errors.Is(err, meta.ErrNotFound) {
		t.Fatalf("deploy unknown: %v", err)
	}

	// notActive -> offline, with a registry time.
	bob := meta.User{ID: "u2", Username: "bob"}
	before := time.Now().Add(-time.Second)
	d, err := s.DeployDevice(ctx, "b", bob)
	if err != nil {
		t.Fatal(err)
	}
	if d.State != meta.StateOffline || time.Time(d.RegisterTime).Before(before) || d.ModifierName != "bob" {
		t.Fatalf("deployed: state %s, registerTime %v, modifier %q", d.State, time.Time(d.RegisterTime), d.ModifierName)
	}

	// A deployed device is left as it is, online included.
	if n, err := s.ApplyStateChanges(ctx, []meta.StateChange{{DeviceID: "b", Online: true, At: time.Now()}}); err != nil || n != 1 {
		t.Fatalf("online: %d %v", n, err)
	}
	again, err := s.DeployDevice(ctx, "b", lcAdmin)
	if err != nil {
		t.Fatal(err)
	}
	if again.State != meta.StateOnline || millis(again.RegisterTime) != millis(d.RegisterTime) {
		t.Fatalf("deploy again: state %s, registerTime %d (was %d)", again.State, millis(again.RegisterTime), millis(d.RegisterTime))
	}

	// A deployed device is not deleted.
	if _, err := s.DeleteDevice(ctx, "b"); !errors.Is(err, meta.ErrDeviceDeployed) || !errors.Is(err, schema.ErrIllegalArgument) {
		t.Fatalf("delete deployed: %v", err)
	}
	if _, err := s.GetDeviceRef(ctx, "b"); err != nil {
		t.Fatalf("deployed device gone after a refused delete: %v", err)
	}

	// Undeploy: from any state back to notActive, registry time cleared.
	u, err := s.UndeployDevice(ctx, "b", lcAdmin)
	if err != nil {
		t.Fatal(err)
	}
	if u.State != meta.StateNotActive || millis(u.RegisterTime) != 0 {
		t.Fatalf("undeployed: state %s, registerTime %d", u.State, millis(u.RegisterTime))
	}
	if _, err := s.UndeployDevice(ctx, "nope", lcAdmin); !errors.Is(err, meta.ErrNotFound) {
		t.Fatalf("undeploy unknown: %v", err)
	}

	// Delete returns what it deleted.
	del, err := s.DeleteDevice(ctx, "b")
	if err != nil || del.ID != "b" || del.ProductID != "on" {
		t.Fatalf("delete: %+v %v", del, err)
	}
	if _, err := s.GetDeviceRef(ctx, "b"); !errors.Is(err, meta.ErrNotFound) {
		t.Fatalf("deleted device: %v", err)
	}
	if _, err := s.DeleteDevice(ctx, "b"); !errors.Is(err, meta.ErrNotFound) {
		t.Fatalf("delete twice: %v", err)
	}
}

func TestDeviceStatusesAndRef(t *testing.T) {
	t.Parallel()
	s := metatest.NewStore(t)
	ctx := context.Background()
	createTestProduct(t, s, "p", true)
	if _, err := s.CreateProduct(ctx, meta.NewProduct{ID: "ctl", Name: "Controller", ClassifiedID: "c", AccessID: "mqtt",
		ModelFrom: "custom", DeviceType: "gateway", Regulator: true}, "admin"); err != nil {
		t.Fatal(err)
	}
	createTestDevice(t, s, "a", "p")
	createTestDevice(t, s, "b", "p")
	deployTestDevice(t, s, "b")
	if _, err := s.CreateDevice(ctx, meta.NewDevice{ID: "c", Name: "C", ProductID: "ctl"}, meta.User{ID: "u9", Username: "carol"}); err != nil {
		t.Fatal(err)
	}

	st, err := s.DeviceStatuses(ctx, []string{"a", "b", "c", "missing"})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]meta.DeviceStatus{
		"a": {ProductID: "p", State: meta.StateNotActive},
		"b": {ProductID: "p", State: meta.StateOffline},
		"c": {ProductID: "ctl", State: meta.StateNotActive},
	}
	if len(st) != len(want) {
		t.Fatalf("statuses %v, want %v", st, want)
	}
	for id, w := range want {
		if st[id] != w {
			t.Fatalf("status of %s: %+v, want %+v", id, st[id], w)
		}
	}
	if st, err := s.DeviceStatuses(ctx, nil); err != nil || len(st) != 0 {
		t.Fatalf("no ids: %v %v", st, err)
	}

	ref, err := s.GetDeviceRef(ctx, "c")
	if err != nil {
		t.Fatal(err)
	}
	p, _ := s.GetProduct(ctx, "ctl")
	if ref != (meta.DeviceRef{ID: "c", ProductID: "ctl", State: meta.StateNotActive, Regulator: true, Metadata: p.Metadata,
		Name: "C", ProductName: "Controller", CreatorID: "u9"}) {
		t.Fatalf("ref %+v", ref)
	}
	if _, err := s.GetDeviceRef(ctx, "missing"); !errors.Is(err, meta.ErrNotFound) {
		t.Fatalf("ref of unknown: %v", err)
	}
}

func TestApplyStateChanges(t *testing.T) {
	t.Parallel()
	s := metatest.NewStore(t)
	ctx := context.Background()
	createTestProduct(t, s, "p", true)
	for _, id := range []string{"a", "b", "idle"} {
		createTestDevice(t, s, id, "p")
		if id != "idle" {
			deployTestDevice(t, s, id)
		}
	}
	t0 := time.UnixMilli(time.Now().UnixMilli())
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	type view = stateView
	get := func(id string) view { return getStateView(t, s, id) }
	ms := func(d time.Duration) int64 { return at(d).UnixMilli() }

	for _, step := range []struct {
		name    string
		changes []meta.StateChange
		changed int
		want    map[string]view
	}{
		{name: "nothing", changed: 0},
		{
			name: "online with address; notActive and unknown devices left alone",
			changes: []meta.StateChange{
				{DeviceID: "a", Online: true, At: at(0), Address: "10.0.0.1:5000"},
				{DeviceID: "idle", Online: true, At: at(0)},
				{DeviceID: "unknown", Online: true, At: at(0)},
			},
			changed: 1,
			want: map[string]view{
				"a":    {"online", "10.0.0.1:5000", ms(0), 0},
				"idle": {"notActive", "", 0, 0},
			},
		},
		{
			name:    "offline keeps the online time and the address",
			changes: []meta.StateChange{{DeviceID: "a", Online: false, At: at(time.Second)}},
			changed: 1,
			want:    map[string]view{"a": {"offline", "10.0.0.1:5000", ms(0), ms(time.Second)}},
		},
		{
			name:    "an older change does not overwrite a newer one",
			changes: []meta.StateChange{{DeviceID: "a", Online: true, At: at(500 * time.Millisecond), Address: "stale"}},
			changed: 0,
			want:    map[string]view{"a": {"offline", "10.0.0.1:5000", ms(0), ms(time.Second)}},
		},
		{
			name:    "a change as old as the last one applies",
			changes: []meta.StateChange{{DeviceID: "a", Online: true, At: at(time.Second)}},
			changed: 1,
			want:    map[string]view{"a": {"online", "10.0.0.1:5000", ms(time.Second), ms(time.Second)}},
		},
		{
			name: "in a batch the latest of a device wins, whatever its place",
			changes: []meta.StateChange{
				{DeviceID: "b", Online: false, At: at(3 * time.Second)},
				{DeviceID: "b", Online: true, At: at(2 * time.Second), Address: "x"},
			},
			changed: 1,
			want:    map[string]view{"b": {"offline", "", 0, ms(3 * time.Second)}},
		},
		{
			name: "on equal times the later in the batch wins",
			changes: []meta.StateChange{
				{DeviceID: "b", Online: false, At: at(4 * time.Second)},
				{DeviceID: "b", Online: true, At: at(4 * time.Second), Address: "y"},
			},
			changed: 1,
			want:    map[string]view{"b": {"online", "y", ms(4 * time.Second), ms(3 * time.Second)}},
		},
	} {
		n, err := s.ApplyStateChanges(ctx, step.changes)
		if err != nil || n != step.changed {
			t.Fatalf("%s: ApplyStateChanges = %d, %v; want %d", step.name, n, err, step.changed)
		}
		for id, w := range step.want {
			if v := get(id); v != w {
				t.Fatalf("%s: %s is %+v, want %+v", step.name, id, v, w)
			}
		}
	}

	online, err := s.OnlineDeviceIDs(ctx)
	if err != nil || len(online) != 2 {
		t.Fatalf("online devices %v %v, want a and b", online, err)
	}

	// An undeployed device ignores state changes until deployed again.
	if _, err := s.UndeployDevice(ctx, "a", lcAdmin); err != nil {
		t.Fatal(err)
	}
	if n, err := s.ApplyStateChanges(ctx, []meta.StateChange{{DeviceID: "a", Online: true, At: at(time.Hour)}}); err != nil || n != 0 {
		t.Fatalf("change of an undeployed device: %d %v", n, err)
	}
	if v := get("a"); v.state != meta.StateNotActive {
		t.Fatalf("undeployed device is %s", v.state)
	}
}

func TestDeviceMetadata(t *testing.T) {
	t.Parallel()
	s := metatest.NewStore(t)
	ctx := context.Background()
	p := createTestProduct(t, s, "p", false)
	createTestDevice(t, s, "d", "p")

	const model = ` {"properties":[{"id":"temp","name":"Temperature","valueType":{"type":"float"}}]} `
	m, err := schema.ParseThingModelString(model)
	if err != nil {
		t.Fatal(err)
	}
	norm := m.String()
	if norm == strings.TrimSpace(model) {
		t.Fatal("the model should need normalising for this test")
	}

	// Refusals leave the product's model in force.
	for _, c := range []struct {
		name, metadata string
	}{
		{"not JSON", "{"},
		{"unknown value type", `{"properties":[{"id":"t","name":"T","valueType":{"type":"bogus"}}]}`},
		{"duplicate id", `{"properties":[{"id":"t","name":"T","valueType":{"type":"int"}},{"id":"t","name":"U","valueType":{"type":"int"}}]}`},
	} {
		if err := s.SetDeviceMetadata(ctx, "d", c.metadata, lcAdmin); !errors.Is(err, schema.ErrInvalidThingModel) {
			t.Fatalf("%s: %v, want an invalid thing model", c.name, err)
		}
	}
	for _, blank := range []string{"", "  \n"} {
		wantArgField(t, s.SetDeviceMetadata(ctx, "d", blank, lcAdmin), "metadata")
	}
	if d := deviceDetail(t, s, "d"); d.IndependentMetadata || d.Metadata != p.Metadata {
		t.Fatalf("after refusals: independent %v, metadata %s", d.IndependentMetadata, d.Metadata)
	}

	// A valid model is stored normalised and is in force.
	bob := meta.User{ID: "u2", Username: "bob"}
	if err := s.SetDeviceMetadata(ctx, "d", model, bob); err != nil {
		t.Fatal(err)
	}
	d := deviceDetail(t, s, "d")
	if !d.IndependentMetadata || d.Metadata != norm || d.ModifierName != "bob" {
		t.Fatalf("own model: independent %v, metadata %s, modifier %q", d.IndependentMetadata, d.Metadata, d.ModifierName)
	}
	if ref, _ := s.GetDeviceRef(ctx, "d"); ref.Metadata != norm {
		t.Fatalf("ref metadata %s, want %s", ref.Metadata, norm)
	}

	// Reset: the product's model is in force again.
	if err := s.ResetDeviceMetadata(ctx, "d", lcAdmin); err != nil {
		t.Fatal(err)
	}
	if d := deviceDetail(t, s, "d"); d.IndependentMetadata || d.Metadata != p.Metadata {
		t.Fatalf("after reset: independent %v, metadata %s", d.IndependentMetadata, d.Metadata)
	}

	if err := s.SetDeviceMetadata(ctx, "nope", model, lcAdmin); !errors.Is(err, meta.ErrNotFound) {
		t.Fatalf("set on unknown: %v", err)
	}
	if err := s.ResetDeviceMetadata(ctx, "nope", lcAdmin); !errors.Is(err, meta.ErrNotFound) {
		t.Fatalf("reset on unknown: %v", err)
	}
}
