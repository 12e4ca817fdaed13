package meta_test

import (
	"context"
	"testing"
	"time"

	"devicehub/meta"
	"devicehub/meta/metatest"
)

// TestStateChangeFold: a folded change is the later one, carrying the
// latest time of the other kind and the latest address, whichever order
// the two come in.
func TestStateChangeFold(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	will := func(s int) meta.StateChange { return meta.StateChange{DeviceID: "d", At: at(s)} }
	birth := func(s int, addr string) meta.StateChange {
		return meta.StateChange{DeviceID: "d", Online: true, At: at(s), Address: addr}
	}
	for _, c := range []struct {
		name string
		got  meta.StateChange
		want meta.StateChange
	}{
		{"a will, then a birth: the birth, with the will's time",
			will(1).Fold(birth(2, "")), meta.StateChange{DeviceID: "d", Online: true, At: at(2), OtherAt: at(1)}},
		{"a birth, then a will: the will, with the birth's time and address",
			birth(1, "a:1").Fold(will(2)), meta.StateChange{DeviceID: "d", At: at(2), OtherAt: at(1), Address: "a:1"}},
		{"a later change first: it stays the later",
			birth(3, "a:1").Fold(will(2)), meta.StateChange{DeviceID: "d", Online: true, At: at(3), OtherAt: at(2), Address: "a:1"}},
		{"equal times: the second",
			birth(2, "").Fold(will(2)), meta.StateChange{DeviceID: "d", At: at(2), OtherAt: at(2)}},
		{"will, birth, will, birth: the last birth, with the last will's time",
			will(1).Fold(birth(2, "a:1")).Fold(will(3)).Fold(birth(4, "")),
			meta.StateChange{DeviceID: "d", Online: true, At: at(4), OtherAt: at(3), Address: "a:1"}},
		{"two births: the later, its own address first",
			birth(1, "a:1").Fold(birth(2, "b:2")), meta.StateChange{DeviceID: "d", Online: true, At: at(2), Address: "b:2"}},
	} {
		if c.got != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, c.got, c.want)
		}
	}
}

// TestApplyFoldedStateChanges: a folded change stores both kinds' times,
// the other only where it is not older than the stored ones, as the
// changes written one by one would.
func TestApplyFoldedStateChanges(t *testing.T) {
	s := metatest.NewStore(t)
	ctx := context.Background()
	createTestProduct(t, s, "p", true)
	for _, id := range []string{"a", "b"} {
		createTestDevice(t, s, id, "p")
		deployTestDevice(t, s, id)
	}
	t0 := time.UnixMilli(time.Now().UnixMilli())
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	ms := func(s int) int64 { return at(s).UnixMilli() }
	type view = stateView
	get := func(id string) view { return getStateView(t, s, id) }
	apply := func(cs ...meta.StateChange) {
		t.Helper()
		if _, err := s.ApplyStateChanges(ctx, cs); err != nil {
			t.Fatal(err)
		}
	}
	apply(meta.StateChange{DeviceID: "a", Online: true, At: at(1), Address: "10.0.0.1:1"},
		meta.StateChange{DeviceID: "b", Online: true, At: at(5)})

	// a: its will at 2 folded into its birth at 3: both times stored.
	apply(meta.StateChange{DeviceID: "a", At: at(2)}.Fold(meta.StateChange{DeviceID: "a", Online: true, At: at(3)}))
	if v, w := get("a"), (view{"online", "10.0.0.1:1", ms(3), ms(2)}); v != w {
		t.Fatalf("a after a folded will and birth: %+v, want %+v", v, w)
	}
	// A birth at 4 folded into the will at 6 behind it: offline, with the
	// birth's time and address.
	apply(meta.StateChange{DeviceID: "a", Online: true, At: at(4), Address: "10.0.0.2:2"}.Fold(meta.StateChange{DeviceID: "a", At: at(6)}))
	if v, w := get("a"), (view{"offline", "10.0.0.2:2", ms(4), ms(6)}); v != w {
		t.Fatalf("a after a folded birth and will: %+v, want %+v", v, w)
	}
	// b, online since 5: a will at 4 (older than the stored birth) folded
	// into a birth at 7 leaves the offline time alone, as the will
	// written alone would.
	apply(meta.StateChange{DeviceID: "b", At: at(4)}.Fold(meta.StateChange{DeviceID: "b", Online: true, At: at(7)}))
	if v, w := get("b"), (view{"online", "", ms(7), 0}); v != w {
		t.Fatalf("b after a stale will folded: %+v, want %+v", v, w)
	}
}

// stateView is a device's connection state as the API shows it.
type stateView struct {
	state, address  string
	online, offline int64
}

func getStateView(t *testing.T, s *meta.Store, id string) stateView {
	t.Helper()
	d := deviceDetail(t, s, id)
	return stateView{string(d.State), d.Address, millis(d.OnlineTime), millis(d.OfflineTime)}
}
