package shadow

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"reflect"
	"sort"
	"strconv"
	"sync"
	"time"

	"devicehub/ingest/link"
	"devicehub/ingest/wire"
	"devicehub/meta"
	"devicehub/schema"
	"devicehub/schema/backoff"
	"devicehub/tsdb"
)

// Message types of the shadow messages devicehub sends.
const (
	TypeDelta    = "SHADOW_DELTA"
	TypeGetReply = "SHADOW_GET_REPLY"
)

// ReportedReader reads the latest values devices reported
// (*tsdb.DB.PropertyHistory with n = 1).
type ReportedReader interface {
	PropertyHistory(ctx context.Context, productID, deviceID string, properties []string, n int) ([]tsdb.PropertyValue, error)
}

// BatchReader reads the latest values of many devices at once
// (*tsdb.DB.LatestValues); a ReportedReader that is one serves the
// deltas of a bulk change and of a storm of births in a query per 1,000
// devices instead of one per device.
type BatchReader interface {
	LatestValues(ctx context.Context, productID string, deviceIDs, properties []string) ([]tsdb.PropertyValue, error)
}

// Sender sends a shadow message to a device (*link.Commands.SendShadow).
type Sender interface {
	SendShadow(ctx context.Context, t link.Target, m link.ShadowMessage) (string, error)
}

// Options configure a Service. Zero fields take DefaultOptions' values.
type Options struct {
	// Workers handle births and shadow requests from ingest, and send the
	// deltas of a change to many devices. Default 8.
	Workers int
	// Queue bounds the births and requests waiting for a worker; when it
	// is full, ingest's worker waits (backpressure, as for state changes).
	// Default 10000.
	Queue int
	// Batch is the most births one worker reads the shadows of in one
	// query. Default 256.
	Batch int
	// Logger; default slog.Default().
	Logger *slog.Logger
	// Changed, if set, is told each change of desired once it is
	// committed, with the view sent to the device (devicehub announces
	// it on /api/live); it must not block.
	Changed func(productID string, v View)
}

// DefaultOptions: 8 workers, a queue of 10,000, batches of 256.
func DefaultOptions() Options {
	return Options{Workers: 8, Queue: 10_000, Batch: 256, Logger: slog.Default()}
}

