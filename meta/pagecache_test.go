package meta_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"devicehub/meta"
	"devicehub/meta/metatest"
)

// openCachedStores opens n stores on one fresh database, each with its
// own page cache (as n devicehub instances sharing PostgreSQL).
func openCachedStores(t *testing.T, n int, ttl time.Duration) []*meta.Store {
	t.Helper()
	opts := meta.DefaultOptions()
	opts.DSN = metatest.NewDatabase(t)
	opts.MaxOpenConns = 4
	opts.PageCacheTTL = ttl
	var stores []*meta.Store
	for range n {
		s, err := meta.Open(context.Background(), opts)
		if err != nil {
			t.Fatalf("open: %v", err)
		}
		t.Cleanup(func() { s.Close() })
		stores = append(stores, s)
	}
	return stores
}

func deviceNames(t *testing.T, s *meta.Store) []string {
	t.Helper()
	q, err := meta.DecodeQuery([]byte(`{"pageSize":100,"sorts":[{"name":"id","order":"asc"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	p, err := s.QueryDevices(context.Background(), q)
	if err != nil {
		t.Fatalf("query devices: %v", err)
	}
	var names []string
	for _, d := range p.Data {
		names = append(names, d.ID+"="+d.Name+"/"+string(d.State))
	}
	return names
}

func productNums(t *testing.T, s *meta.Store) []string {
	t.Helper()
	p, err := s.QueryProducts(context.Background(), &meta.Query{})
	if err != nil {
		t.Fatalf("query products: %v", err)
	}
	var nums []string
	for _, x := range p.Data {
		nums = append(nums, fmt.Sprintf("%s=%d/%d", x.ID, x.DeviceNum, x.State))
	}
	slices.Sort(nums)
	return nums
}

// dbDeviceNames is deviceNames as PostgreSQL has them now.
func dbDeviceNames(t *testing.T, s *meta.Store) []string {
	t.Helper()
	var names []string
	if err := s.DB().Select(&names, `SELECT id || '=' || name || '/' || state FROM devices ORDER BY id`); err != nil {
		t.Fatal(err)
	}
	return names
}

// waitListed waits, up to 1 s, until list() gives want.
func waitListed(t *testing.T, what string, list func() []string, want []string) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		got := list()
		if slices.Equal(got, want) {
			return time.Since(start)
		}
		if time.Since(start) > time.Second {
			t.Fatalf("%s: after 1 s the list is %v, want %v", what, got, want)
		}
		time.Sleep(time.Millisecond) // polling every millisecond: the time it returns is a measured latency
	}
}

// TestPageCacheServesKeptPages: a page is kept while no change of its
// tables is announced. With the announcing trigger disabled, a change
// made in SQL is not seen, even after SyncLists; enabled again, the next
// change is. (Removing the cache, or a kept page's check of its
// generation, fails one half or the other.)
func TestPageCacheServesKeptPages(t *testing.T) {
	t.Parallel()
	s := openCachedStores(t, 1, time.Hour)[0]
	createTestProduct(t, s, "p", false)
	createTestDevice(t, s, "d1", "p")
	ctx := context.Background()
	if err := s.SyncLists(ctx); err != nil { // the watcher listens now
		t.Fatal(err)
	}
	before := deviceNames(t, s) // kept
	listExec(t, s, `ALTER TABLE devices DISABLE TRIGGER devices_list_change`)
	listExec(t, s, `UPDATE devices SET name = 'unannounced'`)
	if got := deviceNames(t, s); !slices.Equal(got, before) {
		t.Fatalf("kept page: got %v, want the kept %v", got, before)
	}
	listExec(t, s, `ALTER TABLE devices ENABLE TRIGGER devices_list_change`)
	listExec(t, s, `UPDATE devices SET name = 'announced'`)
	if got, want := deviceNames(t, s), dbDeviceNames(t, s); !slices.Equal(got, want) || want[0] != "d1=announced/notActive" {
		t.Fatalf("after an announced change: got %v, want %v", got, want)
	}
}

// TestPageCacheOwnWrites: each write through the Store shows on the very
// next page read, without waiting for its announcement. Many rounds: a
// write that relied on the announcement alone would lose the race often.
func TestPageCacheOwnWrites(t *testing.T) {
	t.Parallel()
	s := openCachedStores(t, 1, time.Hour)[0]
	ctx := context.Background()
	createTestProduct(t, s, "p", true)
	_ = productNums(t, s)
	if err := s.SyncLists(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		id := fmt.Sprintf("d%02d", i)
		steps := []struct {
			name  string
			write func() error
		}{
			{"create", func() error {
				_, err := s.CreateDevice(ctx, meta.NewDevice{ID: id, Name: "Device " + id, ProductID: "p"}, lcAdmin)
				return err
			}},
			{"update", func() error {
				name := "Renamed " + id
				_, err := s.UpdateDevice(ctx, id, meta.DevicePatch{Name: &name}, lcAdmin)
				return err
			}},
			{"deploy", func() error { _, err := s.DeployDevice(ctx, id, lcAdmin); return err }},
			{"online", func() error {
				_, err := s.ApplyStateChanges(ctx, []meta.StateChange{{DeviceID: id, Online: true, At: time.Now()}})
				return err
			}},
			{"undeploy", func() error { _, err := s.UndeployDevice(ctx, id, lcAdmin); return err }},
			{"metadata", func() error { return s.ResetDeviceMetadata(ctx, id, lcAdmin) }},
			{"delete", func() error {
				if i%2 == 0 {
					return nil // half the devices stay
				}
				_, err := s.DeleteDevice(ctx, id)
				return err
			}},
		}
		for _, st := range steps {
			_ = deviceNames(t, s) // the page before the write is kept
			_ = productNums(t, s)
			if err := st.write(); err != nil {
				t.Fatalf("%s %s: %v", st.name, id, err)
			}
			if got, want := deviceNames(t, s), dbDeviceNames(t, s); !slices.Equal(got, want) {
				t.Fatalf("device list right after %s %s:\n got  %v\n want %v", st.name, id, got, want)
			}
			var n int
			if err := s.DB().Get(&n, `SELECT count(*) FROM devices`); err != nil {
				t.Fatal(err)
			}
			if got, want := productNums(t, s), []string{fmt.Sprintf("p=%d/1", n)}; !slices.Equal(got, want) {
				t.Fatalf("product list right after %s %s: got %v, want %v", st.name, id, got, want)
			}
		}
	}
	// Products: state and deletion.
	if err := s.SetProductState(ctx, "p", 0, lcAdmin.ID); err != nil {
		t.Fatal(err)
	}
	if got := productNums(t, s); !slices.Equal(got, []string{"p=10/0"}) {
		t.Fatalf("after undeploying the product: %v", got)
	}
	createTestProduct(t, s, "q", false)
	if got := productNums(t, s); !slices.Equal(got, []string{"p=10/0", "q=0/0"}) {
		t.Fatalf("after creating a product: %v", got)
	}
	if _, err := s.DeleteProduct(ctx, "q"); err != nil {
		t.Fatal(err)
	}
	if got := productNums(t, s); !slices.Equal(got, []string{"p=10/0"}) {
		t.Fatalf("after deleting a product: %v", got)
	}
}

// TestPageCacheOtherWriters: a change committed by another instance, or
// in SQL past every instance, shows in this instance's next pages within
// a second, and on the next read after SyncLists. Without the announcing
// triggers the kept page (an hour's TTL) would be served on.
func TestPageCacheOtherWriters(t *testing.T) {
	t.Parallel()
	stores := openCachedStores(t, 2, time.Hour)
	a, b := stores[0], stores[1]
	ctx := context.Background()
	createTestProduct(t, b, "p", false)
	_, _ = deviceNames(t, a), productNums(t, a)
	if err := a.SyncLists(ctx); err != nil {
		t.Fatal(err)
	}
	_, _ = deviceNames(t, a), productNums(t, a) // kept
	var worst time.Duration
	for i := range 10 {
		id := fmt.Sprintf("d%d", i)
		createTestDevice(t, b, id, "p")
		worst = max(worst, waitListed(t, "device created by another instance", func() []string { return deviceNames(t, a) }, dbDeviceNames(t, b)))
		worst = max(worst, waitListed(t, "its product's count", func() []string { return productNums(t, a) }, []string{fmt.Sprintf("p=%d/%d", i+1, i%2)}))
		if _, err := b.DB().Exec(`UPDATE devices SET name = $1 WHERE id = $2`, "psql "+id, id); err != nil {
			t.Fatal(err)
		}
		worst = max(worst, waitListed(t, "device renamed in SQL", func() []string { return deviceNames(t, a) }, dbDeviceNames(t, b)))
		if _, err := b.DB().Exec(`UPDATE products SET state = $1`, (i+1)%2); err != nil {
			t.Fatal(err)
		}
		if err := a.SyncLists(ctx); err != nil {
			t.Fatal(err)
		}
		if got, want := productNums(t, a), []string{fmt.Sprintf("p=%d/%d", i+1, (i+1)%2)}; !slices.Equal(got, want) {
			t.Fatalf("product state written in SQL, after SyncLists: got %v, want %v", got, want)
		}
	}
	t.Logf("slowest change to show through the other instance: %v", worst)
}

// TestPageCacheOff: with no TTL nothing is kept: a change in SQL, not yet
// (or never) announced, shows at once.
func TestPageCacheOff(t *testing.T) {
	t.Parallel()
	s := openCachedStores(t, 1, 0)[0]
	createTestProduct(t, s, "p", false)
	createTestDevice(t, s, "d1", "p")
	_ = deviceNames(t, s)
	if _, err := s.DB().Exec(`ALTER TABLE devices DISABLE TRIGGER devices_list_change`); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if _, err := s.DB().Exec(`UPDATE devices SET name = $1`, fmt.Sprint("n", i)); err != nil {
			t.Fatal(err)
		}
		if got, want := deviceNames(t, s), dbDeviceNames(t, s); !slices.Equal(got, want) {
			t.Fatalf("uncached: got %v, want %v", got, want)
		}
	}
}

// TestPageCacheConcurrent: readers of the same and of different pages
// race writers of both instances; once the writes stop, every reader's
// next page is the tables' state. Run with -race.
func TestPageCacheConcurrent(t *testing.T) {
	t.Parallel()
	stores := openCachedStores(t, 2, time.Hour)
	a, b := stores[0], stores[1]
	ctx := context.Background()
	createTestProduct(t, a, "p", false)
	for i := range 30 {
		createTestDevice(t, a, fmt.Sprintf("d%02d", i), "p")
	}
	bodies := []string{`{"pageSize":100,"sorts":[{"name":"id","order":"asc"}]}`, `{"pageSize":5}`,
		`{"pageSize":5,"pageIndex":2}`, `{"terms":[{"column":"name","value":"device d1","termType":"like"}]}`}
	stop := make(chan struct{})
	var readers, writers sync.WaitGroup
	errs := make(chan error, 16)
	for r := range 8 {
		readers.Add(1)
		go func() {
			defer readers.Done()
			s := stores[r%2]
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				q, err := meta.DecodeQuery([]byte(bodies[(r+i)%len(bodies)]))
				if err != nil {
					errs <- err
					return
				}
				if _, err := s.QueryDevices(ctx, q); err != nil {
					errs <- err
					return
				}
				if _, err := s.QueryProducts(ctx, &meta.Query{}); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	for w, s := range []*meta.Store{a, b} {
		writers.Add(1)
		go func() {
			defer writers.Done()
			for i := range 40 {
				name := fmt.Sprintf("w%d-%d", w, i)
				if _, err := s.UpdateDevice(ctx, fmt.Sprintf("d%02d", (i*7+w)%30), meta.DevicePatch{Name: &name}, lcAdmin); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	writers.Wait()
	close(stop)
	readers.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	want := dbDeviceNames(t, a)
	for i, s := range stores {
		waitListed(t, fmt.Sprint("store ", i), func() []string { return deviceNames(t, s) }, want)
	}
	if got := deviceNames(t, a); !slices.Equal(got, want) {
		t.Fatalf("the writing instance's own list: %v, want %v", got, want)
	}
}

// TestPageCacheMemo: what a caller makes of a kept page is made once and
// served to every request that reads the page; a page read past the cache
// (a TTL of 0 keeps none) keeps nothing.
func TestPageCacheMemo(t *testing.T) {
	t.Parallel()
	s := openCachedStores(t, 1, time.Hour)[0]
	ctx := context.Background()
	createTestProduct(t, s, "p", false)
	for i := range 3 {
		createTestDevice(t, s, fmt.Sprint("d", i), "p")
	}
	if err := s.SyncLists(ctx); err != nil {
		t.Fatal(err)
	}
	var calls int
	encode := func(p *meta.Page[meta.Device]) any {
		calls++
		return fmt.Sprintf("%d of %d", len(p.Data), p.Total)
	}
	for range 3 {
		d, err := s.QueryDevices(ctx, &meta.Query{})
		if err != nil {
			t.Fatal(err)
		}
		b, ok := d.Memo(encode)
		if !ok || b != "3 of 3" {
			t.Fatalf("Memo = %v, %v; want what was made of the kept page", b, ok)
		}
	}
	if calls != 1 {
		t.Fatalf("made of the kept page %d times, want once", calls)
	}

	u := openCachedStores(t, 1, 0)[0]
	d, err := u.QueryDevices(ctx, &meta.Query{})
	if err != nil {
		t.Fatal(err)
	}
	if b, ok := d.Memo(encode); ok || b != nil || calls != 1 {
		t.Fatalf("a page read with no cache: Memo = %v, %v (made %d times)", b, ok, calls)
	}
}
