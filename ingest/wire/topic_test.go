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

func TestIsMarker(t *testing.T) {
	for topic, want := range map[string]bool{
		"/$devicehub/$devicehub/online":            true,
		"/p/$devicehub/properties/report":          true,
		"/p/$devicehub/online":                     true,
		"/p/d/online":                              false,
		"/p/d/properties/report":                   false,
		"/p/$devicehubx/online":                    false, // not the marker level
		"/$devicehub/d/online":                     false, // a product named so
		"p/$devicehub/online":                      false,
		"/p/$devicehub":                            false,
		"":                                         false,
		"/p/d/$devicehub/online":                   false,
		"/p/$devicehub/firmware/progress/anything": true,
	} {
		if got := IsMarker(topic); got != want {
			t.Errorf("IsMarker(%q) = %v, want %v", topic, got, want)
		}
	}
}

// The uplink filters are the data and presence filters, disjoint, and
// each uplink kind is matched by exactly one of them.
func TestFilterSplit(t *testing.T) {
	data, pres := DataFilters("p"), PresenceFilters("p")
	all := UplinkFilters("p")
	if len(all) != len(data)+len(pres) {
		t.Fatalf("UplinkFilters %d = %d data + %d presence?", len(all), len(data), len(pres))
	}
	has := func(fs []string, level string) bool {
		for _, f := range fs {
			if f == DeviceTopic("p", "+", level) {
				return true
			}
		}
		return false
	}
	for _, l := range []string{LevelOnline, LevelOffline} {
		if !has(pres, l) || has(data, l) {
			t.Errorf("%s: presence %v, data %v", l, has(pres, l), has(data, l))
		}
	}
	for _, l := range []string{LevelReport, LevelEvent + "+", LevelReadReply, LevelInvokeReply, LevelWriteReply, LevelShadowGet, LevelFirmwareProgress, LevelFirmwareVersion} {
		if has(pres, l) || !has(data, l) {
			t.Errorf("%s: presence %v, data %v", l, has(pres, l), has(data, l))
		}
	}
}