// Service is the shadows of devices: their views for the API, changes of
// desired with the deltas they cause, and what a device is sent when it
// connects or asks (ingest's hook).
type Service struct {
	store    *Store
	reported ReportedReader
	send     Sender // nil: nothing is sent (an instance without a device link)
	opt      Options
	log      *slog.Logger

	queue  chan request
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// request is a birth (messageID "") or a device's request for its shadow.
type request struct {
	productID, deviceID, messageID string
	get                            bool
	done                           func()
}

// New starts a service's workers; Close stops them.
func New(store *Store, reported ReportedReader, send Sender, opt Options) *Service {
	d := DefaultOptions()
	if opt.Workers <= 0 {
		opt.Workers = d.Workers
	}
	if opt.Queue <= 0 {
		opt.Queue = d.Queue
	}
	if opt.Batch <= 0 {
		opt.Batch = d.Batch
	}
	if opt.Logger == nil {
		opt.Logger = d.Logger
	}
	s := &Service{store: store, reported: reported, send: send, opt: opt,
		log: opt.Logger.With("component", "shadow"), queue: make(chan request, opt.Queue)}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	for range opt.Workers {
		s.wg.Add(1)
		go s.work()
	}
	return s
}

// Close stops the workers. Births and requests not handled yet are left
// without their done: ingest does not acknowledge them, and the broker
// delivers them again to the next ingest session (doc.go).
func (s *Service) Close() {
	s.cancel()
	s.wg.Wait()
}

// Reported is a property's latest reported value and its time (epoch ms).
type Reported struct {
	Value json.RawMessage `json:"value"`
	Time  int64           `json:"time"`
}

// View is a device's shadow as the API shows it and a device reads it:
// desired, reported, their delta (desired properties whose reported value
// differs or is missing) and the version.
type View struct {
	DeviceID   string                     `json:"deviceId"`
	Version    int64                      `json:"version"`
	Desired    map[string]Field           `json:"desired"`
	Reported   map[string]Reported        `json:"reported"`
	Delta      map[string]json.RawMessage `json:"delta"`
	UpdateTime int64                      `json:"updateTime,omitempty"` // of desired, epoch ms
}

// View reads a device's shadow and its reported values: every property of
// its thing model, and any other desired one.
func (s *Service) View(ctx context.Context, ref meta.DeviceRef) (View, error) {
	st, err := s.store.Get(ctx, ref.ID)
	if err != nil {
		return View{}, err
	}
	return s.view(ctx, ref, st, true, nil)
}

// reportedOf is what a batch read of reported values found, by device;
// a device without an entry reported none of the properties asked for.
type reportedOf map[string]map[string]Reported

// reportedMany reads the reported values of the desired properties of
// states (devices of one product) in a batch, when the reader can; nil
// otherwise (each view reads its own).
func (s *Service) reportedMany(ctx context.Context, productID string, states []State) (reportedOf, error) {
	br, ok := s.reported.(BatchReader)
	if !ok || len(states) < 2 {
		return nil, nil
	}
	ids := make([]string, 0, len(states))
	seen := map[string]bool{}
	var props []string
	for _, st := range states {
		ids = append(ids, st.DeviceID)
		for id := range st.Desired {
			if !seen[id] {
				props, seen[id] = append(props, id), true
			}
		}
	}
	sort.Strings(props)
	values, err := br.LatestValues(ctx, productID, ids, props)
	if err != nil {
		return nil, fmt.Errorf("shadow: reported values: %w", err)
	}
	out := make(reportedOf, len(states))
	for _, id := range ids {
		out[id] = map[string]Reported{}
	}
	for _, pv := range values {
		if raw, ok := reportedJSON(pv); ok {
			out[pv.DeviceID][pv.Property] = Reported{Value: raw, Time: pv.Time.UnixMilli()}
		}
	}
	return out, nil
}

// view completes st with reported values: of every property of the model
// when all, else of the desired ones only (what a delta needs), taken
// from pre when it has the device.
func (s *Service) view(ctx context.Context, ref meta.DeviceRef, st State, all bool, pre reportedOf) (View, error) {
	v := View{DeviceID: ref.ID, Version: st.Version, Desired: st.Desired, Reported: map[string]Reported{},
		Delta: map[string]json.RawMessage{}}
	if !st.UpdateTime.IsZero() {
		v.UpdateTime = st.UpdateTime.UnixMilli()
	}
	props := make([]string, 0, len(st.Desired))
	seen := map[string]bool{}
	for id := range st.Desired {
		props, seen[id] = append(props, id), true
	}
	if all {
		if m, err := schema.ParseThingModelString(ref.Metadata); err == nil {
			for i := range m.Properties {
				if id := m.Properties[i].ID; !seen[id] {
					props, seen[id] = append(props, id), true
				}
			}
		}
	}
	sort.Strings(props)
	if rep, ok := pre[ref.ID]; ok && !all {
		for id, r := range rep {
			if seen[id] {
				v.Reported[id] = r
			}
		}
	} else if len(props) > 0 && s.reported != nil {
		values, err := s.reported.PropertyHistory(ctx, ref.ProductID, ref.ID, props, 1)
		if err != nil {
			return View{}, fmt.Errorf("shadow: reported values: %w", err)
		}
		for _, pv := range values {
			if raw, ok := reportedJSON(pv); ok {
				v.Reported[pv.Property] = Reported{Value: raw, Time: pv.Time.UnixMilli()}
			}
		}
	}
	var reached []string
	for id, f := range st.Desired {
		if r, ok := v.Reported[id]; !ok || !sameValue(f.Value, r.Value) {
			v.Delta[id] = f.Value
		} else {
			reached = append(reached, id)
		}
	}
	if len(reached) > 0 {
		return s.clearReached(ctx, ref, v, reached)
	}
	return v, nil
}

// clearReached takes the reached properties out of desired where the
// device's product says so (Settings.ClearReached): every view of a
// shadow passes here, so none shows a reached property in desired. The
// change is conditional on the version read: if the shadow changed
// meanwhile, the view stays as read, and the next one clears them.
func (s *Service) clearReached(ctx context.Context, ref meta.DeviceRef, v View, reached []string) (View, error) {
	set, err := s.store.Settings(ctx, ref.ProductID)
	if err != nil || !set.ClearReached {
		return v, err
	}
	sort.Strings(reached)
	st, ok, err := s.store.ClearReached(ctx, ref.ID, v.Version, reached)
	if err != nil || !ok {
		return v, err
	}
	v.Version, v.Desired, v.UpdateTime = st.Version, st.Desired, st.UpdateTime.UnixMilli()
	return v, nil
}

// Settings reads a product's shadow settings.
func (s *Service) Settings(ctx context.Context, productID string) (Settings, error) {
	return s.store.Settings(ctx, productID)
}

// SetSettings stores a product's shadow settings.
func (s *Service) SetSettings(ctx context.Context, productID string, st Settings) error {
	return s.store.SetSettings(ctx, productID, st)
}

// reportedJSON is a stored value as the JSON the device sent.
func reportedJSON(pv tsdb.PropertyValue) (json.RawMessage, bool) {
	switch pv.ValueType {
	case "number":
		b, err := json.Marshal(pv.Num)
		return b, err == nil
	case "bool":
		return json.RawMessage(strconv.FormatBool(pv.Str == "true")), true
	case "string":
		b, err := json.Marshal(pv.Str)
		return b, err == nil
	case "json":
		return json.RawMessage(pv.Str), json.Valid([]byte(pv.Str))
	}
	return nil, false
}

// sameValue reports whether two JSON values are equal as values: numbers
// by value (21.5 and 2.15e1), objects whatever their keys' order.
func sameValue(a, b json.RawMessage) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	return reflect.DeepEqual(x, y)
}

