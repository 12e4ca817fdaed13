package devauth

import (
	"slices"
	"testing"
	"time"

	"devicehub/meta"
)

// TestTally: a change is confirmed once every broker holds it, at the
// lowest version they all hold, once; one broker passes everything
// through; a device a broker never catches up with is forgotten after
// tallyKeep.
func TestTally(t *testing.T) {
	now := time.Now()
	ch := func(id string, v int64) []meta.LoginChange { return []meta.LoginChange{{ID: id, Version: v}} }
	f := func(got, want []meta.LoginChange) {
		t.Helper()
		if !slices.Equal(got, want) {
			t.Fatalf("confirmed %v, want %v", got, want)
		}
	}
	one := newTally(1)
	f(one.add(0, ch("d", 3), now), ch("d", 3))

	ty := newTally(3)
	f(ty.add(0, ch("d", 2), now), nil)
	f(ty.add(2, ch("d", 2), now), nil)
	f(ty.add(1, ch("d", 2), now), ch("d", 2)) // every broker holds version 2
	if len(ty.seen) != 0 {
		t.Fatalf("a device every broker holds at one version is still tracked: %v", ty.seen)
	}
	// Brokers at different versions: the lowest is confirmed, once.
	f(ty.add(0, ch("d", 5), now), nil)
	f(ty.add(1, ch("d", 4), now), nil)
	f(ty.add(2, ch("d", 5), now), ch("d", 4))
	f(ty.add(2, ch("d", 5), now), nil)
	f(ty.add(1, ch("d", 5), now), ch("d", 5))
	// Version 0 is a version.
	f(ty.add(0, ch("z", 0), now), nil)
	f(ty.add(1, ch("z", 0), now), nil)
	f(ty.add(2, ch("z", 0), now), ch("z", 0))
	// A broker that never applies: the device is dropped after tallyKeep.
	f(ty.add(0, ch("x", 1), now), nil)
	f(ty.add(0, ch("y", 1), now.Add(tallyKeep)), nil)
	if _, ok := ty.seen["x"]; ok {
		t.Fatal("a device tracked past tallyKeep")
	}
	if _, ok := ty.seen["y"]; !ok {
		t.Fatal("a device applied just now is not tracked")
	}
}
