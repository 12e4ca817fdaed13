package link

import "testing"

// TestBirths: with several brokers, a will counts only from the broker of
// the device's last birth; one that follows a birth elsewhere is stale; a
// device of unknown broker goes offline with any broker's will.
func TestBirths(t *testing.T) {
	w := Births{}
	f := func(id string, b int8, online, want bool) {
		t.Helper()
		if got := w.Keep(id, b, online); got != want {
			t.Fatalf("Keep(%s, %d, online %v) = %v, want %v", id, b, online, got, want)
		}
	}
	f("d", 0, false, true) // nothing known: the will counts
	f("d", 0, true, true)  // birth on 0
	f("d", 1, true, true)  // moved to 1
	f("d", 0, false, false)
	f("d", 1, false, true) // its will on 1 counts
	if len(w) != 0 {
		t.Fatalf("an offline device is still held: %v", w)
	}
	f("d", 0, false, true)
	w["s"] = UnknownBroker // seeded from the stored state
	f("s", 1, false, true)
	if _, ok := w["s"]; ok {
		t.Fatal("a seeded device stayed online after a will")
	}
}
