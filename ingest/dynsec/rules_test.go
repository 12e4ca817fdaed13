package dynsec

import "testing"

func TestServiceCommands(t *testing.T) {
	f := func(name string, exists bool, acls []ACL, held bool, want ...string) {
		t.Helper()
		var got []string
		for _, c := range serviceCommands("devicehub", exists, acls, held) {
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
	f("complete", true, ServiceACLs(), true)
	f("no role", false, nil, false, "createRole", "addClientRole")
	f("role held, rights short", true, ServiceACLs()[1:], true, "modifyRole")
	all := ServiceACLs()
	reordered := append([]ACL{all[len(all)-1]}, all[:len(all)-1]...)
	f("rights in another order", true, reordered, true)
}
