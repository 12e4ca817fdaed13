package firmware

import (
	"context"
	"errors"

	"sync"
	"testing"
	"time"

	"devicehub/ingest/link"
	"devicehub/ingest/wire"
	"devicehub/meta"
	"devicehub/meta/metatest"
)

// sent records the upgrades a service sends, by device.
type sent struct {
	mu  sync.Mutex
	got map[string][]wire.FirmwareUpgrade
}

func (s *sent) SendFirmware(_ context.Context, t link.Target, m wire.FirmwareUpgrade) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.got[t.DeviceID] = append(s.got[t.DeviceID], m)
	return nil
}

func (s *sent) count() (devices, upgrades int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, u := range s.got {
		upgrades += len(u)
	}
	return len(s.got), upgrades
}

// setup makes a product with n online devices, a package and a rollout
// of them, and returns a service on the store.
func setup(t *testing.T, n, timeout int) (*meta.Store, *Service, *sent, Rollout) {
	t.Helper()
	ms := metatest.NewStore(t)
	db := ms.DB()
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, `INSERT INTO products (id, name, device_type) VALUES ('fp', 'fp', 'device')`); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `INSERT INTO devices (id, name, product_id, state, secure_id)
		SELECT 'fd-' || i, 'fd', 'fp', 'online', 'fd-' || i FROM generate_series(1, $1) i`, n); err != nil {
		t.Fatal(err)
	}
	svc, s := newService(t, ms)
	files, _ := NewFiles(t.TempDir(), 1<<20)
	svc.files = files
	pkg := Package{ProductID: "fp", Version: "2.0", FileName: "x", Size: 1, SHA256: "00"}
	pkg.ID = NewID()
	pkg, err := svc.store.CreatePackage(ctx, pkg, func() error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	r, err := svc.store.CreateRollout(ctx, pkg, Spec{PackageID: pkg.ID, RatePerMinute: 100_000, TimeoutSeconds: timeout, Retries: 3}, "")
	if err != nil {
		t.Fatal(err)
	}
	return ms, svc, s, r
}

func newService(t *testing.T, ms *meta.Store) (*Service, *sent) {
	t.Helper()
	s := &sent{got: map[string][]wire.FirmwareUpgrade{}}
	svc, err := New(context.Background(), NewStore(ms, 0), nil, ms, s, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(svc.Close)
	return svc, s
}

// TestStartsOnceAcrossOwners: an owner whose epoch was claimed by another
// starts nothing; and even two steps under one epoch at once (what the
// lock and the epoch prevent) start each device once, as a start is the
// change of a QUEUED row.
func TestStartsOnceAcrossOwners(t *testing.T) {
	ms, a, sa, r := setup(t, 300, 60)
	ctx := context.Background()
	b, sb := newService(t, ms)
	ea, err := a.store.Claim(ctx)
	if err != nil {
		t.Fatal(err)
	}
	eb, err := b.store.Claim(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Step(ctx, ea); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("the old owner's step: %v, want ErrNotOwner", err)
	}
	if d, _ := sa.count(); d != 0 {
		t.Fatalf("the old owner sent %d upgrades", d)
	}
	// Both under the current epoch, side by side, many times.
	var wg sync.WaitGroup
	for _, svc := range []*Service{a, b, a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 20 {
				if _, err := svc.store.start(ctx, eb, r, false, 7); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	c, err := a.store.Counts(ctx, r.ID)
	if err != nil {
		t.Fatal(err)
	}
	var attempts []int
	if err := ms.DB().SelectContext(ctx, &attempts, `SELECT attempts FROM firmware_devices WHERE rollout_id = $1 AND attempts <> 1`, r.ID); err != nil {
		t.Fatal(err)
	}
	if c[StateInitiated] != 300 || len(attempts) != 0 {
		t.Fatalf("counts %v; %d devices not started exactly once", c, len(attempts))
	}
	_ = sb
}

// TestStartLostBeforeSend: an owner stops after committing starts and
// before sending them; the next owner times those jobs out and starts
// them again, so each device gets its upgrade (once from the second
// owner).
func TestStartLostBeforeSend(t *testing.T) {
	ms, a, sa, r := setup(t, 20, 1)
	ctx := context.Background()
	ea, _ := a.store.Claim(ctx)
	stop := errors.New("stopped between commit and send")
	a.beforeSend = func([]Start) { panic(stop) }
	func() {
		defer func() {
			if p := recover(); p != stop {
				t.Fatalf("recovered %v", p)
			}
		}()
		_ = a.Step(ctx, ea)
	}()
	if d, _ := sa.count(); d != 0 {
		t.Fatalf("sent %d", d)
	}
	b, sb := newService(t, ms)
	eb, _ := b.store.Claim(ctx)
	deadline := time.Now().Add(30 * time.Second)
	for {
		if err := b.Step(ctx, eb); err != nil {
			t.Fatal(err)
		}
		if d, _ := sb.count(); d == 20 || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	d, n := sb.count()
	if d != 20 {
		t.Fatalf("%d of 20 devices got their upgrade from the next owner (%d upgrades)", d, n)
	}
	for id, ups := range sb.got {
		if len(ups) < 1 || ups[0].RolloutID != r.ID || ups[0].URL == "" {
			t.Fatalf("%s: %+v", id, ups)
		}
	}
	var attempts int
	_ = ms.DB().GetContext(ctx, &attempts, `SELECT min(attempts) FROM firmware_devices WHERE rollout_id = $1`, r.ID)
	if attempts < 2 {
		t.Fatalf("attempts %d: the lost starts were not counted", attempts)
	}

}
