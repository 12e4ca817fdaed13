package bench

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"
	"time"

	"devicehub/bench/fwdevice"
	"devicehub/bench/testkit"
)

// TestFirmwareCeiling: the firmware bench's devices (updaters over
// gateway connections of a private broker) all fetch a package from the
// http.FileServer child, verify it, reboot and report the new version;
// the phase counts every byte, every device UPDATED, and the child's RSS
// and CPU.
func TestFirmwareCeiling(t *testing.T) {
	t.Parallel()
	if _, err := mosquittoBinary(); err != nil {
		t.Fatal(err) // .ci/services installs it (make test runs it)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	broker, err := startFleetBroker(ctx, brokerPlugin, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer broker.stop()
	const n, size = 200, 256 << 10
	image := make([]byte, size)
	_, _ = rand.Read(image)
	sum := sha256.Sum256(image)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "fw.bin"), image, 0o644); err != nil {
		t.Fatal(err)
	}
	logins := make([]fwLogin, n)
	for i := range logins {
		logins[i] = fwLogin{ID: "d" + randHex(4), SecureID: "s", SecureKey: "k"}
	}
	fleet, err := startFWFleet(ctx, broker.url(), "fwtest"+randHex(3), logins, "1.0.0", 3)
	if err != nil {
		t.Fatal(err)
	}
	defer fleet.close()
	fsrv, err := startFileServer(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer fsrv.stop()
	ph, err := runFWPhase(ctx, fleet, "file server", fsrv.pid(), "1.1.0", time.Minute, func() error {
		return fleet.upgradeAll(ctx, fwdevice.Upgrade{RolloutID: "t", Version: "1.1.0", Size: size,
			SHA256: hex.EncodeToString(sum[:]), URL: fsrv.url + "/fw.bin", Expires: time.Now().Add(time.Hour).UnixMilli()})
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", ph)
	if ph.Updated != n || ph.Failed != 0 || ph.Bytes != n*size || ph.MBps <= 0 || ph.DownloadMs <= 0 || ph.DevicesUpdatedMs <= 0 ||
		ph.PeakRSSMB <= 0 || ph.CPUSeconds <= 0 {
		t.Errorf("phase %+v", ph)
	}
	for i, u := range fleet.devs {
		if v := u.Version(); v != "1.1.0" {
			t.Fatalf("%s runs %s", fleet.ids[i], v)
		}
	}
}

// TestFirmwareSmall runs the firmware scenario at 300 devices and a
// 256 KiB package: both phases end with every device UPDATED, devicehub's
// by its rollout's counts, every byte counted and no FAILED report.
func TestFirmwareSmall(t *testing.T) {
	t.Parallel()
	if _, err := mosquittoBinary(); err != nil {
		t.Fatal(err) // .ci/services installs it (make test runs it)
	}
	bin := testkit.Devicehub(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const n, size = 300, 256 << 10
	res, err := RunFirmware(ctx, FirmwareParams{Devices: n, Size: size, Timeout: 90 * time.Second, ChildParams: ChildParams{ServerBinary: bin, Logf: t.Logf}})
	t.Logf("%s", res)
	if err != nil {
		t.Fatal(err)
	}
	for _, ph := range []FirmwarePhase{res.FileServer, res.Devicehub} {
		if ph.Updated != n || ph.Failed != 0 || ph.Bytes != n*size || ph.MBps <= 0 || ph.PeakRSSMB <= 0 {
			t.Errorf("%s: %+v", ph.Server, ph)
		}
	}
	if res.Devicehub.ServerUpdatedMs <= 0 || res.RolloutID == "" {
		t.Errorf("devicehub: rollout %q counted all UPDATED after %.0f ms", res.RolloutID, res.Devicehub.ServerUpdatedMs)
	}
}
