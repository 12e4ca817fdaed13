package firmware

import (
	"context"
	"slices"
	"testing"
)

// TestStoreLists: packages, rollouts and a rollout's devices are listed
// through meta's list engine (List.Range): each filter narrows only when
// given, products nil is every product and empty none, the total counts
// the whole match whatever the page, and past the end the page is empty.
func TestStoreLists(t *testing.T) {
	ms, svc, _, r := setup(t, 5, 60)
	st := svc.store
	ctx := context.Background()
	if _, err := ms.DB().ExecContext(ctx, `INSERT INTO products (id, name, device_type) VALUES ('fq', 'fq', 'device')`); err != nil {
		t.Fatal(err)
	}
	for _, p := range []Package{{ProductID: "fp", Version: "3.0"}, {ProductID: "fq", Version: "1.0"}} {
		p.ID, p.FileName, p.Size, p.SHA256 = NewID(), "x", 1, "00"
		if _, err := st.CreatePackage(ctx, p, func() error { return nil }); err != nil {
			t.Fatal(err)
		}
	}
	pkgs := func(product string, products []string, offset, limit int) ([]string, int) {
		t.Helper()
		out, total, err := st.ListPackages(ctx, product, products, offset, limit)
		if err != nil || out == nil {
			t.Fatalf("packages %q %v: %v, %v", product, products, out, err)
		}
		var v []string
		for _, p := range out {
			v = append(v, p.ProductID+" "+p.Version)
		}
		return v, total
	}
	f := func(got []string, total int, want []string, wantTotal int) {
		t.Helper()
		if !slices.Equal(got, want) || total != wantTotal {
			t.Fatalf("%v (total %d), want %v (total %d)", got, total, want, wantTotal)
		}
	}
	v, n := pkgs("", nil, 0, 10)
	f(v, n, []string{"fq 1.0", "fp 3.0", "fp 2.0"}, 3)
	v, n = pkgs("fp", nil, 0, 10)
	f(v, n, []string{"fp 3.0", "fp 2.0"}, 2)
	v, n = pkgs("", []string{"fq", "other"}, 0, 10)
	f(v, n, []string{"fq 1.0"}, 1)
	v, n = pkgs("fp", []string{"fq"}, 0, 10)
	f(v, n, nil, 0)
	v, n = pkgs("", []string{}, 0, 10)
	f(v, n, nil, 0)
	v, n = pkgs("", nil, 1, 1)
	f(v, n, []string{"fp 3.0"}, 3)
	v, n = pkgs("", nil, 10, 5)
	f(v, n, nil, 3)

	ros := func(product, state string, products []string) ([]string, int) {
		t.Helper()
		out, total, err := st.ListRollouts(ctx, product, state, products, 0, 10)
		if err != nil {
			t.Fatal(err)
		}
		var v []string
		for _, ro := range out {
			if ro.Counts["QUEUED"] != 5 || ro.RampUp != nil || ro.Abort != nil {
				t.Fatalf("rollout %+v: want 5 queued, no ramp-up, no abort", ro)
			}
			v = append(v, ro.ID)
		}
		return v, total
	}
	v, n = ros("", "", nil)
	f(v, n, []string{r.ID}, 1)
	v, n = ros("fp", RolloutRunning, []string{"fp"})
	f(v, n, []string{r.ID}, 1)
	v, n = ros("", RolloutPaused, nil)
	f(v, n, nil, 0)
	v, n = ros("", "", []string{"fq"})
	f(v, n, nil, 0)

	jobs := func(states []string, offset, limit int) ([]string, int) {
		t.Helper()
		out, total, err := st.Jobs(ctx, r.ID, states, offset, limit)
		if err != nil {
			t.Fatal(err)
		}
		var v []string
		for _, j := range out {
			v = append(v, j.DeviceID+" "+j.State)
		}
		return v, total
	}
	v, n = jobs(nil, 0, 2)
	f(v, n, []string{"fd-1 QUEUED", "fd-2 QUEUED"}, 5)
	v, n = jobs([]string{"QUEUED", "FAILED"}, 4, 10)
	f(v, n, []string{"fd-5 QUEUED"}, 5)
	v, n = jobs([]string{"FAILED"}, 0, 10)
	f(v, n, nil, 0)
	if _, n, _ := st.Jobs(ctx, "nope", nil, 0, 10); n != 0 {
		t.Fatalf("another rollout's jobs: %d", n)
	}
}