// Set makes ch on the shadows of refs (Store.Apply: one statement, one
// version each) and then sends each changed device its delta with the new
// version, whether or not it looks connected (doc.go says why). It
// returns the views of the shadows changed, in refs' order.
func (s *Service) Set(ctx context.Context, refs []meta.DeviceRef, ch Change) ([]View, error) {
	ids := make([]string, len(refs))
	byID := make(map[string]meta.DeviceRef, len(refs))
	for i, r := range refs {
		ids[i] = r.ID
		byID[r.ID] = r
	}
	changed, err := s.store.Apply(ctx, ids, ch)
	if err != nil {
		return nil, err
	}
	pos := make(map[string]int, len(changed))
	for i, st := range changed {
		pos[st.DeviceID] = i
	}
	var pre reportedOf
	if len(refs) > 1 && len(changed) > 0 {
		// A bulk change reaches one product's devices (or a list): the
		// reported values of each product's devices in batches.
		byProduct := map[string][]State{}
		for _, st := range changed {
			pid := byID[st.DeviceID].ProductID
			byProduct[pid] = append(byProduct[pid], st)
		}
		pre = reportedOf{}
		for pid, sts := range byProduct {
			got, err := s.reportedMany(ctx, pid, sts)
			if err != nil {
				return nil, err
			}
			for id, r := range got {
				pre[id] = r
			}
		}
	}
	views := make([]View, len(changed))
	errs := make([]error, len(changed))
	sem := make(chan struct{}, s.opt.Workers)
	var wg sync.WaitGroup
	for i, st := range changed {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			ref := byID[st.DeviceID]
			v, err := s.view(ctx, ref, st, len(refs) == 1, pre)
			if err == nil && s.opt.Changed != nil {
				s.opt.Changed(ref.ProductID, v)
			}
			if err == nil {
				err = s.sendDelta(ctx, ref, v, true)
			}
			views[i], errs[i] = v, err
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			// The change is stored: the device gets it when it next
			// connects or asks. The caller learns that it was not sent.
			s.log.Warn("shadow delta not sent", "device", changed[i].DeviceID, "version", changed[i].Version, "err", err)
		}
	}
	out := make([]View, 0, len(changed))
	for _, r := range refs {
		if i, ok := pos[r.ID]; ok {
			out = append(out, views[i])
		}
	}
	return out, nil
}

// sendDelta sends v's delta with its version; at a birth (always false)
// only when there is one.
func (s *Service) sendDelta(ctx context.Context, ref meta.DeviceRef, v View, always bool) error {
	if s.send == nil || (!always && len(v.Delta) == 0) {
		return nil
	}
	_, err := s.send.SendShadow(ctx, target(ref), link.ShadowMessage{
		Level: wire.LevelShadowDelta, MessageType: TypeDelta, Version: v.Version, State: v.Delta,
	})
	return err
}

func target(ref meta.DeviceRef) link.Target {
	return link.Target{DeviceID: ref.ID, DeviceName: ref.Name, ProductID: ref.ProductID,
		ProductName: ref.ProductName, CreatorID: ref.CreatorID}
}

// Born is ingest's hook for a device's birth: the device is sent its
// delta, if it has one, and then done is called (ingest acknowledges the
// birth only then). It waits while the queue is full.
func (s *Service) Born(productID, deviceID string, done func()) {
	s.enqueue(request{productID: productID, deviceID: deviceID, done: done})
}

// Requested is ingest's hook for a device's request for its whole shadow
// (.../shadow/get, messageID its messageId): the answer goes to
// .../shadow/get/reply with that messageId, then done is called.
func (s *Service) Requested(productID, deviceID, messageID string, done func()) {
	s.enqueue(request{productID: productID, deviceID: deviceID, messageID: messageID, get: true, done: done})
}

func (s *Service) enqueue(r request) {
	select {
	case s.queue <- r:
	case <-s.ctx.Done(): // closed: left unacknowledged, delivered again
	}
}

// work takes requests, a batch at a time: the births' shadows are read in
// one query, most devices having none.
func (s *Service) work() {
	defer s.wg.Done()
	for {
		var batch []request
		select {
		case r := <-s.queue:
			batch = append(batch, r)
		case <-s.ctx.Done():
			return
		}
	more:
		for len(batch) < s.opt.Batch {
			select {
			case r := <-s.queue:
				batch = append(batch, r)
			default:
				break more
			}
		}
		s.handle(batch)
	}
}

