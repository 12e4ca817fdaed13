package wire

import "testing"

func TestParsePresenceTopic(t *testing.T) {
	f := func(topic, wantDevice string, wantOnline, wantOK bool) {
		t.Helper()
		d, online, ok := ParsePresenceTopic(topic)
		if d != wantDevice || online != wantOnline || ok != wantOK {
			t.Fatalf("ParsePresenceTopic(%q) = %q, %v, %v; want %q, %v, %v", topic, d, online, ok, wantDevice, wantOnline, wantOK)
		}
	}
	f("/p/d/online", "d", true, true)
	f("/p/d/offline", "d", false, true)
	f("/p/d-1.x/online", "d-1.x", true, true)
	f("/p/d/online/x", "", false, false)
	f("/p/d/properties/report", "", false, false)
	f("/p/d/properties/read/reply", "", false, false)
	f("p/d/online", "", false, false)
	f("//d/online", "", false, false)
	f("/p//online", "", false, false)
	f("/p/$devicehub/online", "", false, false) // an ingest backlog marker, no device
	f("/p/+/online", "", false, false)
	f("/#/d/offline", "", false, false)
	f("/p/online", "", false, false)
	f("", "", false, false)
}

// TestDeviceTopic: every topic DeviceTopic builds for a device parses back
// to its kind and ids; downlink topics are no uplink.
func TestDeviceTopic(t *testing.T) {
	for _, c := range []struct {
		level string
		kind  Kind
	}{
		{LevelReport, KindReport}, {LevelEvent + "alarm", KindEvent}, {LevelOnline, KindOnline}, {LevelOffline, KindOffline},
		{LevelReadReply, KindReadReply}, {LevelInvokeReply, KindInvokeReply}, {LevelRead, KindUnknown}, {LevelInvoke, KindUnknown},
		{LevelWriteReply, KindWriteReply}, {LevelShadowGet, KindShadowGet},
		{LevelWrite, KindUnknown}, {LevelShadowDelta, KindUnknown}, {LevelShadowGetReply, KindUnknown},
	} {
		s := DeviceTopic("meter", "meter-1", c.level)
		tp, ok := ParseTopic(s)
		if ok != (c.kind != KindUnknown) || tp.Kind != c.kind || (ok && (tp.ProductID != "meter" || tp.DeviceID != "meter-1" || tp.Name != s)) {
			t.Errorf("ParseTopic(%q) = %+v, %v; want kind %v", s, tp, ok, c.kind)
		}
	}
	if got := UplinkFilters("p"); len(got) != 10 || got[0] != "/p/+/properties/report" || got[1] != "/p/+/event/+" {
		t.Errorf("UplinkFilters: %q", got)
	}
}
