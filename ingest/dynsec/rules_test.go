package dynsec

import (
	"testing"

	"devicehub/meta"
)

func TestUpdateDevice(t *testing.T) {
	d := meta.DeviceLogin{ID: "d", ProductID: "p", SecureID: "sid", SecureKey: "key", Deployed: true}
	have := want(d)
	f := func(name string, have brokerDevice, want []string) {
		t.Helper()
		var got []string
		for _, c := range newScope("inst").updateDevice(have, d) {
			got = append(got, c["command"].(string))
		}
		if len(got) != len(want) {
			t.Fatalf("%s: commands %v, want %v", name, got, want)
		}
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("%s: commands %v, want %v", name, got, want)
			}
		}
	}
	f("unchanged", have, nil)
	newKey := have
	newKey.fingerprint = "old"
	f("new key", newKey, []string{"modifyClient"})
	newID := have
	newID.username = "old-sid"
	f("new secureId", newID, []string{"deleteClient", "createClient"})
	moved := have
	moved.productID = "q"
	f("new product", moved, []string{"modifyRole"})
}

func TestDeviceACLs(t *testing.T) {
	acls := DeviceACLs("p", "d")
	for _, a := range acls {
		if a.Topic[:len("/p/d/")] != "/p/d/" || !a.Allow {
			t.Fatalf("an ACL outside the device's prefix: %+v", a)
		}
	}
	if !sameACLs(acls, DeviceACLs("p", "d")) || sameACLs(acls, DeviceACLs("p", "e")) {
		t.Fatal("sameACLs")
	}
	reordered := append([]ACL{acls[len(acls)-1]}, acls[:len(acls)-1]...)
	if !sameACLs(acls, reordered) {
		t.Fatal("sameACLs depends on order")
	}
}

func TestFingerprint(t *testing.T) {
	d := meta.DeviceLogin{ID: "d", SecureID: "sid", SecureKey: "key"}
	e := d
	e.SecureKey = "key2"
	if Fingerprint(d) == Fingerprint(e) || len(Fingerprint(d)) != 16 {
		t.Fatalf("fingerprints %s %s", Fingerprint(d), Fingerprint(e))
	}
}