// handle answers a batch, retrying what fails (PostgreSQL, ClickHouse or
// the broker away) with backoff until it succeeds or the service closes.
func (s *Service) handle(batch []request) {
	retry := backoff.Backoff{Min: 100 * time.Millisecond, Max: 5 * time.Second}
	for len(batch) > 0 {
		batch = s.try(batch)
		if len(batch) == 0 || retry.Wait(s.ctx) != nil {
			return
		}
	}
}

// try handles the batch and returns what failed.
func (s *Service) try(batch []request) []request {
	ctx := s.ctx
	ids := make([]string, len(batch))
	for i, r := range batch {
		ids[i] = r.deviceID
	}
	states, err := s.store.GetMany(ctx, ids)
	if err != nil {
		s.log.Warn("shadow: reading shadows for births failed; retrying", "devices", len(batch), "err", err)
		return batch
	}
	// The births' reported values in a batch per product.
	byProduct := map[string][]State{}
	for _, r := range batch {
		if st, has := states[r.deviceID]; has && !r.get {
			byProduct[r.productID] = append(byProduct[r.productID], st)
		}
	}
	pre := reportedOf{}
	for pid, sts := range byProduct {
		got, err := s.reportedMany(ctx, pid, sts)
		if err != nil {
			s.log.Warn("shadow: reading reported values for births failed; retrying", "devices", len(sts), "err", err)
			return batch
		}
		for id, r := range got {
			pre[id] = r
		}
	}
	// The devices to answer, in one query; one absent is gone.
	var need []string
	for _, r := range batch {
		if _, has := states[r.deviceID]; has || r.get {
			need = append(need, r.deviceID)
		}
	}
	refs := map[string]meta.DeviceRef{}
	if len(need) > 0 {
		rs, err := s.store.DeviceRefs(ctx, need, "")
		if err != nil {
			s.log.Warn("shadow: reading devices for births failed; retrying", "devices", len(need), "err", err)
			return batch
		}
		for _, r := range rs {
			refs[r.ID] = r
		}
	}
	// Devices are answered side by side (each answer waits for the
	// broker's PUBACK), a device's requests in their order.
	var order []string
	byDevice := map[string][]request{}
	for _, r := range batch {
		if _, ok := byDevice[r.deviceID]; !ok {
			order = append(order, r.deviceID)
		}
		byDevice[r.deviceID] = append(byDevice[r.deviceID], r)
	}
	var (
		mu     sync.Mutex
		failed []request
		wg     sync.WaitGroup
	)
	sem := make(chan struct{}, sendsInFlight)
	for _, id := range order {
		wg.Add(1)
		sem <- struct{}{}
		go func(rs []request) {
			defer func() { <-sem; wg.Done() }()
			for i, r := range rs {
				st, has := states[r.deviceID]
				if !has && !r.get {
					r.done() // no shadow, no delta: most births
					continue
				}
				if err := s.answer(ctx, r, refs, st, has, pre); err != nil {
					if ctx.Err() == nil {
						s.log.Warn("shadow: answering a device failed; retrying", "device", r.deviceID, "err", err)
					}
					mu.Lock()
					failed = append(failed, rs[i:]...) // the rest after it, in order
					mu.Unlock()
					return
				}
				r.done()
			}
		}(byDevice[id])
	}
	wg.Wait()
	return failed
}

// sendsInFlight bounds the devices one worker answers at once.
const sendsInFlight = 32

// answer sends a born device its delta, or a requesting one its shadow.
func (s *Service) answer(ctx context.Context, r request, refs map[string]meta.DeviceRef, st State, has bool, pre reportedOf) error {
	ref, ok := refs[r.deviceID]
	if !ok || ref.ProductID != r.productID {
		return nil // gone, or not this product's: nothing to send
	}
	if !has {
		st = State{DeviceID: r.deviceID, Desired: map[string]Field{}}
	}
	v, err := s.view(ctx, ref, st, r.get, pre)
	if err != nil {
		return err
	}
	if !r.get {
		return s.sendDelta(ctx, ref, v, false)
	}
	if s.send == nil {
		return nil
	}
	_, err = s.send.SendShadow(ctx, target(ref), link.ShadowMessage{
		Level: wire.LevelShadowGetReply, MessageType: TypeGetReply, ReplyTo: r.messageID, Version: v.Version,
		State: map[string]any{"desired": v.Desired, "reported": v.Reported, "delta": v.Delta},
	})
	return err
}

// DeviceRefs reads many devices' references at once (Store.DeviceRefs).
func (s *Service) DeviceRefs(ctx context.Context, ids []string, productID string) ([]meta.DeviceRef, error) {
	return s.store.DeviceRefs(ctx, ids, productID)
}
