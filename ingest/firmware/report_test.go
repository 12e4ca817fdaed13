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
	startJobs(t, svc, r, n)
	steps := []wire.FirmwareProgress{
		{State: StateDownloading, Progress: 10}, {State: StateDownloading, Progress: 60},
		{State: StateDownloaded}, {State: StateVerified}, {State: StateDownloading, Progress: 30},
	}
	last := steps[len(steps)-1]
	reportAll(t, len(steps), n, func(step int, id string, ack func()) {
		p := steps[step]
		p.RolloutID, p.Version = r.ID, "2.0"
		svc.Progress("fp", id, p, time.Now(), ack)
	}, func(id string) (string, bool) {
		var got Job
		_ = ms.DB().GetContext(ctx, &got, `SELECT state, progress FROM firmware_devices WHERE rollout_id = $1 AND device_id = $2`, r.ID, id)
		return fmt.Sprintf("%s/%d", got.State, got.Progress), got.State == last.State && got.Progress == last.Progress
	})
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

// TestVersionBatched: many devices' version and progress reports,
// several per device, queued at once, are stored in batches in each
// device's order: version 1.9 (left alone: the job is only INITIATED),
// then DOWNLOADING, then version 1.8 (another version after the device
// began: QUEUED again), then 1.9 again (the device row follows). Each
// device ends QUEUED at 1.9 after one attempt (a version report applied
// before the progress report that came first would leave it
// DOWNLOADING or its version 1.8), and every report is acknowledged only
// once committed.
func TestVersionBatched(t *testing.T) {
	const n = 400
	ms, svc, _, r := setup(t, n, 600)
	ctx := context.Background()
	startJobs(t, svc, r, n)
	reportAll(t, 4, n, func(step int, id string, ack func()) {
		switch step {
		case 0:
			svc.Version("fp", id, "1.9", time.Now(), ack)
		case 1:
			svc.Progress("fp", id, wire.FirmwareProgress{RolloutID: r.ID, Version: "2.0", State: StateDownloading, Progress: 10}, time.Now(), ack)
		case 2:
			svc.Version("fp", id, "1.8", time.Now(), ack)
		case 3:
			svc.Version("fp", id, "1.9", time.Now(), ack)
		}
	}, func(id string) (string, bool) {
		var got struct {
			State   string `db:"state"`
			Version string `db:"version"`
		}
		_ = ms.DB().GetContext(ctx, &got, `SELECT j.state, v.version FROM firmware_devices j
			JOIN device_firmware v ON v.device_id = j.device_id WHERE j.rollout_id = $1 AND j.device_id = $2`, r.ID, id)
		return got.State + "/" + got.Version, got.State == StateQueued && got.Version == "1.9"
	})
	var wrong int
	if err := ms.DB().GetContext(ctx, &wrong, `SELECT count(*) FROM firmware_devices j LEFT JOIN device_firmware v ON v.device_id = j.device_id
		WHERE j.rollout_id = $1 AND NOT (j.state = 'QUEUED' AND j.attempts = 1 AND j.progress = 10 AND v.version = '1.9'
			AND j.reason = 'reported version 1.8 after attempt 1')`, r.ID); err != nil {
		t.Fatal(err)
	}
	if wrong != 0 {
		t.Fatalf("%d devices not QUEUED at 1.9 by their reports in order", wrong)
	}
}

// startJobs claims the engine and starts rollout r's jobs of n devices.
func startJobs(t *testing.T, svc *Service, r Rollout, n int) {
	t.Helper()
	ctx := context.Background()
	epoch, err := svc.store.Claim(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := svc.store.start(ctx, epoch, r, false, n); err != nil || len(st) != n {
		t.Fatalf("started %d: %v", len(st), err)
	}
}

// reportAll queues steps rounds of reports of devices fd-1 to fd-n, all
// at once, send(step, id, ack) queueing one, and waits (60 s at most)
// until every one is acknowledged. When a device's last report is
// acknowledged, stored(id) tells whether its row shows it committed (and
// what the row holds): t fails if one was acknowledged before, or the
// reports were applied out of order.
func reportAll(t *testing.T, steps, n int, send func(step int, id string, ack func()), stored func(id string) (string, bool)) {
	t.Helper()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var early []string
	for step := range steps {
		last := step == steps-1
		for d := 1; d <= n; d++ {
			id := fmt.Sprintf("fd-%d", d)
			wg.Add(1)
			send(step, id, func() {
				defer wg.Done()
				if !last {
					return
				}
				if row, ok := stored(id); !ok {
					mu.Lock()
					early = append(early, id+" "+row)
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
		t.Fatalf("%d acknowledged before stored or out of order, e.g. %v", len(early), early[:min(5, len(early))])
	}
}
