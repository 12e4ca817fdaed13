package meta_test

import (
	"context"
	"testing"

	"devicehub/meta/metatest"
)

// Every write gives a device a new version, later than the last
// (products.go nextModifyTime): deploy, undeploy, rotation and the thing
// model too, not only UpdateDevice.
func TestDeviceWritesNeverMoveModifyTimeBack(t *testing.T) {
	t.Parallel()
	s := metatest.NewStore(t)
	ctx := context.Background()
	createTestProduct(t, s, "p", true)
	createTestDevice(t, s, "d", "p")
	for _, w := range []struct {
		name  string
		write func() error
	}{
		{"deploy", func() error { _, err := s.DeployDevice(ctx, "d", lcAdmin); return err }},
		{"rotate", func() error { _, err := s.RotateDeviceSecret(ctx, "d", lcAdmin); return err }},
		{"metadata", func() error { return s.ResetDeviceMetadata(ctx, "d", lcAdmin) }},
		{"undeploy", func() error { _, err := s.UndeployDevice(ctx, "d", lcAdmin); return err }},
	} {
		// The version is ahead of the clock, as after two writes in one millisecond.
		if _, err := s.DB().Exec(`UPDATE devices SET modify_time = now() + interval '5 milliseconds' WHERE id = 'd'`); err != nil {
			t.Fatal(err)
		}
		before := millis(deviceDetail(t, s, "d").ModifyTime)
		if err := w.write(); err != nil {
			t.Fatal(err)
		}
		if after := millis(deviceDetail(t, s, "d").ModifyTime); after <= before {
			t.Errorf("%s: modifyTime %d after a write on version %d: the version went back", w.name, after, before)
		}
	}
}
