package ingest

import "testing"

// TestBornAt: with several brokers, a will counts only from the broker of
// the device's last birth; one that follows a birth elsewhere is stale.
func TestBornAt(t *testing.T) {
	w := newBornAt()
	f := func(id string, b int8, online, want bool) {
		t.Helper()
		if got := w.keep(id, b, online); got != want {
			t.Fatalf("keep(%s, %d, online %v) = %v, want %v", id, b, online, got, want)
		}
	}
	f("d", 0, false, true) // nothing known: the will counts
	f("d", 0, true, true)  // birth on 0
	f("d", 1, true, true)  // moved to 1
	f("d", 0, false, false)
	f("d", 1, false, true) // its will on 1 counts
	if len(w.at) != 0 {
		t.Fatalf("an offline device is still held: %v", w.at)
	}
	f("d", 0, false, true)
}
