package firmware

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"devicehub/ingest/wire"
)

// TestProgressBatched: many devices' reports, several per device, queued
// at once, are stored in batches; each device ends at its last report
// (its reports applied in order, none lost to a batch that held two of
// them), and each report is acknowledged only once the row shows it
// committed.
func TestProgressBatched(t *testing.T) {
	const n = 400
	ms, svc, _, r := setup(t, n, 600)
	ctx := context.Background()
	epoch, err := svc.store.Claim(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := svc.store.start(ctx, epoch, r, false, n); err != nil || len(st) != n {
		t.Fatalf("started %d: %v", len(st), err)
	}
	steps := []wire.FirmwareProgress{
		{State: StateDownloading, Progress: 10}, {State: StateDownloading, Progress: 60},
		{State: StateDownloaded}, {State: StateVerified}, {State: StateDownloading, Progress: 30},
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var early []string
	for i, p := range steps {
		for d := 1; d <= n; d++ {
			id := fmt.Sprintf("fd-%d", d)
			p.RolloutID, p.Version = r.ID, "2.0"
			wg.Add(1)
			want := p
			last := i == len(steps)-1
			svc.Progress("fp", id, p, time.Now(), func() {
				defer wg.Done()
				if !last {
					return
				}
				// Acknowledged: the last report is committed.
				var got Job
				_ = ms.DB().GetContext(ctx, &got, `SELECT state, progress FROM firmware_devices WHERE rollout_id = $1 AND device_id = $2`, r.ID, id)
				if got.State != want.State || got.Progress != want.Progress {
					mu.Lock()
					early = append(early, fmt.Sprintf("%s %s/%d", id, got.State, got.Progress))
					mu.Unlock()
				}
			})
		}
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("reports not all acknowledged")
	}
	if len(early) > 0 {
		t.Fatalf("%d acknowledged before stored, e.g. %v", len(early), early[:min(5, len(early))])
	}
	var wrong int
	if err := ms.DB().GetContext(ctx, &wrong, `SELECT count(*) FROM firmware_devices WHERE rollout_id = $1
		AND NOT (state = 'DOWNLOADING' AND progress = 30 AND reported = 'DOWNLOADING')`, r.ID); err != nil {
		t.Fatal(err)
	}
	if wrong != 0 {
		t.Fatalf("%d devices not at their last report", wrong)
	}
}

// TestProgressBatchStatement: one statement stores reports of several
// devices; reports of another version or of a job not started change
// nothing.
func TestProgressBatchStatement(t *testing.T) {
	_, svc, _, r := setup(t, 3, 600)
	ctx := context.Background()
	epoch, _ := svc.store.Claim(ctx)
	if _, err := svc.store.start(ctx, epoch, r, false, 2); err != nil {
		t.Fatal(err)
	}
	cs, err := svc.store.ProgressBatch(ctx, []ProgressReport{
		{DeviceID: "fd-1", RolloutID: r.ID, Version: "2.0", State: StateDownloading, Progress: 40},
		{DeviceID: "fd-2", RolloutID: r.ID, Version: "2.0", State: StateFailed, Reason: "flash"},
		{DeviceID: "fd-3", RolloutID: r.ID, Version: "2.0", State: StateDownloading, Progress: 5}, // QUEUED
		{DeviceID: "fd-1", RolloutID: r.ID, Version: "9.9", State: StateUpdated},                  // other version
	})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]Change{}
	for _, c := range cs {
		got[c.DeviceID] = c
	}
	if len(cs) != 2 || got["fd-1"].State != StateDownloading || got["fd-1"].Progress != 40 ||
		got["fd-2"].State != StateFailed || got["fd-2"].Reason != "flash" {
		t.Fatalf("changes %+v", cs)
	}
}
